"""A release's files in the workspace (`artifacts/REL/`): the output saved once after the run
(release.npz: images, labels, label distributions, extra image columns; internal.json: what was
derived from sensitive data, for the audit, stewards and auditors only; the files its output kind
adds, release.kinds; output.json: the kind and the SHA-256 of what is released), read back typed
and checked against that hash; the row ids a release gives its records; the content hash of public
data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from accounting import ledger
from accounting.errors import LedgerStateError, TamperError
from accounting.events import event_to_json
from accounting.store import Store
from release import kinds, runner
from release.kinds import RELEASE_ARRAYS, OutputKind
from release.records import Release, RunRecord, get_release
from synth.progress import ProgressFn
from synth.registry import Data, Mechanism, MechanismOutput

if TYPE_CHECKING:
    from release.executor import ExecutorChoice
    from release.spec import Plan
    from synth.tools.nodes import Nodes

EXTRA_IMAGE = "extra_image__"  # release.npz key prefix of MechanismOutput.extra_images
OUTPUT_RECORD = "output.json"  # the output kind and the fingerprint of what is released


def release_dir(store: Store, release_id: str) -> Path:
    return store.workspace.artifacts / release_id


def release_ids(release_id: str, n: int) -> list[str]:
    return [f"{release_id}-{i:06d}" for i in range(n)]


def public_sha256(public: Data | None) -> str | None:
    """Content hash of PUBLIC data (a plain hash is fine here: nothing sensitive); None when the
    mechanism reads none."""
    return None if public is None else public.content_sha256()


def save_output(
    store: Store, release_id: str, result: runner.RunResult, mechanism: str
) -> RunRecord:
    """One copy of the output: release.npz (images, labels) + internal.json (sensitive-derived,
    internal) + its kind's files, then output.json (the kind, the fingerprint of what is
    released)."""
    from audit.report import jsonable

    out, o = release_dir(store, release_id), result.output
    out.mkdir(parents=True, exist_ok=True)
    kind = kinds.of_mechanism(mechanism)
    ids = release_ids(release_id, len(o.images))
    kind.save(out, ids, o)
    arrays: dict[str, Any] = {"images": o.images, "labels": o.labels}
    if o.label_distributions is not None:
        arrays["label_distributions"] = o.label_distributions
    for name, extra in o.extra_images.items():
        arrays[EXTRA_IMAGE + name] = extra
    np.savez_compressed(out / RELEASE_ARRAYS, **arrays)
    internal = {
        **o.internal,
        "clusters": None if o.clusters is None else [c.tolist() for c in o.clusters],
        "selected_public_indices": None
        if o.selected_public_indices is None
        else o.selected_public_indices.tolist(),
        "withheld": {str(i): why for i, why in o.withheld.items()},
    }
    (out / "internal.json").write_text(json.dumps(jsonable(internal)))
    record = {"output_kind": kind.name, "sha256": kind.fingerprint(out, ids)}
    (out / OUTPUT_RECORD).write_text(json.dumps(record))
    summary = {
        "mechanism": mechanism,
        "guarantee": result.guarantee.as_dict(),
        "parameters": dict(o.parameters),
        "executed_events": [event_to_json(e) for e in result.executed_events],
        "generator": o.generator,
        "artifacts": dict(o.artifacts),
        "count": int(len(o.images)),
        "charge_id": result.charge_id,
    }
    return RunRecord.from_json(jsonable(summary))


def run_and_save(
    store: Store,
    rel: Release,
    inputs: tuple[Plan, ledger.Dataset, Data, Data | None, Mechanism, Any],
    lease: runner.Lease,
    *,
    actor: str,
    acknowledge_non_dp: bool,
    progress: ProgressFn,
    nproc: int,
    executor: ExecutorChoice,
    nodes: Nodes | None,
) -> RunRecord:
    """Run the approved plan through the runner (it alone charges), then save its output once."""
    release_id, (plan, ds, data, public, mech, config) = rel.release_id, inputs
    result = runner.run_charged(
        store,
        run_id=release_id,
        dataset=ds.name,
        data=data,
        public=public,
        mechanism=mech,
        config=config,
        plan=plan.mechanism_view(),
        workdir=release_dir(store, release_id) / "work",
        progress=progress,
        actor=actor,
        acknowledge_non_dp=acknowledge_non_dp,
        lease=lease,
        nproc=nproc,
        executor=executor,
        nodes=nodes,
        fingerprint=rel.plan_digest,
    )
    return save_output(store, release_id, result, plan.mechanism)


def load_release_data(
    store: Store, release_id: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    with np.load(release_dir(store, release_id) / RELEASE_ARRAYS) as z:
        return (
            z["images"],
            z["labels"],
            (z["label_distributions"] if "label_distributions" in z else None),
        )


def load_extra_images(store: Store, release_id: str) -> dict[str, np.ndarray]:
    """The release's extra image columns (MechanismOutput.extra_images), by name."""
    with np.load(release_dir(store, release_id) / RELEASE_ARRAYS) as z:
        return {k[len(EXTRA_IMAGE) :]: z[k] for k in z.files if k.startswith(EXTRA_IMAGE)}


def saved_kind(store: Store, release_id: str, mechanism: str) -> OutputKind:
    """The output kind of a release's saved output, refused if what it releases changed since the
    run saved it (its fingerprint, output.json). Outputs saved before output.json existed: the
    mechanism's kind, unchecked."""
    folder = release_dir(store, release_id)
    path = folder / OUTPUT_RECORD
    if not path.exists():
        return kinds.of_mechanism(mechanism)
    record = json.loads(path.read_text())
    kind = kinds.get(str(record["output_kind"]))
    with np.load(folder / RELEASE_ARRAYS) as z:
        n = len(z["images"])
    if kind.fingerprint(folder, release_ids(release_id, n)) != record["sha256"]:
        raise TamperError(
            f"The saved output of release {release_id} ({folder}) changed since its run saved it "
            f"(its {kind.name} no longer hash to {OUTPUT_RECORD}'s sha256); restore it."
        )
    return kind


def load_output(store: Store, release_id: str) -> MechanismOutput:
    """A synthesised release's output, typed (internal fields included: stewards and auditors
    only)."""
    rel = get_release(store, release_id)
    if rel.result is None:
        raise LedgerStateError(f"Release {release_id} has not been synthesised yet; run it first.")
    images, labels, dist = load_release_data(store, release_id)
    path = release_dir(store, release_id) / "internal.json"
    internal = json.loads(path.read_text()) if path.exists() else {}
    clusters, selected = (
        internal.pop("clusters", None),
        internal.pop("selected_public_indices", None),
    )
    withheld = {int(i): str(why) for i, why in (internal.pop("withheld", None) or {}).items()}
    res = rel.result
    kind = saved_kind(store, release_id, res.mechanism)
    return MechanismOutput(
        payload=kind.load(release_dir(store, release_id), release_ids(release_id, len(images))),
        images=images,
        labels=labels,
        parameters=res.parameters,
        label_distributions=dist,
        clusters=None
        if clusters is None
        else tuple(np.asarray(c, dtype=np.int64) for c in clusters),
        selected_public_indices=None if selected is None else np.asarray(selected, dtype=np.int64),
        internal=internal,
        generator=res.generator,
        artifacts=res.artifacts,
        extra_images=load_extra_images(store, release_id),
        withheld=withheld,
    )
