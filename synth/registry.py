"""The mechanism interface and its registry.

A mechanism reads sensitive data and produces releasable data. It never touches the budget ledger:
it declares a frozen config type, `plan(config, dataset, prior, public) -> MechanismPlan` (the
events it will charge, warnings, its guarantee) and `run(config, data, ctx) -> MechanismOutput`. The
runner in `release/runner.py` reserves the plan's events, calls `run`, and settles the charge from
what the context recorded (ARCHITECTURE.md, "Adding a mechanism").

Adding a mechanism = one folder under `synth/` exposing a `MECHANISM` object + one line in
`_ENTRIES` (built-ins), or `register(entry)` from anywhere else (a plug-in, a test). What it
releases is an output kind, named by `MechanismEntry.output_kind` (release/kinds/ saves, bundles
and audits each kind).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from accounting.errors import InvalidParameterError
from accounting.events import DpSgd, MechanismEvent
from synth.config import MechanismConfig
from synth.kinds.datasets import ImageDataset
from synth.kinds.volume import VolumeDataset
from synth.progress import ProgressFn

# name -> "module:attribute" of the Mechanism object; imported lazily (torch is heavy)
_ENTRIES: dict[str, str] = {
    "privimage": "synth.mechanisms.privimage.pipeline:MECHANISM",
    "ksalsa": "synth.mechanisms.ksalsa.run:MECHANISM",
    "merf": "synth.mechanisms.merf.run:MECHANISM",
    "deface": "synth.mechanisms.deface_reface.run:DEFACE",
    "reface": "synth.mechanisms.deface_reface.run:REFACE",
    "face-deid": "synth.mechanisms.face_deid.run:MECHANISM",
}
# the data a mechanism takes, where not images (its entry's data_kind says the same; a test checks)
_VOLUME_MECHANISMS = ("deface", "reface")
# registration-time checks that the built-in mechanisms taking a data kind need of every record
# ("module:attribute", imported lazily): head volumes must fit the head atlases deface and reface
# register them with
_ADMISSIONS: dict[str, str] = {
    "volumes": "synth.mechanisms.deface_reface.admission:check_heads",
}
# What a dataset holds and a mechanism takes: 2D image sets (ImageDataset) or 3D head volumes
# (NIfTI, synth.tools.mri.VolumeDataset). The plan refuses a mechanism on data of the other kind.
DATA_KINDS = ("images", "volumes")
Data = ImageDataset | VolumeDataset


def data_kind(data: Data) -> str:
    return "volumes" if isinstance(data, VolumeDataset) else "images"


def images_only(data: Data | None, where: str) -> ImageDataset:
    """`data` as an image set; head volumes, or no data, are refused naming `where` (a mechanism's
    images)."""
    if data is None:
        raise InvalidParameterError(
            f"{where} needs public images and none were given: name them with "
            "`public = ...` in the spec's mechanism table."
        )
    if not isinstance(data, ImageDataset):
        raise InvalidParameterError(
            f"{where} needs 2D images, got head volumes ({data.source}); the volume mechanisms "
            "are deface and reface."
        )
    return data


@dataclass(frozen=True)
class DatasetInfo:
    """What a mechanism may know about the registered dataset at plan time (all public metadata)."""

    dataset_id: str
    name: str
    record_count: int
    labels: tuple[int, ...]
    image_shape: tuple[int, ...]  # volumes: the common (X, Y, Z), or () when shapes vary
    delta_cap: float
    data_kind: str = "images"  # one of DATA_KINDS


# The guarantee kinds a mechanism may declare (MechanismPlan.guarantee_kind), with the words the
# plan, card, dashboard and policy use for them. Every kind but "dp" carries no differential
# privacy: a release of such a kind voids the DP meaning of its dataset's other releases unless the
# steward acknowledges it (ARCHITECTURE.md, rule 5), whatever the mechanism.
DP = "dp"
GUARANTEE_KINDS: dict[str, str] = {
    DP: "differential privacy",
    "k-anonymity": "k-anonymity",
    "empirical": "empirical de-identification",
}


def guarantee_label(kind: str) -> str:
    """The words for a guarantee kind ("k-anonymity (no DP guarantee)")."""
    label = GUARANTEE_KINDS.get(kind, kind)
    return label if kind == DP else f"{label} (no DP guarantee)"


@dataclass(frozen=True)
class MechanismDescription:
    """What a mechanism tells a consumer about a release it made (the card, Croissant): written by
    the mechanism, so that release/ never needs to know which mechanism made what."""

    what: str  # the card's "What this is" paragraph
    # DP: what the guarantee covers ("the synthetic images and labels (DP-SGD), ...");
    # otherwise the card's whole "Privacy guarantee" paragraph
    guarantee: str
    collection: str  # one sentence: how the data was made (Croissant's data_collection)
    collection_type: str = "Synthetic data"  # Croissant's data_collection_type
    tags: tuple[str, ...] = ("synthetic", "differential-privacy")


@dataclass(frozen=True)
class Guarantee:
    kind: str  # a key of GUARANTEE_KINDS
    epsilon_rdp: float | None = None  # of the dataset's whole history (dp)
    epsilon_pld: float | None = None
    delta: float | None = None
    k: int | None = None  # k-anonymity
    method: str | None = None
    description: str = ""

    def as_dict(self) -> dict[str, Any]:
        if self.kind == "dp":
            return {
                "type": "dp",
                "epsilon_rdp": self.epsilon_rdp,
                "epsilon_pld": self.epsilon_pld,
                "delta": self.delta,
            }
        return {
            "type": self.kind,
            "k": self.k,
            "method": self.method,
            "description": self.description,
        }


@dataclass(frozen=True)
class MechanismPlan:
    """What a run will charge and produce; `detail` is the mechanism's own JSON (e.g. sigma, q,
    steps)."""

    events: tuple[MechanismEvent, ...]
    expected_count: int
    output_shape: tuple[int, ...]
    guarantee_kind: str
    warnings: tuple[str, ...] = ()
    requires_acknowledgement: bool = False
    parameters: Mapping[str, Any] = field(default_factory=dict)  # public config, JSON
    # the mechanism's own JSON; for a guarantee other than DP, "guarantee_description" holds the
    # line the card and dashboard show ("k-anonymous (k=5)")
    detail: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.guarantee_kind not in GUARANTEE_KINDS:
            raise InvalidParameterError(
                f"guarantee kind {self.guarantee_kind!r} is not one of {sorted(GUARANTEE_KINDS)}."
            )

    @property
    def step_event(self) -> DpSgd | None:
        """The event whose steps the write-ahead counter counts (DP-SGD), if any."""
        return next((e for e in self.events if isinstance(e, DpSgd)), None)


@dataclass(frozen=True)
class MechanismOutput:
    images: np.ndarray  # uint8 (N, H, W[, C]): releasable
    labels: np.ndarray  # int64 (N,)
    parameters: Mapping[str, Any]  # public parameters (manifest, card), JSON
    label_distributions: np.ndarray | None = None
    # computed from sensitive data, internal (audit, stewards, auditors): never in a bundle
    clusters: tuple[np.ndarray, ...] | None = None  # sensitive indices per representative
    selected_public_indices: np.ndarray | None = None  # public rows chosen by a DP query
    internal: Mapping[str, Any] = field(default_factory=dict)
    generator: str | None = None  # path of a released generative model (for the MIA)
    artifacts: Mapping[str, str] = field(default_factory=dict)
    # what the output kind releases beside the pictures, saved and read back by the kind
    # (release/kinds/): a volume release's VolumeDataset, a toy kind's lines; None for images
    payload: Any = None
    # more releasable images, one per row, each a bundle column (e.g. "face": aligned crops)
    extra_images: Mapping[str, np.ndarray] = field(default_factory=dict)
    # sensitive indices not released, and why (internal; the card states how many)
    withheld: Mapping[int, str] = field(default_factory=dict)

    @property
    def volumes(self) -> VolumeDataset | None:
        """The released volumes of a volume release (its payload), else None."""
        return self.payload if isinstance(self.payload, VolumeDataset) else None

    @classmethod
    def of_volumes(
        cls,
        volumes: VolumeDataset,
        parameters: Mapping[str, Any],
        internal: Mapping[str, Any] | None = None,
        pictures: Sequence[np.ndarray] | None = None,
    ) -> MechanismOutput:
        """The output of a mechanism that releases volumes: `volumes`, and as `images` one
        face-surface picture of each released volume (what the dashboard, the bundle's Parquet
        and its sample grid show; computed from released data only), labels 0. `pictures`: those
        pictures, `synth.tools.mri.render.picture` of each volume, when the caller took them as
        it went through the volumes (volumes held by reference are then not read once more)."""
        from synth.tools.mri.render import picture

        if pictures is None:
            pictures = [picture(v) for v in volumes.volumes]
        if len(pictures) != len(volumes):
            raise ValueError(f"{len(pictures)} pictures for {len(volumes)} volumes")
        return cls(
            images=np.stack(pictures),
            labels=np.zeros(len(volumes), np.int64),
            parameters=parameters,
            internal=dict(internal or {}),
            payload=volumes,
        )


ItemFn = Callable[[Any, Any], Any]  # `fn(config, item) -> result`: module-level, picklable


class MapItems(Protocol):
    """How per-item work is mapped (a run's `ctx.map_items`, the audit's `AuditInputs.map_items`):
    `fn(config, item)` for every item, results in item order, wherever the caller chose (this
    process, `--workers N`, `--cluster`). `fn` is module-level and picklable, reads no store and
    returns a picklable result (a mechanism's is its entry's `per_item`). Progress is reported
    under `label`; in a run each finished item is kept in the workdir, so a resumed run does not
    redo it (`keep=False`: results too sensitive to store, such as un-noised sums, are never
    written and a resumed run computes them again). `lazy=True` holds no result in memory: each
    is read back from its item file when the returned sequence is asked for it (results too big
    to hold all at once, such as released heads)."""

    def __call__(
        self,
        fn: ItemFn,
        config: Any,
        items: Sequence[Any],
        *,
        label: str,
        keep: bool = True,
        lazy: bool = False,
    ) -> Sequence[Any]: ...


class RunContext(Protocol):
    """What the runner gives a mechanism's `run`."""

    workdir: Path
    progress: ProgressFn
    # a volume mechanism's public data is the head templates (VolumeDataset); None for a
    # mechanism that declares none
    public: Data | None
    plan: MechanismPlan
    cache_dir: Path | None  # for results computed from public data only, shared across releases
    nproc: int  # processes a distributed mechanism may run on (1 = this process)

    def on_sensitive_access(self) -> None:
        """Call just before the first read of sensitive data: from then on a failure is not
        refunded."""

    def charge_lost_steps(self, started: int, resumed_from: int) -> None:
        """A resumed run will re-execute steps started before a crash but lost since the checkpoint
        `resumed_from`: the runner charges them (before they run; may raise BudgetExceededError)."""

    def prepare_workers(self, setup: Callable[..., Any], *args: Any) -> list[Any]:
        """`setup(*args)` once in every process that will run items (this one, or each worker the
        runner started), e.g. to load public models before the first read of sensitive data (a
        failure then is refunded); returns what each returned."""

    # the entry's `per_item` over the run's items, wherever the runner chose (MapItems)
    map_items: MapItems


