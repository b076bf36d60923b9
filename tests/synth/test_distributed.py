"""PrivImage on 2 CPU processes (torchrun, gloo): the same charged events as one process, replicas that
train identically, a killed worker that leaves the ledger conservatively charged, and the lockstep
Poisson sampler (opacus 1.6's skips a rank's empty batch)."""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from accounting import ledger
from accounting.errors import InvalidParameterError, PrivReleaseError
from accounting.events import DpSgd, event_from_json
from accounting.store import Store, Workspace
from release import runner
from release.planning import dataset_info
from synth import registry
from synth.kinds.datasets import ImageDataset, load_source, uci_digits
from synth.mechanisms.privimage import PrivImageConfig, distributed, state
from synth.mechanisms.privimage.model import make_unet
from synth.mechanisms.privimage.sampling import sample_images
from synth.mechanisms.privimage.training import dp_finetune
from synth.progress import no_progress
from synth.tools import nodes, step_counter

DELTA = 1e-4


@pytest.fixture(scope="module")
def data() -> tuple[ImageDataset, ImageDataset]:
    torch.set_num_threads(1)
    sens = load_source("builtin:mnist5k")
    idx = np.concatenate([np.flatnonzero(sens.labels == c)[:12] for c in range(10)])
    return sens.subset(idx), uci_digits()


def _store(root: Path, sens: ImageDataset) -> Store:
    ws = Workspace(root)
    ws.init()
    store = Store(ws)
    ledger.register_dataset(
        store,
        name="mnist",
        source="test",
        fingerprint="fp",
        record_count=len(sens),
        labels=sens.label_set,
        image_shape=[28, 28],
        epsilon_cap=10.0,
        delta_cap=DELTA,
    )
    return store


def _plan(store: Store, pub, cfg):
    b = ledger.budget(store, "mnist")
    return registry.get("privimage").plan(cfg, dataset_info(b.dataset), b.history, pub)


def _run(
    store: Store,
    sens,
    pub,
    cfg,
    wd: Path,
    nproc: int,
    run_id: str = "r",
    progress=no_progress,
    plan=None,
    nodes=None,
):
    plan = plan or _plan(store, pub, cfg)
    res = runner.run_charged(
        store,
        run_id=run_id,
        dataset="mnist",
        data=sens,
        public=pub,
        mechanism="privimage",
        config=cfg,
        plan=plan,
        workdir=wd,
        progress=progress,
        nproc=nproc,
        nodes=nodes,
    )
    return plan, res


def _short() -> PrivImageConfig:
    """The tiny preset with 4 DP-SGD steps (q = 1/8) instead of 8: most of a run on two processes is
    torchrun starting its workers; the steps each cost the same on one process and on two."""
    return PrivImageConfig.tiny(4.0, DELTA, selection="none", finetune_epochs=0.5)


def test_two_processes_charge_exactly_what_one_process_charges(data, tmp_path: Path) -> None:
    sens, pub = data
    cfg = _short()
    runs = {}
    for n in (1, 2):
        store = _store(tmp_path / f"ws{n}", sens)
        stages: set[str] = set()
        plan, res = _run(
            store, sens, pub, cfg, tmp_path / f"w{n}", n, progress=lambda s, d, t: stages.add(s)
        )
        runs[n] = (plan, res, ledger.get_charge(store, "r"), stages)
    _charged_as_one_process(runs[1], runs[2], tmp_path / "w2")


def _charged_as_one_process(one: tuple, several: tuple, workdir: Path) -> None:
    """The DDP privacy checks: a run on several processes (`several`: plan, result, charge, progress
    stages; its run folder `workdir`) charged, and opacus' accountant recorded, exactly what one
    process (`one`) did: the plan's (sigma, q, steps), one noise draw per step."""
    (plan1, res1, charge1, stages1), (plan2, res2, charge2, stages2) = one, several
    assert plan2.events == plan1.events
    assert charge2.state == charge1.state == "committed"
    assert list(charge2.charged_events) == list(charge1.charged_events) == list(plan1.events)
    (dp,) = charge2.charged_events
    assert isinstance(dp, DpSgd) and dp.steps > 1
    # opacus' own accountant on rank 0 recorded the same (sigma, q, steps) as in one process
    assert (
        res2.internal["opacus_history"]
        == res1.internal["opacus_history"]
        == [[dp.noise_multiplier, dp.sample_rate, dp.steps]]
    )
    assert step_counter.started(workdir) == dp.steps  # rank 0 alone counted
    assert stages2 == stages1 == {"DP fine-tuning", "sampling"}  # progress forwarded from rank 0
    assert res2.images.shape == res1.images.shape == (20, 28, 28) and res2.images.dtype == np.uint8
    assert np.array_equal(res2.labels, res1.labels)
    assert len({img.tobytes() for img in res2.images}) == 20  # each rank drew its own noise
    assert not list(workdir.glob("dist_*job*"))  # the sensitive job files are gone


