"""`deface` and `reface` as registered mechanisms (ledger-free; release/runner.py charges them).

Order of a run: the public templates and atlases, in every process that will see a head (a failure
here is refunded) -> `ctx.on_sensitive_access()` -> each subject, one `deface_head` / `reface_head`
(the entries' per-item functions, mapped by `ctx.map_items` in this process or on Dask workers):
read the head from its file (a registered folder is handed out by reference, path and sha256, so
no task carries voxels) and refuse it unless it is still the content the run checked against the
registration, register the face atlas, cut or replace the face outside the brain's margin. Nothing
is charged in epsilon: the plan's one event is a `NonPrivateRelease`, which voids the dataset's DP
claims, so approval needs `--acknowledge-non-dp`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from accounting.errors import DataFormatError, DatasetConflictError, InvalidParameterError
from accounting.events import MechanismEvent, NonPrivateRelease
from synth import registry
from synth.kinds.head_templates import NAMES, SOURCE
from synth.kinds.volume import Record, Volume, VolumeDataset, open_record
from synth.mechanisms.deface_reface import admission, edit
from synth.mechanisms.deface_reface import describe as text
from synth.mechanisms.deface_reface import replacement_faces as faces
from synth.mechanisms.deface_reface.config import DefaceConfig, RefaceConfig
from synth.registry import DatasetInfo, MechanismOutput, MechanismPlan, RunContext
from synth.tools.mri.atlas import Atlas, atlases

WARNING = (
    "A {what} release carries NO differential-privacy guarantee and claims no epsilon: after it, "
    "the dataset's DP guarantees no longer hold (its epsilon becomes infinite in the ledger). It "
    "removes the face, which a surface render shows; it does not protect against "
    "re-identification from the brain itself. Acknowledge explicitly to run."
)
MIN_AUDIT_SUBJECTS = 5  # below this the audit's re-identification test cannot tell from chance


def make_deface_config(
    params: dict[str, Any], dataset: DatasetInfo, n_images: int | None, preset: str
) -> DefaceConfig:
    _check_count(n_images, dataset)
    return registry.build_config(DefaceConfig, "deface", preset, {}, params)


def make_reface_config(
    params: dict[str, Any], dataset: DatasetInfo, n_images: int | None, preset: str
) -> RefaceConfig:
    _check_count(n_images, dataset)
    return registry.build_config(RefaceConfig, "reface", preset, {}, params)


def _check_count(n_images: int | None, dataset: DatasetInfo) -> None:
    if n_images is not None and n_images != dataset.record_count:
        raise InvalidParameterError(
            f"[release] n_images = {n_images}: a volume release has one volume per registered "
            f"record ({dataset.record_count}); remove n_images."
        )


def _plan(
    name: str, config: Any, dataset: DatasetInfo, public: Any, extra: Sequence[str] = ()
) -> MechanismPlan:
    registry.check_data_kind(name, dataset)
    if not isinstance(public, VolumeDataset) or not set(NAMES) <= set(public.names):
        raise InvalidParameterError(
            f"[{name}] public must be {SOURCE!r} (the head templates the faces come from)."
        )
    params = config.as_dict()
    line = text.what(name, params)
    warnings = [WARNING.format(what=name), *extra]
    if dataset.record_count < MIN_AUDIT_SUBJECTS:
        warnings.append(
            f"The audit's re-identification test needs at least {MIN_AUDIT_SUBJECTS} subjects to "
            f"tell a match from chance; with {dataset.record_count} it cannot run, and the "
            "default policy (require_attacks = true) then refuses publication."
        )
    return MechanismPlan(
        events=(NonPrivateRelease(f"empirical de-identification by {name}"),),
        expected_count=dataset.record_count,
        output_shape=tuple(dataset.image_shape),
        guarantee_kind="empirical",
        warnings=tuple(warnings),
        requires_acknowledgement=True,
        parameters=params,
        detail={"guarantee_description": line, "n_volumes": dataset.record_count},
    )


def plan_deface(
    config: DefaceConfig,
    dataset: DatasetInfo,
    prior: Sequence[MechanismEvent],
    public: Any,
) -> MechanismPlan:
    registry.check_data_kind("deface", dataset)
    admission.check_plan("deface", config.method, dataset.image_shape, dataset.record_count)
    return _plan("deface", config, dataset, public)


def plan_reface(
    config: RefaceConfig,
    dataset: DatasetInfo,
    prior: Sequence[MechanismEvent],
    public: Any,
) -> MechanismPlan:
    faces.load(config.face)  # refuses a face model that is not installed, before any charge
    registry.check_data_kind("reface", dataset)
    admission.check_plan("reface", None, dataset.image_shape, dataset.record_count)
    return _plan("reface", config, dataset, public)


@dataclass(frozen=True)
class HeadJob:
    """What every head of a run shares (the `config` that `ctx.map_items` hands each item): the
    mechanism's config and the public cache the face atlas is read from (the same path on every
    worker: a shared folder on a cluster)."""

    config: DefaceConfig | RefaceConfig
    cache_dir: Path | None


# per process (the coordinator, or a Dask worker): the face atlas of each cache folder, and a face
# model handed to run_reface (tests) while that run lasts
_ATLASES: dict[str, Atlas] = {}
_GIVEN_MODELS: dict[str, faces.FaceModel] = {}
_LOADED_MODELS: dict[str, faces.FaceModel] = {}


def load_atlas(cache_dir: Path | None) -> str:
    """Load the face atlas (public templates; its registration pyramid built) into this process;
    run before the data is read, so a failure is refunded. Returns its name."""
    face_atlas, _ = atlases(cache_dir)
    face_atlas.pyramid  # noqa: B018 (built before the data is read)
    _ATLASES[str(cache_dir)] = face_atlas
    return face_atlas.name


def _atlas(cache_dir: Path | None) -> Atlas:
    if str(cache_dir) not in _ATLASES:  # a worker that joined after the run started
        load_atlas(cache_dir)
    return _ATLASES[str(cache_dir)]


def _open_head(record: Record) -> Volume:
    """The head of one item: read from its file (and its digest checked) when it is handed by
    reference. A file changed since the run checked the dataset fails the run as any item error
    does: after the sensitive data was read, so the run's reservation stays in force."""
    try:
        return open_record(record)
    except DatasetConflictError as exc:
        raise DatasetConflictError(
            f"{exc} The run stops here, after reading the registered heads: its reservation "
            "stays in force. Run the release again once the file is restored (heads already "
            "finished are reused, not redone), or abandon it."
        ) from exc


