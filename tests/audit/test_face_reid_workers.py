"""The face attack's per-image work mapped by the run's executor (issue 56, audit/face_reid.py
`map_sightings`, `realism_photo`): every image the attack reads is found once, as one item, with a
progress bar over them; the numbers equal the attack that finds faces as it goes; on two real Dask
worker processes (a LocalCluster started here: slow) every face check equals this process's,
number for number."""

from __future__ import annotations

import numpy as np
import pytest

from audit import AuditPolicy
from audit.face_reid import (
    REALISM_STAGE,
    SIGHTINGS_STAGE,
    compute_paired,
    compute_unpaired,
    image_sightings,
    map_sightings,
    paired_sample,
    policy_recognisers,
    run_face_reid,
)
from release.executor import ExecutorChoice, InProcess, ItemMapper, mapping_on
from synth.kinds.datasets import ImageDataset
from tests.support import face_photos

POLICY = AuditPolicy.from_dict({"face_samples": 50})


@pytest.fixture(scope="module")
def originals() -> ImageDataset:
    """Three 256 x 256 records: two portraits and the photo with both faces."""
    from PIL import Image

    def square(a: np.ndarray) -> np.ndarray:
        return np.asarray(Image.fromarray(a).resize((256, 256)))

    images = np.stack(
        [
            square(face_photos.astronaut()),
            square(face_photos.grace_hopper()),
            square(face_photos.two_faces()),
        ]
    )
    return ImageDataset(images, np.zeros(3, np.int64), ["photo"], "portraits")


@pytest.fixture(scope="module")
def released(originals) -> np.ndarray:
    """The originals with a band of each photo's middle darkened: faces moved a little."""
    images = originals.images.copy()
    images[:, 100:140] = (images[:, 100:140] * 0.6).astype(np.uint8)
    return images


def _own(data: ImageDataset) -> list[np.ndarray]:
    return [np.array([i]) for i in range(len(data))]


class _Recording:
    """An ItemMapper in this process that records what it was asked to map and its progress."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, object, int, str, bool]] = []
        self.steps: list[tuple[str, int, int]] = []
        self.mapper = ItemMapper(InProcess(), lambda s, d, t: self.steps.append((s, d, t)))

    def __call__(self, fn, config, items, *, label, keep=True):
        self.calls.append((fn, config, len(items), label, keep))
        return self.mapper(fn, config, items, label=label, keep=keep)


def test_every_image_the_paired_attack_reads_is_one_item_with_a_progress_bar(
    originals, released
) -> None:
    recording = _Recording()
    indexes = map_sightings(released, _own(originals), originals, None, POLICY, recording)
    attacked, gallery = paired_sample(len(released), _own(originals), len(originals), POLICY)
    [(fn, job, n, label, keep)] = recording.calls
    assert fn is image_sightings and n == len(attacked) + len(gallery) == 6
    assert label == SIGHTINGS_STAGE and keep is False  # the audit keeps no work folder
    assert recording.steps == [(SIGHTINGS_STAGE, d, 6) for d in range(7)]
    assert [i.recogniser.key for i in indexes] == [r.key for r in policy_recognisers(POLICY)]
    for index in indexes:
        assert set(index.found) == {("sensitive", int(g)) for g in gallery} | {
            ("release", int(r)) for r in attacked
        }
    # the numbers equal those of the attack finding faces as it goes, recogniser by recogniser
    for index in indexes:
        mapped = compute_paired(
            released, _own(originals), originals, POLICY, index.recogniser, index
        )
        lazy = compute_paired(released, _own(originals), originals, POLICY, index.recogniser)
        assert mapped.details == lazy.details


def test_the_unpaired_attack_maps_the_released_training_and_held_out_images(originals) -> None:
    recording = _Recording()
    heldout = originals.subset(np.array([0, 1]))
    indexes = map_sightings(originals.images, None, originals, heldout, POLICY, recording)
    [(_, _, n, _, _)] = recording.calls
    assert n == 3 + 2 + 2  # released, training (as many as held out), held out
    dlib = indexes[0]
    mapped = compute_unpaired(originals.images, originals, heldout, POLICY, dlib.recogniser, dlib)
    lazy = compute_unpaired(originals.images, originals, heldout, POLICY, dlib.recogniser)
    assert mapped.details == lazy.details


def test_an_item_mapper_keeps_nothing_without_a_work_folder_and_starts_only_when_used(
    tmp_path,
) -> None:
    steps: list[tuple[str, int, int]] = []
    with mapping_on(ExecutorChoice(), lambda s, d, t: steps.append((s, d, t))) as mapper:
        assert mapper._executor is None  # nothing started until the first map
        assert mapper(_square, 3, [1, 2, 4], label="x") == [3, 12, 48]
        assert isinstance(mapper.executor, InProcess)
    assert mapper._executor is None  # stopped on leaving
    assert steps == [("x", 0, 3), ("x", 1, 3), ("x", 2, 3), ("x", 3, 3)]
    assert not list(tmp_path.iterdir())
    kept = ItemMapper(InProcess(), workdir=tmp_path)
    assert kept(_square, 3, [1, 2], label="y") == [3, 12]
    assert len(list((tmp_path / "items").rglob("*.pkl"))) == 2  # a run's items are kept


def _square(config: int, item: int) -> int:
    return config * item * item


@pytest.mark.slow  # two worker processes import torch and load three recognisers each
def test_the_face_checks_on_two_dask_workers_equal_this_process(originals, released) -> None:
    here = run_face_reid(
        released, _own(originals), originals, None, POLICY, ["sface"], ItemMapper(InProcess())
    )
    steps: list[tuple[str, int, int]] = []
    with mapping_on(ExecutorChoice(workers=2), lambda s, d, t: steps.append((s, d, t))) as mapper:
        there = run_face_reid(released, _own(originals), originals, None, POLICY, ["sface"], mapper)
        assert mapper.executor.workers == 2
    assert [r.name for r in here] == [r.name for r in there]
    assert len(here) >= 4  # three recognisers, then the realism checks
    for a, b in zip(here, there, strict=True):
        assert (a.passed, a.summary, a.details) == (b.passed, b.summary, b.details)
    # a progress bar over the images the attack reads, then over the photos realism compares
    assert (SIGHTINGS_STAGE, 6, 6) in steps and steps[-1] == (REALISM_STAGE, 3, 3)
