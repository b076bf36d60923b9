"""DSSE/PAE, statements, and offline verification of bundles against every kind of tampering."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from accounting.errors import PrivReleaseError, TamperError
from accounting.store import Store, Workspace
from release import dsse, keys
from release.bundle import decode_png, encode_png, write_bundle
from release.manifest import build_statement, parse_statement, statement_bytes
from release.verify import verify_bundle

# ---------------------------------------------------------------- DSSE


def test_pae_matches_the_dsse_spec_example():
    # protocol.md: PAE("http://example.com/HelloWorld", "hello world"), lengths in bytes, decimal.
    assert (
        dsse.pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert dsse.pae("\u00e9", b"") == b"DSSEv1 2 \xc3\xa9 0 "
    assert dsse.pae(dsse.PAYLOAD_TYPE, b"{}") == b"DSSEv1 28 application/vnd.in-toto+json 2 {}"


def test_envelope_round_trip_keyid_and_failures():
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    env = dsse.sign_envelope(b'{"a": 1}', key)
    raw = keys.raw_public_bytes(key.public_key())
    assert env["payloadType"] == "application/vnd.in-toto+json"
    # securesystemslib's default keyid (sha256 of the canonical JSON key), so its Envelope.verify finds it
    assert (
        env["signatures"][0]["keyid"]
        == hashlib.sha256(
            b'{"keytype":"ed25519","keyval":{"public":"%s"},"scheme":"ed25519"}'
            % raw.hex().encode()
        ).hexdigest()
    )
    legacy = {
        **env,
        "signatures": [{**env["signatures"][0], "keyid": hashlib.sha256(raw).hexdigest()}],
    }
    assert (
        dsse.verify_envelope(legacy, key.public_key()) == b'{"a": 1}'
    )  # bundles signed before it still verify
    assert base64.b64decode(env["payload"]) == b'{"a": 1}'
    # The signature is over PAE(type, body), not over the body alone.
    sig = base64.b64decode(env["signatures"][0]["sig"])
    key.public_key().verify(sig, dsse.pae(dsse.PAYLOAD_TYPE, b'{"a": 1}'))
    assert dsse.verify_envelope(env, key.public_key()) == b'{"a": 1}'
    assert dsse.verify_envelope(dsse.envelope_bytes(env), raw) == b'{"a": 1}'
    urlsafe = {
        **env,
        "signatures": [
            {**env["signatures"][0], "sig": base64.urlsafe_b64encode(sig).decode().rstrip("=")}
        ],
    }
    assert dsse.verify_envelope(urlsafe, key.public_key()) == b'{"a": 1}'

    with pytest.raises(TamperError, match="payloadType"):
        dsse.verify_envelope({**env, "payloadType": "text/plain"}, key.public_key())
    with pytest.raises(TamperError, match="payloadType"):
        dsse.verify_envelope(env, key.public_key(), payload_type="text/plain")
    with pytest.raises(TamperError, match="does not verify"):
        dsse.verify_envelope(
            {**env, "payload": base64.b64encode(b'{"a": 2}').decode()}, key.public_key()
        )
    with pytest.raises(TamperError, match="wrong key"):
        dsse.verify_envelope(env, other.public_key())
    no_keyid = {**env, "signatures": [{"sig": env["signatures"][0]["sig"]}]}
    with pytest.raises(TamperError, match="does not verify"):
        dsse.verify_envelope(no_keyid, other.public_key())
    with pytest.raises(TamperError, match="no signature"):
        dsse.verify_envelope({**env, "signatures": []}, key.public_key())
    with pytest.raises(TamperError, match="not valid base64"):
        dsse.verify_envelope({**env, "payload": "***"}, key.public_key())
    with pytest.raises(TamperError, match="not valid JSON"):
        dsse.verify_envelope(b"{not json", key.public_key())


def test_statement_is_deterministic_and_checked(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "b.bin").write_bytes(b"b")
    (tmp_path / "a.txt").write_bytes(b"a")
    (tmp_path / "manifest.dsse.json").write_bytes(b"excluded")
    st = build_statement(tmp_path, {"z": 1, "a": [1, 2]})
    assert [s["name"] for s in st["subject"]] == ["a.txt", "data/b.bin"]
    assert st["subject"][0]["digest"]["sha256"] == hashlib.sha256(b"a").hexdigest()
    text = statement_bytes(st)
    assert text == statement_bytes(json.loads(text)) and parse_statement(text) == st
    assert (
        text.index(b'"_type"') < text.index(b'"predicate"') < text.index(b'"subject"')
    )  # sorted keys
    for bad_name in ["../x", "/etc/passwd", "a/../b", "", "manifest.dsse.json"]:
        bad = {**st, "subject": [{"name": bad_name, "digest": {"sha256": "0" * 64}}]}
        with pytest.raises(TamperError):
            parse_statement(statement_bytes(bad))
    with pytest.raises(TamperError, match="sha256"):
        parse_statement(
            statement_bytes({**st, "subject": [{"name": "a", "digest": {"sha256": "xyz"}}]})
        )
    with pytest.raises(TamperError, match="predicateType"):
        parse_statement(statement_bytes({**st, "predicateType": "https://example.com/other"}))


# ---------------------------------------------------------------- bundles


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A published bundle (dir + tarball) and the release public key; the workspace is then deleted,
    so every check below runs with only the bundle and the public key (offline)."""
    base = tmp_path_factory.mktemp("pub")
    ws = Workspace(base / "ws")
    ws.init()
    rng = np.random.default_rng(7)
    info = write_bundle(
        base / "bundles" / "rel-7",
        images=rng.integers(0, 256, (10, 6, 6), dtype=np.uint8),
        labels=np.arange(10) % 3,
        ids=[f"id{i}" for i in range(10)],
        card_markdown="# Release rel-7\nepsilon 1.0 (RDP)\n",
        predicate={"mechanism": "test"},
        workspace=ws,
        rows_per_file=4,
    )
    pub = base / "release.pub"
    shutil.copy(info.public_key_path, pub)
    # Let go of the kept store connection first: its idle-release timer would otherwise close it (and
    # remove store.duckdb.wal) in the middle of rmtree, which then fails (seen once in CI).
    Store(ws).backend.release()
    shutil.rmtree(ws.root)
    return info.path, info.tarball, pub


