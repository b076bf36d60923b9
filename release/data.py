"""Registering datasets from their source, and loading a registered dataset back safely, whatever
input kind the source holds (`synth.kinds.inputs`: how each kind is recognised, loaded, given its
label set and fingerprinted; this module names none).

The label set of a labelled kind is declared at registration (public metadata), never read off the
data (`synth.kinds.label_declaration`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from accounting import ledger
from accounting.errors import DatasetConflictError
from accounting.store import Store
from synth import registry
from synth.kinds import inputs
from synth.kinds.label_declaration import LabelDeclaration

DEFAULT_UNIT = "one image"  # the CLI's default privacy unit; a kind words its own in its place


def register_from_source(
    store: Store,
    name: str,
    source: str,
    epsilon_cap: float,
    delta_cap: float,
    *,
    labels: LabelDeclaration = None,
    privacy_unit: str = DEFAULT_UNIT,
    actor: str = "steward",
) -> tuple[ledger.Dataset, bool]:
    """Load the data once to check and fingerprint it (HMAC, rule 4) and register it with its
    declared label set; the data stays where it is. Any problem raises before the store is
    touched: the kind's reading checks and label set, then what the mechanisms that take the kind
    need of every record (`registry.admit`), which would otherwise fail (or be released wrong)
    only after a release had read the data and been charged."""
    kind = inputs.for_source(source)
    data = kind.with_key(kind.load(source), store.workspace.hmac_key())
    label_set = kind.declare(source, data, labels)
    content = fingerprint(store, data)
    if not _known(store, name, content):
        registry.admit(kind.name, data, _public_cache(store))
    if privacy_unit == DEFAULT_UNIT:
        privacy_unit = kind.unit(data)
    return ledger.register_dataset(
        store,
        name=name,
        source=source,
        fingerprint=content,
        record_count=len(data),
        labels=label_set,
        image_shape=list(data.image_shape),
        epsilon_cap=epsilon_cap,
        delta_cap=delta_cap,
        privacy_unit=privacy_unit,
        actor=actor,
    )


def _known(store: Store, name: str, content: str) -> bool:
    """Whether `name` or this content is registered already: then registering is a no-op or refused
    (ledger.register_dataset), and the admission checks (minutes for an archive of head scans) were
    run when it was registered, or would be wasted."""
    return any(d.name == name or d.fingerprint == content for d in ledger.list_datasets(store))


def _public_cache(store: Store) -> Path:
    """The workspace's cache of public computations (release.runner.public_cache_dir's rule)."""
    env = os.environ.get("PRIVRELEASE_CACHE")
    return Path(env) if env else store.workspace.root / "cache"


def fingerprint(store: Store, data: Any) -> str:
    """The dataset's HMAC-SHA256 under the workspace key, as its kind computes it."""
    return inputs.of_data(data).fingerprint(store.workspace.hmac_key(), data)


def dataset_info(ds: ledger.Dataset) -> registry.DatasetInfo:
    """What a mechanism may know of a registered dataset at plan time (public metadata)."""
    return registry.DatasetInfo(
        ds.dataset_id,
        ds.name,
        ds.record_count,
        tuple(ds.labels),
        tuple(ds.image_shape),
        ds.delta_cap,
        data_kind(ds),
    )


def data_kind(ds: ledger.Dataset) -> str:
    """The input kind a dataset was registered as (synth.registry.DATA_KINDS), from whether it was
    registered with a label set."""
    return inputs.registered_as(bool(ds.labels)).name


def load_registered(store: Store, name: str) -> tuple[ledger.Dataset, Any]:
    """Load a registered dataset and check it is the content that was registered (the ledger is
    about that content; silently changed data would make its accounting meaningless). The returned
    data carries the registered label set, which is what mechanisms generate and release."""
    ds = ledger.get_dataset(store, name)
    kind = inputs.registered_as(bool(ds.labels))
    if not kind.recognises(ds.source):
        raise DatasetConflictError(
            f"{ds.source}: dataset {ds.name!r} was registered as {kind.what}, which is no longer "
            "there (the source is gone or now holds another kind of data). Restore the original "
            "data."
        )
    data = kind.with_key(kind.load(ds.source), store.workspace.hmac_key())
    if fingerprint(store, data) != ds.fingerprint:
        raise DatasetConflictError(
            f"The data at {ds.source} have changed since dataset {ds.name!r} was registered. "
            "Restore the original data, or register the new content under a new name (its "
            "budget starts fresh)."
        )
    return ds, kind.as_registered(data, list(ds.labels))
