"""Registering datasets from their source, and loading a registered dataset back safely."""
from __future__ import annotations

from accounting import ledger
from accounting.errors import DatasetConflictError
from accounting.fingerprint import dataset_fingerprint
from accounting.store import Store
from synth.datasets import ImageDataset, load_source


def register_from_source(
    store: Store, name: str, source: str, epsilon_cap: float, delta_cap: float, *,
    privacy_unit: str = "one image", actor: str = "steward",
) -> tuple[ledger.Dataset, bool]:
    """Load the data once to fingerprint it (HMAC, rule 4) and register it; the data stays where it is."""
    data = load_source(source)
    fp = dataset_fingerprint(store.workspace.hmac_key(), data.images, data.labels)
    return ledger.register_dataset(
        store, name=name, source=source, fingerprint=fp, record_count=len(data), labels=data.label_set,
        image_shape=list(data.image_shape), epsilon_cap=epsilon_cap, delta_cap=delta_cap,
        privacy_unit=privacy_unit, actor=actor,
    )


def load_registered(store: Store, name: str) -> tuple[ledger.Dataset, ImageDataset]:
    """Load a registered dataset and check it is the content that was registered (the ledger is
    about that content; silently changed data would make its accounting meaningless)."""
    ds = ledger.get_dataset(store, name)
    data = load_source(ds.source)
    if dataset_fingerprint(store.workspace.hmac_key(), data.images, data.labels) != ds.fingerprint:
        raise DatasetConflictError(
            f"The data at {ds.source} has changed since dataset {ds.name!r} was registered. Restore the original "
            "data, or register the new content under a new name (its budget starts fresh)."
        )
    return ds, data
