"""Pre-trained UNets shipped in the repository (`checkpoints/`), used instead of public pre-training
when a run's public pre-training is exactly what one of them was trained on.

A shipped checkpoint is trained on public images only (the UCI digits the demo's semantic query
selects), so it has seen no sensitive record and using it costs no privacy: it is the model the
run's own public pre-training would compute in float32 (`python -m
synth.mechanisms.privimage.build_shipped` rebuilds it from the same code). It is matched by the
pre-training cache key (training._pretrain_key: the selected public images and labels, the
architecture and every pre-training setting, in float32) and its bytes are checked against the
sha256 written here, in the code, before it is loaded (as weights only). A missing or changed file
is refused with a warning and the run pre-trains as if none were shipped. Under bfloat16 autocast
the float32 weights are used too: precision only decides how fast pre-training computes.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from synth.mechanisms.privimage.training import _pretrain_key

CHECKPOINT_DIR = Path(__file__).with_name("checkpoints")


class ShippedCheckpointWarning(UserWarning):
    """A shipped checkpoint fits the run but its file is missing or changed: the run pre-trains."""


@dataclass(frozen=True)
class ShippedCheckpoint:
    file: str  # in CHECKPOINT_DIR
    sha256: str  # of the file's bytes
    key: str  # training._pretrain_key of its float32 pre-training
    trained_on: str  # what it saw, in words (the release parameters and the card say it)


# `make demo`'s public pre-training (preset "demo": 2,000 steps, UNet 16/32/32) on the 1,797 UCI
# digits, each labelled as the MNIST digit the demo's query selects it for.
DEMO = ShippedCheckpoint(
    file="demo-pretrain.pt",
    sha256="b2d1f3d12aca91d56b9d988676738ecf84d10b1ce47174266354598ef53a0468",
    key="44bfdc0cd6faedc129f171e25d659f6d",
    trained_on="the 1,797 public UCI digits (scikit-learn), preset 'demo', float32",
)
SHIPPED: tuple[ShippedCheckpoint, ...] = (DEMO,)


def shipped_key(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, settings: dict[str, Any]
) -> str:
    """The cache key of this pre-training computed in float32 (what a shipped checkpoint is keyed
    by); `settings` are pretrain()'s keyword arguments."""
    return _pretrain_key(model, x, y, {**settings, "precision": "float32"})


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def shipped_weights(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    settings: dict[str, Any],
    *,
    shipped: tuple[ShippedCheckpoint, ...] | None = None,
    directory: Path | None = None,
) -> tuple[dict[str, torch.Tensor], str] | None:
    """(weights, words for the release parameters) of the shipped checkpoint trained on exactly
    this public pre-training; None when none is, or when its file is missing or fails its sha256
    (then with a ShippedCheckpointWarning saying so: the caller pre-trains). `shipped` and
    `directory` default to SHIPPED and CHECKPOINT_DIR."""
    key = shipped_key(model, x, y, settings)
    found = next((c for c in (SHIPPED if shipped is None else shipped) if c.key == key), None)
    if found is None:
        return None
    path = (CHECKPOINT_DIR if directory is None else directory) / found.file
    if not path.is_file():
        _refuse(f"{path} is missing")
        return None
    digest = file_sha256(path)
    if digest != found.sha256:
        _refuse(f"{path} has sha256 {digest}, not the {found.sha256} it was shipped with")
        return None
    weights = torch.load(path, map_location="cpu", weights_only=True)
    return weights, (
        f"shipped checkpoint {found.file} (sha256 {found.sha256}), trained on {found.trained_on}: "
        "public data only, no sensitive record, no privacy cost"
    )


def _refuse(why: str) -> None:
    warnings.warn(
        f"The shipped pre-trained checkpoint is not used: {why}. Public pre-training runs instead "
        "(several minutes on a CPU). Restore the file from the repository (git checkout -- "
        "synth/mechanisms/privimage/checkpoints) or rebuild it with `python -m "
        "synth.mechanisms.privimage.build_shipped`.",
        ShippedCheckpointWarning,
        stacklevel=3,
    )
