"""`deface` and `reface` as registered mechanisms (ledger-free; release/runner.py charges them).

Order of a run: the public templates and atlases (a failure here is refunded) ->
`ctx.on_sensitive_access()` -> each subject in turn: register the face atlas, cut or replace the
face outside the brain's margin. Nothing is charged in epsilon: the plan's one event is a
`NonPrivateRelease`, which voids the dataset's DP claims, so approval needs
`--acknowledge-non-dp`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from accounting.errors import DataFormatError, InvalidParameterError
from accounting.events import MechanismEvent, NonPrivateRelease
from synth import registry
from synth.kinds.head_templates import NAMES, SOURCE
from synth.kinds.volume import VolumeDataset
from synth.mechanisms.deface_reface import admission, edit
from synth.mechanisms.deface_reface import describe as text
from synth.mechanisms.deface_reface import replacement_faces as faces
from synth.mechanisms.deface_reface.config import DefaceConfig, RefaceConfig
from synth.registry import DatasetInfo, MechanismOutput, MechanismPlan, RunContext
from synth.tools.mri.atlas import atlases

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
    params = config.public_parameters()
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


def _run(
    name: str,
    data: Any,
    ctx: RunContext,
    params: dict[str, Any],
    one: Callable[..., edit.Edited],
) -> MechanismOutput:
    if not isinstance(data, VolumeDataset):
        raise DataFormatError(f"{name} needs a volume dataset (NIfTI), got {type(data).__name__}.")
    face_atlas, _ = atlases(ctx.cache_dir)  # public data only: a failure here is refunded
    face_atlas.pyramid  # noqa: B018 (built before the data is read)
    ctx.on_sensitive_access()
    out, stats = [], []
    started = time.perf_counter()
    stage = f"{name} (subjects)"
    for i, subject in enumerate(data.volumes):
        ctx.progress(stage, i, len(data))
        t = time.perf_counter()
        edited = one(subject, face_atlas)
        out.append(edited.volume)
        stats.append({**edited.stats, "seconds": round(time.perf_counter() - t, 2)})
        ctx.progress(stage, i + 1, len(data))
    seconds = time.perf_counter() - started
    parameters = {
        **params,
        "n_volumes": len(out),
        "template": face_atlas.name,
        "registration": "SimpleITK affine, Mattes mutual information, 8 and 4 mm levels",
        "seconds_per_volume": round(seconds / max(1, len(out)), 2),
    }
    return MechanismOutput.of_volumes(
        VolumeDataset(out, f"{name} release"), parameters, {"per_volume": stats}
    )


def run_deface(config: DefaceConfig, data: Any, ctx: RunContext) -> MechanismOutput:
    def one(subject, atlas):
        return edit.deface(
            subject, atlas, config.method, config.brain_margin_mm, config.quickshear_buffer
        )

    return _run("deface", data, ctx, config.public_parameters(), one)


def run_reface(
    config: RefaceConfig, data: Any, ctx: RunContext, *, model: faces.FaceModel | None = None
) -> MechanismOutput:
    face_model = model if model is not None else faces.load(config.face)

    def one(subject, atlas):
        return edit.reface(subject, atlas, config.brain_margin_mm, face_model)

    return _run("reface", data, ctx, config.public_parameters(), one)


DEFACE = registry.MechanismEntry(
    name="deface",
    config_type=DefaceConfig,
    default_public=SOURCE,  # the head templates the face atlas is registered from
    make_config=make_deface_config,
    plan=plan_deface,
    run=run_deface,
    describe=text.describe_deface,
    data_kind="volumes",
)
REFACE = registry.MechanismEntry(
    name="reface",
    config_type=RefaceConfig,
    default_public=SOURCE,
    make_config=make_reface_config,
    plan=plan_reface,
    run=run_reface,
    describe=text.describe_reface,
    data_kind="volumes",
)
