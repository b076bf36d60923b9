"""Issue 57's volume misses, each refused before anything is charged: a head turned against its
header, grids too small for a method, a run that would not fit in memory, registration that could
hang or ignore Ctrl-C, big-endian input."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from accounting import ledger
from accounting.errors import (
    DataFormatError,
    InvalidParameterError,
    ItemTimeoutError,
    ProcessDiedError,
)
from accounting.store import Store, Workspace
from release.data import register_from_source
from synth.kinds.datasets import load_data
from synth.kinds.nifti import load_volume_folder, write_volume
from synth.kinds.volume import Volume
from synth.mechanisms.deface_reface import admission
from synth.mechanisms.deface_reface.edit import deface, little_endian
from synth.tools.mri.atlas import atlases
from synth.tools.mri.registration import Registration, check_fit, interruptible
from tests.support.heads import cohort, needs_templates


@pytest.fixture(scope="module")
def cache(head_atlas_cache: Path) -> Path:
    return head_atlas_cache


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> Path:
    return cohort(tmp_path_factory.mktemp("heads"), 2, colin_only=True, seed=1)


def _turned(folder: Path, out: Path) -> Path:
    """Each head's voxels flipped along the axes that map to world R-L and A-P, affine unchanged: a
    180-degree turn about S (an LPS/RAS sign slip in a converter)."""
    out.mkdir()
    for v in load_volume_folder(folder).volumes:
        axes = np.abs(v.affine[:3, :3]).argmax(0)  # voxel axis -> the world axis it maps to
        flip = tuple(int(i) for i in np.flatnonzero(axes != 2))
        write_volume(v.with_data(np.ascontiguousarray(np.flip(v.data, flip))), out / v.name)
    return out


@needs_templates
def test_a_head_turned_against_its_header_is_refused_at_registration(
    heads, cache, tmp_path, monkeypatch
) -> None:
    """The critical miss: the face where the header says the back is. Nothing is registered, so
    no release can be planned or charged on it."""
    monkeypatch.setenv("PRIVRELEASE_CACHE", str(cache))
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    turned = _turned(heads, tmp_path / "turned")
    with pytest.raises(DataFormatError, match="turned 180 degrees about the vertical axis"):
        register_from_source(store, "turned", str(turned), 10.0, 1e-5)
    assert ledger.list_datasets(store) == []
    ds, _ = register_from_source(store, "heads", str(heads), 10.0, 1e-5)  # upright: admitted
    assert ds.record_count == 2


@needs_templates
def test_the_mechanism_never_cuts_a_turned_head(heads, cache, tmp_path) -> None:
    """Defence in depth: the mechanism judges its own fit too (a dataset admitted before a template
    change), so a turned head fails instead of losing the back of its skull."""
    face_atlas, _ = atlases(cache)
    subject = load_volume_folder(_turned(heads, tmp_path / "t")).volumes[0]
    with pytest.raises(DataFormatError, match="turned 180 degrees"):
        deface(subject, face_atlas, "mask", 5.0, 10)


def test_check_fit_judges_the_metric_and_the_turn() -> None:
    check_fit(Registration(None, -0.9, "none"), "ok")
    with pytest.raises(DataFormatError, match="does not fit this image"):
        check_fit(Registration(None, -0.2, "none"), "a")
    with pytest.raises(DataFormatError, match="does not fit this image"):
        check_fit(Registration(None, float("nan"), "none"), "a")
    with pytest.raises(DataFormatError, match="upside down"):
        check_fit(Registration(None, -0.9, "x"), "a")


@needs_templates
def test_a_grid_too_coarse_for_the_masks_is_refused(heads, cache) -> None:
    """The smallest grids crashed quickshear after the data was read (an empty brain mask)."""
    v = load_volume_folder(heads).volumes[0]
    affine = v.affine.copy()
    affine[:3, :3] *= 3  # every third voxel: the same head on a 10 x 12 x 10 grid of 18 mm
    coarse = Volume(np.ascontiguousarray(v.data[::3, ::3, ::3]), affine, name="coarse")
    data = load_data(str(heads))
    data.volumes = (coarse,)
    with pytest.raises(DataFormatError, match="covers .* voxels|does not fit|quickshear|best"):
        admission.check_heads(data, cache)


@pytest.mark.parametrize(
    ("mechanism", "method", "side"), [("deface", "quickshear", 8), ("deface", "mask", 8)]
)
def test_the_plan_refuses_a_grid_below_the_methods_minimum(mechanism, method, side) -> None:
    with pytest.raises(InvalidParameterError, match="needs at least .* voxels per side"):
        admission.check_plan(mechanism, method, (side, side, side), 5)
    admission.check_plan(mechanism, method, (30, 36, 30), 5)  # the test cohort's grid


def test_the_plan_refuses_a_run_bigger_than_the_machine() -> None:
    """A 1024^3 volume needs ~100 GB to deface."""
    shape = (1024, 1024, 1024)
    need = admission.peak_memory("deface:mask", 1024**3)
    if need <= admission.machine_memory():
        pytest.skip("this machine has the memory for a 1024^3 volume")
    with pytest.raises(InvalidParameterError, match=r"needs about .* GiB .* more than this"):
        admission.check_plan("deface", "mask", shape, 1)


def test_machine_memory_is_this_machines() -> None:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < admission.machine_memory() <= total


def test_registration_work_that_never_ends_times_out() -> None:
    """A time limit is a transient failure (release/retries.py tries the item again once)."""
    started = time.monotonic()
    with pytest.raises(ItemTimeoutError, match="did not finish within 1 s"):
        interruptible(lambda: time.sleep(60), 1.0, "x")
    assert time.monotonic() - started < 10


def test_a_registration_child_killed_says_so_with_its_signal_not_eof_error() -> None:
    """Issue 66: a SIGKILLed child (the out-of-memory killer's choice) surfaced as `EOFError()`."""
    with pytest.raises(ProcessDiedError) as died:
        interruptible(lambda: os.kill(os.getpid(), signal.SIGKILL), 30.0, "sub-07.nii.gz")
    assert died.value.signal == signal.SIGKILL
    assert str(died.value) == (
        "sub-07.nii.gz: the registration process was killed by signal 9 (SIGKILL; likely out "
        "of memory)"
    )
    with pytest.raises(ProcessDiedError, match=r"exited \(code 3\) without an answer"):
        interruptible(lambda: os._exit(3), 30.0, "x")


def test_ctrl_c_stops_registration_work_and_its_child() -> None:
    """SimpleITK's C++ loop ignores Ctrl-C; run in a child, the parent answers it at once.

    Python's own Ctrl-C handler is installed for the test: a process started in the background by
    a shell without job control (`make test &` in a script) inherits SIGINT ignored, and then no
    Ctrl-C reaches it at all (the test waited the child's 60 s and failed)."""
    import multiprocessing

    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    try:
        timer.start()
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            interruptible(lambda: time.sleep(60), 600.0, "x")
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, inherited)
    assert time.monotonic() - started < 10
    assert multiprocessing.active_children() == []


