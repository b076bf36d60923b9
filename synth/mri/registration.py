"""Affine registration of a template head to a subject with SimpleITK, and resampling of template
images (heads, masks) into the subject's voxel grid.

Mattes mutual information (templates and subjects differ in contrast), an affine transform (12
parameters: pose, size and shear) initialised by the images' centres of mass, a coarse-to-fine
pyramid at about 8, 4 and 2 mm with random sampling: one 1 mm head takes a few seconds
on 2 cores. The last level stays at twice the voxel size: the face and brain masks are smooth at
that scale, and the voxels a mechanism keeps are the subject's own, never resampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from synth.mri.volume import Volume

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


def register_affine(
    template: Volume | Pyramid, subject: Volume | Pyramid, *, seed: int = 0
) -> Registration:
    """The affine transform that best aligns `template` to `subject` (mutual information), fitted
    on 8 mm then 4 mm versions of both images."""
    import SimpleITK as sitk

    # one ITK thread: with several, the metric's partial sums are combined in whatever order the
    # threads finish, so the same inputs could register a voxel apart from one run to the next (the
    # mechanism's and the audit's registrations must each be reproducible)
    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(1)
    moving = template if isinstance(template, Pyramid) else Pyramid(template)
    fixed = subject if isinstance(subject, Pyramid) else Pyramid(subject)
    transform = sitk.CenteredTransformInitializer(
        fixed.levels[LEVELS_MM[0]],
        moving.levels[LEVELS_MM[0]],
        sitk.AffineTransform(3),
        sitk.CenteredTransformInitializerFilter.MOMENTS,
    )
    metric = 0.0
    for mm in LEVELS_MM:
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
        transform = reg.Execute(fixed.levels[mm], moving.levels[mm])
        metric = float(reg.GetMetricValue())
    return Registration(_as_affine(transform), metric)


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