def _unet() -> torch.nn.Module:
    torch.manual_seed(0)
    return make_unet(28, 1, 10, (8, 16), 1)


def _weights_differ(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


# Slow since issue 63 (end to end: two DDP ranks trained and sampled end to end; fast:
# test_two_processes_charge_exactly_what_one_process_charges,
# test_lockstep_sampler_yields_every_step_on_every_rank)
@pytest.mark.slow
def test_replicas_train_identically_and_sampling_is_gathered_in_order(data, tmp_path: Path) -> None:
    """Both stages through the real launcher: every rank's weights have the same digest after DDP
    pre-training and after DP-SGD, and they moved away from the initial weights."""
    sens, _ = data
    x = torch.from_numpy(sens.images[:, None].astype(np.float32) / 127.5 - 1)
    y = torch.from_numpy(sens.labels.astype(np.int64))
    model = _unet()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    pre = dict(
        steps=4, batch=16, lr=2e-3, train_timesteps=100, seed=0, augment=0.0, label_dropout=0.0
    )
    job = {
        "model": model,
        "x": x,
        "y": y,
        "kwargs": pre,
        "cache_dir": str(tmp_path / "cache"),
        "workdir_ckpt": str(tmp_path / "pre.pt"),
        "device": "cpu",
    }
    r = distributed.launch("pretrain", job, nproc=2, workdir=tmp_path, progress=no_progress)
    assert len(r["rank_digests"]) == 2 and len(set(r["rank_digests"])) == 1
    assert _weights_differ(r["weights"], initial)
    assert (
        len(list((tmp_path / "cache").glob("pretrain-*.pt"))) == 1
    )  # rank 0 alone wrote the cache
    model.load_state_dict(r["weights"])
    labels = np.arange(7) % 3
    finetune = dict(
        sample_rate=1 / 8,
        noise_multiplier=1.0,
        steps=5,
        batch_size=15,
        max_physical_batch=4,
        max_grad_norm=1.0,
        lr=1e-3,
        ema_decay=0.5,
        train_timesteps=100,
        seed=0,
        ckpt_every=2,
    )
    sample = dict(
        labels=labels, image_size=28, channels=1, train_timesteps=100, ddim_steps=2, batch=4, seed=0
    )
    job = {
        "model": model,
        "x": x,
        "y": y,
        "finetune": finetune,
        "sample": sample,
        "unet": (28, 1, 10, (8, 16), 1),
        "workdir": str(tmp_path),
        "device": "cpu",
    }
    r2 = distributed.launch("finetune_sample", job, nproc=2, workdir=tmp_path, progress=no_progress)
    assert len(set(r2["rank_digests"])) == 1 and _weights_differ(r2["weights"], r["weights"])
    assert r2["steps"] == 5 and [list(h) for h in r2["opacus_history"]] == [[1.0, 1 / 8, 5]]
    assert r2["images"].shape == (7, 28, 28)
    # rank 1 drew positions 1, 3, 5 with seed 0 + 1: redrawing them here gives the same images, in place
    sampler = make_unet(28, 1, 10, (8, 16), 1)
    sampler.load_state_dict(r2["weights"])
    kw = {k: v for k, v in sample.items() if k != "labels"}
    again = sample_images(sampler, labels[1::2], **{**kw, "seed": 1}, device=torch.device("cpu"))
    gap = np.abs(again.astype(int) - r2["images"][1::2].astype(int)).mean()
    assert gap < 1.0 < np.abs(again.astype(int) - r2["images"][0:6:2].astype(int)).mean()
    assert step_counter.started(tmp_path) == 5
    # rank 0's checkpoint is an ordinary one: one process continues it (a resume with another --nproc)
    resumed: list = []
    more = dp_finetune(
        _unet(),
        x,
        y,
        **{**finetune, "steps": 7},
        device=torch.device("cpu"),
        workdir=tmp_path,
        on_resume=lambda started, done: resumed.append((started, done)),
    )
    assert (
        resumed == [(5, 5)]
        and more.steps == 7
        and [list(h) for h in more.opacus_history] == [[1.0, 1 / 8, 7]]
    )


def _worker_pids(marker: str) -> list[tuple[int, int]]:
    """(pid, LOCAL_RANK) of the torchrun workers whose command line names `marker` (not the agent)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            marker in cmd
            and "synth.mechanisms.privimage.worker" in cmd
            and "torch.distributed.run" not in cmd
        ):
            rank = [e for e in env if e.startswith(b"LOCAL_RANK=")]
            found.append((int(pid), int(rank[0].split(b"=")[1]) if rank else -1))
    return found


@pytest.mark.slow
def test_killed_worker_leaves_the_ledger_conservatively_charged_and_resumes(
    data, tmp_path: Path
) -> None:
    sens, pub = data
    cfg = PrivImageConfig.tiny(4.0, DELTA, selection="none", finetune_epochs=2.0)
    store, wd = _store(tmp_path / "ws", sens), tmp_path / "w"
    killed: list[int] = []

    def kill_rank1(stage: str, done: int, total: int) -> None:
        if stage == "DP fine-tuning" and done == 5 and not killed:
            for pid, rank in _worker_pids(str(wd)):
                if rank == 1:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

    plan = _plan(store, pub, cfg)
    with pytest.raises(PrivReleaseError, match="worker failed or was killed"):
        _run(store, sens, pub, cfg, wd, 2, progress=kill_rank1, plan=plan)
    assert killed
    plan_events = plan.events
    (planned,) = plan_events
    started = step_counter.started(wd)
    assert 5 <= started < planned.steps
    charge = ledger.get_charge(store, "r")
    assert charge.state == "reserved" and list(charge.planned_events) == list(
        plan_events
    )  # in full: >= steps taken
    assert ledger.budget(store, "mnist").spent_rdp > 0
    ckpt_step = state.load_torch(wd / state.FINETUNE)["step"]
    _, res = _run(
        store, sens, pub, cfg, wd, 2, plan=plan
    )  # resumes from the checkpoint, lost steps charged again
    main = ledger.get_charge(store, "r")
    redo = [c for c in ledger.budget(store, "mnist").charges if c.run_id.startswith("r:redo-")]
    assert main.state == "committed" and list(main.charged_events) == list(plan_events)
    assert [c.charged_events[0].steps for c in redo] == (
        [started - ckpt_step] if started > ckpt_step else []
    )
    total = sum(e.steps for c in [main, *redo] for e in c.charged_events)
    assert total == step_counter.started(wd) >= planned.steps  # every executed step charged
    assert res.images.shape == (20, 28, 28)


def test_nproc_is_refused_before_anything_is_charged(data, tmp_path: Path) -> None:
    sens, pub = data
    store = _store(tmp_path / "ws", sens)
    with pytest.raises(InvalidParameterError, match="--nproc must be an integer from 1"):
        _run(store, sens, pub, _short(), tmp_path / "w", 0)
    assert ledger.get_charge(store, "r").state == "refunded"
    with pytest.raises(PrivReleaseError, match="runs in one process only"):
        runner.run_charged(
            store,
            run_id="k",
            dataset="mnist",
            data=sens,
            public=pub,
            mechanism="ksalsa",
            config=None,
            plan=None,
            workdir=tmp_path / "k",
            nproc=2,
        )
    assert ledger.get_charge(store, "k") is None


def test_an_empty_poisson_batch_is_a_noise_only_step(tmp_path: Path) -> None:
    """q = 1/20 on 20 images: a step's batch is empty with probability 0.95^20 = 0.36, so a run of 20
    steps meets one all but surely (1 - 0.64^20); opacus then had no per-sample gradients to clip (it
    failed); now the step adds noise only and is counted."""
    x, y = torch.rand(20, 1, 28, 28) * 2 - 1, torch.arange(20) % 10
    out = dp_finetune(
        _unet(),
        x,
        y,
        sample_rate=1 / 20,
        noise_multiplier=1.0,
        steps=20,
        batch_size=1,
        max_physical_batch=4,
        max_grad_norm=1.0,
        lr=1e-3,
        ema_decay=0.5,
        train_timesteps=100,
        seed=0,
        device=torch.device("cpu"),
        workdir=tmp_path,
        ckpt_every=10,
        on_resume=lambda s, d: None,
    )
    assert out.steps == 20 and out.opacus_history == [(1.0, 1 / 20, 20)]
    assert step_counter.started(tmp_path) == 20


def _count_batches(rank: int, world: int, port: int, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler

    kw = dict(
        total_size=40, sample_rate=1 / 40, steps=200, generator=torch.Generator().manual_seed(rank)
    )
    ours = list(distributed.LockstepPoissonSampler(**kw))
    kw["generator"] = torch.Generator().manual_seed(rank)
    out[rank] = (
        len(ours),
        len(list(DistributedUniformWithReplacementSampler(**kw))),
        sorted({int(i) for b in ours for i in b}),
    )
    torch.distributed.destroy_process_group()


def test_lockstep_sampler_yields_every_step_on_every_rank() -> None:
    with mp.Manager() as manager:
        out = manager.dict()
        port = 29500 + os.getpid() % 1000
        # forked, not spawned: the ranks inherit this process's imports instead of redoing them
        mp.start_processes(
            _count_batches, args=(2, port, out), nprocs=2, join=True, start_method="fork"
        )
        result = dict(out)
    for rank in (0, 1):
        ours, opacus_count, seen = result[rank]
        assert ours == 200 and opacus_count < 200  # opacus skips this rank's empty batches
        assert set(seen) <= set(range(40))
    assert not set(result[0][2]) & set(
        result[1][2]
    )  # disjoint shards: one Poisson sample of the whole set


COORDINATOR = """
import sys
from pathlib import Path
import numpy as np
from accounting import ledger
from accounting.store import Store, Workspace
from release import runner
from release.planning import dataset_info
from synth import registry
from synth.kinds.datasets import load_source, uci_digits
from synth.mechanisms.privimage import PrivImageConfig
root = Path(sys.argv[1])
sens = load_source("builtin:mnist5k")
sens = sens.subset(np.concatenate([np.flatnonzero(sens.labels == c)[:12] for c in range(10)]))
ws = Workspace(root / "ws"); ws.init(); store = Store(ws)
ledger.register_dataset(store, name="mnist", source="test", fingerprint="fp", record_count=len(sens),
                        labels=sens.label_set, image_shape=[28, 28], epsilon_cap=10.0, delta_cap=1e-4)
cfg = PrivImageConfig.tiny(4.0, 1e-4, selection="none", finetune_epochs=4.0)
b = ledger.budget(store, "mnist")
plan = registry.get("privimage").plan(cfg, dataset_info(b.dataset), b.history, uci_digits())
runner.run_charged(store, run_id="r", dataset="mnist", data=sens, public=uci_digits(), mechanism="privimage",
                   config=cfg, plan=plan, workdir=root / "w", nproc=2)
"""


def _wait(condition, seconds: float) -> bool:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.5)
    return False


@pytest.mark.slow
def test_killing_the_coordinator_stops_its_workers(tmp_path: Path) -> None:
    """No orphan keeps training (and writing the step counter) once the process holding the lease is gone."""
    import subprocess
    import sys

    script = tmp_path / "coordinator.py"
    script.write_text(COORDINATOR)
    wd = tmp_path / "w"
    coord = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert _wait(lambda: step_counter.started(wd) >= 2, 240)
        assert len(_worker_pids(str(wd))) == 2
    finally:
        coord.kill()
        coord.wait()
    assert _wait(lambda: not _worker_pids(str(wd)), 30), _worker_pids(str(wd))
    started = step_counter.started(wd)
    assert not _wait(lambda: step_counter.started(wd) != started, 3)


@pytest.mark.slow
def test_release_run_nproc_through_the_cli(store: Store, tmp_path: Path) -> None:
    """`privrelease release run ID --as S --nproc 2`: the steward's command, charged once, as planned."""
    from typer.testing import CliRunner

    from release import artifacts, keys, manager
    from release.cli import app
    from release.data import register_from_source
    from release.spec import ReleaseSpec

    train = load_source("builtin:mnist5k")
    idx = np.random.default_rng(0).choice(len(train), 120, replace=False)
    np.savez(tmp_path / "train.npz", images=train.images[idx], labels=train.labels[idx])
    keys.create_identity(store, "alice", "steward")
    keys.ensure_release_key(store.workspace)
    register_from_source(
        store, "digits", str(tmp_path / "train.npz"), epsilon_cap=10.0, delta_cap=1e-4, labels="0-9"
    )
    spec = {
        "release": {"dataset": "digits", "mechanism": "privimage", "n_images": 20},
        "privimage": {
            "epsilon": 6.0,
            "preset": "tiny",
            "public": "builtin:uci-digits",
            "selection": "none",
        },
        "policy": {
            "mia_samples": 20,
            "feature_samples": 40,
            "fid_samples": 40,
            "utility_train_samples": 60,
            "cnn_epochs": 1,
            "min_utility_gain": None,
        },
    }
    rel = manager.create_plan(store, ReleaseSpec.from_dict(spec), "alice")
    manager.approve(store, rel.release_id, "alice", digest=rel.plan_digest)
    r = CliRunner().invoke(
        app,
        [
            "--workspace",
            str(store.workspace.root),
            "release",
            "run",
            rel.release_id,
            "--as",
            "alice",
            "--nproc",
            "2",
        ],
    )
    assert r.exit_code == 0, r.output
    (charge,) = ledger.budget(store, "digits").charges
    assert charge.state == "committed"
    assert list(charge.charged_events) == [event_from_json(e) for e in rel.plan.events]
    assert manager.get_release(store, rel.release_id).state == "checked"
    assert (
        artifacts.release_dir(store, rel.release_id) / "work" / "dist_finetune_sample.log"
    ).exists()


def _one_noisy_step(rank: int, world: int, port: int, out: dict) -> None:
    """A DP-SGD step whose clipped gradients are all zero (zero inputs): what is left is the noise."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    from synth.mechanisms.privimage import training
    from synth.tools.dp_noise import install

    model = torch.nn.Linear(20_000, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = torch.zeros(64, 20_000), torch.zeros(64, dtype=torch.long)
    _, dp_model, dp_opt, loader = training._make_private(
        model, opt, x, y, 16, 2.0, 3.0, 1 / 4, torch.device("cpu"), world_size=world
    )
    install(dp_opt)  # as dp_finetune does by default
    xb, _ = next(iter(loader))
    if len(xb):
        dp_opt.zero_grad()
        dp_model(xb).sum().backward()
    else:
        training._empty_batch(dp_opt, list(model.parameters()))
    dp_opt.step()
    out[rank] = model.weight.grad.detach().clone().reshape(-1)
    torch.distributed.destroy_process_group()


def test_the_noise_is_added_once_not_once_per_process() -> None:
    """sigma * C on the summed gradient, as in one process: not sqrt(2) times it (every rank adding noise,
    only less useful) and not 0 (no rank adding it: no privacy)."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(  # forked: the ranks inherit this process's imports
            _one_noisy_step,
            args=(2, 29500 + (os.getpid() + 7) % 1000, out),
            nprocs=2,
            join=True,
            start_method="fork",
        )
        grads = dict(out)
    assert torch.equal(grads[0], grads[1])  # every replica applies the same update
    expected_batch = 64 // 4
    assert float(grads[0].std() * expected_batch) == pytest.approx(2.0 * 3.0, rel=0.05)