@runtime_checkable
class TargetedConfig(Protocol):
    """A config that calibrates its noise to a target epsilon, the spec's `epsilon` (PrivImage,
    DP-MERF): the plan's noise is the smallest whose composed history stays within it."""

    epsilon: float


def target_epsilon(config: object) -> float | None:
    """The target epsilon `config` calibrates to; None for a mechanism without one (k-anonymity,
    de-identification)."""
    return float(config.epsilon) if isinstance(config, TargetedConfig) else None


@dataclass(frozen=True, kw_only=True)
class MechanismEntry:
    """The mechanism interface: what each mechanism folder declares as its MECHANISM (module-level
    functions and facts, keyword-only; the optional members have honest defaults).

    - make_config(params, dataset, n_images, preset) -> the config, a frozen
      synth.config.MechanismConfig (bad values raise InvalidParameterError; `build_config`);
    - plan(config, dataset, prior, public) -> MechanismPlan: events, count, shape, warnings and its
      decisions; reads no sensitive data;
    - run(config, data, ctx) -> MechanismOutput (ctx: RunContext);
    - loss_function(generator) -> the released generator's per-sample loss for the
      membership-inference audit (None: nothing generative is released);
    - per_item(config, item) -> result: the work its run maps over items with `ctx.map_items`
      (one photo, one head), module-level and picklable, reading no store; declaring it lets
      the runner run those items on Dask workers (`release run --workers N | --cluster ADDR`)."""

    name: str
    config_type: type[MechanismConfig]
    make_config: Callable[..., Any]
    plan: Callable[..., MechanismPlan]
    run: Callable[..., MechanismOutput]
    loss_function: Callable[[str | None], Callable[[np.ndarray, np.ndarray], np.ndarray] | None] = (
        lambda generator: None
    )
    distributed: bool = False  # its run honours ctx.nproc > 1 (`release run --nproc`)
    # the module torchrun runs on every host for `release run --nnodes` (synth/tools/nodes.py);
    # None: it trains on one host only
    node_worker: str | None = None
    # its DP-SGD trainer, `(model, x, y, **settings) -> outcome with .weights`, for the one-run
    # implementation audit (audit/dpsgd_audit.py); None for a mechanism that trains nothing with
    # DP-SGD
    dpsgd_trainer: Callable[..., Any] | None = None
    # `(public parameters, guarantee dict, image count) -> MechanismDescription` for the card
    describe: Callable[[Mapping[str, Any], Mapping[str, Any], int], MechanismDescription] | None = (
        None
    )
    # the public data source a spec gets when it names none; None: the mechanism reads no public
    # data (its run gets none, and the plan binds none)
    default_public: str | None = None
    data_kind: str = "images"  # what it takes: one of DATA_KINDS
    # what it releases: the name of an output kind (release.kinds: how the output is saved,
    # fingerprinted, bundled, carded and audited)
    output_kind: str = "images"
    # the per-item function its run maps with ctx.map_items; None: its run is one piece of work
    per_item: ItemFn | None = None


