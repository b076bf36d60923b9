"""The environment against the committed lock.

`python .ci/lock_check.py LOCK MODELS_LOCK` (after `make venv` installed the lock): every
requirement of every installed distribution is met (`pip check`), except the declared requirements
of the model-file packages that are installed without them on purpose. A requirement the lock does
not meet means the lock is stale: run `make lock`.

`python .ci/lock_check.py --latest LOCK MODELS_LOCK -- PYTEST_ARGS` (`make test-latest`, in an
environment resolved from pyproject's ranges without the lock): runs pytest with PYTEST_ARGS, then
names every package whose version differs from the lock and, when tests failed, those of them that
the failures' tracebacks run through: the upstream release that broke us.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
_CHECK_LINE = re.compile(r"^(\S+) \S+ (?:requires|has requirement) ")
_SITE = re.compile(r"site-packages/([A-Za-z0-9_]+)")
# the project (installed editable) and the installer the venv came with (Python's ensurepip)
_NOT_LOCKED = {"privrelease", "pip"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(*locks: Path) -> dict[str, str]:
    """Package -> version pinned by the lock files (`name==version` lines)."""
    pins: dict[str, str] = {}
    for lock in locks:
        for line in lock.read_text().splitlines():
            match = _PIN.match(line.strip())
            if match:
                pins[canonical(match.group(1))] = match.group(2)
    return pins


def installed_versions() -> dict[str, str]:
    return {canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}


def unmet_requirements(pip_check_output: str, no_deps: set[str]) -> list[str]:
    """`pip check`'s complaints, less those about what the no-deps packages declare."""
    unmet = []
    for line in pip_check_output.splitlines():
        match = _CHECK_LINE.match(line)
        if match and canonical(match.group(1)) not in no_deps:
            unmet.append(line)
    return unmet


def drift(locked: dict[str, str], installed: dict[str, str]) -> dict[str, tuple[str | None, str]]:
    """Package -> (locked version or None, installed version), where they differ."""
    return {
        name: (locked.get(name), version)
        for name, version in sorted(installed.items())
        if name not in _NOT_LOCKED and locked.get(name) != version
    }


def suspects(failure_output: str, drifted: set[str]) -> list[str]:
    """The drifted distributions whose files the failures' tracebacks pass through, or whose name
    the failures' messages give (ours name the package when a library cannot do what we need)."""
    owners = metadata.packages_distributions()
    found: list[str] = []
    for module in dict.fromkeys(_SITE.findall(failure_output)):
        for dist in owners.get(module, [module]):
            name = canonical(dist)
            if name in drifted and name not in found:
                found.append(name)
    text = failure_output.lower()
    for name in sorted(drifted):
        if name not in found and re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text):
            found.append(name)
    return found


def check_installed(lock: Path, models_lock: Path) -> int:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False
    ).stdout
    unmet = unmet_requirements(out, set(locked_versions(models_lock)))
    if unmet:
        print("The installed lock does not meet these requirements:")
        print("\n".join(f"  {line}" for line in unmet))
        print(f"{lock} is stale against pyproject.toml: run `make lock`, `make test`, commit it.")
        return 1
    return 0


def check_latest(lock: Path, models_lock: Path, pytest_args: list[str]) -> int:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args],
        capture_output=True,
        text=True,
        check=False,
    )
    print(run.stdout[-20000:], run.stderr[-4000:], sep="\n")
    differ = drift(locked_versions(lock, models_lock), installed_versions())
    print(f"{len(differ)} package(s) differ from the lock:")
    for name, (was, now) in differ.items():
        print(f"  {name}: {was or 'not in the lock'} -> {now}")
    if run.returncode in (0, 5):
        print("test-latest: the newest releases pyproject allows pass the smoke tests.")
        return 0
    named = suspects(run.stdout + run.stderr, set(differ))
    if named:
        listed = ", ".join(f"{n} {differ[n][1]} (locked {differ[n][0]})" for n in named)
        print(f"test-latest: the smoke tests fail; the failures run through or name {listed}.")
        print("Bound it in pyproject.toml (a comment says why) or adapt the code; `make lock`.")
    else:
        print("test-latest: the smoke tests fail, through no package that differs from the lock.")
    return 1


def main(argv: list[str]) -> int:
    latest = "--latest" in argv
    args = [a for a in argv if a != "--latest"]
    pytest_args: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, pytest_args = args[:cut], args[cut + 1 :]
    lock, models_lock = (Path(a) for a in args)
    if latest:
        return check_latest(lock, models_lock, pytest_args)
    return check_installed(lock, models_lock)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
