"""`make demo`: a complete release on the built-in default data, no questions asked.

init -> identities -> register MNIST-5k with a budget -> what-if -> plan -> approve (steward) ->
run (reserve, PrivImage, commit) -> audit -> publish -> verify offline -> budget and trail.
Uses the `demo` preset (few training steps, public pre-training from the shipped checkpoint: about
5-10 minutes on 2 CPU cores, README); it says so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any

import tomli_w
from rich.rule import Rule

from accounting import ledger, trail
from accounting.store import Store, Workspace
from release import keys, manager
from release.auth import set_password
from release.data import register_from_source
from release.spec import ReleaseSpec
from release.terminal import console, fmt_eps, print_plan, rich_progress, say_our_warnings
from release.verify import verify_bundle
from synth.mechanisms.privimage.config import PrivImageConfig

# demo workspace only; real identities set theirs with `privrelease keys password`
DEMO_PASSWORD = "demo-password"
DEMO_SPEC: dict[str, dict[str, Any]] = {
    "release": {
        "dataset": "mnist",
        "mechanism": "privimage",
        "n_images": 4000,
        "description": "Synthetic MNIST-style digits for prototyping (privrelease demo).",
    },
    # the demo preset, sized to finish in well under 15 minutes on 2 idle CPU cores (measured:
    # BENCHMARKS.md)
    "privimage": {"public": "builtin:public-pool", "epsilon": 8.0, "k": 1, "preset": "demo"},
    "policy": {
        "mia_max_auc": 0.6,
        "max_near_copy_fraction": 0.01,
        "mia_samples": 300,
        "feature_samples": 500,
        "fid_samples": 500,
        "utility_train_samples": 4000,
        "cnn_epochs": 8,
    },
}


def step(title: str) -> None:
    console.print(Rule(f"[bold]{title}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workspace", type=Path, default=Path("demo-workspace"))
    args = parser.parse_args()
    say_our_warnings(console)
    t0 = time.time()
    root = args.workspace
    # Public pre-training costs no budget and is cached across releases; keep the demo's cache
    # outside its workspace (which is wiped every run) so a second `make demo` skips it.
    os.environ.setdefault("PRIVRELEASE_CACHE", str(Path(".privrelease-cache").resolve()))
    if root.exists():
        shutil.rmtree(root)  # the demo's own workspace: start from scratch every time
    store, release_pub = _identities(root)
    _register(store)
    rid = _plan_and_approve(store, root)
    _run_and_audit(store, rid)
    bundle = _publish_and_verify(store, rid, release_pub)
    _summary(store, root, bundle, release_pub, t0)


def _identities(root: Path) -> tuple[Store, Path]:
    step("1. Workspace and identities")
    ws = Workspace(root)
    ws.init()
    store = Store(ws)
    for name, role in (("alice", "steward"), ("bob", "auditor"), ("carol", "consumer")):
        ident = keys.create_identity(store, name, role, actor="demo")
        set_password(store, name, DEMO_PASSWORD, actor="demo")
        console.print(
            f"  {role:<9} {name}  key {ident.key_id[:16]}…  dashboard password: {DEMO_PASSWORD}"
        )
    release_pub = keys.ensure_release_key(ws)
    console.print(f"  release-signing public key: {release_pub}")
    return store, release_pub


def _register(store: Store) -> None:
    step("2. Register the sensitive dataset (MNIST-5k: 4,000 images; 1,000 held out for audits)")
    ds, _ = register_from_source(
        store, "mnist", "builtin:mnist5k", epsilon_cap=10.0, delta_cap=1e-5, actor="alice"
    )
    console.print(
        f"  {ds.name} ({ds.dataset_id}): {ds.record_count} records, cap "
        f"epsilon={ds.epsilon_cap:g}, delta={ds.delta_cap:g}; fingerprint (HMAC) "
        f"{ds.fingerprint[:16]}…"
    )


def _plan_and_approve(store: Store, root: Path) -> str:
    step("3. Plan the release (PrivImage, target epsilon 8 for the whole history)")
    spec_path = root / "privimage-demo.toml"
    spec_path.write_text(tomli_w.dumps(DEMO_SPEC))
    console.print(f"  spec: {spec_path}")
    rel = manager.create_plan(store, ReleaseSpec.from_toml(spec_path), "alice")
    print_plan(rel)
    step("4. Steward approval (Ed25519 signature over the plan digest)")
    manager.approve(store, rel.release_id, "alice", digest=rel.plan_digest)
    console.print(f"  approved by alice: plan {rel.plan_digest[:16]}…")
    return rel.release_id


def _run_and_audit(store: Store, rid: str) -> None:
    from audit import load_report, render_report

    step(
        "5. Run: reserve budget -> semantic query -> pretrain "
        "-> DP-SGD fine-tune -> sample -> vote -> audit"
    )
    demo = PrivImageConfig.demo(
        DEMO_SPEC["privimage"]["epsilon"], 1e-5, n_samples=DEMO_SPEC["release"]["n_images"]
    )
    console.print(
        "  [yellow]Demo settings (preset 'demo', sized for 2 CPU cores): public pre-training "
        f"from the checkpoint shipped with privrelease ({demo.pretrain_steps:,} steps on public "
        "digits only, sha256-checked: no privacy cost; if it does not fit or fails its check, "
        f"trained here and cached in {os.environ['PRIVRELEASE_CACHE']}), "
        f"{demo.finetune_epochs:g} DP-SGD epochs, {demo.base_images:,} images kept by the "
        f"private vote ({demo.vote_rounds} rounds of "
        f"{demo.candidates_per_image * demo.base_images:,} candidates, each round on variations of "
        "the last one's winners; each sensitive image splits its vote over its "
        f"{demo.vote_neighbours} nearest candidates), each released with "
        f"{demo.release_variations} light variations "
        f"({demo.n_samples:,} images). The images are recognisable digits but grainy; use preset "
        "'default' (or a GPU) for real releases.[/]"
    )
    with rich_progress() as progress:
        manager.run_release(store, rid, "alice", progress)
    report = load_report(store, rid)
    if report is None:  # run_release audits before it returns
        raise SystemExit(f"Release {rid} has no audit report.")
    console.print(render_report(report))
    if not report.passed:
        console.print("[red]The audit failed: the release is not published (as designed).[/]")
        raise SystemExit(1)


def _publish_and_verify(store: Store, rid: str, release_pub: Path) -> dict:
    step("6. Publish the signed bundle")
    bundle = manager.publish(store, rid, "alice").bundle
    assert bundle is not None  # a published release has its bundle
    console.print(
        f"  bundle:  {bundle['path']}\n  archive: {bundle['tarball']}\n  sha256:  "
        f"{bundle['tarball_sha256']}"
    )
    step("7. Verify offline, as a consumer would (bundle + release.pub only)")
    result = verify_bundle(Path(bundle["tarball"]), release_pub)
    console.print(
        f"  {'[green]OK[/]' if result.ok else '[red]FAILED[/]'}: {len(result.checked)} files "
        f"match, signature key {result.key_id[:16]}…"
    )
    if not result.ok:
        raise SystemExit(1)
    return bundle


def _summary(store: Store, root: Path, bundle: dict, release_pub: Path, t0: float) -> None:
    step("8. Budget and audit trail")
    b = ledger.budget(store, "mnist")
    console.print(
        f"  mnist: spent RDP {fmt_eps(b.spent.epsilon_rdp)}, PLD {fmt_eps(b.spent.epsilon_pld)} of "
        f"cap {b.dataset.epsilon_cap:g}; remaining {b.remaining_rdp:.3f}"
    )
    for c in b.charges:
        console.print(
            f"    {c.run_id}: {c.state}: {'; '.join(e.describe() for e in c.counted_events)}"
        )
    v = trail.verify(store)
    console.print(
        f"  audit trail: {'intact' if v.ok else 'BROKEN'}, {v.length} entries, head {v.head_hash}"
    )
    console.print(Rule())
    console.print(
        f"[bold green]Done in {time.time() - t0:.0f} s.[/] Bundle: {bundle['tarball']}\nSample "
        f"grid: {Path(bundle['path']) / 'sample_grid.png'}\nTry: .venv/bin/privrelease --workspace "
        f"{root} budget show mnist\n     .venv/bin/privrelease verify {bundle['tarball']} --key "
        f"{release_pub}\n     .venv/bin/privrelease --workspace {root} dashboard"
    )


if __name__ == "__main__":
    main()
