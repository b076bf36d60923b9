"""`release run --nnodes` on a host other than the coordinator: it follows the coordinator's run
of an approved release, training its ranks only, and never writes the store (the release's state
transitions stay in release.manager, on the coordinator)."""

from __future__ import annotations

from accounting.errors import LedgerStateError, PrivReleaseError
from accounting.store import Store
from release import approval
from release.records import recorded_release
from synth import registry
from synth.progress import ProgressFn, no_progress
from synth.tools import nodes as multi_host


def refuse_unless_coordinator(release_id: str, nodes: multi_host.Nodes | None) -> None:
    """Only node rank 0 runs a release (`run_release`); the other hosts follow it."""
    if nodes is not None and not nodes.coordinator:
        raise LedgerStateError(
            f"This host is not the coordinator of {release_id} (node rank {nodes.node_rank}): it "
            "follows (follow_release); only node rank 0 runs the release."
        )


def follow_release(
    store: Store,
    release_id: str,
    nodes: multi_host.Nodes,
    progress: ProgressFn = no_progress,
) -> None:
    """A host other than the coordinator in `release run REL --nnodes N --rdzv HOST:PORT`: it
    reads the release's approved plan from its workspace (reads never write the store), joins the
    rendezvous and trains the coordinator's stages. It never takes the lease, reserves, charges or
    writes the release's files; a release it cannot run here (not approved, its approval not
    valid, already synthesised, another plan) is refused on every host, before anything is
    charged."""
    # a host that cannot run the release joins only to say why: nodes' own worker refuses
    problem, fingerprint, worker = None, None, multi_host.REFUSING_WORKER
    rel = None
    try:
        rel = recorded_release(store, release_id)
        if rel.state not in ("approved", "failed", "running"):
            raise LedgerStateError(
                f"release {release_id} is {rel.state} here; only an approved (or failed) release "
                "runs."
            )
        approval.verified_approval(store, rel)
        mech = registry.get(rel.plan.mechanism)
        if mech.node_worker is None:
            across = [n for n in registry.names() if registry.get(n).node_worker is not None]
            raise PrivReleaseError(
                f"mechanism {mech.name!r} trains on one host only (those that train across "
                f"hosts: {', '.join(across) or 'none'})."
            )
        worker, fingerprint = mech.node_worker, rel.plan_digest
    except PrivReleaseError as exc:
        problem = str(exc)
    if rel is not None and rel.result is not None:  # the coordinator only audits: nobody trains
        raise LedgerStateError(
            f"Release {release_id} is already synthesised; only its audit is left, which the "
            "coordinator runs alone. Nothing to do on this host."
        )
    multi_host.follow(
        nodes,
        worker=worker,
        run_id=release_id,
        fingerprint=fingerprint,
        problem=problem,
        progress=progress,
    )
    if problem:  # the coordinator refused too: follow() raised
        raise PrivReleaseError(problem)
