"""Affine registration of a template head to a subject with SimpleITK, and resampling of template
images (heads, masks) into the subject's voxel grid.

Mattes mutual information (templates and subjects differ in contrast), an affine transform (12
parameters: pose, size and shear) initialised by the images' centres of mass, a coarse-to-fine
pyramid at about 8, 4 and 2 mm with random sampling: one 1 mm head takes a few seconds
on 2 cores. The last level stays at twice the voxel size: the face and brain masks are smooth at
that scale, and the voxels a mechanism keeps are the subject's own, never resampled.

Orientation is found, not trusted: the coarse level is fitted from four starting orientations (as
the header says, and turned 180 degrees about each world axis), and the best metric wins. A head
whose best fit is a turned start has a header that disagrees with its image (an LPS/RAS sign slip
in a converter): `check_fit` refuses it, and refuses a fit whose metric says the template was not
found in the image at all.

SimpleITK runs in a forked child process with a time limit: C++ code ignores Ctrl-C, and an input
ITK cannot handle could otherwise keep a run (and its reserved charge) busy forever.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from accounting.errors import (
    DataFormatError,
    InvalidParameterError,
    ItemTimeoutError,
    ProcessDiedError,
)
from synth.kinds.volume import Volume

_LPS = np.diag([-1.0, -1.0, 1.0])  # nibabel's world is RAS, ITK's LPS


def to_sitk(volume: Volume, values: np.ndarray | None = None):
    """`volume` (or other `values` on its grid) as a SimpleITK image with the same geometry."""
    import SimpleITK as sitk

    arr = volume.physical() if values is None else np.asarray(values)
    img = sitk.GetImageFromArray(np.ascontiguousarray(arr.transpose(2, 1, 0)))
    zooms = np.asarray(volume.zooms)
    img.SetSpacing(tuple(float(z) for z in zooms))
    img.SetDirection(tuple((_LPS @ (volume.affine[:3, :3] / zooms)).ravel().tolist()))
    img.SetOrigin(tuple((_LPS @ volume.affine[:3, 3]).tolist()))
    return img


def from_sitk(img) -> np.ndarray:
    import SimpleITK as sitk

    return sitk.GetArrayFromImage(img).transpose(2, 1, 0)


@dataclass(frozen=True)
class Registration:
    """A fitted template -> subject transform (maps subject points to template points, ITK's
    convention for resampling the template onto the subject)."""

    transform: Any  # SimpleITK AffineTransform
    metric: float  # final Mattes mutual information (more negative = better)
    turn: str = "none"  # the starting orientation that fitted best (TURNS)

    def resample(
        self,
        template: Volume | Any,
        subject: Volume,
        values: np.ndarray | None = None,
        *,
        nearest: bool = False,
    ) -> np.ndarray:
        """Template intensities (or `values` on its grid, e.g. a mask) on the subject's grid.
        `template` may be a ready SimpleITK image on the template's grid (`values` then unused)."""
        import SimpleITK as sitk

        interp = sitk.sitkNearestNeighbor if nearest else sitk.sitkLinear
        if isinstance(template, Volume):
            src = to_sitk(template, None if values is None else np.asarray(values, np.float32))
        else:
            src = template
        out = sitk.Resample(
            src,
            to_sitk(subject, np.zeros(subject.shape, np.float32)),
            self.transform,
            interp,
            0.0,
            sitk.sitkFloat32,
        )
        return from_sitk(out)

    def resample_mask(
        self, template: Volume | Any, mask: np.ndarray | None, subject: Volume
    ) -> np.ndarray:
        """A 0/1 template mask on the subject's grid (linear interpolation, cut at one half)."""
        values = None if mask is None else mask.astype(np.float32)
        return self.resample(template, subject, values) >= 0.5


def _grid(img, mm: float):
    """`img` smoothed and resampled onto an isotropic `mm` grid over the same extent (what one
    pyramid level registers: both images are small, so a level costs well under a second)."""
    import SimpleITK as sitk

    spacing = np.asarray(img.GetSpacing())
    size = np.asarray(img.GetSize())
    if mm <= spacing.min():
        return img
    new_size = [max(4, int(round(n))) for n in size * spacing / mm]
    smooth = sitk.SmoothingRecursiveGaussian(
        img, float(np.sqrt(max(mm**2 - spacing.min() ** 2, 0))) / 2
    )
    return sitk.Resample(
        smooth,
        new_size,
        sitk.Transform(),
        sitk.sitkLinear,
        img.GetOrigin(),
        [mm] * 3,
        img.GetDirection(),
        0.0,
        sitk.sitkFloat32,
    )


