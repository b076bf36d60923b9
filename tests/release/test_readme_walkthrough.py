"""README.md's walkthrough ("A release, step by step"), run as written.

Every fenced `bash` block of that section is split into commands, which run in order in one throwaway directory
as a user would type them, with `privrelease` on PATH running this tree's CLI. Only the placeholders the README
tells the reader to fill in (REL, DIGEST: printed by `release plan`) are replaced. The fast tests check that each
command names a real subcommand and real options and run the commands up to the plan; the slow one runs them all.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## A release, step by step"
PLACEHOLDERS = ("REL", "DIGEST")


def walkthrough_blocks(readme: str) -> list[str]:
    """The fenced bash blocks of the walkthrough section, in order."""
    if SECTION not in readme:
        raise AssertionError(f"README.md has no {SECTION!r} section")
    section = readme.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def split_commands(block: str) -> list[str]:
    """One command per line; a heredoc keeps its body, a trailing backslash its continuation; comments and blank
    lines between commands are dropped."""
    lines, commands, i = block.splitlines(), [], 0
    while i < len(lines):
        cmd = lines[i]
        i += 1
        if not cmd.strip() or cmd.lstrip().startswith("#"):
            continue
        while cmd.rstrip().endswith("\\") and i < len(lines):
            cmd, i = cmd + "\n" + lines[i], i + 1
        heredoc = re.search(r"<<-?\s*'?(\w+)'?", cmd)
        if heredoc:
            while True:
                if i >= len(lines):
                    raise AssertionError(f"unterminated heredoc in README command: {cmd!r}")
                cmd, i = cmd + "\n" + lines[i], i + 1
                if lines[i - 1].strip() == heredoc.group(1):
                    break
        commands.append(cmd)
    return commands


def walkthrough_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return [c for block in walkthrough_blocks(readme) for c in split_commands(block)]


def privrelease_argv(command: str) -> list[list[str]]:
    """The argument lists of the `privrelease` invocations in a command line (not inside a heredoc body)."""
    first_line = command.splitlines()[0]
    out = []
    for part in re.split(r"&&|\|\||;|\|", first_line.split(" #", 1)[0]):
        words = part.split()
        if "privrelease" in words:
            out.append(words[words.index("privrelease") + 1 :])
    return out


class Shell:
    """Commands run one at a time by bash in `workdir`, keeping the working directory and exported variables from
    one command to the next, as one interactive shell would."""

    def __init__(self, workdir: Path, bindir: Path) -> None:
        self.state, self.cwd_file, self.env_file = (
            workdir.parent / "shell",
            workdir.parent / "shell/cwd",
            workdir.parent / "shell/env",
        )
        self.state.mkdir()
        self.cwd_file.write_text(str(workdir))
        self.env_file.write_text("")
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PRIVRELEASE_ACTOR", "PRIVRELEASE_HOME", "VIRTUAL_ENV")
        }
        self.env.update(
            PATH=f"{bindir}{os.pathsep}{self.env.get('PATH', '')}",
            HF_HOME=str(workdir.parent / "hf"),
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            PRIVRELEASE_HOME=str(workdir / ".privrelease"),
        )
        # beside other pytest workers, torch's default threads oversubscribe the cores and crawl
        self.env.setdefault("OMP_NUM_THREADS", "1")

    def run(self, command: str, timeout: float) -> subprocess.CompletedProcess:
        script = (
            f'set -e\ncd "$(cat {self.cwd_file})"\n. {self.env_file}\n{command}\n'
            f"pwd > {self.cwd_file}\nexport -p > {self.env_file}\n"
        )
        return subprocess.run(
            ["bash", "-c", script], env=self.env, capture_output=True, text=True, timeout=timeout
        )


def make_bin(bindir: Path) -> Path:
    """`privrelease` and `python` as a user of this checkout has them (the console script may point elsewhere)."""
    bindir.mkdir()
    scripts = {
        "privrelease": f'PYTHONPATH="{ROOT}" exec "{sys.executable}" -m release.entry "$@"',
        "python": f'exec "{sys.executable}" "$@"',
    }
    for name, line in scripts.items():
        path = bindir / name
        path.write_text(f"#!/bin/sh\n{line}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bindir


def fill(command: str, values: dict[str, str]) -> str:
    for name in PLACEHOLDERS:
        if re.search(rf"\b{name}\b", command):
            assert name in values, f"README uses {name} before any command printed it: {command!r}"
            command = re.sub(rf"\b{name}\b", values[name], command)
    return command


def capture(output: str, values: dict[str, str]) -> None:
    """The placeholders' values, from `release plan`'s output as the README describes it."""
    text = re.sub(r"\s+", " ", output)  # rich wraps long lines
    if m := re.search(r"Release (rel-[0-9a-f]+) \(planned\)", text):
        values["REL"] = m.group(1)
    if m := re.search(r"plan digest: ([0-9a-f]{64})", text):
        values["DIGEST"] = m.group(1)


# ----------------------------------------------------------------------------------------------- fast tests


def test_walkthrough_has_every_role_and_only_known_placeholders():
    commands = walkthrough_commands()
    invoked = [" ".join(a[:2]) for c in commands for a in privrelease_argv(c)]
    for needed in (
        "init --steward",
        "keys create",
        "dataset register",
        "release plan",
        "release approve",
        "release run",
        "release publish",
        "audit report",
        "budget verify",
        "audit verify",
        "verify",
    ):
        assert any(i.startswith(needed) for i in invoked), (
            f"the walkthrough lost `privrelease {needed}`"
        )
    # the issue-36 trap: `audit report` with no --as must follow an exported PRIVRELEASE_ACTOR
    report = next(i for i, c in enumerate(commands) if "audit report" in c)
    assert "--as" in commands[report] or any(
        "export PRIVRELEASE_ACTOR=" in c for c in commands[:report]
    )
    capitals = {
        w for c in commands for w in re.findall(r"\b[A-Z]{3,}\b", c.splitlines()[0].split(" #")[0])
    }
    assert capitals <= set(PLACEHOLDERS) | {"TOML", "PY", "PRIVRELEASE_ACTOR"}, capitals - set(
        PLACEHOLDERS
    )


def test_split_commands_keeps_heredocs_and_continuations():
    block = "a --x 1   # note\n\n# comment\ncat > f <<'EOF'\nline\nEOF\nb \\\n  --y\n"
    assert split_commands(block) == [
        "a --x 1   # note",
        "cat > f <<'EOF'\nline\nEOF",
        "b \\\n  --y",
    ]


def help_text(path: list[str], capsys) -> str:
    """`privrelease PATH --help`, failing the test if PATH is not a command."""
    if path == ["verify"]:  # the executable dispatches it to release.verify_cmd before typer
        from release.verify_cmd import main as verify_main

        with pytest.raises(SystemExit) as done:
            verify_main(["--help"])
        assert done.value.code == 0
        return capsys.readouterr().out
    from release.cli import app

    r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, f"`privrelease {' '.join(path)}` is not a command: {r.output}"
    return r.output


def check_invocation(argv: list[str], capsys) -> None:
    """The command named by `argv` (the words after `privrelease`) exists and takes every --option in it."""
    words = [w for w in argv if not w.startswith("-")]
    path = words[:1] if words[0] in ("init", "dashboard", "verify") else words[:2]
    text = help_text(path, capsys)
    for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", " ".join(argv)):
        assert re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text), (
            f"`privrelease {' '.join(path)}` has no option {opt}"
        )


def test_every_walkthrough_command_and_option_exists(capsys):
    """Each `privrelease` invocation names a real command, and each of its --options is one that command takes."""
    invocations = [argv for command in walkthrough_commands() for argv in privrelease_argv(command)]
    assert len(invocations) >= 12
    for argv in invocations:
        check_invocation(argv, capsys)


def cli_reference_invocations(readme: str) -> list[list[str]]:
    """The commands of the CLI reference table: `privrelease a b ...` / `c d ...` (same program) per row."""
    section = readme.split("## CLI reference", 1)[1].split("\n## ", 1)[0]
    out = []
    for row in re.findall(r"^\| `privrelease (.+?)` \|", section, re.M):
        for alternative in re.split(r"` / `", row.replace("\\|", "|")):
            out.append(alternative.replace("privrelease ", "", 1).split())
    return out


def test_every_cli_reference_command_and_option_exists(capsys):
    invocations = cli_reference_invocations((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(invocations) >= 30
    for argv in invocations:
        check_invocation(argv, capsys)


def test_the_cli_check_catches_a_wrong_option(capsys):
    check_invocation(["release", "approve", "REL", "--digest", "D"], capsys)
    with pytest.raises(AssertionError, match="has no option --digets"):
        check_invocation(["release", "approve", "REL", "--digets", "D"], capsys)
    with pytest.raises(AssertionError, match="is not a command"):
        check_invocation(["release", "aprove", "REL"], capsys)


def test_walkthrough_spec_is_a_valid_release_spec(tmp_path):
    """The spec the README writes parses, and names the preset that keeps the walkthrough short."""
    from release.spec import ReleaseSpec

    heredoc = next(c for c in walkthrough_commands() if "release.toml <<" in c)
    body = "\n".join(heredoc.splitlines()[1:-1])
    (tmp_path / "release.toml").write_text(body)
    spec = ReleaseSpec.from_toml(tmp_path / "release.toml")
    assert spec.mechanism == "privimage" and spec.preset == "tiny"


def test_walkthrough_setup_commands_run(tmp_path):
    """The steward's commands up to the plan (seconds), exactly as written."""
    work = tmp_path / "work"
    work.mkdir()
    shell, values = Shell(work, make_bin(tmp_path / "bin")), {}
    for command in walkthrough_commands():
        if "release plan" in command:
            break
        r = shell.run(fill(command, values), timeout=300)
        assert r.returncode == 0, f"README command failed: {command}\n{r.stdout}\n{r.stderr}"
    assert (work / ".privrelease" / "keys" / "bob.key").exists() and (
        work / "release.toml"
    ).exists()


# ----------------------------------------------------------------------------------------------- slow test


@pytest.mark.slow
def test_whole_walkthrough_runs_as_written(tmp_path):
    """Steward, auditor and consumer: every command of the walkthrough, in order, must succeed."""
    work = tmp_path / "work"
    work.mkdir()
    shell, values, took = Shell(work, make_bin(tmp_path / "bin")), {}, []
    for command in walkthrough_commands():
        t0 = time.monotonic()
        r = shell.run(fill(command, values), timeout=1800)
        took.append((round(time.monotonic() - t0, 1), command.splitlines()[0][:60]))
        assert r.returncode == 0, (
            f"README command failed: {command}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )
        capture(r.stdout, values)
    print("\n".join(f"{t:7.1f} s  {c}" for t, c in took))
    rel = values["REL"]
    assert (work / ".privrelease" / "bundles" / f"{rel}.tar.gz").exists()
    assert (work / "consumer" / rel / "README.md").exists()  # extracted by the consumer's verify
    assert "LogisticRegression" in r.stdout  # the consumer's last command trained on the release
