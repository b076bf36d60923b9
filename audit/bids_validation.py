"""The `bids_valid` check: a released BIDS tree run through the BIDS validator, the community's
own (the `bids-validator` npm package, run by Node), as OpenNeuro validates every upload.

The validator is found as `$PRIVRELEASE_BIDS_VALIDATOR` (a path to its executable), else
`bids-validator` on the PATH, else the copy `make bids-validator` installs in this repository
(`npm ci` from requirements/npm's lock into .tools/). Its report, reduced to what it says of the
released tree (issue codes, reasons, files relative to the tree, counts: no file system
metadata), is written beside the audit's other files and shipped in the bundle.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from audit.report import CheckResult

CHECK = "bids_valid"
REPORT = "bids_validator.json"
ENV = "PRIVRELEASE_BIDS_VALIDATOR"
VERSION = "1.15.0"  # the npm package version the report was written with and the docs name
INSTALL = "make bids-validator"  # npm ci of requirements/npm/package-lock.json into .tools/
LOCAL = Path(__file__).resolve().parents[1] / ".tools/bids-validator/node_modules/.bin"
TIMEOUT_S = 600


def validator() -> str | None:
    """The validator's executable, or None when none is installed."""
    given = os.environ.get(ENV, "").strip()
    if given:
        return given if Path(given).is_file() else None
    return shutil.which("bids-validator") or (
        str(LOCAL / "bids-validator") if (LOCAL / "bids-validator").is_file() else None
    )


def bids_root(files: list[Path]) -> Path | None:
    """The tree the released files lie in (the folder above them holding
    dataset_description.json), or None for a release that is not a BIDS tree."""
    if not files:
        return None
    for parent in files[0].parents:
        if (parent / "dataset_description.json").is_file():
            return parent
    return None


def _issues(found: list[dict[str, Any]], root: Path) -> list[dict[str, Any]]:
    out = []
    for issue in found:
        files = []
        for f in issue.get("files") or []:
            file = (f or {}).get("file") or {}
            rel = file.get("relativePath") or file.get("name") or ""
            files.append({"file": str(rel).replace(str(root), ""), "reason": f.get("reason")})
        out.append(
            {
                "code": issue.get("key"),
                "severity": issue.get("severity"),
                "reason": issue.get("reason"),
                "files": files[:50],
                "count": len(issue.get("files") or []),
            }
        )
    return out


def validate(root: Path) -> dict[str, Any]:
    """The validator's verdict on the tree at `root` (raises RuntimeError when it cannot run)."""
    exe = validator()
    if exe is None:
        raise RuntimeError(
            f"the BIDS validator is not installed; install it with `{INSTALL}` (Node 18 or "
            f"later), or set {ENV} to its executable"
        )
    done = subprocess.run(
        [exe, str(root), "--json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    try:
        raw = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(
            f"the BIDS validator failed (exit {done.returncode}): {tail[0]}"
        ) from exc
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    issues = raw.get("issues") or {}
    summary = raw.get("summary") or {}
    return {
        "validator": "bids-validator",
        "version": version.stdout.strip() or "unknown",
        "errors": _issues(issues.get("errors") or [], root),
        "warnings": _issues(issues.get("warnings") or [], root),
        "summary": {
            k: summary.get(k) for k in ("subjects", "sessions", "modalities", "totalFiles")
        },
    }


def bids_check(files: list[Path], art: Path | None) -> CheckResult | None:
    """The `bids_valid` check of a release written as a BIDS tree (None for a flat one): passes
    when the validator reports no error; its reduced report kept in `art` (the bundle ships it)."""
    root = bids_root(files)
    if root is None:
        return None
    try:
        report = validate(root)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        return CheckResult(
            CHECK, "expectations", False, f"the released BIDS tree was not validated: {exc}", {}
        )
    artifacts = {}
    if art is not None:
        art.mkdir(parents=True, exist_ok=True)
        (art / REPORT).write_text(json.dumps(report, indent=2))
        artifacts["report"] = str(art / REPORT)
    errors, warnings = report["errors"], report["warnings"]
    said = "; ".join(f"{e['code']} ({e['count']} file(s)): {e['reason']}" for e in errors[:5])
    return CheckResult(
        CHECK,
        "expectations",
        not errors,
        f"bids-validator {report['version']}: {len(errors)} error(s), {len(warnings)} "
        f"warning(s) on the released tree" + (f": {said}" if said else ""),
        {
            "errors": [e["code"] for e in errors],
            "warnings": [w["code"] for w in warnings],
            "version": report["version"],
        },
        artifacts,
    )