# mechanisms registered at run time (`register`): a plug-in's, a test's
_REGISTERED: dict[str, MechanismEntry] = {}


def names() -> tuple[str, ...]:
    return (*_ENTRIES, *_REGISTERED)


Mechanism = MechanismEntry  # the interface every mechanism declares


def register(entry: MechanismEntry) -> MechanismEntry:
    """Make `entry` a known mechanism under `entry.name` (a mechanism defined outside synth/:
    a plug-in, a test); refuses a name already known. Its output kind must be registered with
    release.kinds.register before a release of it is saved."""
    if not isinstance(entry, MechanismEntry):
        raise TypeError(f"{entry!r} is not a MechanismEntry")
    if entry.name in _ENTRIES or entry.name in _REGISTERED:
        raise InvalidParameterError(f"A mechanism named {entry.name!r} is already known.")
    if entry.data_kind not in DATA_KINDS:
        raise InvalidParameterError(
            f"Mechanism {entry.name!r} takes {entry.data_kind!r}; one of {DATA_KINDS}."
        )
    _REGISTERED[entry.name] = entry
    return entry


def unregister(name: str) -> None:
    """Forget a mechanism `register` made known (built-ins stay)."""
    _REGISTERED.pop(name, None)


def get(name: str) -> MechanismEntry:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _ENTRIES:
        raise InvalidParameterError(f"Unknown mechanism {name!r}; known: {', '.join(names())}.")
    module, attr = _ENTRIES[name].split(":")
    entry = getattr(importlib.import_module(module), attr)
    if not isinstance(entry, MechanismEntry):
        raise TypeError(f"{module}:{attr} is not a MechanismEntry")
    return entry


