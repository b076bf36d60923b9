"""`privrelease verify BUNDLE --key PUB`, importable without the store, the accountants, torch or
typer.

`release.entry` runs `main` directly when the command line asks for `verify`, so a consumer's check
starts in a fraction of a second (argparse here: typer's option parsing alone costs 0.4 s to
import); the full CLI registers a typer wrapper around `run`, with the same options.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from accounting.errors import PrivReleaseError

HELP = {
    "bundle": "Bundle directory or its <release>.tar.gz",
    "key": "The publisher's release public key (release.pub)",
    "extract": (
        "Also extract a verified .tar.gz into this directory (as DIR/<release>); nothing is left "
        "there if verification fails"
    ),
    "max_size": (
        "Refuse an archive that expands beyond this many bytes (default: 20x its size + 64 MiB)"
    ),
    "json": "Print the result (and the signed predicate) as JSON",
}
DOC = (
    "Verify a bundle offline: DSSE signature, every file's sha256, the release id bound to the "
    "bundle's name. Exit 1 if anything is wrong."
)


def run(
    bundle: Path,
    key: Path,
    *,
    extract: Path | None = None,
    max_size: int | None = None,
    as_json: bool = False,
) -> int:
    """Verify, print the outcome; returns the exit code (0 ok, 1 failed). Raises PrivReleaseError on
    bad input."""
    from release.verify import verify_bundle

    r = verify_bundle(bundle, key, extract_to=extract, max_bytes=max_size)
    if as_json:
        print(
            json.dumps(
                {
                    "ok": r.ok,
                    "problems": r.problems,
                    "missing": r.missing,
                    "added": r.added,
                    "altered": r.altered,
                    "checked": r.checked,
                    "key_id": r.key_id,
                    "extracted": str(r.extracted) if r.extracted else None,
                    "predicate": r.predicate,
                },
                indent=2,
                sort_keys=True,
                default=str,
            )
        )
    elif r.ok:
        p = r.predicate or {}
        print(
            f"OK: signature valid (key {r.key_id[:16]}…), "
            f"{len(r.checked)} files match the manifest."
        )
        print(
            f"  release {p.get('release_id')} of dataset {p.get('dataset_id')}: "
            f"{describe_guarantee(p.get('guarantee'))}"
        )
        if r.extracted:
            print(f"  extracted to {r.extracted}")
    else:
        print(f"VERIFICATION FAILED for {bundle}:")
        for problem in r.problems:
            print(f"  - {problem}")
    return 0 if r.ok else 1


def describe_guarantee(g: dict | None) -> str:
    """The signed guarantee in words: "(epsilon 8.000 RDP / 6.820 PLD, delta 1e-05) for the
    dataset's whole history"."""
    if not isinstance(g, dict):
        return "no guarantee stated"
    if g.get("type") == "dp" and isinstance(g.get("epsilon_rdp"), (int, float)):
        pld = g.get("epsilon_pld")
        pld_text = f" / {pld:.3f} PLD" if isinstance(pld, (int, float)) else ""
        return (
            f"(epsilon {g['epsilon_rdp']:.3f} RDP{pld_text}, delta {g.get('delta'):g})-DP for the "
            "dataset's whole history"
        )
    if g.get("type") == "k-anonymity":
        return f"k-anonymity with k = {g.get('k')}, {g.get('method')} (no differential privacy)"
    if isinstance(g.get("type"), str) and g.get("description"):  # e.g. empirical de-identification
        return f"{g['type']}: {g['description']} (no differential privacy)"
    return ", ".join(f"{k} {v}" for k, v in sorted(g.items()))


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number of bytes, got {text!r}")
    return value


def main(args: list[str]) -> None:
    """Parse the arguments that follow `verify` and run it; exits 0, 1 (verification failed) or 2
    (bad input)."""
    parser = argparse.ArgumentParser(prog="privrelease verify", description=DOC)
    parser.add_argument("bundle", type=Path, help=HELP["bundle"])
    parser.add_argument("--key", type=Path, required=True, help=HELP["key"])
    parser.add_argument("--extract", type=Path, default=None, metavar="DIR", help=HELP["extract"])
    parser.add_argument(
        "--max-size", type=_positive, default=None, metavar="BYTES", help=HELP["max_size"]
    )
    parser.add_argument("--json", action="store_true", dest="as_json", help=HELP["json"])
    ns = parser.parse_args(args)
    try:
        code = run(ns.bundle, ns.key, extract=ns.extract, max_size=ns.max_size, as_json=ns.as_json)
    except PrivReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code)