@pytest.fixture
def bundle(published, tmp_path) -> tuple[Path, Path]:
    """A private copy of the bundle directory to tamper with, and the public key."""
    src, _, pub = published
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst, pub


def _fails_naming(result, part: str, *words: str) -> str:
    assert not result.ok
    msgs = [p for p in result.problems if p.startswith(part) or f"{part}:" in p]
    assert msgs, result.problems
    for w in words:
        assert any(w in m for m in msgs), (w, msgs)
    return msgs[0]


@pytest.mark.smoke
def test_untouched_bundle_and_tarball_verify_offline(published):
    root, tarball, pub = published
    for target in (root, tarball):
        r = verify_bundle(target, pub)
        assert r.ok and r.problems == [], r.problems
        assert sorted(r.checked) == [
            "README.md",
            "croissant.json",
            "data/part-00000.parquet",
            "data/part-00001.parquet",
            "data/part-00002.parquet",
            "sample_grid.png",
        ]
        assert r.predicate["mechanism"] == "test" and r.key_id == dsse.sslib_keyid(pub)


def test_one_pixel_in_a_parquet_file(bundle):
    root, pub = bundle
    part = root / "data" / "part-00000.parquet"
    table = pq.read_table(part)
    cells = table.column("image").to_pylist()
    img = decode_png(cells[0]["bytes"]).copy()
    img[2, 3] ^= 1  # one pixel, one bit
    cells[0] = {**cells[0], "bytes": encode_png(img)}
    table = table.set_column(
        table.schema.get_field_index("image"),
        "image",
        pa.array(cells, table.schema.field("image").type),
    )
    pq.write_table(table, part, compression="zstd")
    r = verify_bundle(root, pub)
    msg = _fails_naming(r, "data/part-00000.parquet", "sha256 mismatch", "altered")
    assert "download it again" in msg and r.altered == ["data/part-00000.parquet"]
    assert r.missing == [] and r.added == []


