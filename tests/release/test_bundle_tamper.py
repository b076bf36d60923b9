"""Hostile bundle archives: duplicate members, appended data, renamed bundles, decompression bombs, and
extraction that leaves nothing behind when verification fails (issue 13, item 8)."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from accounting.store import Workspace
from release.bundle import write_bundle
from release.verify import verify_bundle

MANIFESTS = ("manifest.dsse.json", "manifest.intoto.json")


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """Two releases (rel-7, rel-8) signed by one release key, as directories and tarballs, and the key."""
    base = tmp_path_factory.mktemp("pub")
    ws = Workspace(base / "ws")
    ws.init()
    rng = np.random.default_rng(3)
    out = {}
    for rid in ("rel-7", "rel-8"):
        out[rid] = write_bundle(
            base / "bundles" / rid,
            images=rng.integers(0, 256, (9, 6, 6), dtype=np.uint8),
            labels=np.arange(9) % 3,
            ids=[f"{rid}-{i}" for i in range(9)],
            card_markdown=f"# {rid}\n",
            predicate={"mechanism": "test"},
            workspace=ws,
        )
    pub = base / "release.pub"
    shutil.copy(out["rel-7"].public_key_path, pub)
    return out, pub


def _members(root: Path, top: str | None = None) -> list[tuple[str, bytes | None]]:
    """(arcname, data or None for a directory) in privrelease's order: top dir, manifests, the rest sorted."""
    top = top or root.name
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    order = [m for m in MANIFESTS if m in files] + [f for f in files if f not in MANIFESTS]
    return [(top, None)] + [
        (f"{top}/{f}", None if (root / f).is_dir() else (root / f).read_bytes()) for f in order
    ]