def test_a_failure_in_the_child_is_reported() -> None:
    def broken():
        raise RuntimeError("All samples map outside moving image buffer")

    with pytest.raises(DataFormatError, match="registration failed .*outside moving image"):
        interruptible(broken, 60.0, "x")


def test_big_endian_voxels_are_released_little_endian_with_the_same_values() -> None:
    v = Volume(np.arange(512, dtype=">i2").reshape(8, 8, 8), np.eye(4), 2.0, 1.0)
    out = little_endian(v)
    assert out.data.dtype == np.dtype("<i2") and np.array_equal(out.data, v.data)
    assert (out.slope, out.inter) == (2.0, 1.0)
    assert little_endian(out) is out


def test_the_memory_estimate_counts_heads_in_flight_not_the_dataset() -> None:
    """10,000 1 mm heads need what 5 do: the coordinator holds HEADS_HELD at a time."""
    voxels = 181 * 217 * 181
    need = admission.peak_memory("reface", voxels, 2)
    assert need == (admission.HEADS_HELD * 2 + admission.PEAK_BYTES_PER_VOXEL["audit"]) * voxels
    assert need < 1 << 30  # a 1 mm head's working set fits any machine that runs the tests
    admission.check_plan("reface", None, (181, 217, 181), 10_000)  # no refusal for the count