def test_edited_card(bundle):
    root, pub = bundle
    (root / "README.md").write_text("# Release rel-7\nepsilon 0.1 (RDP)\n")
    r = verify_bundle(root, pub)
    _fails_naming(r, "README.md", "altered")
    assert r.altered == ["README.md"]


def test_edited_statement_file(bundle):
    root, pub = bundle
    path = root / "manifest.intoto.json"
    st = json.loads(path.read_bytes())
    st["predicate"]["mechanism"] = "something else"
    path.write_bytes(statement_bytes(st))
    _fails_naming(
        verify_bundle(root, pub), "manifest.intoto.json", "differs from the statement signed"
    )


def test_re_encoded_payload_in_envelope(bundle):
    """An attacker alters the card, updates the digest in the statement and re-encodes the payload."""
    root, pub = bundle
    (root / "README.md").write_text("# Release rel-7\nepsilon 0.01 (RDP)\n")
    env_path = root / "manifest.dsse.json"
    env = json.loads(env_path.read_bytes())
    st = json.loads(base64.b64decode(env["payload"]))
    for s in st["subject"]:
        if s["name"] == "README.md":
            s["digest"]["sha256"] = hashlib.sha256((root / "README.md").read_bytes()).hexdigest()
    payload = statement_bytes(st)
    env["payload"] = base64.b64encode(payload).decode()
    env_path.write_bytes(dsse.envelope_bytes(env))
    (root / "manifest.intoto.json").write_bytes(payload)
    r = verify_bundle(root, pub)
    _fails_naming(r, "manifest.dsse.json", "does not verify", "altered")
    assert r.statement is None  # nothing from an unverified manifest is trusted


def test_altered_signature(bundle):
    root, pub = bundle
    env_path = root / "manifest.dsse.json"
    env = json.loads(env_path.read_bytes())
    sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
    sig[10] ^= 0x01
    env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    env_path.write_bytes(dsse.envelope_bytes(env))
    _fails_naming(verify_bundle(root, pub), "manifest.dsse.json", "signature does not verify")


def test_changed_payload_type(bundle):
    root, pub = bundle
    env_path = root / "manifest.dsse.json"
    env = json.loads(env_path.read_bytes())
    env["payloadType"] = "application/json"
    env_path.write_bytes(dsse.envelope_bytes(env))
    _fails_naming(verify_bundle(root, pub), "manifest.dsse.json", "payloadType")


def test_extra_file(bundle):
    root, pub = bundle
    (root / "data" / "part-00003.parquet").write_bytes(
        (root / "data" / "part-00000.parquet").read_bytes()
    )
    (root / "notes.txt").write_text("hi")
    r = verify_bundle(root, pub)
    _fails_naming(r, "data/part-00003.parquet", "added after signing")
    assert (
        r.added == ["data/part-00003.parquet", "notes.txt"] and r.altered == [] and r.missing == []
    )


def test_missing_file(bundle):
    root, pub = bundle
    (root / "data" / "part-00001.parquet").unlink()
    r = verify_bundle(root, pub)
    _fails_naming(r, "data/part-00001.parquet", "missing")
    assert r.missing == ["data/part-00001.parquet"]


def test_missing_manifest_files(bundle):
    root, pub = bundle
    (root / "manifest.intoto.json").unlink()
    _fails_naming(verify_bundle(root, pub), "manifest.intoto.json", "missing")
    (root / "manifest.dsse.json").unlink()
    _fails_naming(verify_bundle(root, pub), "manifest.dsse.json", "unsigned")


def test_symlink_in_bundle(bundle, tmp_path):
    root, pub = bundle
    target = tmp_path / "elsewhere.md"
    (root / "README.md").rename(target)
    (root / "README.md").symlink_to(target)
    r = verify_bundle(root, pub)
    _fails_naming(r, "README.md", "symbolic link")
    assert r.missing == ["README.md"]


