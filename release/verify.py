"""Offline verification of a bundle with only the bundle (directory or .tar.gz) and the release public key.

Checks the DSSE signature over the in-toto statement (payload type included), that
manifest.intoto.json is exactly the signed statement, and every file's sha256; names each file that
is missing, added or altered. Archives are extracted with tarfile's "data" filter after refusing
absolute paths, '..', links and devices, so a hostile archive cannot write outside a temp dir.
"""
from __future__ import annotations

import os
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from accounting.errors import PrivReleaseError, TamperError
from release import dsse
from release.keys import key_id, load_public_key
from release.manifest import ENVELOPE_FILE, MANIFEST_FILES, STATEMENT_FILE, file_sha256, parse_statement

REFETCH = dsse.REFETCH


@dataclass
class VerificationResult:
    ok: bool
    problems: list[str]
    statement: dict | None          # the signed statement, once its signature verified
    bundle: Path | None = None      # what was checked (directory or tarball)
    key_id: str = ""                # id of the public key used
    checked: list[str] = field(default_factory=list)   # files whose digest matched
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    altered: list[str] = field(default_factory=list)

    @property
    def predicate(self) -> dict | None:
        return self.statement.get("predicate") if self.statement else None


def verify_bundle(path: Path, public_key_path: Path) -> VerificationResult:
    """Verify a bundle directory or `.tar.gz` against the publisher's Ed25519 public key (PEM file)."""
    path = Path(path)
    key = load_public_key(Path(public_key_path))  # a missing/invalid key file is the caller's error: raises
    kid = key_id(key)
    if not path.exists():
        raise PrivReleaseError(f"No bundle at {path}: give the bundle directory or its .tar.gz.")
    if path.is_dir():
        result = _verify_dir(path, key)
    else:
        with tempfile.TemporaryDirectory(prefix="privrelease-verify-") as tmp:
            root, problems = _extract(path, Path(tmp))
            result = _verify_dir(root, key) if root is not None else VerificationResult(False, problems, None)
    result.bundle, result.key_id = path, kid
    result.ok = not result.problems
    return result


def _extract(archive: Path, dest: Path) -> tuple[Path | None, list[str]]:
    """Safely extract; returns (bundle root, problems). Refuses the whole archive on any unsafe member."""
    name = archive.name
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            bad = [_unsafe(m) for m in members]
            bad = [b for b in bad if b]
            if bad:
                return None, [f"{name}: {b}; refusing to extract it. Do not use this archive; download it again "
                              "from the publisher." for b in bad]
            tar.extractall(dest, filter="data")
    except tarfile.FilterError as e:
        return None, [f"{name}: unsafe archive member ({e}); refusing to extract it. {REFETCH}"]
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        return None, [f"{name}: not a readable .tar.gz archive ({e}); it is truncated or corrupted. {REFETCH}"]
    top = list(dest.iterdir())
    # A bundle archive holds one top-level directory; a flat archive is accepted too.
    root = top[0] if len(top) == 1 and top[0].is_dir() and not top[0].is_symlink() else dest
    return root, []


def _unsafe(m: tarfile.TarInfo) -> str | None:
    n = m.name
    if n.startswith("/") or (len(n) > 1 and n[1] == ":"):
        return f"member {n!r} has an absolute path"
    if ".." in n.replace("\\", "/").split("/"):
        return f"member {n!r} contains '..' (would write outside the bundle)"
    if m.issym() or m.islnk():
        return f"member {n!r} is a link (bundles contain only regular files)"
    if not (m.isfile() or m.isdir()):
        return f"member {n!r} is a device, FIFO or other special file"
    return None


def _walk(root: Path) -> tuple[set[str], list[str]]:
    """Regular files under root (relative POSIX paths) and problems for links/special files."""
    files, problems = set(), []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for entry in dirnames + filenames:
            p = Path(dirpath) / entry
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                problems.append(f"{rel}: is a symbolic link; bundles contain only regular files. {REFETCH}")
            elif p.is_file():
                files.add(rel)
            elif not p.is_dir():
                problems.append(f"{rel}: is a special file (device, FIFO or socket). {REFETCH}")
    return files, problems


def _verify_dir(root: Path, key) -> VerificationResult:
    res = VerificationResult(False, [], None)
    env_path = root / ENVELOPE_FILE
    if not env_path.is_file() or env_path.is_symlink():
        res.problems.append(f"{ENVELOPE_FILE}: missing, so the bundle is unsigned and cannot be trusted. {REFETCH}")
        return res
    try:
        payload = dsse.verify_envelope(env_path.read_bytes(), key)
        statement = parse_statement(payload)
    except TamperError as e:
        res.problems.append(str(e))
        return res
    res.statement = statement

    stmt_path = root / STATEMENT_FILE
    if not stmt_path.is_file() or stmt_path.is_symlink():
        res.problems.append(f"{STATEMENT_FILE}: missing (listed beside the signed envelope in every bundle). "
                            f"{REFETCH}")
    elif stmt_path.read_bytes() != payload:
        res.problems.append(f"{STATEMENT_FILE}: differs from the statement signed in {ENVELOPE_FILE} (altered "
                            f"after signing). {REFETCH}")

    present, problems = _walk(root)
    res.problems += problems
    expected = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    for name in sorted(expected):
        if name not in present:
            res.missing.append(name)
            res.problems.append(f"{name}: missing (listed in the signed manifest but not in the bundle). {REFETCH}")
        elif file_sha256(root / name) != expected[name]:
            res.altered.append(name)
            res.problems.append(f"{name}: sha256 mismatch (altered after signing). {REFETCH}")
        else:
            res.checked.append(name)
    for name in sorted(present - expected.keys() - set(MANIFEST_FILES)):
        res.added.append(name)
        res.problems.append(f"{name}: not in the signed manifest (added after signing). Do not trust it; remove it "
                            "or download the bundle again from the publisher.")
    return res
