"""in-toto Statement v1 listing every file of a bundle with its sha256, plus the release
predicate."""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath

from accounting.digests import file_sha256 as file_sha256
from accounting.errors import InvalidParameterError, TamperError
from release.predicate import PREDICATE_TYPE, TYPE_PREFIX, UnsupportedPredicateError, version_of

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
STATEMENT_FILE = "manifest.intoto.json"
ENVELOPE_FILE = "manifest.dsse.json"
MANIFEST_FILES = (STATEMENT_FILE, ENVELOPE_FILE)
_HEX64 = re.compile(r"[0-9a-f]{64}")


def tool_info() -> dict:
    from importlib import metadata  # not at import time: verification should start fast

    try:
        version = metadata.version("privrelease")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"name": "privrelease", "version": version}


def bundle_files(root: Path) -> list[str]:
    """Relative POSIX paths of the regular files under `root` (no links followed), manifest files
    excluded."""
    names = []
    for p in sorted(Path(root).rglob("*")):
        if p.is_file() and not p.is_symlink():
            rel = p.relative_to(root).as_posix()
            if rel not in MANIFEST_FILES:
                names.append(rel)
    return names


def build_statement(root: Path, predicate: dict) -> dict:
    """The Statement for the bundle directory `root`: one subject per file, sorted by name."""
    if not isinstance(predicate, dict):
        raise InvalidParameterError("The release predicate must be a dict (JSON object).")
    subjects = [
        {"name": n, "digest": {"sha256": file_sha256(Path(root) / n)}} for n in bundle_files(root)
    ]
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


def statement_bytes(statement: dict) -> bytes:
    """Deterministic JSON (sorted keys, fixed layout); refuses NaN/inf, which JSON cannot carry."""
    try:
        text = json.dumps(statement, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
    except ValueError as e:
        raise InvalidParameterError(
            f"The release predicate holds a NaN or infinite number ({e}); every figure in a "
            "manifest must be finite."
        ) from None
    except TypeError as e:
        raise InvalidParameterError(
            f"The release predicate is not plain JSON data ({e}); convert numpy values and paths "
            "to int/float/str first."
        ) from None
    return (text + "\n").encode("utf-8")


def safe_member_name(name: object) -> bool:
    """A relative path inside the bundle: no absolute path, no '..', no backslashes or empty
    parts."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        return False
    parts = PurePosixPath(name).parts
    return (
        not name.startswith("/")
        and all(p not in ("", ".", "..") for p in parts)
        and "/".join(parts) == name
    )


def parse_statement(payload: bytes) -> dict:
    """Parse and check the signed Statement; raises TamperError naming what is wrong."""
    where = "manifest (signed statement)"
    try:
        st = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise TamperError(f"{where}: not valid UTF-8 JSON.") from None
    if not isinstance(st, dict) or st.get("_type") != STATEMENT_TYPE:
        raise TamperError(f"{where}: not an in-toto Statement v1 (_type must be {STATEMENT_TYPE}).")
    if st.get("predicateType") != PREDICATE_TYPE:
        if isinstance(st.get("predicateType"), str) and st["predicateType"].startswith(TYPE_PREFIX):
            try:
                version_of(st["predicateType"])
            except UnsupportedPredicateError as exc:  # a privrelease predicate of another version
                raise TamperError(f"{where}: {exc}") from None
        raise TamperError(
            f"{where}: predicateType is {st.get('predicateType')!r}, expected {PREDICATE_TYPE}; "
            "this is not a privrelease release manifest."
        )
    subjects = st.get("subject")
    if not isinstance(subjects, list) or not subjects:
        raise TamperError(f"{where}: lists no subjects (files).")
    seen = set()
    for s in subjects:
        name = s.get("name") if isinstance(s, dict) else None
        digest = (
            s.get("digest", {}).get("sha256")
            if isinstance(s, dict) and isinstance(s.get("digest"), dict)
            else None
        )
        if not safe_member_name(name):
            raise TamperError(
                f"{where}: subject name {name!r} is not a plain relative path inside the bundle."
            )
        if name in MANIFEST_FILES or name in seen:
            raise TamperError(
                f"{where}: subject {name!r} is listed twice or names a manifest file."
            )
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise TamperError(f"{where}: subject {name!r} has no valid sha256 digest.")
        seen.add(name)
    if not isinstance(st.get("predicate"), dict):
        raise TamperError(f"{where}: has no release predicate.")
    return st