def test_wrong_public_key(bundle, tmp_path):
    root, _ = bundle
    other = tmp_path / "other.pub"
    other.write_bytes(
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    r = verify_bundle(root, other)
    _fails_naming(r, "manifest.dsse.json", "wrong key", "release.pub")
    assert r.statement is None


def test_bad_inputs_raise_clear_errors(published, tmp_path):
    root, _, pub = published
    with pytest.raises(keys.KeyFileError, match="Cannot read public key file"):
        verify_bundle(root, tmp_path / "nope.pub")
    (tmp_path / "bad.pub").write_text("hello")
    with pytest.raises(keys.KeyFileError, match="expected a PEM Ed25519 public key"):
        verify_bundle(root, tmp_path / "bad.pub")
    with pytest.raises(PrivReleaseError, match="No bundle at"):
        verify_bundle(tmp_path / "absent", pub)


def test_manifest_signed_with_hostile_subject_names(bundle):
    """Even a validly signed statement may not point outside the bundle."""
    root, _ = bundle
    key = Ed25519PrivateKey.generate()
    pub = root.parent / "attacker.pub"
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    st = build_statement(root, {"mechanism": "x"})
    st["subject"].append({"name": "../attacker.pub", "digest": {"sha256": "0" * 64}})
    payload = statement_bytes(st)
    (root / "manifest.intoto.json").write_bytes(payload)
    (root / "manifest.dsse.json").write_bytes(dsse.envelope_bytes(dsse.sign_envelope(payload, key)))
    _fails_naming(
        verify_bundle(root, pub), "manifest (signed statement)", "not a plain relative path"
    )


# ---------------------------------------------------------------- tarballs


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _from_dir(root: Path) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out = []
    for p in sorted(root.rglob("*")):
        info = tarfile.TarInfo(f"{root.name}/{p.relative_to(root).as_posix()}")
        if p.is_dir():
            info.type = tarfile.DIRTYPE
            out.append((info, None))
        else:
            out.append((info, p.read_bytes()))
    return out


def test_tampered_tarball(bundle, tmp_path):
    root, pub = bundle
    (root / "README.md").write_text("# changed\n")
    r = verify_bundle(_tar(tmp_path / "rel-7.tar.gz", _from_dir(root)), pub)
    _fails_naming(r, "README.md", "altered")


def test_tarball_with_dotdot_path_is_refused(bundle, tmp_path):
    root, pub = bundle
    evil = tarfile.TarInfo("../evil.txt")
    r = verify_bundle(_tar(tmp_path / "rel-7.tar.gz", _from_dir(root) + [(evil, b"pwned")]), pub)
    msg = _fails_naming(r, "rel-7.tar.gz", "'..'", "refusing to extract")
    assert "../evil.txt" in msg
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path.parent / "evil.txt").exists()


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "absolute", "device"])
def test_tarball_with_unsafe_members_is_refused(bundle, tmp_path, kind):
    root, pub = bundle
    info = tarfile.TarInfo(f"{root.name}/x")
    data = None
    if kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif kind == "hardlink":
        info.type, info.linkname = tarfile.LNKTYPE, f"{root.name}/README.md"
    elif kind == "absolute":
        info.name, data = "/tmp/privrelease-evil.txt", b"x"
    else:
        info.type = tarfile.CHRTYPE
    r = verify_bundle(_tar(tmp_path / "rel-7.tar.gz", _from_dir(root) + [(info, data)]), pub)
    _fails_naming(r, "rel-7.tar.gz", "refusing to extract")


def test_corrupt_tarball(published, tmp_path):
    _, tarball, pub = published
    broken = tmp_path / "rel-7.tar.gz"
    broken.write_bytes(tarball.read_bytes()[: tarball.stat().st_size // 2])
    _fails_naming(verify_bundle(broken, pub), "rel-7.tar.gz", "corrupted")


def test_verify_states_the_guarantee_in_words() -> None:
    """`privrelease verify` printed the predicate's raw dict; a consumer reads the guarantee in words."""
    from release.verify_cmd import describe_guarantee

    dp = {"type": "dp", "epsilon_rdp": 7.99997, "epsilon_pld": 6.81997, "delta": 1e-5}
    assert (
        describe_guarantee(dp)
        == "(epsilon 8.000 RDP / 6.820 PLD, delta 1e-05)-DP for the dataset's whole history"
    )
    kanon = {"type": "k-anonymity", "k": 5, "method": "ksalsa", "description": "k-anonymous (k=5)"}
    assert describe_guarantee(kanon) == "k-anonymity with k = 5, ksalsa (no differential privacy)"
    assert describe_guarantee(None) == "no guarantee stated"