@pytest.mark.slow
def test_semantic_release_on_two_processes_pretrains_with_ddp_and_charges_the_plan(
    data, tmp_path: Path
) -> None:
    """The whole PrivImage path: query in the coordinator, DDP pre-training and DP-SGD + sampling on 2 ranks."""
    sens, pub = data
    cfg = PrivImageConfig.tiny(4.0, DELTA)
    store = _store(tmp_path / "ws", sens)
    stages: set[str] = set()
    plan, res = _run(
        store, sens, pub, cfg, tmp_path / "w", 2, progress=lambda s, d, t: stages.add(s)
    )
    assert stages == {"query classifier", "pretraining", "DP fine-tuning", "sampling"}
    charge = ledger.get_charge(store, "r")
    assert (
        charge.state == "committed"
        and list(charge.charged_events) == list(plan.events)
        and len(plan.events) == 2
    )
    assert len(res.parameters["selected_public_classes"]) == 10
    cached = list((store.workspace.root / "cache").glob("pretrain-*.pt"))
    assert (
        len(cached) == 1 and "partial" not in cached[0].name
    )  # one cache entry, keyed on world size 2
    assert res.images.shape == (20, 28, 28)


# ------------------------------------------------------------------ across hosts (--nnodes)
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _host(port: int, rank: int) -> nodes.Nodes:
    """One of two "hosts" on this machine: a torchrun agent each, --nnodes 2 --nproc-per-node 1,
    rendezvous on a localhost port (both addresses are local here, so the rank is explicit)."""
    return nodes.parse_nodes(2, f"127.0.0.1:{port}", 1, rank)