def _timed(one: Callable[[], edit.Edited]) -> tuple[Volume, dict[str, Any]]:
    t = time.perf_counter()
    edited = one()
    return edited.volume, {**edited.stats, "seconds": round(time.perf_counter() - t, 2)}


def deface_head(job: HeadJob, record: Record) -> tuple[Volume, dict[str, Any]]:
    """The per-item function of deface: one head's face cut off (deterministic: the registration's
    sampling is seeded and single-threaded)."""
    config = job.config
    assert isinstance(config, DefaceConfig)
    atlas = _atlas(job.cache_dir)
    subject = _open_head(record)
    return _timed(
        lambda: edit.deface(
            subject, atlas, config.method, config.brain_margin_mm, config.quickshear_buffer
        )
    )


def reface_head(job: HeadJob, record: Record) -> tuple[Volume, dict[str, Any]]:
    """The per-item function of reface: one head's face replaced by the face model's."""
    config = job.config
    assert isinstance(config, RefaceConfig)
    atlas = _atlas(job.cache_dir)
    model = _GIVEN_MODELS.get(config.face)
    if model is None:  # an installed face model, loaded once per process
        if config.face not in _LOADED_MODELS:
            _LOADED_MODELS[config.face] = faces.load(config.face)
        model = _LOADED_MODELS[config.face]
    subject = _open_head(record)
    return _timed(lambda: edit.reface(subject, atlas, config.brain_margin_mm, model))


