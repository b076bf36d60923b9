"""Issue 36, item 1: who acts when a command has no --as. The default is $PRIVRELEASE_ACTOR, else the OS user
name; when that identity does not exist the error says where the name came from, which identities exist, and how
to pick one, instead of a bare "No identity named 'root'"."""

import pytest
from typer.testing import CliRunner

from release import keys
from release.cli import app

runner = CliRunner()


def cli(ws, *args, actor=None):
    env = {
        "PRIVRELEASE_ACTOR": actor,
        "LOGNAME": "os-user",
        "USER": "os-user",
        "LNAME": None,
        "USERNAME": None,
    }
    return runner.invoke(app, ["--workspace", str(ws), *args], catch_exceptions=True, env=env)


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    assert cli(root, "init", "--steward", "alice").exit_code == 0
    assert cli(root, "keys", "create", "bob", "--role", "auditor", "--as", "alice").exit_code == 0
    assert (
        cli(root, "keys", "create", "carol", "--role", "consumer", "--as", "alice").exit_code == 0
    )
    return root


def test_os_user_default_names_the_identities_and_how_to_choose(ws):
    r = cli(ws, "audit", "report", "rel-0000000000")
    assert isinstance(r.exception, keys.UnknownIdentityError)
    assert str(r.exception) == (
        "No identity named 'os-user' (your user name: no --as was given and $PRIVRELEASE_ACTOR is not set). "
        "Identities with the steward or auditor role here: alice (steward), bob (auditor). Act as one with "
        "`--as NAME`, or set it once with `export PRIVRELEASE_ACTOR=NAME`."
    )


def test_privrelease_actor_is_the_default_identity(ws):
    r = cli(ws, "audit", "report", "rel-0000000000", actor="bob")
    assert not isinstance(r.exception, keys.UnknownIdentityError)
    assert "No audit report for rel-0000000000" in r.output  # got past the identity check as bob
    r = cli(
        ws, "audit", "report", "rel-0000000000", actor="carol"
    )  # exists, wrong role: not the default's fault
    assert "carol" in str(r.exception) and "consumer" in str(r.exception)


def test_unknown_privrelease_actor_lists_the_stewards_for_a_steward_command(ws):
    r = cli(ws, "release", "publish", "rel-0000000000", actor="bobb")
    assert isinstance(r.exception, keys.UnknownIdentityError)
    assert str(r.exception).startswith(
        "No identity named 'bobb' (from $PRIVRELEASE_ACTOR). Identities with the "
        "steward role here: alice (steward). Act as one with `--as NAME`"
    )


def test_explicit_as_keeps_the_create_hint(ws):
    r = cli(ws, "audit", "report", "rel-0000000000", "--as", "dave", actor="bob")
    assert str(r.exception).startswith(
        "No identity named 'dave'. Create one with `privrelease keys create dave"
    )


def test_a_workspace_without_identities_says_how_to_make_the_first(tmp_path):
    root = tmp_path / "bare"
    assert cli(root, "init").exit_code == 0
    r = cli(root, "audit", "checkpoint")
    assert str(r.exception) == (
        "No identity named 'os-user' (your user name: no --as was given and $PRIVRELEASE_ACTOR is not set), and this "
        "workspace has no identities yet: create the first steward with `privrelease init --steward NAME`."
    )