def describe(
    name: str, parameters: Mapping[str, Any], guarantee: Mapping[str, Any], n: int
) -> MechanismDescription:
    """Mechanism `name`'s account of a release of `n` images (a plain one where it gives none)."""
    # a mechanism not installed here (e.g. a bundle from another publisher) gets the plain account
    fn = get(name).describe if name in names() else None
    if fn is not None:
        return fn(parameters, guarantee, n)
    kind = str(guarantee.get("type", DP))
    return MechanismDescription(
        what=f"{n} images released by the {name} mechanism.",
        guarantee=(
            "the released images and labels"
            if kind == DP
            else f"{guarantee_label(kind)}: {guarantee.get('description') or name}."
        ),
        collection=f"Images released by the {name} mechanism from a sensitive image dataset.",
        collection_type="Synthetic data" if kind == DP else "Derived data",
        tags=("synthetic", "differential-privacy") if kind == DP else ("anonymized",),
    )


def kind_of(name: str) -> str:
    """The data kind mechanism `name` takes, without importing it (a built-in's)."""
    if name in _REGISTERED:
        return _REGISTERED[name].data_kind
    return "volumes" if name in _VOLUME_MECHANISMS else "images"


def admit(data_kind: str, data: Data, cache_dir: Path | None) -> None:
    """Refuse, when a dataset is registered, data that the mechanisms taking its kind could not run
    on (what would otherwise fail only after a release had read the data and been charged);
    `cache_dir` is the workspace's cache of public computations (the atlases)."""
    target = _ADMISSIONS.get(data_kind)
    if target is not None:
        module, attr = target.split(":")
        getattr(importlib.import_module(module), attr)(data, cache_dir)