def _tar_bytes(members: list[tuple[str, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _member_bytes(name: str, data: bytes | None) -> bytes:
    """One tar member (header and data padded to 512-byte blocks), without the end-of-archive blocks."""
    info = tarfile.TarInfo(name)
    if data is None:
        info.type = tarfile.DIRTYPE
        return info.tobuf(format=tarfile.PAX_FORMAT)
    info.size = len(data)
    return info.tobuf(format=tarfile.PAX_FORMAT) + data + bytes(-len(data) % 512)


def _write(path: Path, raw_tar: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw_tar, mtime=0))
    return path


def _refused(result, *words: str) -> str:
    assert not result.ok
    text = " ".join(result.problems)
    for w in words:
        assert w in text, (w, result.problems)
    return text


def _nothing_extracted(dest: Path) -> None:
    assert not dest.exists() or list(dest.iterdir()) == [], list(dest.iterdir())


def test_genuine_archive_in_privrelease_order_verifies_and_extracts(published, tmp_path):
    infos, pub = published
    info = infos["rel-7"]
    dest = tmp_path / "out"
    r = verify_bundle(info.tarball, pub, extract_to=dest)
    assert r.ok, r.problems
    assert r.extracted == dest / "rel-7" and sorted(os.listdir(dest)) == [
        "rel-7"
    ]  # no staging left
    for p in info.path.rglob("*"):
        if p.is_file():
            assert (dest / "rel-7" / p.relative_to(info.path)).read_bytes() == p.read_bytes()
    assert verify_bundle(dest / "rel-7", pub).ok
    with pytest.raises(Exception, match="already exists"):
        verify_bundle(info.tarball, pub, extract_to=dest)


@pytest.mark.parametrize("forged_first", [True, False])
def test_duplicate_member_is_refused(published, tmp_path, forged_first):
    """tar -x keeps the last copy of a name; either order must be refused, and nothing written."""
    infos, pub = published
    members = _members(infos["rel-7"].path)
    card = next(i for i, (n, _) in enumerate(members) if n == "rel-7/README.md")
    forged = ("rel-7/README.md", b"# rel-7\nepsilon 0.01, trust me\n")
    members.insert(card if forged_first else card + 1, forged)
    archive = _write(tmp_path / "dl" / "rel-7.tar.gz", _tar_bytes(members))
    dest = tmp_path / "out"
    r = verify_bundle(archive, pub, extract_to=dest)
    _refused(r, "'rel-7/README.md' appears twice", "refusing to extract")
    _nothing_extracted(dest)
    _refused(verify_bundle(archive, pub), "appears twice")


def test_a_file_in_place_of_the_bundle_directory_is_refused(published, tmp_path):
    infos, pub = published
    members = [("rel-7", b"a file, not the bundle's directory")] + _members(infos["rel-7"].path)[1:]
    _refused(
        verify_bundle(_write(tmp_path / "dl" / "rel-7.tar.gz", _tar_bytes(members)), pub),
        "outside the top-level directory",
    )


def test_appended_gzip_member_is_refused(published, tmp_path):
    """gzip (and Python's gzip module) read on into an appended member; the verifier must not ignore it."""
    infos, pub = published
    genuine = infos["rel-7"].tarball.read_bytes()
    extra = _tar_bytes([("rel-7/evil.txt", b"appended after signing")])
    archive = tmp_path / "dl" / "rel-7.tar.gz"
    archive.parent.mkdir()
    archive.write_bytes(genuine + gzip.compress(extra, mtime=0))
    with tarfile.open(
        archive, ignore_zeros=True
    ) as tar:  # what `tar -x --ignore-zeros` would write
        assert "rel-7/evil.txt" in tar.getnames()
    r = verify_bundle(archive, pub, extract_to=tmp_path / "out")
    _refused(r, "after the end of the gzip stream")
    _nothing_extracted(tmp_path / "out")
    archive.write_bytes(genuine + b"junk")
    _refused(verify_bundle(archive, pub), "after the end of the gzip stream")


def test_data_after_the_end_of_the_tar_archive_is_refused(published, tmp_path):
    infos, pub = published
    raw = gzip.decompress(infos["rel-7"].tarball.read_bytes())
    hidden = _tar_bytes([("rel-7/hidden.txt", b"after the end-of-archive blocks")])
    archive = _write(tmp_path / "dl" / "rel-7.tar.gz", raw + hidden)
    _refused(verify_bundle(archive, pub), "after the end of the tar archive")
    # Extra zero padding alone is harmless and accepted.
    assert verify_bundle(_write(tmp_path / "pad" / "rel-7.tar.gz", raw + bytes(10240)), pub).ok


def test_renamed_bundle_of_another_release_is_refused(published, tmp_path):
    infos, pub = published
    # The archive of rel-8 saved under rel-7's name: its members are outside the expected directory.
    copy = tmp_path / "a" / "rel-7.tar.gz"
    copy.parent.mkdir()
    shutil.copy(infos["rel-8"].tarball, copy)
    _refused(verify_bundle(copy, pub), "outside the top-level directory 'rel-7'")
    # Repacked consistently under rel-7's name: the signed release id still says rel-8.
    repacked = _write(
        tmp_path / "b" / "rel-7.tar.gz", _tar_bytes(_members(infos["rel-8"].path, top="rel-7"))
    )
    text = _refused(
        verify_bundle(repacked, pub), "signed manifest is for release 'rel-8'", "named 'rel-7'"
    )
    assert "rename the bundle to rel-8.tar.gz" in text
    renamed_dir = tmp_path / "c" / "rel-7"
    shutil.copytree(infos["rel-8"].path, renamed_dir)
    _refused(verify_bundle(renamed_dir, pub), "signed manifest is for release 'rel-8'")
    # An archive not named <release id>.tar.gz at all.
    odd = tmp_path / "d" / "download"
    odd.parent.mkdir()
    shutil.copy(infos["rel-8"].tarball, odd)
    _refused(verify_bundle(odd, pub), "named <release id>.tar.gz")


@pytest.fixture(scope="module")
def bomb(published, tmp_path_factory) -> Path:
    """rel-7's genuine members plus a 1 GiB file of zeros (about 4.5 MB compressed)."""
    infos, _ = published
    path = tmp_path_factory.mktemp("bomb") / "rel-7.tar.gz"
    head = b"".join(
        _member_bytes(n, d) for n, d in _members(infos["rel-7"].path)
    )  # no end-of-archive yet
    info = tarfile.TarInfo("rel-7/data/zzz-bomb.bin")
    info.size = 1 << 30
    header = info.tobuf(format=tarfile.PAX_FORMAT)
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    zeros = bytes(16 << 20)
    with open(path, "wb") as f:
        f.write(z.compress(head + header))
        for _ in range(64):
            f.write(z.compress(zeros))
        f.write(z.compress(bytes(1024 + 10240)))  # end-of-archive blocks and padding
        f.write(z.flush())
    assert path.stat().st_size < 8 << 20
    return path


def test_decompression_bomb_is_refused_before_anything_is_written(bomb, published, tmp_path):
    _, pub = published
    dest = tmp_path / "out"
    start = time.perf_counter()
    r = verify_bundle(bomb, pub, extract_to=dest)
    elapsed = time.perf_counter() - start
    _refused(r, "zzz-bomb.bin", "decompression bomb", "refused before reading it")
    _nothing_extracted(dest)
    assert elapsed < 5, elapsed  # refused from the tar header, not after inflating 1 GiB
    # An explicit, larger limit lets the consumer decide; then the unsigned member is named (never extracted).
    r = verify_bundle(bomb, pub, max_bytes=2 << 30)
    assert not r.ok and r.added == ["data/zzz-bomb.bin"]


def test_extraction_needs_the_signed_manifest_first(published, tmp_path):
    """An archive re-packed in plain sorted order (manifest last) verifies, but is not extracted blind."""
    infos, pub = published
    root = infos["rel-7"].path
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    members = [("rel-7", None)] + [
        (f"rel-7/{f}", None if (root / f).is_dir() else (root / f).read_bytes()) for f in files
    ]
    archive = _write(tmp_path / "dl" / "rel-7.tar.gz", _tar_bytes(members))
    assert verify_bundle(archive, pub).ok
    _refused(
        verify_bundle(archive, pub, extract_to=tmp_path / "out"), "comes before the signed manifest"
    )
    _nothing_extracted(tmp_path / "out")


def test_tampered_member_with_extract_leaves_nothing(published, tmp_path):
    infos, pub = published
    members = [
        (n, (b"# rel-7\nedited\n" if n == "rel-7/README.md" else d))
        for n, d in _members(infos["rel-7"].path)
    ]
    archive = _write(tmp_path / "dl" / "rel-7.tar.gz", _tar_bytes(members))
    r = verify_bundle(archive, pub, extract_to=tmp_path / "out")
    assert not r.ok and r.altered == ["README.md"] and r.extracted is None
    _nothing_extracted(tmp_path / "out")


def test_cli_verify_exit_codes_and_light_imports(published, tmp_path):
    """`privrelease verify` runs without importing the store, the accountants, torch or typer."""
    infos, pub = published
    probe = (
        "import sys\nfrom release.entry import main\nsys.argv = ['privrelease'] + sys.argv[1:]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'duckdb', 'dp_accounting', 'scipy', 'torch',"
        " 'typer', 'pyarrow', 'numpy'})\nprint('HEAVY', heavy, 'CODE', code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    ok = subprocess.run(
        [sys.executable, "-c", probe, "verify", str(infos["rel-7"].tarball), "--key", str(pub)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert "OK: signature valid" in ok.stdout and "HEAVY [] CODE 0" in ok.stdout, (
        ok.stdout + ok.stderr
    )
    bad = tmp_path / "rel-7.tar.gz"
    bad.write_bytes(infos["rel-7"].tarball.read_bytes() + b"x")
    failed = subprocess.run(
        [sys.executable, "-c", probe, "verify", str(bad), "--key", str(pub)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert "VERIFICATION FAILED" in failed.stdout and "CODE 1" in failed.stdout
    missing = subprocess.run(
        [
            sys.executable,
            "-c",
            probe,
            "--workspace",
            "x",
            "verify",
            str(bad),
            "--key",
            str(tmp_path / "nope.pub"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert "Cannot read public key file" in missing.stderr and "CODE 2" in missing.stdout


def test_an_extra_empty_directory_fails_verification(published, tmp_path):
    """Issue 42: an unlisted entry of any kind fails, an empty directory too (the manifest lists
    files; the only directories a bundle has are their parents)."""
    infos, pub = published
    info = infos["rel-7"]
    folder = tmp_path / "rel-7"
    shutil.copytree(info.path, folder)
    assert verify_bundle(folder, pub).ok  # the copy as published
    inner = next((p.name for p in folder.iterdir() if p.is_dir()), None)
    extra = f"{inner}/extra_dir" if inner else "extra_dir"
    (folder / extra).mkdir()
    r = verify_bundle(folder, pub)
    _refused(r, f"{extra}/: a directory that holds no signed file")
    assert r.added == [f"{extra}/"]

    members = _members(info.path)
    members.append((f"rel-7/{extra}", None))
    archive = _write(tmp_path / "dl" / "rel-7.tar.gz", _tar_bytes(members))
    assert verify_bundle(
        _write(tmp_path / "ok" / "rel-7.tar.gz", _tar_bytes(_members(info.path))), pub
    ).ok
    dest = tmp_path / "out"
    _refused(verify_bundle(archive, pub, extract_to=dest), f"{extra}/: a directory")
    _nothing_extracted(dest)
