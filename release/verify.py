"""Offline verification of a bundle with only the bundle (directory or .tar.gz) and the release
public key.

Checks the DSSE signature over the in-toto statement (payload type included), that
manifest.intoto.json is exactly the signed statement, every file's sha256, and that the bundle's
name is the release id the statement names (a renamed bundle of another release is refused). Names
each file that is missing, added or altered.

An archive is read once, as a stream: one gzip member (anything after it is refused), tar members
hashed as they are decompressed, never written to disk unless `extract_to` is given, and then only
into a hidden staging directory that is renamed into place after everything checked out. Duplicate
members, links, devices, absolute or '..' paths, members outside the one top-level directory, data
after the end of the archive and archives that expand far beyond their compressed size are refused
from the tar headers, before their content is read.
"""

from __future__ import annotations

import hashlib
import os
import queue
import shutil
import tarfile
import tempfile
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from accounting.errors import InvalidParameterError, PrivReleaseError, TamperError
from release import dsse
from release.manifest import (
    ENVELOPE_FILE,
    MANIFEST_FILES,
    STATEMENT_FILE,
    file_sha256,
    parse_statement,
    safe_member_name,
)
from release.predicate import ReleasePredicate
from release.pubkey import load_public_key

REFETCH = dsse.REFETCH
CHUNK = 1 << 20
ARCHIVE_SUFFIX = ".tar.gz"
# Parquet of PNGs barely compresses, so a real bundle expands little; a bomb expands ~1000x.
MAX_EXPANSION = 20
EXPANSION_SLACK = 64 << 20
MANIFEST_MAX = 16 << 20  # the envelope and statement are small JSON files
TRAILER_MAX = 64 << 10  # end-of-archive blocks plus record padding


@dataclass
class VerificationResult:
    ok: bool
    problems: list[str]
    statement: dict | None  # the signed statement, once its signature verified
    bundle: Path | None = None  # what was checked (directory or tarball)
    key_id: str = ""  # securesystemslib's default keyid of the public key used
    checked: list[str] = field(default_factory=list)  # files whose digest matched
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    altered: list[str] = field(default_factory=list)
    # where the verified bundle was extracted (extract_to given, ok only)
    extracted: Path | None = None

    @property
    def predicate(self) -> dict | None:
        """The signed predicate as JSON (None until the signature verified)."""
        return self.statement.get("predicate") if self.statement else None

    @property
    def release_predicate(self) -> ReleasePredicate | None:
        """The signed predicate, typed (None until the signature verified).

        Raises:
            UnsupportedPredicateError: a predicate of another version, or not one privrelease
                publishes.
        """
        if not self.statement:
            return None
        return ReleasePredicate.from_json(
            self.statement.get("predicate"), self.statement.get("predicateType", "")
        )


def verify_bundle(
    path: Path,
    public_key_path: Path,
    *,
    extract_to: Path | None = None,
    max_bytes: int | None = None,
) -> VerificationResult:
    """Verify a bundle directory or `<release>.tar.gz` against the publisher's Ed25519 public key
    (PEM file).

    With `extract_to`, a verified archive is also extracted to `extract_to/<release>` (nothing is
    left there if verification fails). `max_bytes` bounds how far an archive may expand (default:
    20x its size plus 64 MiB).
    """
    path = Path(path)
    # a missing/invalid key file is the caller's error: raises
    key = load_public_key(Path(public_key_path))
    if not path.exists():
        raise PrivReleaseError(f"No bundle at {path}: give the bundle directory or its .tar.gz.")
    if path.is_dir():
        if extract_to is not None:
            raise InvalidParameterError(
                f"{path} is a directory; --extract applies to a .tar.gz bundle only."
            )
        result = _verify_dir(path, key)
        _check_release_id(result, path.name, path.name)
    else:
        result = _verify_archive(path, key, extract_to, max_bytes)
    result.bundle, result.key_id = path, dsse.sslib_keyid(key)
    result.ok = not result.problems
    return result


def _check_release_id(res: VerificationResult, name: str, shown: str, suffix: str = "") -> None:
    """The signed release id must be the bundle's name: a renamed bundle of another release is not
    this one."""
    if res.predicate is None:
        return
    rid = res.predicate.get("release_id")
    if not isinstance(rid, str) or not rid:
        res.problems.append(
            f"{shown}: the signed manifest names no release id, "
            f"so the bundle cannot be bound to its name. {REFETCH}"
        )
    elif rid != name:
        res.problems.append(
            f"{shown}: the signed manifest is for release {rid!r}, but the bundle "
            f"is named {name!r}: it is another release's bundle under this name, "
            f"or it was renamed. Make sure {rid!r} is the release you wanted; if "
            f"it is, rename the bundle to {rid}{suffix} and verify again."
        )