def check_data_kind(name: str, dataset: DatasetInfo) -> None:
    """Refuse mechanism `name` on a dataset of another kind (images vs volumes), naming those that
    fit."""
    wanted = get(name).data_kind
    if dataset.data_kind != wanted:
        fits = [n for n in names() if kind_of(n) == dataset.data_kind]
        raise InvalidParameterError(
            f"Mechanism {name!r} works on {wanted}, but dataset {dataset.name!r} holds "
            f"{dataset.data_kind}; use {' or '.join(repr(f) for f in fits) or 'another dataset'}."
        )


def dpsgd_trainer(name: str) -> Callable[..., Any]:
    """The DP-SGD trainer of mechanism `name`, the code the implementation audit runs on
    canaries."""
    trainer = get(name).dpsgd_trainer
    if trainer is None:
        with_dpsgd = [n for n in names() if get(n).dpsgd_trainer is not None]
        raise InvalidParameterError(
            f"Mechanism {name!r} trains nothing with DP-SGD, so there is no implementation to "
            f"audit; the audit applies to {', '.join(with_dpsgd)}."
        )
    return trainer


def presets(name: str) -> tuple[str, ...]:
    """The presets mechanism `name`'s spec table may name ("default" first): data its config
    declares (`PRESETS`), listed without building a config."""
    return get(name).config_type.presets()


def check_preset(name: str, preset: object) -> None:
    """Refuse a preset mechanism `name` does not have, naming its table and the presets it has."""
    try:
        get(name).config_type.check_preset(preset)
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"[{name}] {exc}") from exc


def build_config(
    cls: type[MechanismConfig],
    table: str,
    preset: str,
    base: dict[str, Any],
    overrides: dict[str, Any],
) -> Any:
    """A config from a preset (`default` = the fields' defaults), then `base` (what the mechanism
    reads from the spec's other tables), then the spec table's own values; an unknown parameter or
    preset is refused naming the valid ones, and every message names the table."""
    known = set(cls.field_names())
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise InvalidParameterError(
            f"Unknown [{table}] parameter(s) {unknown}; known: {sorted(known)}."
        )
    try:
        return cls.preset(preset, **{**base, **overrides})
    except InvalidParameterError as exc:
        if str(exc).startswith("["):
            raise  # already names its table
        raise InvalidParameterError(f"[{table}] {exc}") from exc
    except (TypeError, OverflowError, ValueError) as exc:
        raise InvalidParameterError(f"[{table}] {exc}") from exc
