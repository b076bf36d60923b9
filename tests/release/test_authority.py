"""Who may act: a private key, not a name, authorises a change; stewards are made by stewards; file modes."""

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from accounting import replay
from accounting.errors import PermissionDeniedError
from accounting.store import Store
from release import keys
from release.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def cli(ws, *args, env=None):
    return runner.invoke(
        app,
        ["--workspace", str(ws), *args],
        catch_exceptions=True,
        env={"PRIVRELEASE_ACTOR": "nobody-here", **(env or {})},
    )


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    r = cli(root, "init", "--steward", "alice")
    assert r.exit_code == 0, r.output
    assert cli(root, "keys", "create", "bob", "--role", "auditor", "--as", "alice").exit_code == 0
    assert (
        cli(root, "keys", "create", "carol", "--role", "consumer", "--as", "alice").exit_code == 0
    )
    return root


def test_authenticate_needs_the_registered_private_key(ws):
    store = Store(ws)
    assert keys.authenticate(store, "alice", "steward").name == "alice"
    with pytest.raises(PermissionDeniedError):
        keys.authenticate(store, "bob", "steward")
    with pytest.raises(keys.UnknownIdentityError):
        keys.authenticate(store, "mallory")
    alice_key = keys.private_key_path(store.workspace, "alice")
    saved = alice_key.read_bytes()
    shutil.copyfile(
        keys.private_key_path(store.workspace, "carol"), alice_key
    )  # another identity's key
    with pytest.raises(keys.KeyFileError, match="not the key registered for 'alice'"):
        keys.authenticate(store, "alice")
    alice_key.unlink()
    with pytest.raises(keys.KeyFileError, match="needs alice's private key"):
        keys.authenticate(store, "alice", "steward")
    alice_key.write_bytes(saved)
    os.chmod(alice_key, 0o600)
    assert keys.authenticate(store, "alice").name == "alice"


def test_steward_needs_an_existing_stewards_signature(ws):
    store = Store(ws)
    with pytest.raises(PermissionDeniedError, match="Only an existing steward"):
        keys.create_identity(store, "mallory", "steward")
    with pytest.raises(PermissionDeniedError):
        keys.create_identity(
            store, "mallory", "steward", endorser="bob"
        )  # an auditor cannot endorse
    dave = keys.create_identity(store, "dave", "steward", endorser="alice")
    entry = store.query(
        "SELECT payload FROM audit_trail WHERE action = 'identity.create' ORDER BY seq DESC LIMIT 1"
    )
    p = json.loads(entry[0]["payload"])
    msg = replay.endorsement_message("dave", "steward", dave.public_key)
    assert p["endorsed_by"] == "alice"
    assert keys.verify_signature(
        keys.get_identity(store, "alice").public_key, msg, bytes.fromhex(p["endorsement"])
    )


def test_cli_refuses_names_without_keys(ws):
    r = cli(ws, "keys", "create", "mallory", "--role", "steward")  # default actor is no identity
    assert r.exit_code != 0 and isinstance(r.exception, keys.UnknownIdentityError)
    r = cli(ws, "keys", "create", "mallory", "--role", "steward", "--as", "bob")
    assert isinstance(r.exception, PermissionDeniedError)
    r = cli(ws, "audit", "report", "rel-x", "--as", "nosuchuser")
    assert isinstance(r.exception, keys.UnknownIdentityError)
    r = cli(ws, "audit", "report", "rel-x", "--as", "carol")
    assert isinstance(r.exception, PermissionDeniedError)
    r = cli(
        ws,
        "dataset",
        "register",
        "m",
        "--source",
        "builtin:mnist5k",
        "--epsilon",
        "3",
        "--delta",
        "1e-5",
        "--as",
        "bob",
    )
    assert isinstance(r.exception, PermissionDeniedError)
    r = cli(ws, "keys", "password", "bob", "--as", "carol")
    assert isinstance(r.exception, PermissionDeniedError)
    (ws / "keys" / "alice.key").rename(ws.parent / "alice.key")  # alice's key taken off the machine
    r = cli(ws, "keys", "create", "mallory", "--role", "consumer", "--as", "alice")
    assert isinstance(r.exception, keys.KeyFileError)
    r = cli(ws, "audit", "checkpoint", "--as", "alice")
    assert isinstance(r.exception, keys.KeyFileError)
    assert [i.name for i in keys.list_identities(Store(ws))] == ["alice", "bob", "carol"]


def test_first_steward_only_at_init(tmp_path):
    root = tmp_path / "fresh"
    assert cli(root, "init").exit_code == 0
    r = cli(root, "keys", "create", "mallory", "--role", "steward", "--as", "mallory")
    assert isinstance(r.exception, PermissionDeniedError) and "init --steward" in str(r.exception)
    assert cli(root, "init", "--steward", "alice").exit_code == 0
    r = cli(root, "init", "--steward", "mallory")
    assert isinstance(r.exception, PermissionDeniedError)


def test_checkpoint_and_verify_on_the_command_line(ws, tmp_path):
    out = tmp_path / "pinned.json"
    r = cli(ws, "audit", "checkpoint", "--as", "alice", "--out", str(out))
    assert r.exit_code == 0, r.output
    r = cli(
        ws,
        "audit",
        "verify",
        "--json",
        "--checkpoint",
        str(out),
        "--key",
        str(ws / "keys" / "alice.pub"),
    )
    data = json.loads(r.output)
    assert (
        r.exit_code == 0
        and data["ok"]
        and data["status"] == "intact"
        and len(data["checkpoints"]) == 2
    )
    r = cli(ws, "audit", "verify", "--checkpoint", str(out), "--key", str(ws / "keys" / "bob.pub"))
    assert r.exit_code == 1 and "trusted steward key" in " ".join(r.output.split())


WRITE_ARTIFACT = """
import sys, types
import numpy as np
from pathlib import Path
from accounting.store import Store
from audit.memorisation import nn_grid
ws = Path(sys.argv[1])
Store(ws)
imgs = np.zeros((2, 8, 8), dtype=np.uint8)
real = types.SimpleNamespace(images=imgs)
nn_grid(imgs, real, None, np.arange(2), np.arange(2), None, np.zeros(2), ws / "artifacts" / "r" / "nearest_pairs.png")
"""


def test_workspace_0700_store_and_sensitive_artifacts_0600(ws):
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(ws) == 0o700 and mode(ws / "artifacts") == 0o700 and mode(ws / "bundles") == 0o700
    assert mode(ws / "store.duckdb") == 0o600 and mode(ws / "keys" / "alice.key") == 0o600
    # A process with the usual umask 022 that opens the workspace writes real-image plots 0600 (dirs 0700).
    subprocess.run(
        [sys.executable, "-c", f"import os; os.umask(0o022); exec({WRITE_ARTIFACT!r})", str(ws)],
        cwd=ROOT,
        check=True,
    )
    png = ws / "artifacts" / "r" / "nearest_pairs.png"
    assert mode(png) == 0o600 and mode(png.parent) == 0o700


def test_run_and_publish_need_the_stewards_key(ws):
    from release import manager

    store = Store(ws)
    (ws / "keys" / "alice.key").rename(ws.parent / "alice.key")
    for action in (manager.run_release, manager.publish):
        with pytest.raises(keys.KeyFileError, match="needs alice's private key"):
            action(store, "rel-anything", "alice")
    with pytest.raises(keys.KeyFileError):
        manager.audit_release(store, "rel-anything", "alice")
