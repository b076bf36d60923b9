"""Rebuild the shipped pre-trained checkpoint (synth.mechanisms.privimage.shipped) from public data:

    python -m synth.mechanisms.privimage.build_shipped [--out DIR] [--check]

It runs the demo's own public pre-training, with the pipeline's own code and settings, on the
public UCI digits labelled as the MNIST digits the demo's semantic query selects them for, in
float32, seeded, with deterministic algorithms and a fixed thread count, then writes the weights
and prints their sha256 and cache key. `--check` exits 1 unless both equal the ones shipped.
Bit-for-bit: the same torch build on the same CPU kind writes the same bytes (floating-point sums
may round differently on another instruction set or thread count, which is why both are fixed and
printed). No sensitive record is read: shipping the result costs no privacy.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from synth.kinds.datasets import uci_digits
from synth.mechanisms.privimage import shipped
from synth.mechanisms.privimage.config import PrivImageConfig
from synth.mechanisms.privimage.data import label_index, to_format, to_tensor
from synth.mechanisms.privimage.model import make_unet
from synth.mechanisms.privimage.pipeline import pretrain_settings
from synth.mechanisms.privimage.query import build_selection
from synth.mechanisms.privimage.training import pretrain

BUILD_THREADS = 1  # fixed: how a sum is split over threads changes its rounding (measured)
# Fixed instruction set (read by torch and oneDNN when they load, so main() re-executes the
# interpreter with it): AVX-512 without its bfloat16 and AMX extensions, the CPU kind of issue 63,
# which every AVX-512 CPU runs the same way. (AVX2 kernels would run on more CPUs but took 2-3x as
# long here.) Another kind of CPU computes a model of the same quality with other roundings.
BUILD_ENV = {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
DEMO_EPSILON = 8.0  # the demo's (pre-training does not depend on it)


def demo_public_pretraining(
    config: PrivImageConfig,
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The untrained model and the public images and labels the demo pre-trains on when its query
    selects UCI digit d for MNIST digit d (k = 1): what pipeline._prepare_public and
    _semantic_selection build (the seed is set before the model, as there)."""
    public = uci_digits(config.image_size)
    pub_x = to_tensor(to_format(public.images, config.image_size, 1))
    pub_y = label_index(public.labels, public.label_set)
    selection = build_selection([[d] for d in range(10)], pub_y)
    x = pub_x[selection.public_index]
    y = torch.from_numpy(np.asarray(selection.new_labels))
    torch.manual_seed(config.seed)
    model = make_unet(config.image_size, 1, 10, config.unet_channels, config.layers_per_block)
    return model, x, y


def build(
    out: Path, config: PrivImageConfig | None = None, *, progress: bool = True
) -> tuple[Path, str, str]:
    """Train and write `out`/<file>; (path, sha256 of the file, cache key)."""
    config = config or PrivImageConfig.demo(DEMO_EPSILON, 1e-5, precision="float32")
    deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(BUILD_THREADS)
    try:
        return _build(out, config, progress)
    finally:  # a caller's process (a test) keeps its own settings
        torch.use_deterministic_algorithms(deterministic)
        torch.set_num_threads(threads)


def _build(out: Path, config: PrivImageConfig, progress: bool) -> tuple[Path, str, str]:
    model, x, y = demo_public_pretraining(config)
    cpu = torch.device("cpu")
    settings = pretrain_settings(config, cpu)
    key = shipped.shipped_key(model, x, y, settings)
    with tempfile.TemporaryDirectory() as tmp:
        model = pretrain(
            model,
            x,
            y,
            device=cpu,
            ckpt=Path(tmp) / "partial.pt",
            progress=_print_progress if progress else _silent,
            **settings,
        )
    out.mkdir(parents=True, exist_ok=True)
    path = out / shipped.DEMO.file
    torch.save({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, path)
    return path, shipped.file_sha256(path), key


def _print_progress(stage: str, done: int, total: int) -> None:
    if done % 200 == 0 or done == total:
        print(f"  {stage}: {done}/{total}", flush=True)


def _silent(stage: str, done: int, total: int) -> None:
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=None, help=f"folder (default {shipped.CHECKPOINT_DIR})"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless sha256 and key equal the shipped ones (writes to a temporary folder "
        "unless --out is given: the shipped file is left as it is)",
    )
    args = parser.parse_args(argv)
    if any(os.environ.get(k) != v for k, v in BUILD_ENV.items()):
        argv = sys.argv[1:] if argv is None else argv
        os.execve(  # this interpreter, this module, the same arguments
            sys.executable,
            [sys.executable, "-m", __spec__.name if __spec__ else __name__, *argv],
            {**os.environ, **BUILD_ENV},
        )
    print(
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{BUILD_THREADS} threads, float32, deterministic algorithms",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        kept = args.out or (None if args.check else shipped.CHECKPOINT_DIR)
        path, digest, key = build(kept or Path(tmp))
    print(f"{f'wrote {path}' if kept else 'built (not kept)'}\n  sha256 {digest}\n  key    {key}")
    same = digest == shipped.DEMO.sha256 and key == shipped.DEMO.key
    print(
        "identical to the shipped checkpoint"
        if same
        else f"differs from the shipped one (sha256 {shipped.DEMO.sha256}, key {shipped.DEMO.key})"
    )
    return 1 if args.check and not same else 0


if __name__ == "__main__":
    sys.exit(main())