def _in_thread(fn, *args, **kwargs) -> tuple[threading.Thread, list]:
    """Run a second host's side (it only starts a torchrun agent and reads its output) beside this
    one; returns the thread and where its exception lands."""
    errors: list[BaseException] = []

    def body() -> None:
        try:
            fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t, errors


def _follow(port: int, fingerprint: str):
    return _in_thread(
        nodes.follow,
        _host(port, 1),
        worker="synth.mechanisms.privimage.worker",
        run_id="r",
        fingerprint=fingerprint,
    )


@pytest.mark.slow
def test_two_hosts_charge_exactly_what_one_process_charges(data, tmp_path: Path) -> None:
    """Two hosts (two torchrun agents over gloo, c10d rendezvous): the DDP privacy checks of two
    processes on one host hold, the coordinator's ledger has one charge, and only the coordinator's
    rank 0 wrote (the step counter, checkpoints, the result)."""
    sens, pub = data
    cfg = PrivImageConfig.tiny(4.0, DELTA, selection="none")
    store1 = _store(tmp_path / "ws1", sens)
    stages1: set[str] = set()
    plan1, res1 = _run(
        store1, sens, pub, cfg, tmp_path / "w1", 1, progress=lambda s, d, t: stages1.add(s)
    )
    store, wd, port = _store(tmp_path / "ws", sens), tmp_path / "w", _free_port()
    plan = _plan(store, pub, cfg)
    follower, errors = _follow(port, nodes.plan_fingerprint(plan))
    stages: set[str] = set()
    res = runner.run_charged(
        store,
        run_id="r",
        dataset="mnist",
        data=sens,
        public=pub,
        mechanism="privimage",
        config=cfg,
        plan=plan,
        workdir=wd,
        progress=lambda s, d, t: stages.add(s),
        nodes=_host(port, 0),
    )
    follower.join(120)
    assert not follower.is_alive() and errors == []
    one = (plan1, res1, ledger.get_charge(store1, "r"), stages1)
    _charged_as_one_process(one, (plan, res, ledger.get_charge(store, "r"), stages), wd)
    (charge,) = ledger.budget(store, "mnist").charges  # exactly one charge, committed once
    assert charge.state == "committed" and charge.run_id == "r"
    assert not list(wd.glob("dist_node_*")) and not (wd / "dist_nodes_hello.json").exists()


