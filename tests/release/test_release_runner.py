"""The runner's lease (one run of a release at a time, every executed DP-SGD step charged), the
approval binding what runs (spec file, policy, public data, steward key) and plan-time validation."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading

import numpy as np
import pytest
import tomli_w
import torch

from accounting import ledger, trail
from accounting.errors import InvalidParameterError, TamperError
from accounting.events import DpSgd
from release import approval, keys, manager, planning, runner
from release.data import register_from_source
from release.spec import ReleaseSpec
from synth import registry
from synth.kinds.datasets import load_source, uci_digits
from synth.mechanisms.privimage import PrivImageConfig

DELTA = 1e-4


@pytest.fixture
def small(store, tmp_path):
    """120 MNIST images registered as `mnist`; UCI digits as the public set."""
    torch.set_num_threads(1)
    sens = load_source("builtin:mnist5k")
    idx = np.concatenate([np.flatnonzero(sens.labels == c)[:12] for c in range(10)])
    path = tmp_path / "sens.npz"
    np.savez(path, images=sens.images[idx], labels=sens.labels[idx])
    register_from_source(store, "mnist", str(path), 10.0, DELTA, labels="0-9")
    keys.create_identity(store, "alice", "steward")
    return store, sens.subset(idx), uci_digits()


def _plan(store, pub, cfg):
    b = ledger.budget(store, "mnist")
    return registry.get("privimage").plan(cfg, planning.dataset_info(b.dataset), b.history, pub)


def test_two_concurrent_runs_of_one_release_charge_every_executed_step(small, tmp_path):
    store, sens, pub = small
    cfg = PrivImageConfig.tiny(4.0, DELTA)
    plan = _plan(store, pub, cfg)
    inside, second_done = threading.Event(), threading.Event()
    executed = {"a": 0, "b": 0}
    errors: dict[str, BaseException] = {}

    def progress_for(who):
        def progress(stage, done, total):
            if stage == "DP fine-tuning":
                executed[who] += 1
            if who == "a" and stage == "query classifier":
                inside.set()  # A holds the lease and is running ...
                second_done.wait(120)  # ... while B tries to run the same release

        return progress

    def go(who):
        try:
            runner.run_charged(
                store.__class__(store.workspace),
                run_id="rel-x",
                dataset="mnist",
                data=sens,
                public=pub,
                mechanism="privimage",
                config=cfg,
                plan=plan,
                workdir=tmp_path / "w",
                progress=progress_for(who),
            )
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertions
            errors[who] = exc
        finally:
            if who == "b":
                second_done.set()

    a = threading.Thread(target=go, args=("a",))
    a.start()
    assert inside.wait(300)
    b = threading.Thread(target=go, args=("b",))
    b.start()
    b.join(300)
    a.join(600)
    assert "a" not in errors, errors.get("a")
    assert isinstance(errors["b"], runner.RunInProgressError) and "already running" in str(
        errors["b"]
    )
    charged = sum(
        e.steps
        for c in ledger.budget(store, "mnist").charges
        for e in c.counted_events
        if isinstance(e, DpSgd)
    )
    assert executed["b"] == 0 and executed["a"] == plan.step_event.steps == charged


def test_lease_of_a_dead_holder_is_taken_over_and_recorded(store):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lease = runner.acquire_lease(store, "rel-y", "alice")
    with pytest.raises(runner.RunInProgressError, match="already running"):
        runner.acquire_lease(store, "rel-y", "bob")  # a live holder (this process)
    with (
        store.transaction() as con
    ):  # the holder dies without releasing: its row stays, with its pid
        con.execute("UPDATE run_leases SET pid = ? WHERE run_id = 'rel-y'", [dead.pid])
    lease._stop.set()
    taken = runner.acquire_lease(store, "rel-y", "bob")
    entries = [e for e in trail.entries(store) if e["action"] == "run.lease_takeover"]
    assert len(entries) == 1 and entries[0]["payload"]["previous_pid"] == dead.pid
    taken.release()
    runner.acquire_lease(store, "rel-y", "carol").release()  # released: free again, no takeover
    assert len([e for e in trail.entries(store) if e["action"] == "run.lease_takeover"]) == 1


def test_release_run_while_another_run_holds_the_lease_is_refused_and_changes_nothing(
    small, tmp_path
):
    store = small[0]
    rid = _approved(store, tmp_path)
    held = runner.acquire_lease(store, rid, "alice")  # e.g. a first `release run` still in progress
    try:
        with pytest.raises(runner.RunInProgressError, match=f"Run {rid} is already running"):
            manager.run_release(store, rid, "alice")
    finally:
        held.release()
    assert manager.get_release(store, rid).state == "approved"
    assert ledger.budget(store, "mnist").charges == []


class Crash(RuntimeError):
    pass


def test_a_failed_release_is_abandoned_with_its_started_steps_charged(small, tmp_path):
    store = small[0]
    rid = _approved(store, tmp_path)

    def crash_at_step_3(stage, done, total):
        if stage == "DP fine-tuning" and done == 3:
            raise Crash("power cut")

    with pytest.raises(Crash):
        manager.run_release(store, rid, "alice", crash_at_step_3)
    assert manager.get_release(store, rid).state == "failed"
    planned = ledger.get_charge(store, rid)
    assert (
        planned.state == "reserved"
    )  # it read the data: counted in full until resumed or abandoned
    rel = manager.abandon_release(store, rid, "alice")
    charge = ledger.get_charge(store, rid)
    assert charge.state == "committed" and "abandoned by alice" in rel.reason
    assert [e.steps for e in charge.charged_events if isinstance(e, DpSgd)] == [3]
    assert any(e["action"] == "release.abandon" for e in trail.entries(store))
    with pytest.raises(Exception, match="already settled"):  # no silent re-run on a settled charge
        manager.run_release(store, rid, "alice")


def test_a_release_interrupted_in_its_audit_is_audited_on_rerun_not_run_again(small, tmp_path):
    store = small[0]
    spec = {
        "release": {"dataset": "mnist", "mechanism": "ksalsa"},
        # one optimisation step and a one-row nearest-neighbour grid: what is checked is where the
        # run stops and how it is charged, not the images or the audit's figures
        "ksalsa": {"k": 12, "preset": "tiny", "public": "builtin:uci-digits", "steps": 1},
        "policy": {
            "mia_samples": 20,
            "feature_samples": 40,
            "fid_samples": 40,
            "utility_train_samples": 60,
            "cnn_epochs": 1,
            "grid_pairs": 1,
        },
    }
    path = tmp_path / "rel.toml"
    path.write_text(tomli_w.dumps(spec))
    rel = manager.create_plan(store, ReleaseSpec.from_toml(path), "alice")
    rid = rel.release_id
    manager.approve(store, rid, "alice", digest=rel.plan_digest, acknowledge_non_dp=True)

    def crash_in_audit(stage, done, total):
        if stage == "audit: expectations":
            raise Crash("killed during the audit")

    with pytest.raises(Crash):
        manager.run_release(store, rid, "alice", crash_in_audit)
    interrupted = manager.get_release(store, rid)
    assert interrupted.result is not None
    # failed, not left `running` with nothing running (issue 36)
    assert interrupted.state == "failed" and interrupted.reason.startswith(
        "audit not finished: Crash"
    )
    assert ledger.get_charge(store, rid).state == "committed"
    rel = manager.run_release(store, rid, "alice")
    assert rel.state == "checked"
    assert [c.run_id for c in ledger.budget(store, "mnist").charges] == [rid]  # charged once
    assert (
        sum(e["action"] == "run.sensitive_access" for e in trail.entries(store)) == 1
    )  # not run again


HOLDER = """
import sys, time
from accounting.store import Store, Workspace
from release import runner
runner.acquire_lease(Store(Workspace(sys.argv[1])), "rel-z", "alice")
print("held", flush=True)
time.sleep(600)
"""


def test_lease_survives_in_the_store_and_a_killed_holder_is_taken_over(store):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store.workspace.root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(runner.RunInProgressError, match=f"pid {holder.pid}"):
            runner.acquire_lease(store, "rel-z", "bob")  # another process holds it
    finally:
        holder.kill()  # SIGKILL: no chance to release the lease
        holder.wait()
    taken = runner.acquire_lease(store, "rel-z", "bob")
    taken.release()
    takeovers = [e["payload"] for e in trail.entries(store) if e["action"] == "run.lease_takeover"]
    assert [t["previous_pid"] for t in takeovers] == [holder.pid]


# ------------------------------------------------------------------ what runs is what was signed
def _spec(k=1, policy=None, public="builtin:uci-digits"):
    return {
        "release": {"dataset": "mnist", "mechanism": "privimage", "n_images": 20},
        "privimage": {"epsilon": 4.0, "preset": "tiny", "public": public, "k": k},
        "policy": policy or {"mia_max_auc": 0.6},
    }


def _approved(store, tmp_path, spec=None):
    """Plan `spec` (default `_spec()`) from the TOML file tmp_path/rel.toml, as `release plan` does, and approve it."""
    spec_path = tmp_path / "rel.toml"
    spec_path.write_text(tomli_w.dumps(spec or _spec()))
    rel = manager.create_plan(store, ReleaseSpec.from_toml(spec_path), "alice")
    manager.approve(store, rel.release_id, "alice", digest=rel.plan_digest)
    return rel.release_id


def _refused_and_uncharged(store, rid, match):
    with pytest.raises(TamperError, match=match):
        manager.run_release(store, rid, "alice")
    assert ledger.budget(store, "mnist").charges == []


def test_spec_file_edited_after_approval_is_refused(small, tmp_path):
    store = small[0]
    rid = _approved(store, tmp_path, _spec(k=1))
    (tmp_path / "rel.toml").write_text(tomli_w.dumps(_spec(k=3)))
    _refused_and_uncharged(store, rid, r"edited after the plan.*\[privimage\] k")


def test_policy_edited_in_the_store_after_approval_is_refused(small, tmp_path, tamper):
    store = small[0]
    rid = _approved(store, tmp_path)
    tamper(store.workspace.db_path, "UPDATE releases SET spec = replace(spec, '0.6', '0.99')")
    _refused_and_uncharged(store, rid, "stored spec differs")


def test_changed_public_data_after_approval_is_refused(small, tmp_path):
    store = small[0]
    pub = uci_digits()
    pub_path = tmp_path / "public.npz"
    np.savez(pub_path, images=pub.images, labels=pub.labels)
    rid = _approved(store, tmp_path, _spec(public=str(pub_path)))
    np.savez(pub_path, images=pub.images[::-1], labels=pub.labels[::-1])
    _refused_and_uncharged(store, rid, "public data .* changed")


def test_steward_key_replaced_after_approval_is_refused(small, tmp_path, tamper):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    store = small[0]
    rid = _approved(store, tmp_path)
    # mallory swaps alice's public key for his own and re-signs the approval with it
    mallory = Ed25519PrivateKey.generate()
    pub_b64 = base64.b64encode(keys.raw_public_bytes(mallory.public_key())).decode()
    digest = manager.get_release(store, rid).plan_digest
    sig = mallory.sign(
        approval.approval_message(rid, digest, "approve", False, keys.key_id(mallory.public_key()))
    )
    tamper(
        store.workspace.db_path,
        f"UPDATE identities SET public_key = '{pub_b64}' WHERE name = 'alice'",
        f"UPDATE approvals SET signature = '{sig.hex()}'",
    )
    assert keys.get_identity(store, "alice").key_id == keys.key_id(mallory.public_key())
    # the identity row no longer matches the key the trail recorded at its creation (checked first;
    # behind it, the approval's key id is checked against the one recorded at approval)
    with pytest.raises(TamperError, match="public key in the identities table is not the one"):
        approval.verified_approval(store, manager.get_release(store, rid))


# ------------------------------------------------------------------ validated at plan time
@pytest.mark.parametrize(
    "params,match",
    [
        ({"k": 1000}, "k = 1000 is more than the 10 classes"),
        ({"k": 1e308}, r"\[privimage\] k"),
        ({"query_sigma": 1e308}, "query_sigma"),
        ({"finetune_epochs": 1e308}, "finetune_epochs"),
        (
            {"finetune_epochs": 1e-300},
            "finetune_epochs 1e-300 means .* DP-SGD steps .* less than one step",
        ),
        ({"n_samples": 1e308}, "n_samples"),
        ({"image_size": 32}, "releases 32x32 images but dataset 'mnist' is 28x28"),
        ({"vote_sigma": 1e308}, "vote_sigma"),
        ({"vote_sigma": -1.0}, "vote_sigma"),
        ({"vote_sigma": float("nan")}, "vote_sigma"),
        ({"vote_sigma": 2.0, "vote_pool": 1}, "vote_pool must be between 2 and 64"),
        (
            {"vote_sigma": 2.0, "vote_pool": 4, "n_samples": 300_000},
            "the vote would draw 1,200,000 candidates",
        ),
        ({"vote_sigma": 2.0, "vote_rounds": 1e308}, "vote_rounds"),
        (
            {"vote_sigma": 2.0, "vote_rounds": 20},
            "vote_rounds must be a whole number from 1 to 8, got 20",
        ),
        ({"vote_sigma": 2.0, "vote_rounds": 2, "variation_strength": -0.5}, "variation_strength"),
    ],
)
def test_bad_mechanism_values_are_refused_at_plan_time(small, params, match):
    store = small[0]
    spec = _spec()
    spec["privimage"].update(params)
    if "n_samples" in params:
        del spec["release"]["n_images"]
    with pytest.raises(InvalidParameterError, match=match):
        manager.create_plan(store, ReleaseSpec.from_dict(spec), "alice")
    assert (
        store.query("SELECT * FROM releases") == [] and ledger.budget(store, "mnist").charges == []
    )


@pytest.mark.parametrize(
    "policy",
    [
        {"mia_max_auc": 7},
        {"mia_samples": -1},
        {"cnn_epochs": 1.5},
        {"max_fid": float("nan")},
        {"no_such_check": 1},
        {"require_attacks": "yes"},
    ],
)
def test_bad_policy_is_refused_at_plan_time(small, policy):
    store = small[0]
    with pytest.raises(InvalidParameterError, match="policy"):
        manager.create_plan(store, ReleaseSpec.from_dict(_spec(policy=policy)), "alice")
    assert store.query("SELECT * FROM releases") == []


def test_a_dataset_the_audit_can_never_pass_is_refused_at_plan_time(store, tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny8.npz"
    np.savez(
        path, images=rng.integers(0, 255, (200, 8, 8), dtype=np.uint8), labels=np.arange(200) % 10
    )
    register_from_source(store, "mnist", str(path), 10.0, 1e-4, labels="0-9")
    keys.create_identity(store, "alice", "steward")
    with pytest.raises(InvalidParameterError, match="28x28 images but dataset 'mnist' is 8x8"):
        manager.create_plan(store, ReleaseSpec.from_dict(_spec()), "alice")
    assert store.query("SELECT * FROM releases") == []