# ---------------------------------------------------------------- archives


class _OneGzipMember:
    """Readable stream of exactly one gzip member, inflated in bounded chunks by a helper thread.

    Python's gzip module silently reads on into appended members; here anything after the first
    member is kept in `trailing` (one byte suffices to prove it exists) and never decompressed.
    zlib and sha256 both release the GIL, so inflating here while the caller hashes (and writes)
    uses two cores, as `tar -xzf` does with its gzip child process.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=4)
        self._stop = threading.Event()
        self._pending = memoryview(b"")
        self._done = False
        self.trailing: bytes | None = None
        self._thread = threading.Thread(target=self._inflate, args=(raw,), daemon=True)
        self._thread.start()

    def _inflate(self, raw: IO[bytes]) -> None:
        z = zlib.decompressobj(zlib.MAX_WBITS | 16)
        try:
            while not self._stop.is_set():
                if z.eof:
                    self.trailing = z.unused_data + raw.read(1)
                    self._put(None)
                    return
                data = z.unconsumed_tail or raw.read(CHUNK)
                if not data:
                    raise EOFError("the gzip stream ends early")
                out = z.decompress(data, CHUNK)
                if out:
                    self._put(out)
        except Exception as e:  # handed to the reader, which raises it
            self._put(e)

    def _put(self, item: object) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read(self, size: int = -1) -> bytes:
        size = CHUNK if size is None or size < 0 else size
        while not self._pending:
            if self._done:
                return b""
            item = self._queue.get()
            if item is None or isinstance(item, Exception):
                self._done = True
                if item is None:
                    return b""
                raise item
            self._pending = memoryview(item)
        out, self._pending = self._pending[:size], self._pending[size:]
        return out.tobytes()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class _ArchiveScan:
    """State of one pass over an archive's members; `problem` set means refuse the whole archive."""

    def __init__(self, top: str, limit: int, out_root: Path | None, key) -> None:
        self.top, self.limit, self.out_root, self.key = top, limit, out_root, key
        self.seen: set[str] = set()
        self.digests: dict[str, str] = {}
        self.manifests: dict[str, bytes] = {}
        self.statement: dict | None = None
        self.payload = b""
        self.expected: dict[str, str] = {}
        self.added: list[str] = []
        self.dirs: list[str] = []  # directory members below the top one, relative to it
        self.total = 0
        self.problem: str | None = None
        self.tamper: str | None = None  # envelope that does not verify: reported like a directory's

    def header_problem(self, m: tarfile.TarInfo) -> str | None:
        """Everything that can be refused from the header alone, before any content is read."""
        unsafe = _unsafe(m)
        if unsafe:
            return unsafe
        name = m.name[:-1] if m.isdir() and m.name.endswith("/") else m.name
        if not safe_member_name(name):
            return f"member {m.name!r} is not a plain relative path"
        if name.split("/")[0] != self.top or (name == self.top and not m.isdir()):
            return (
                f"member {m.name!r} is outside the top-level directory {self.top!r} that a bundle "
                f"named {self.top}{ARCHIVE_SUFFIX} must have (renamed, or not a privrelease bundle)"
            )
        if name in self.seen:
            return (
                f"member {m.name!r} appears twice (tar would silently keep the last copy, which "
                "the signature never covered)"
            )
        self.seen.add(name)
        if m.isfile():
            self.total += m.size
            rel = name[len(self.top) + 1 :]
            if rel in MANIFEST_FILES and m.size > MANIFEST_MAX:
                return f"member {m.name!r} is {m.size} bytes, far larger than any signed manifest"
            if self.total > self.limit:
                return (
                    f"member {m.name!r} makes the archive expand to more than {self.limit} bytes "
                    f"(its own size is {m.size}): a decompression bomb or not a bundle; refused "
                    "before reading it (raise the limit with --max-size only for a bundle you "
                    "expect to be that large)"
                )
        return None

    def member(self, tar: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        self.problem = self.header_problem(m)
        if self.problem or m.isdir():
            if not self.problem and m.isdir() and m.name.rstrip("/") != self.top:
                self.dirs.append(m.name.rstrip("/")[len(self.top) + 1 :])
            if not self.problem and self.out_root is not None:
                (self.out_root / m.name).mkdir(parents=True, exist_ok=True)
            return
        rel = m.name[len(self.top) + 1 :]
        if rel in MANIFEST_FILES:
            self.manifests[rel] = _stream(tar, m).read()
            self.digests[rel] = hashlib.sha256(self.manifests[rel]).hexdigest()
            if rel == ENVELOPE_FILE:
                self._open_envelope(self.manifests[rel])
            if self.out_root is not None:
                _write(self.out_root / m.name, [self.manifests[rel]])
            return
        if self.statement is not None and rel not in self.expected:
            self.added.append(rel)  # not signed: never read, never extracted
            return
        if self.statement is None and self.out_root is not None:
            self.problem = (
                f"member {m.name!r} comes before the signed manifest; privrelease archives put "
                f"{ENVELOPE_FILE} first so that nothing unsigned is written to disk"
            )
            return
        self.digests[rel] = _hash_member(
            _stream(tar, m), self.out_root / m.name if self.out_root else None
        )

    def _open_envelope(self, data: bytes) -> None:
        try:
            self.payload = dsse.verify_envelope(data, self.key)
            self.statement = parse_statement(self.payload)
        except TamperError as e:
            self.tamper = str(e)
            self.problem = "its signed manifest does not verify"
            return
        self.expected = {s["name"]: s["digest"]["sha256"] for s in self.statement["subject"]}


def _stream(tar: tarfile.TarFile, m: tarfile.TarInfo) -> IO[bytes]:
    stream = tar.extractfile(m)
    if stream is None:  # header_problem refused every member but files and folders before this
        raise tarfile.TarError(f"member {m.name!r} is not a regular file")
    return stream


def _hash_member(src: IO[bytes], dest: Path | None) -> str:
    h = hashlib.sha256()
    out = _open_new(dest) if dest is not None else None
    try:
        for block in iter(lambda: src.read(CHUNK), b""):
            h.update(block)
            if out is not None:
                out.write(block)
    finally:
        if out is not None:
            out.close()
    return h.hexdigest()


def _open_new(path: Path) -> IO[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "xb")


def _write(path: Path, blocks: list[bytes]) -> None:
    with _open_new(path) as f:
        for b in blocks:
            f.write(b)


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


def _archive_name(archive: Path) -> str | None:
    name = archive.name
    return (
        name[: -len(ARCHIVE_SUFFIX)]
        if name.endswith(ARCHIVE_SUFFIX) and len(name) > len(ARCHIVE_SUFFIX)
        else None
    )


def _scan_archive(archive: Path, scan: _ArchiveScan) -> str | None:
    """Stream every member through `scan`; returns a problem with the archive's structure, if
    any."""
    with open(archive, "rb") as raw:
        gz = _OneGzipMember(raw)
        try:
            with tarfile.open(  # type: ignore[call-overload]
                fileobj=gz, mode="r|", bufsize=CHUNK
            ) as tar:
                for m in tar:
                    scan.member(tar, m)
                    if scan.problem:
                        return None
                # read past the end-of-archive block, not yet consumed
                rest = getattr(tar.fileobj, "buf", b"")
            while len(rest) <= TRAILER_MAX and (block := gz.read(CHUNK)):
                rest += block
        finally:
            gz.close()
        if len(rest) > TRAILER_MAX or rest.count(0) != len(rest):
            return "data after the end of the tar archive (an appended archive?)"
        if gz.trailing:
            return "data after the end of the gzip stream (an appended gzip member?)"
    return None


def _verify_archive(
    archive: Path, key, extract_to: Path | None, max_bytes: int | None
) -> VerificationResult:
    name = archive.name
    res = VerificationResult(False, [], None)
    top = _archive_name(archive)
    if top is None:
        res.problems.append(
            f"{name}: a bundle archive is named <release id>{ARCHIVE_SUFFIX}; this name is not. "
            "Rename it to the release id it was published under."
        )
        return res
    limit = (
        max_bytes
        if max_bytes is not None
        else MAX_EXPANSION * archive.stat().st_size + EXPANSION_SLACK
    )
    staging = _staging(extract_to, top) if extract_to is not None else None
    scan = _ArchiveScan(top, limit, staging, key)
    try:
        try:
            structural = _scan_archive(archive, scan)
        except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
            structural = None
            res.problems.append(
                f"{name}: not a readable .tar.gz archive ({e}); "
                f"it is truncated or corrupted. {REFETCH}"
            )
        if scan.tamper:
            res.problems.append(scan.tamper)
        elif scan.problem or structural:
            res.problems.append(
                f"{name}: {scan.problem or structural}; refusing to extract it. {REFETCH}"
            )
        elif not res.problems:
            _compare(res, scan)
            _check_release_id(res, top, name, ARCHIVE_SUFFIX)
        if staging is not None and extract_to is not None and not res.problems:
            res.extracted = _place(staging / top, Path(extract_to) / top)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return res


def _staging(extract_to: Path, top: str) -> Path:
    extract_to = Path(extract_to)
    if os.path.lexists(extract_to / top):
        raise PrivReleaseError(
            f"{extract_to / top} already exists; extract into another directory or move it away."
        )
    extract_to.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{top}.partial-", dir=extract_to))


def _place(src: Path, dest: Path) -> Path:
    if os.path.lexists(dest):
        raise PrivReleaseError(
            f"{dest} appeared while the bundle was being extracted; not replaced."
        )
    os.rename(src, dest)
    return dest


def _compare(res: VerificationResult, scan: _ArchiveScan) -> None:
    if scan.statement is None:
        res.problems.append(
            f"{ENVELOPE_FILE}: missing, so the bundle is unsigned and cannot be trusted. {REFETCH}"
        )
        return
    res.statement = scan.statement
    _check_statement_file(res, scan.manifests.get(STATEMENT_FILE), scan.payload)
    present = {n: d for n, d in scan.digests.items() if n not in MANIFEST_FILES}
    present.update({n: "" for n in scan.added})
    _compare_digests(res, scan.expected, present)
    _check_directories(res, scan.expected, scan.dirs)


# ---------------------------------------------------------------- directories and shared checks


def _check_statement_file(res: VerificationResult, stmt: bytes | None, payload: bytes) -> None:
    if stmt is None:
        res.problems.append(
            f"{STATEMENT_FILE}: missing (listed beside the "
            f"signed envelope in every bundle). {REFETCH}"
        )
    elif stmt != payload:
        res.problems.append(
            f"{STATEMENT_FILE}: differs from the statement signed in {ENVELOPE_FILE} (altered "
            f"after signing). {REFETCH}"
        )


def _compare_digests(
    res: VerificationResult, expected: dict[str, str], present: dict[str, str]
) -> None:
    """`present` maps each file found to its sha256 (or "" for a file that was not hashed)."""
    for name in sorted(expected):
        if name not in present:
            res.missing.append(name)
            res.problems.append(
                f"{name}: missing (listed in the signed manifest but not in the bundle). {REFETCH}"
            )
        elif present[name] != expected[name]:
            res.altered.append(name)
            res.problems.append(f"{name}: sha256 mismatch (altered after signing). {REFETCH}")
        else:
            res.checked.append(name)
    for name in sorted(present.keys() - expected.keys()):
        res.added.append(name)
        res.problems.append(
            f"{name}: not in the signed manifest (added after signing). Do not trust it; remove it "
            "or download the bundle again from the publisher."
        )


def _check_directories(res: VerificationResult, expected: dict[str, str], dirs: list[str]) -> None:
    """Every directory must hold a signed file: the manifest lists files, so the only directories a
    bundle has are their parents. Any other (an empty `data/extra_dir/` too) was added after
    signing: an unlisted entry of any kind fails verification."""
    needed = {
        "/".join(parts[:i])
        for name in [*expected, *MANIFEST_FILES]
        for parts in [name.split("/")]
        for i in range(1, len(parts))
    }
    for rel in sorted(set(dirs) - needed):
        res.added.append(rel + "/")
        res.problems.append(
            f"{rel}/: a directory that holds no signed file (added after signing). Do not trust "
            "the bundle; download it again from the publisher."
        )


def _walk(root: Path) -> tuple[set[str], list[str], list[str]]:
    """Regular files and directories under root (relative POSIX paths) and problems for
    links/special files."""
    files, dirs, problems = set(), [], []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for entry in dirnames + filenames:
            p = Path(dirpath) / entry
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                problems.append(
                    f"{rel}: is a symbolic link; bundles contain only regular files. {REFETCH}"
                )
            elif p.is_file():
                files.add(rel)
            elif p.is_dir():
                dirs.append(rel)
            else:
                problems.append(f"{rel}: is a special file (device, FIFO or socket). {REFETCH}")
    return files, dirs, problems


def _verify_dir(root: Path, key) -> VerificationResult:
    res = VerificationResult(False, [], None)
    env_path = root / ENVELOPE_FILE
    if not env_path.is_file() or env_path.is_symlink():
        res.problems.append(
            f"{ENVELOPE_FILE}: missing, so the bundle is unsigned and cannot be trusted. {REFETCH}"
        )
        return res
    try:
        payload = dsse.verify_envelope(env_path.read_bytes(), key)
        statement = parse_statement(payload)
    except TamperError as e:
        res.problems.append(str(e))
        return res
    res.statement = statement
    stmt_path = root / STATEMENT_FILE
    stmt = stmt_path.read_bytes() if stmt_path.is_file() and not stmt_path.is_symlink() else None
    _check_statement_file(res, stmt, payload)
    present, dirs, problems = _walk(root)
    res.problems += problems
    expected = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    found = {
        n: (file_sha256(root / n) if n in expected else "") for n in present - set(MANIFEST_FILES)
    }
    _compare_digests(res, expected, found)
    _check_directories(res, expected, dirs)
    return res