def test_flags_for_several_hosts_are_checked() -> None:
    n = nodes.parse_nodes(3, "node1.example.org:29400", 4, None)
    assert (n.nnodes, n.host, n.port, n.nproc_per_node, n.world_size) == (
        3,
        "node1.example.org",
        29400,
        4,
        12,
    )
    assert n.torchrun_args("rel-1") == [
        "--nnodes=3",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=node1.example.org:29400",
        "--rdzv-id=rel-1",
        "--max-restarts=0",
    ]
    assert nodes.parse_nodes(2, "[::1]:29400").rdzv == "[::1]:29400"
    assert nodes.parse_nodes(None, None) is None
    assert nodes.parse_nodes(2, "127.0.0.1:1", node_rank=1).coordinator is False
    assert nodes.parse_nodes(2, "127.0.0.1:1").coordinator is True  # the endpoint is this host
    assert nodes.parse_nodes(2, "192.0.2.1:29400").coordinator is False  # TEST-NET: not this host
    refused = {
        (0, "h:1", None, None, 1): "--nnodes must be an integer from 1",
        (2, None, None, None, 1): "--nnodes needs --rdzv HOST:PORT",
        (None, "h:1", None, None, 1): "--rdzv only make sense with --nnodes",
        (None, None, 2, None, 1): "--nproc-per-node only make sense with --nnodes",
        (2, "h:1", 2, None, 2): "--nproc and --nnodes together",
        (2, "h:1", 0, None, 1): "--nproc-per-node must be an integer from 1",
        (2, "h:1", None, 2, 1): "--node-rank must be an integer from 0 to 1",
        (2, "h:1", None, -1, 1): "--node-rank must be an integer from 0 to 1",
        (2, "h", None, None, 1): "--rdzv must be HOST:PORT",
        (2, "h:0", None, None, 1): "--rdzv must be HOST:PORT",
        (2, "h:70000", None, None, 1): "--rdzv must be HOST:PORT",
        (2, ":29400", None, None, 1): "--rdzv must be HOST:PORT",
        (2, "::1:29400", None, None, 1): "--rdzv must be HOST:PORT",
        (2, "h:port", None, None, 1): "--rdzv must be HOST:PORT",
    }
    for args, message in refused.items():
        with pytest.raises(InvalidParameterError, match=re.escape(message)):
            nodes.parse_nodes(*args)


