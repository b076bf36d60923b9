"""The command line as a user runs it: tables for people, --json for machines, one clear error line."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from accounting.epsilon import epsilon_pld, epsilon_rdp
from accounting.errors import BudgetExceededError, InvalidParameterError, UnknownDatasetError
from accounting.events import DpSgd
from release.cli import app

runner = CliRunner()


def cli(ws, *args):
    return runner.invoke(app, ["--workspace", str(ws), *args], catch_exceptions=True)


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    assert cli(root, "init", "--steward", "alice").exit_code == 0
    r = cli(
        root,
        "dataset",
        "register",
        "mnist",
        "--source",
        "builtin:mnist5k",
        "--epsilon",
        "3",
        "--delta",
        "1e-5",
        "--as",
        "alice",
    )
    assert r.exit_code == 0, r.output
    return root


def test_budget_plan_json_keys_and_values(ws):
    r = cli(
        ws,
        "budget",
        "plan",
        "--sigma",
        "1.0",
        "--sample-rate",
        "0.01",
        "--steps",
        "1000",
        "--delta",
        "1e-5",
        "--json",
    )
    out = json.loads(r.output)
    assert {"epsilon_rdp", "epsilon_pld", "sigma"} <= set(out)
    assert out["epsilon_rdp"] == pytest.approx(epsilon_rdp([DpSgd(0.01, 1.0, 1000)], 1e-5))
    assert out["epsilon_pld"] == pytest.approx(epsilon_pld([DpSgd(0.01, 1.0, 1000)], 1e-5))


def test_budget_plan_sigma_for_epsilon_composed_with_dataset(ws):
    r = cli(
        ws,
        "budget",
        "plan",
        "--epsilon",
        "2",
        "--sample-rate",
        "0.01",
        "--steps",
        "500",
        "--dataset",
        "mnist",
        "--json",
    )
    out = json.loads(r.output)
    assert out["epsilon_rdp"] <= 2.0 and out["fits_cap"] and out["delta"] == 1e-5


def test_budget_show_and_ledger(ws):
    r = cli(ws, "budget", "show", "mnist", "--json")
    out = json.loads(r.output)
    assert out["epsilon_cap"] == 3 and out["spent_epsilon_rdp"] == 0 and out["charges"] == []
    assert "Ledger" in cli(ws, "ledger", "show").output
    assert "mnist" in cli(ws, "dataset", "list").output


def test_bad_numbers_and_unknown_dataset_are_user_errors(ws):
    r = cli(
        ws,
        "budget",
        "plan",
        "--sigma",
        "nan",
        "--sample-rate",
        "0.01",
        "--steps",
        "10",
        "--delta",
        "1e-5",
    )
    assert isinstance(r.exception, InvalidParameterError)
    r = cli(
        ws,
        "budget",
        "plan",
        "--sigma",
        "1",
        "--sample-rate",
        "1.5",
        "--steps",
        "10",
        "--delta",
        "1e-5",
    )
    assert isinstance(r.exception, InvalidParameterError)
    r = cli(ws, "budget", "show", "nope")
    assert isinstance(r.exception, UnknownDatasetError)
    r = cli(
        ws,
        "budget",
        "plan",
        "--epsilon",
        "5",
        "--sample-rate",
        "0.01",
        "--steps",
        "10",
        "--dataset",
        "mnist",
        "--json",
    )
    out = json.loads(r.output)  # a what-if above the cap is answered, and says it does not fit
    assert r.exit_code == 0 and out["fits_cap"] is False and out["epsilon_rdp"] > out["epsilon_cap"]


def test_synth_is_a_preview_that_reads_no_data_and_spends_nothing(ws, tmp_path):
    import numpy as np

    from accounting import ledger
    from accounting.store import Store
    from synth.kinds.datasets import load_source

    d = load_source("builtin:mnist5k")
    path = tmp_path / "user.npz"
    np.savez(path, images=d.images[:200], labels=d.labels[:200])
    r = cli(
        ws,
        "dataset",
        "register",
        "user",
        "--source",
        str(path),
        "--epsilon",
        "3",
        "--delta",
        "1e-5",
        "--labels",
        "0-9",
        "--as",
        "alice",
    )
    assert r.exit_code == 0, r.output
    path.unlink()  # the sensitive data is gone: a preview must not need it

    def preview(*extra: str):
        return cli(
            ws,
            "synth",
            "privimage",
            "--dataset",
            "user",
            "--epsilon",
            "2",
            "--preset",
            "tiny",
            "--public",
            "builtin:uci-digits",
            "--k",
            "1",
            *extra,
        )

    spec = tmp_path / "spec.toml"
    r = preview("--write-spec", str(spec))
    assert r.exit_code == 0, r.output
    assert "nothing was read or charged" in r.output and "privrelease release plan" in r.output
    # its choices, in words, before anything is approved (auto's decisions marked as auto's)
    assert "choice: pre-training data: the 1 public classes nearest" in r.output
    assert "choice: central images:" in r.output and "choice: DP-SGD:" in r.output
    varied = tmp_path / "varied.toml"
    r = preview("--release-variations", "1", "--write-spec", str(varied))
    assert r.exit_code == 0 and "release_variations = 1" in varied.read_text(), r.output
    r = preview("--release-variations", "16")
    assert r.exit_code != 0 and "release_variations must be" in str(r.exception)
    half = tmp_path / "half.toml"
    r = preview("--precision", "float32", "--write-spec", str(half))
    assert r.exit_code == 0 and 'precision = "float32"' in half.read_text(), r.output
    r = preview("--precision", "fp16")
    assert r.exit_code != 0 and "precision must be one of" in str(r.exception)
    r = cli(ws, "synth", "ksalsa", "--dataset", "user", "--k", "5", "--preset", "tiny")
    assert r.exit_code == 0, r.output
    labelled = tmp_path / "merf.toml"
    r = cli(
        ws,
        *("synth", "merf", "--dataset", "user", "--epsilon", "2", "--teacher-labels"),
        *("--write-spec", str(labelled)),
    )
    assert r.exit_code == 0 and "teacher_labels = true" in labelled.read_text(), r.output
    assert "DP-SGD" in r.output  # the classifier's event is previewed beside the query
    r = cli(
        ws,
        *("synth", "merf", "--dataset", "user", "--epsilon", "2", "--no-teacher-labels"),
        *("--write-spec", str(labelled)),
    )
    assert r.exit_code == 0 and "teacher_labels = false" in labelled.read_text(), r.output
    assert "DP-SGD" not in r.output
    merf = ("synth", "merf", "--dataset", "user", "--epsilon", "2")
    r = cli(ws, *merf, "--perceptual-share", "0", "--write-spec", str(labelled))
    assert r.exit_code == 0 and "perceptual_share = 0.0" in labelled.read_text(), r.output
    # the steward sees the plan's choices before approving: set ones plainly, auto's as auto's
    assert "choice: perceptual features: off (pixels only)\n" in r.output
    assert "choice: kernel:" in r.output and "choice: DP labels:" in r.output
    r = cli(ws, *merf, "--perceptual-share", "auto", "--write-spec", str(labelled))
    assert r.exit_code == 0 and 'perceptual_share = "auto"' in labelled.read_text(), r.output
    r = cli(ws, *merf, "--perceptual-share", "lots")
    assert r.exit_code != 0 and "not a number" in r.output
    r = cli(ws, *merf, "--perceptual-share", "1e308")
    assert r.exit_code != 0 and "perceptual_share must be" in str(r.exception)
    r = cli(ws, *merf, "--steps", "3000", "--write-spec", str(labelled))
    assert r.exit_code == 0 and "steps = 3000" in labelled.read_text(), r.output
    assert "choice: generator: 3000 updates\n" in r.output  # set, so not "chosen by auto"
    r = cli(ws, *merf, "--write-spec", str(labelled))  # no --steps: the plan decides
    assert r.exit_code == 0 and "steps" not in labelled.read_text(), r.output
    assert "updates; chosen by auto" in r.output
    r = cli(ws, *merf, "--steps", "many")
    assert r.exit_code != 0 and "not a whole number" in r.output
    r = cli(ws, *merf, "--steps", "0")
    assert r.exit_code != 0 and "steps must be" in str(r.exception)
    store = Store(ws)
    assert (
        ledger.budget(store, "user").charges == [] and ledger.budget(store, "mnist").charges == []
    )
    assert store.query("SELECT * FROM releases") == []
    # the written spec goes through the lifecycle: a plan, which a steward must approve before it runs
    r = cli(ws, "release", "plan", str(spec), "--json", "--as", "alice")
    assert r.exit_code == 0, r.output
    rid = json.loads(r.stdout)["release_id"]  # JSON alone on stdout; progress on stderr
    assert "plan: epsilon before and after (RDP, PLD): 2/2 (100%" in r.stderr
    r = cli(ws, "release", "run", rid, "--as", "alice")
    assert r.exit_code != 0 and "planned" in str(r.exception)
    assert ledger.budget(store, "user").charges == []


def test_audit_verify_detects_tampering(ws, tamper):
    r = cli(ws, "audit", "verify", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["ok"]
    tamper(ws / "store.duckdb", "UPDATE audit_trail SET actor = 'mallory'")
    r = cli(ws, "audit", "verify")
    assert r.exit_code == 1 and "BROKEN" in r.output


def test_errors_print_one_message_and_exit_2(tmp_path):
    env = {**os.environ, "PRIVRELEASE_HOME": str(tmp_path / "missing")}
    p = subprocess.run(
        [sys.executable, "-m", "release.cli", "dataset", "list"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert p.returncode == 2
    assert "privrelease init" in p.stderr and "Traceback" not in p.stderr


# Slow since issue 63 (end to end: a plan's bisection through the CLI; fast:
# tests/release/test_bad_sources.py::test_paths_with_brackets_are_shown_verbatim)
@pytest.mark.slow
def test_text_in_square_brackets_reaches_the_steward_verbatim(ws, tmp_path):
    """Rich reads [..] as markup: a warning naming the spec's [privimage] table, or a reason a person typed, lost
    its brackets (regression)."""
    spec = tmp_path / "at-cap.toml"
    spec.write_text(
        '[release]\ndataset = "mnist"\nmechanism = "privimage"\nn_images = 100\n\n'
        '[privimage]\nepsilon = 3.0\npreset = "tiny"\npublic = "builtin:uci-digits"\n'
    )
    r = cli(ws, "release", "plan", str(spec), "--as", "alice")
    # at the cap: refused at plan time (issue 57), naming the target that fits (the error's
    # printing escapes brackets: release.cli.main)
    assert isinstance(r.exception, BudgetExceededError), r.output
    refusal = str(r.exception)
    assert "its plan will be refused" in refusal and "in the spec's [privimage] table" in refusal
    assert "Nothing was planned or stored" in refusal
    text = " ".join(r.output.split())
    # progress while it calibrates, readable in a log: each stage reaches its total (issue 36)
    for stage in (
        "public data and mechanism: 1/1",
        "calibrating the noise",
        "largest target that fits: 8/8",
    ):
        assert f"plan: {stage}" in text
    assert any(
        line.strip().startswith("plan: calibrating the noise:") and "(100%" in line
        for line in r.output.splitlines()
    )
    spec.write_text(spec.read_text().replace("epsilon = 3.0", "epsilon = 1.0"))
    r = cli(ws, "release", "plan", str(spec), "--as", "alice")
    assert r.exit_code == 0, r.output
    release_id = " ".join(r.output.split()).split("Release ")[1].split()[0]
    r = cli(
        ws,
        "release",
        "reject",
        release_id,
        "--reason",
        "[bold]cap[/bold] too tight",
        "--as",
        "alice",
    )
    assert r.exit_code == 0 and "[bold]cap[/bold] too tight" in r.output


def test_write_spec_names_the_heldout_data_the_audit_needs(ws, tmp_path):
    """Issue 36: `synth ksalsa --write-spec` left out `heldout`, which the audit of user data needs."""
    import tomllib

    import numpy as np

    from synth.kinds.datasets import load_source

    d = load_source("builtin:mnist5k")
    np.savez(tmp_path / "user.npz", images=d.images[:60], labels=d.labels[:60])
    np.savez(tmp_path / "heldout.npz", images=d.images[60:90], labels=d.labels[60:90])
    r = cli(
        ws,
        "dataset",
        "register",
        "user",
        "--source",
        str(tmp_path / "user.npz"),
        "--epsilon",
        "3",
        "--delta",
        "1e-5",
        "--labels",
        "0-9",
        "--as",
        "alice",
    )
    assert r.exit_code == 0, r.output
    spec = tmp_path / "k.toml"

    def written(dataset: str, *extra: str) -> tuple[dict, str]:
        r = cli(
            ws,
            "synth",
            "ksalsa",
            "--dataset",
            dataset,
            "--k",
            "5",
            "--preset",
            "tiny",
            "--write-spec",
            str(spec),
            *extra,
        )
        assert r.exit_code == 0, r.output
        return tomllib.loads(spec.read_text())["release"], " ".join(r.output.split())

    release, out = written("user")
    assert "heldout" not in release and "no held-out data" in out and "--heldout PATH" in out
    release, out = written("user", "--heldout", str(tmp_path / "heldout.npz"))
    assert (
        release["heldout"] == str((tmp_path / "heldout.npz").resolve())
        and "no held-out data" not in out
    )
    release, _ = written("mnist")  # a built-in: its own split, written out
    assert release["heldout"] == "builtin:mnist5k-heldout"
    r = cli(
        ws,
        "synth",
        "privimage",
        "--dataset",
        "user",
        "--epsilon",
        "2",
        "--preset",
        "tiny",
        "--heldout",
        str(tmp_path / "missing.npz"),
        "--write-spec",
        str(spec),
    )
    assert r.exit_code != 0 and "no such file or folder" in str(r.exception)
