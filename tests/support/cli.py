"""The privrelease CLI driven as a steward drives it, for the end-to-end tests: in this process
(typer's runner), or as its own process (for tests that signal, kill or outlive it), and the
workspace with one registered dataset that most of them start from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from accounting.store import Store, Workspace
from release import keys
from release.data import register_from_source

ROOT = Path(__file__).resolve().parents[2]
ENTRY = [sys.executable, "-m", "release.entry"]


def steward_store(root: Path, dataset: str = "mnist", source: str = "builtin:mnist5k") -> Store:
    """A workspace under `root`/ws with steward alice and `source` registered as `dataset` with a
    budget of epsilon 10, delta 1e-5."""
    ws = Workspace(root / "ws")
    ws.init()
    store = Store(ws)
    keys.create_identity(store, "alice", "steward", actor="alice")
    register_from_source(store, dataset, source, 10.0, 1e-5)
    return store


def approved_merf_release(root: Path) -> tuple[Store, str]:
    """steward_store(root) with a tiny DP-MERF release of 20 images planned and approved."""
    from release import manager
    from release.spec import ReleaseSpec

    store = steward_store(root)
    spec = {
        "release": {"dataset": "mnist", "mechanism": "merf", "n_images": 20},
        "merf": {"epsilon": 4.0, "preset": "tiny", "steps": 5, "teacher_labels": False},
    }
    rel = manager.create_plan(store, ReleaseSpec.from_dict(spec), "alice")
    manager.approve(store, rel.release_id, "alice", digest=rel.plan_digest)
    return store, rel.release_id


def in_process(monkeypatch, home: Path, cache: Path) -> Callable[..., str]:
    """`run(*args, ok=True)`: the CLI in this process with PRIVRELEASE_HOME=`home`; asserts it
    succeeded (or, with ok=False, failed) and returns its output (a failure's with its error)."""
    from typer.testing import CliRunner

    from release.cli import app

    monkeypatch.setenv("PRIVRELEASE_HOME", str(home))
    monkeypatch.setenv("PRIVRELEASE_CACHE", str(cache))
    runner = CliRunner()

    def run(*args: str, ok: bool = True) -> str:
        res = runner.invoke(app, list(args))
        assert (res.exit_code == 0) == ok, res.output + repr(res.exception)
        return res.output if ok else f"{res.output}{res.exception or ''}"

    return run


def init_and_register(run: Callable[..., str], dataset: str, source: str) -> None:
    """`privrelease init` (steward alice) and `dataset register` with epsilon 10, delta 1e-5."""
    run("init", "--steward", "alice")
    run(
        *("dataset", "register", dataset, "--source", source),
        *("--epsilon", "10", "--delta", "1e-5", "--as", "alice"),
    )


def planned(run: Callable[..., str], spec: Path, toml: str, *approve: str) -> str:
    """`release plan` of the spec `toml` (written to `spec`) as alice; its release id. With
    `approve` (e.g. "--acknowledge-non-dp") also `release approve` with those flags."""
    spec.write_text(toml)
    run("release", "plan", str(spec), "--as", "alice")
    rid = json.loads(run("release", "list", "--json", "--as", "alice"))[0]["release_id"]
    if approve:
        run("release", "approve", rid, "--as", "alice", *approve)
    return rid


def process_env(home: Path, cache: Path | None = None) -> dict[str, str]:
    """The environment of a CLI process: this one's, the workspace, one thread."""
    env = {
        **os.environ,
        "PRIVRELEASE_HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "PRIVRELEASE_THREADS": "1",
    }
    if cache is not None:
        env["PRIVRELEASE_CACHE"] = str(cache)
    return env


def run_process(
    env: dict[str, str], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess:
    """The CLI as its own process, to its end."""
    return subprocess.run(
        [*ENTRY, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def as_process(env: dict[str, str]) -> Callable[..., str]:
    """`run(*args, ok=True)`: the CLI as its own process; asserts its exit status, returns its
    standard output."""

    def run(*args: str, ok: bool = True) -> str:
        done = run_process(env, *args)
        assert (done.returncode == 0) == ok, done.stdout + done.stderr
        return done.stdout

    return run


def start_process(env: dict[str, str], *args: str) -> subprocess.Popen:
    """The CLI as its own process, still running, its console (stdout and stderr) readable."""
    return subprocess.Popen(
        [*ENTRY, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def read_until(proc: subprocess.Popen, trigger: str, timeout: float = 300) -> str:
    """The process's console up to and including the first line naming `trigger` (the process
    left running); AssertionError with the console if it ends or takes longer first."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if trigger in line:
            return "".join(seen)
        assert time.monotonic() < deadline, "".join(seen)
    raise AssertionError(f"the run ended before {trigger!r}: {''.join(seen)}")