def _hello(host: str, coordinator: bool, fingerprint: str = "fp", **kw) -> dict:
    hello = dict(
        coordinator=coordinator,
        fingerprint=fingerprint,
        nnodes=2,
        nproc_per_node=1,
        problem=None,
        host=host,
        host_id=f"{host}/0",
    )
    return {**hello, **kw}


def test_hosts_must_agree_on_the_coordinator_the_plan_and_the_layout() -> None:
    """What every rank decides from the hosts' hellos, before anything is reserved."""
    a, b = _hello("a", True), _hello("b", False)
    assert nodes.verdict([a, b]) is None
    assert "different plan" in nodes.verdict([a, _hello("b", False, "other")])
    assert "no host is the coordinator" in nodes.verdict([_hello("a", False), b])
    assert "2 hosts claim to be the coordinator" in nodes.verdict([a, _hello("b", True)])
    refusing = _hello("b", False, None, problem="release r is planned here")
    assert nodes.verdict([a, refusing]) == "host b refuses: release r is planned here"
    assert "--nnodes 3" in nodes.verdict([a, _hello("b", False, nnodes=3)])
    assert "2 processes joined" in nodes.verdict(
        [_hello("a", True, nproc_per_node=2), _hello("b", False, nproc_per_node=2)]
    )