@dataclass(frozen=True)
class ReleasedHead:
    """A released head held by reference (`synth.kinds.volume.VolumeRef`): result `index` of the
    run's map, which `results` reads back from the run's work folder (the item file written when
    the head came back), with the sha256, shape and stored size taken when the run went through
    its results once. Saving the release reads each head again from there, one at a time."""

    results: Sequence[tuple[Volume, dict[str, Any]]]
    index: int
    name: str
    sha256: str
    shape: tuple[int, int, int]
    nbytes: int

    def read(self) -> Volume:
        volume = self.results[self.index][0]
        now = volume.digest()
        if now != self.sha256:
            raise DatasetConflictError(
                f"released head {self.index}: its item file in the run's work folder changed "
                f"since the run read it (sha256 now {now[:16]}..., then {self.sha256[:16]}...). "
                "Remove that file (the item files are under the release's work/items/ folder) "
                "and run the release again: that head is redone, the others are reused."
            )
        return volume


def _run(
    name: str,
    data: Any,
    ctx: RunContext,
    config: DefaceConfig | RefaceConfig,
    per_head: Callable[[HeadJob, Record], tuple[Volume, dict[str, Any]]],
) -> MechanismOutput:
    from synth.tools.mri.render import picture

    if not isinstance(data, VolumeDataset):
        raise DataFormatError(f"{name} needs a volume dataset (NIfTI), got {type(data).__name__}.")
    # public data only, in every process that will see a head: a failure here is refunded
    template = ctx.prepare_workers(load_atlas, ctx.cache_dir)[0]
    ctx.on_sensitive_access()
    started = time.perf_counter()
    # lazy: each released head is written to the run's work folder as it comes back and not kept
    # here, so the coordinator's memory does not grow with the number of heads
    done = ctx.map_items(
        per_head,
        HeadJob(config, ctx.cache_dir),
        list(data.records),
        label=f"{name} (subjects)",
        lazy=True,
    )
    seconds = time.perf_counter() - started
    # one pass over the released heads, one at a time: the small per-head figures, the picture
    # the dashboard shows, and a reference to each head (read again when the release is saved)
    heads: list[ReleasedHead] = []
    pictures: list[np.ndarray] = []
    stats: list[dict[str, Any]] = []
    for i, (volume, st) in enumerate(done):
        heads.append(
            ReleasedHead(
                done, i, volume.name, volume.digest(), volume.shape, int(volume.data.nbytes)
            )
        )
        pictures.append(picture(volume))
        stats.append(st)
        del volume
    parameters = {
        **config.as_dict(),
        "n_volumes": len(heads),
        "template": template,
        "registration": "SimpleITK affine, Mattes mutual information, 8 and 4 mm levels",
        "seconds_per_volume": round(seconds / max(1, len(heads)), 2),
    }
    # a BIDS dataset's layout (paths, scrubbed sidecars) goes with the released heads, which are
    # written back into it; what it releases beside the voxels is described in the parameters
    layout = None if data.layout is None else replace(data.layout, mechanism=name)
    if layout is not None:
        parameters["bids"] = layout.summary()
    return MechanismOutput.of_volumes(
        VolumeDataset.by_reference(heads, f"{name} release", layout=layout),
        parameters,
        {"per_volume": stats},
        pictures=pictures,
    )


def run_deface(config: DefaceConfig, data: Any, ctx: RunContext) -> MechanismOutput:
    return _run("deface", data, ctx, config, deface_head)


def run_reface(
    config: RefaceConfig, data: Any, ctx: RunContext, *, model: faces.FaceModel | None = None
) -> MechanismOutput:
    """`model` replaces the installed face model in this process (tests)."""
    if model is None:
        return _run("reface", data, ctx, config, reface_head)
    _GIVEN_MODELS[config.face] = model
    try:
        return _run("reface", data, ctx, config, reface_head)
    finally:
        _GIVEN_MODELS.pop(config.face, None)


DEFACE = registry.MechanismEntry(
    name="deface",
    config_type=DefaceConfig,
    default_public=SOURCE,  # the head templates the face atlas is registered from
    make_config=make_deface_config,
    plan=plan_deface,
    run=run_deface,
    describe=text.describe_deface,
    data_kind="volumes",
    output_kind="volumes",
    per_item=deface_head,
)
# deface's public source and data and output kinds, with reface's own config and functions
REFACE = replace(
    DEFACE,
    name="reface",
    config_type=RefaceConfig,
    make_config=make_reface_config,
    plan=plan_reface,
    run=run_reface,
    describe=text.describe_reface,
    per_item=reface_head,
)
