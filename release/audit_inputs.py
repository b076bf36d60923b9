"""What the audit of a synthesised release reads, assembled from the store, the release's saved
output and its signed spec (audit.AuditInputs), and the audit run on it: the report is stored
internal; release.manager records the state change (`audit_release`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from accounting import ledger
from accounting.store import Store
from release import runner
from release.artifacts import load_output, release_dir, release_ids, saved_kind
from release.data import load_registered
from release.executor import IN_PROCESS, ExecutorChoice, mapping_on
from release.records import Release, list_releases
from release.spec import ReleaseSpec
from synth import registry
from synth.kinds.datasets import ImageDataset, heldout_source, load_source
from synth.progress import ProgressFn, no_progress
from synth.registry import Data, MechanismOutput

if TYPE_CHECKING:
    from audit import AuditInputs, AuditReport
    from audit.baseline import Baseline


def run_checks(
    store: Store,
    rel: Release,
    progress: ProgressFn = no_progress,
    *,
    data: Data | None = None,
    public: Data | None = None,
    executor: ExecutorChoice = IN_PROCESS,
) -> AuditReport:
    """Run every check of the release's policy on its saved output and store the (internal)
    report. `data` and `public`: the run's, when it has just read them (else read again).
    `executor`: where the audit's per-item work runs (`--workers N`, `--cluster ADDR`: Dask
    workers started for the audit, at its first per-item stage; else this process)."""
    from audit import AuditPolicy, run_audit, save_report

    out = load_output(store, rel.release_id)
    spec = ReleaseSpec.from_dict(rel.spec)
    ds, sensitive = (
        (ledger.get_dataset(store, spec.dataset), data)
        if data is not None
        else load_registered(store, spec.dataset)
    )
    inputs = audit_inputs(store, rel, out, spec, ds, sensitive, public)
    work = release_dir(store, rel.release_id) / "work"  # the run's run.log
    with mapping_on(executor, progress, work) as inputs.map_items:
        report = run_audit(inputs, AuditPolicy.from_dict(spec.policy), progress)
    save_report(store, report)
    return report


def audit_inputs(
    store: Store,
    rel: Release,
    out: MechanismOutput,
    spec: ReleaseSpec,
    ds: ledger.Dataset,
    sensitive: Data,
    public: Data | None,
) -> AuditInputs:
    """The audit's inputs for a release's output `out`, from the sensitive data it was made of."""
    from audit import AuditInputs
    from audit.dpsgd_audit import DpSgdSetting

    release_id = rel.release_id
    # load_output refused a release not run
    mechanism = rel.result.mechanism if rel.result else rel.mechanism
    g = rel.guarantee
    selected = None
    if out.selected_public_indices is not None:
        source = spec.public_source
        pool = registry.images_only(
            public or (load_source(source) if source else None), "The SDS check"
        )
        selected = pool.subset(out.selected_public_indices)
    kind = saved_kind(store, release_id, mechanism)
    ids = release_ids(release_id, len(out.images))
    return AuditInputs(
        release_id=release_id,
        images=out.images,
        labels=out.labels,
        ids=ids,
        # a mechanism may withhold records it cannot process (e.g. one it finds nothing to
        # change in), and says so
        expected_count=int(rel.plan.expected_count) - len(out.withheld),
        label_set=list(ds.labels),
        sensitive=sensitive,
        heldout=spec_heldout(spec, ds),
        record_fingerprint_key=store.workspace.hmac_key(),
        mechanism=mechanism,
        guarantee_kind=str(g.get("type") or rel.plan.guarantee_kind),
        claimed_epsilon=g.get("epsilon_rdp"),
        delta=g.get("delta"),
        k=g.get("k"),
        loss_fn=registry.get(mechanism).loss_function(out.generator),
        clusters=None if out.clusters is None else list(out.clusters),
        selected_public=selected,
        artifacts_dir=release_dir(store, release_id) / "audit",
        # the DP-SGD a mechanism trains with its registered trainer (DP-SGD it trains otherwise
        # has no canary audit): the typed event the plan charges
        dpsgd=DpSgdSetting.from_plan(
            rel.plan.mechanism_view().step_event
            if registry.get(spec.mechanism).dpsgd_trainer is not None
            else None,
            rel.plan.config or {},
            spec.mechanism,
        ),
        output_kind=kind.name,
        released=out.payload,
        released_files=kind.audit_files(release_dir(store, release_id), ids),
        cache_dir=runner.public_cache_dir(store),
        baselines=baselines(store, rel, spec, ds),
        searched_recognisers=out.parameters.get("searched_recognisers"),
        part_clusters=out.internal.get("part_clusters"),
        part_cluster_k=out.internal.get("part_cluster_k"),
        shape_replaced_share=out.internal.get("shape_replaced_share"),
    )


def baselines(store: Store, rel: Release, spec: ReleaseSpec, ds: ledger.Dataset) -> list[Baseline]:
    """Earlier DP releases of the same dataset by another mechanism (a simpler generator's is
    the usual one), checked or published, whose audit measured downstream accuracy on the same
    held-out source: what a DP release is compared with (audit.baseline)."""
    from audit import load_report
    from audit.baseline import Baseline

    if rel.plan.guarantee_kind != registry.DP:
        return []
    heldout = spec.heldout or heldout_source(ds.source)
    out = []
    for other in list_releases(store):
        if (
            other.release_id == rel.release_id
            or other.state not in ("checked", "published")
            or other.plan.dataset != spec.dataset
            or other.mechanism == rel.mechanism
            or other.plan.guarantee_kind != registry.DP
        ):
            continue
        other_spec = ReleaseSpec.from_dict(other.spec)
        if (other_spec.heldout or heldout_source(ds.source)) != heldout:
            continue
        report = load_report(store, other.release_id)
        utility = next(
            (r for r in (report.results if report else []) if r.name == "downstream_accuracy"),
            None,
        )
        best = utility.details.get("best") if utility is not None else None
        if isinstance(best, (int, float)):
            out.append(Baseline(other.release_id, other.mechanism, float(best)))
    return out


def spec_heldout(spec: ReleaseSpec, ds: ledger.Dataset) -> ImageDataset | None:
    source = spec.heldout or heldout_source(ds.source)
    return load_source(source) if source else None