def test_flags_are_checked_by_release_run(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from release.cli import app

    base = ["--workspace", str(tmp_path / "none"), "release", "run", "rel-x"]
    for extra, message in (
        (["--nnodes", "2"], "--nnodes needs --rdzv HOST:PORT"),
        (["--nnodes", "2", "--rdzv", "h:1", "--nproc", "2"], "--nproc and --nnodes together"),
        (["--rdzv", "h:1"], "--rdzv only make sense with --nnodes"),
        (["--nnodes", "2", "--rdzv", "nohost"], "--rdzv must be HOST:PORT"),
    ):
        r = CliRunner().invoke(app, base + extra)
        assert isinstance(r.exception, InvalidParameterError) and message in str(r.exception)
    assert not (tmp_path / "none").exists()  # refused before the workspace was opened


@pytest.mark.slow
def test_a_host_with_another_plan_is_refused_before_anything_is_charged(
    data, tmp_path: Path
) -> None:
    """The second host's plan has more steps: every host refuses, the coordinator reserves nothing."""
    sens, pub = data
    cfg = PrivImageConfig.tiny(4.0, DELTA, selection="none")
    store, port = _store(tmp_path / "ws", sens), _free_port()
    other = _plan(
        store, pub, PrivImageConfig.tiny(4.0, DELTA, selection="none", finetune_epochs=2.0)
    )
    follower, errors = _follow(port, nodes.plan_fingerprint(other))
    with pytest.raises(PrivReleaseError, match="runs a different plan of this release") as exc:
        _run(store, sens, pub, cfg, tmp_path / "w", 1, plan=None, nodes=_host(port, 0))
    assert "Nothing was charged" in str(exc.value)
    follower.join(120)
    assert len(errors) == 1 and "different plan" in str(errors[0])
    assert ledger.get_charge(store, "r") is None and ledger.budget(store, "mnist").charges == []
    assert step_counter.started(tmp_path / "w") == 0


@pytest.mark.slow
def test_a_host_that_cannot_run_the_release_tells_the_coordinator(data, tmp_path: Path) -> None:
    """A follower whose workspace has no approved release REL joins only to refuse: the coordinator
    stops at once with its reason, before reserving."""
    from release import manager

    sens, pub = data
    store, port = _store(tmp_path / "ws", sens), _free_port()
    elsewhere = Workspace(tmp_path / "other")
    elsewhere.init()
    follower, errors = _in_thread(manager.follow_release, Store(elsewhere), "r", _host(port, 1))
    with pytest.raises(PrivReleaseError, match="host .* refuses: .*r") as exc:
        _run(
            store,
            sens,
            pub,
            PrivImageConfig.tiny(4.0, DELTA, selection="none"),
            tmp_path / "w",
            1,
            nodes=_host(port, 0),
        )
    assert "Nothing was charged" in str(exc.value)
    follower.join(120)
    assert len(errors) == 1 and ledger.get_charge(store, "r") is None


@pytest.mark.slow
def test_release_run_on_two_hosts_through_the_cli(store: Store, tmp_path: Path) -> None:
    """`privrelease release run REL --nnodes 2 --rdzv HOST:PORT` on two "hosts" (the second a
    separate process reading the same workspace): one charge, the release's files written by the
    coordinator alone, nothing left behind by the follower."""
    import subprocess
    import sys

    from typer.testing import CliRunner

    from release import artifacts, keys, manager
    from release.cli import app
    from release.data import register_from_source
    from release.spec import ReleaseSpec

    train = load_source("builtin:mnist5k")
    idx = np.random.default_rng(0).choice(len(train), 120, replace=False)
    np.savez(tmp_path / "train.npz", images=train.images[idx], labels=train.labels[idx])
    keys.create_identity(store, "alice", "steward")
    keys.ensure_release_key(store.workspace)
    register_from_source(
        store, "digits", str(tmp_path / "train.npz"), epsilon_cap=10.0, delta_cap=1e-4, labels="0-9"
    )
    spec = {
        "release": {"dataset": "digits", "mechanism": "privimage", "n_images": 20},
        "privimage": {
            "epsilon": 6.0,
            "preset": "tiny",
            "public": "builtin:uci-digits",
            "selection": "none",
        },
        "policy": {
            "mia_samples": 20,
            "feature_samples": 40,
            "fid_samples": 40,
            "utility_train_samples": 60,
            "cnn_epochs": 1,
            "min_utility_gain": None,
        },
    }
    rel = manager.create_plan(store, ReleaseSpec.from_dict(spec), "alice")
    manager.approve(store, rel.release_id, "alice", digest=rel.plan_digest)
    port, scratch = _free_port(), tmp_path / "follower-tmp"
    scratch.mkdir()
    command = ["--workspace", str(store.workspace.root), "release", "run", rel.release_id]
    command += ["--nnodes", "2", "--rdzv", f"127.0.0.1:{port}"]
    follower = subprocess.Popen(
        [sys.executable, "-m", "release.entry", *command, "--node-rank", "1"],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "TMPDIR": str(scratch)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        r = CliRunner().invoke(app, [*command, "--node-rank", "0", "--as", "alice"])
        out, _ = follower.communicate(timeout=180)
    finally:
        follower.kill()
    assert r.exit_code == 0, r.output
    assert follower.returncode == 0 and "this host's part" in out, out
    (charge,) = ledger.budget(store, "digits").charges  # charged once, by the coordinator
    assert charge.state == "committed"
    assert list(charge.charged_events) == [event_from_json(e) for e in rel.plan.events]
    assert manager.get_release(store, rel.release_id).state == "checked"
    assert (artifacts.release_dir(store, rel.release_id) / "work" / "dist_nodes.log").exists()
    assert list(scratch.iterdir()) == []  # the follower's private folder is gone, nothing else


@pytest.mark.slow
def test_a_killed_host_leaves_the_charge_in_force_and_the_hosts_resume_from_the_checkpoint(
    data, tmp_path: Path
) -> None:
    """The follower's process is killed mid-DP-SGD: the run fails with its reservation in force;
    the same command on both hosts again resumes from the coordinator's checkpoint (sent to the
    follower, whose ranks would otherwise start over and fall out of lockstep), lost steps charged
    again."""
    sens, pub = data
    cfg = PrivImageConfig.tiny(4.0, DELTA, selection="none", finetune_epochs=2.0)
    store, wd = _store(tmp_path / "ws", sens), tmp_path / "w"
    plan = _plan(store, pub, cfg)
    killed: list[int] = []

    def kill_follower(stage: str, done: int, total: int) -> None:
        if stage == "DP fine-tuning" and done == 5 and not killed:
            for pid, _ in _worker_pids("privrelease-follower-"):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    port = _free_port()
    follower, errors = _follow(port, nodes.plan_fingerprint(plan))
    with pytest.raises(PrivReleaseError, match="failed during finetune_sample"):
        _run(store, sens, pub, cfg, wd, 1, plan=plan, progress=kill_follower, nodes=_host(port, 0))
    follower.join(120)
    assert killed and len(errors) == 1
    started, (planned,) = step_counter.started(wd), plan.events
    assert 5 <= started < planned.steps
    assert ledger.get_charge(store, "r").state == "reserved"  # in full until settled
    ckpt_step = state.load_torch(wd / state.FINETUNE)["step"]
    assert 0 < ckpt_step <= started
    port = _free_port()
    follower, errors = _follow(port, nodes.plan_fingerprint(plan))
    _, res = _run(store, sens, pub, cfg, wd, 1, plan=plan, nodes=_host(port, 0))
    follower.join(120)
    assert errors == []
    main = ledger.get_charge(store, "r")
    redo = [c for c in ledger.budget(store, "mnist").charges if c.run_id.startswith("r:redo-")]
    assert main.state == "committed" and list(main.charged_events) == list(plan.events)
    assert [c.charged_events[0].steps for c in redo] == (
        [started - ckpt_step] if started > ckpt_step else []
    )
    total = sum(e.steps for c in [main, *redo] for e in c.charged_events)
    assert total == step_counter.started(wd) >= planned.steps
    assert res.images.shape == (20, 28, 28)