LEVELS_MM = (8.0, 4.0)  # the registration's pyramid (isotropic voxel sizes, coarse to fine)


class Pyramid:
    """A volume as SimpleITK images at full resolution and at each pyramid level, built once: a
    template registered to many subjects is smoothed and resampled only once."""

    def __init__(self, volume: Volume) -> None:
        self.volume = volume
        self.full = to_sitk(volume)
        self.levels = {mm: _grid(self.full, mm) for mm in LEVELS_MM}


# starting orientations of the coarse level: as the header says, and turned 180 degrees about each
# world axis (the same matrix in RAS and ITK's LPS). "z" is the issue-57 slip: voxels flipped along
# the axes that map to R-L and A-P, header unchanged.
TURNS: dict[str, tuple[float, float, float]] = {
    "none": (1.0, 1.0, 1.0),
    "x": (1.0, -1.0, -1.0),
    "y": (-1.0, 1.0, -1.0),
    "z": (-1.0, -1.0, 1.0),
}
TURN_WORDS = {
    "none": "as the header says",
    "x": "turned 180 degrees about the left-right axis (upside down and back to front)",
    "y": "turned 180 degrees about the front-back axis (upside down, left and right swapped)",
    "z": "turned 180 degrees about the vertical axis (face where the header puts the back)",
}
# Mattes mutual information (32 bins) of a fit: a template registered to a head scores well below
# this, one registered to something that is not a head in its header's orientation scores near it
# or above (BENCHMARKS-NOTEBOOK.md, "Measurement history from the code"). Above this, the
# template was not found.
MAX_METRIC = -0.5
TIMEOUT_S = 600.0  # one registration in the child; a 1 mm head takes a few seconds


def _level(fixed, moving, transform, mm: float, seed: int):
    import SimpleITK as sitk

    reg = sitk.ImageRegistrationMethod()
    reg.SetMetricAsMattesMutualInformation(numberOfHistogramBins=32)
    reg.SetMetricSamplingStrategy(reg.REGULAR)
    # SimpleITK reads a seed of 0 as "seed from the wall clock": shifted, runs are reproducible
    reg.SetMetricSamplingPercentage(0.15, seed + 1)
    reg.SetInterpolator(sitk.sitkLinear)
    reg.SetOptimizerAsRegularStepGradientDescent(
        learningRate=mm / 4,
        minStep=1e-3,
        numberOfIterations=150,
        gradientMagnitudeTolerance=1e-6,
    )
    reg.SetOptimizerScalesFromPhysicalShift()
    reg.SetInitialTransform(transform, inPlace=False)
    out = reg.Execute(fixed.levels[mm], moving.levels[mm])
    return out, float(reg.GetMetricValue())


def _fit(moving: Pyramid, fixed: Pyramid, seed: int) -> tuple[list[float], float, str]:
    """The registration itself (run in the child): (matrix and translation, metric, turn)."""
    import SimpleITK as sitk

    # one ITK thread: with several, the metric's partial sums are combined in whatever order the
    # threads finish, so the same inputs could register a voxel apart from one run to the next (the
    # mechanism's and the audit's registrations must each be reproducible)
    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(1)
    coarse = LEVELS_MM[0]
    initial = sitk.AffineTransform(
        sitk.CenteredTransformInitializer(
            fixed.levels[coarse],
            moving.levels[coarse],
            sitk.AffineTransform(3),
            sitk.CenteredTransformInitializerFilter.MOMENTS,
        )
    )
    best = None
    for turn, signs in TURNS.items():
        start = sitk.AffineTransform(initial)
        start.SetMatrix(np.diag(signs).ravel().tolist())
        fitted, metric = _level(fixed, moving, start, coarse, seed)
        if best is None or metric < best[1] - 1e-6:  # ties keep the header's orientation
            best = (fitted, metric, turn)
    assert best is not None
    transform, metric, turn = best
    for mm in LEVELS_MM[1:]:
        transform, metric = _level(fixed, moving, transform, mm, seed)
    affine = _as_affine(transform)
    return [*affine.GetMatrix(), *affine.GetTranslation()], metric, turn


def _child(conn, fn: Callable[[], Any]) -> None:
    try:
        conn.send(("ok", fn()))
    except BaseException as exc:  # noqa: BLE001 (reported to the parent, whatever it is)
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


