"""The shipped public pre-trained checkpoint: its bytes match the sha256 in the code, it is keyed on
exactly the demo's public pre-training, and a missing or changed file is refused with a warning and
the run pre-trains instead (tiny models: seconds; the full rebuild is
`python -m synth.mechanisms.privimage.build_shipped --check`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from synth.mechanisms.privimage import pipeline, shipped
from synth.mechanisms.privimage.build_shipped import BUILD_THREADS, build, demo_public_pretraining
from synth.mechanisms.privimage.config import PrivImageConfig
from synth.mechanisms.privimage.pipeline import pretrain_settings
from synth.mechanisms.privimage.shipped import (
    DEMO,
    ShippedCheckpoint,
    ShippedCheckpointWarning,
    shipped_weights,
)

CPU = torch.device("cpu")
TINY = PrivImageConfig.tiny(8.0, 1e-5, precision="float32")


def test_the_committed_checkpoint_matches_its_sha256_and_the_demos_pretraining() -> None:
    path = shipped.CHECKPOINT_DIR / DEMO.file
    assert path.is_file() and path.stat().st_size < 5_000_000
    assert shipped.file_sha256(path) == DEMO.sha256
    demo = PrivImageConfig.demo(8.0, 1e-5)
    model, x, y = demo_public_pretraining(demo)
    # keyed on the float32 pre-training whatever precision the run computes in
    for precision in ("float32", "bfloat16"):
        settings = {**pretrain_settings(demo, CPU), "precision": precision}
        assert shipped.shipped_key(model, x, y, settings) == DEMO.key
    weights = torch.load(path, map_location="cpu", weights_only=True)
    assert weights.keys() == model.state_dict().keys()


@pytest.fixture(scope="module")
def tiny_shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ShippedCheckpoint]:
    """A tiny checkpoint built by the build script's own code, registered as shipped."""
    folder = tmp_path_factory.mktemp("shipped")
    path, digest, key = build(folder, TINY, progress=False)
    return folder, ShippedCheckpoint(path.name, digest, key, "tiny test digits")


def _fresh_inputs() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    return demo_public_pretraining(TINY)


def test_a_fitting_checkpoint_is_used_only_while_its_bytes_match(
    tiny_shipped: tuple[Path, ShippedCheckpoint], tmp_path: Path
) -> None:
    folder, ck = tiny_shipped
    model, x, y = _fresh_inputs()
    settings = pretrain_settings(TINY, CPU)
    found = shipped_weights(model, x, y, settings, shipped=(ck,), directory=folder)
    assert found is not None and "public data only" in found[1] and ck.sha256 in found[1]
    # other public images: no shipped checkpoint fits, nothing is said
    assert shipped_weights(model, x.flip(-1), y, settings, shipped=(ck,), directory=folder) is None

    changed = tmp_path / ck.file
    data = bytearray((folder / ck.file).read_bytes())
    data[-100] ^= 1
    changed.write_bytes(bytes(data))
    with pytest.warns(ShippedCheckpointWarning, match=f"not the {ck.sha256}"):
        assert shipped_weights(model, x, y, settings, shipped=(ck,), directory=tmp_path) is None
    with pytest.warns(ShippedCheckpointWarning, match="is missing"):
        assert (
            shipped_weights(model, x, y, settings, shipped=(ck,), directory=tmp_path / "none")
            is None
        )


def test_the_pipeline_pretrains_instead_of_a_changed_checkpoint_and_gets_the_same_weights(
    tiny_shipped: tuple[Path, ShippedCheckpoint],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder, ck = tiny_shipped
    monkeypatch.setattr(shipped, "SHIPPED", (ck,))
    stages: list[str] = []
    ctx = SimpleNamespace(
        progress=lambda s, i, n: stages.append(s), cache_dir=None, workdir=tmp_path, nproc=1
    )
    model, x, y = _fresh_inputs()
    monkeypatch.setattr(shipped, "CHECKPOINT_DIR", folder)
    used, source = pipeline._pretrain(model, x, y, TINY, CPU, ctx)
    assert stages == ["pretraining (shipped checkpoint, sha256 checked)"]
    assert source.startswith(f"shipped checkpoint {ck.file} (sha256 {ck.sha256})")

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / ck.file).write_bytes((folder / ck.file).read_bytes()[:-1])
    monkeypatch.setattr(shipped, "CHECKPOINT_DIR", broken)
    stages.clear()
    model, x, y = _fresh_inputs()
    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)  # as the build: the same sums, the same weights
    try:
        with pytest.warns(ShippedCheckpointWarning, match="Public pre-training runs instead"):
            trained, source = pipeline._pretrain(model, x, y, TINY, CPU, ctx)
    finally:
        torch.set_num_threads(threads)
    assert "pretraining" in stages and source == "3 steps on the selected public images"
    for name, value in used.state_dict().items():
        assert torch.equal(value, trained.state_dict()[name]), name