def interruptible(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """`fn()` run in a forked child process, its result sent back: the parent keeps answering
    Ctrl-C (SimpleITK's C++ code does not) and stops waiting after `timeout_s`. The child is killed
    whenever the parent stops waiting."""
    if multiprocessing.current_process().daemon:
        raise InvalidParameterError(
            f"{what}: the registration runs in a child process, and this one (a Dask worker "
            "started as a daemon) may not start any. Start the workers with "
            "DASK_DISTRIBUTED__WORKER__DAEMON=False (docs/scaling-out.md)."
        )
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn), daemon=True)
    proc.start()
    child.close()
    deadline = time.monotonic() + timeout_s
    try:
        while not parent.poll(0.2):
            if not proc.is_alive() and not parent.poll(0):
                raise died(proc, what)
            if time.monotonic() > deadline:
                raise ItemTimeoutError(
                    f"{what}: the registration did not finish within {timeout_s:g} s (on a busy "
                    "machine it may finish on another try; a volume that is not a head SimpleITK "
                    "can register never does: check its intensities and header)."
                )
        try:
            status, value = parent.recv()
        except EOFError:  # the child died before it answered: its end of the pipe closed
            proc.join(5)
            raise died(proc, what) from None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        parent.close()
    if status != "ok":
        raise DataFormatError(f"{what}: the registration failed ({value}).")
    return value


def died(proc: Any, what: str) -> ProcessDiedError:
    """The error for a child process that ended without answering: its signal and the likely cause
    (a SIGKILL is what the kernel's out-of-memory killer sends, to the largest process)."""
    code = proc.exitcode
    if code is not None and code < 0:
        sig = -code
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "unknown signal"
        cause = "; likely out of memory" if sig == signal.SIGKILL else ""
        return ProcessDiedError(
            f"{what}: the registration process was killed by signal {sig} ({name}{cause})",
            signal=sig,
        )
    return ProcessDiedError(
        f"{what}: the registration process exited (code {code}) without an answer", exitcode=code
    )


def register_affine(
    template: Volume | Pyramid,
    subject: Volume | Pyramid,
    *,
    seed: int = 0,
    timeout_s: float = TIMEOUT_S,
) -> Registration:
    """The affine transform that best aligns `template` to `subject` (mutual information), fitted
    on 8 mm then 4 mm versions of both images, the 8 mm level from each of the starting
    orientations TURNS (the best metric wins: `Registration.turn`)."""
    import SimpleITK as sitk

    moving = template if isinstance(template, Pyramid) else Pyramid(template)
    fixed = subject if isinstance(subject, Pyramid) else Pyramid(subject)
    name = fixed.volume.name or "volume"
    params, metric, turn = interruptible(lambda: _fit(moving, fixed, seed), timeout_s, name)
    out = sitk.AffineTransform(3)
    out.SetMatrix(params[:9])
    out.SetTranslation(params[9:])
    return Registration(out, metric, turn)


def check_fit(reg: Registration, what: str) -> None:
    """Refuse a registration that cannot be trusted: the head turned against its header, or a
    metric that says the template was not found (MAX_METRIC)."""
    if not np.isfinite(reg.metric) or reg.metric > MAX_METRIC:
        raise DataFormatError(
            f"{what}: the head template does not fit this image (registration metric "
            f"{reg.metric:.3f}, a head fits at {MAX_METRIC:g} or better): it is not a whole head "
            "scan (T1-weighted, face and brain in the field of view), or its header's geometry "
            "is wrong. Remove it or fix it."
        )
    if reg.turn != "none":
        raise DataFormatError(
            f"{what}: the image fits the template best {TURN_WORDS[reg.turn]}; its header's "
            "orientation disagrees with the voxels (a converter's LPS/RAS sign slip?). The face "
            "would be looked for in the wrong place. Fix the affine (sform/qform) or reconvert "
            "the scan (e.g. dcm2niix), then register it again."
        )


def _as_affine(transform):
    """One AffineTransform from what the registration returns (a composite of the initial and
    fitted transforms), so it can be inverted and stored."""
    import SimpleITK as sitk

    composite = sitk.CompositeTransform(transform)
    composite.FlattenTransform()
    matrix, offset = np.eye(3), np.zeros(3)
    for i in range(composite.GetNumberOfTransforms()):
        t = sitk.AffineTransform(composite.GetNthTransform(i))  # every part is affine here
        # points go through the last-added transform first
        a = np.asarray(t.GetMatrix()).reshape(3, 3)
        c = np.asarray(t.GetCenter())
        b = np.asarray(t.GetTranslation()) + c - a @ c
        matrix, offset = matrix @ a, matrix @ b + offset
    out = sitk.AffineTransform(3)
    out.SetMatrix(matrix.ravel().tolist())
    out.SetTranslation(offset.tolist())
    return out
