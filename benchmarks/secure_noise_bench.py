"""Cost of the secure DP-SGD noise (synth/tools/secure_noise.py) per step against torch's generator,
for the
demo's and the default UNet's trainable parameter counts: `python -m benchmarks.secure_noise_bench`.

`--paths [--device cuda] [--json F] [--tiny]`: instead, the cost per million normals (and per million DP noise values,
each the sum of 4 normals) of every path side by side in one run: the AES keystream (OpenSSL on the host; off the
CPU its words are copied to the device), ChaCha20 in torch ops on the device (synth/tools/device_noise.py), and torch's
own generator (`torch.randn`, float64 and float32; not secure, the reference)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from opacus.optimizers.optimizer import DPOptimizer

from benchmarks.common import machine, run_dp_finetune, today
from synth.mechanisms.privimage.model import make_unet
from synth.tools import dp_noise
from synth.tools.device_noise import ChaChaGaussian
from synth.tools.dp_noise import noise_like
from synth.tools.secure_noise import SecureGaussian

MILLION = 1_000_000


def _best_ms(fn, device: torch.device, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def bench(channels: tuple[int, ...], device: torch.device) -> dict:
    params = [p for p in make_unet(28, 1, 10, channels, 1).to(device).parameters()]
    n = sum(p.numel() for p in params)
    gen, secure = torch.Generator(device).manual_seed(0), SecureGaussian()
    plain = _best_ms(
        lambda: [torch.normal(0, 1.0, p.shape, device=device, generator=gen) for p in params],
        device,
    )
    safe = _best_ms(lambda: noise_like(secure, params, 1.0), device)
    return {"channels": channels, "params": n, "torch_ms": plain, "secure_ms": safe}


def _timed(fn, spent: list[float]):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        spent.append(time.perf_counter() - t)
        return out

    return wrapper


def in_training(
    secure: bool, device: torch.device, workdir: Path, steps: int = 4
) -> tuple[float, float]:
    """(ms per DP-SGD step, ms of it adding noise) for the demo model, batch 250 of 2,000 images,
    both timed in
    the same run so the shared machine's load affects them alike."""
    spent: list[float] = []
    workdir.mkdir(parents=True)
    saved = DPOptimizer.add_noise, dp_noise._secure_add_noise
    DPOptimizer.add_noise = _timed(DPOptimizer.add_noise, spent)
    dp_noise._secure_add_noise = _timed(dp_noise._secure_add_noise, spent)
    try:
        t = time.perf_counter()
        run_dp_finetune(
            2000,
            widths=(16, 32, 32),
            layers=1,
            batch_size=250,
            max_physical_batch=125,
            steps=steps,
            device=device,
            workdir=workdir,
            secure_noise=secure,
        )
        total = time.perf_counter() - t
    finally:
        DPOptimizer.add_noise, dp_noise._secure_add_noise = saved
    return total / steps * 1e3, sum(spent) / steps * 1e3


def run(quick: bool = True) -> str:
    """The "Secure noise" section of docs/benchmarks/secure_noise.md (same settings quick or
    full)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for ch in ((16, 32, 32), (32, 64, 64)):
        r = bench(ch, device)
        rows.append(f"| UNet {ch} | {r['params']:,} | {r['torch_ms']:.1f} | {r['secure_ms']:.1f} |")
    with tempfile.TemporaryDirectory() as tmp:
        steps = {
            secure: in_training(secure, device, Path(tmp) / str(secure)) for secure in (False, True)
        }
    lines = [
        f"| {'secure (default)' if s else 'torch generator'} | {t:.0f} | {n:.1f} | {100 * n / t:.1f}% |"
        for s, (t, n) in steps.items()
    ]
    return "\n".join(
        [
            "## Secure noise",
            "",
            f"{today()}, {machine()}, {torch.get_num_threads()} torch thread(s), device {device}. "
            "`python -m benchmarks.secure_noise_bench`. DP-SGD noise for every trainable parameter, once per step: torch's "
            "generator (`torch.normal`) vs. synth/tools/secure_noise.py (AES-256-CTR keystream, float64 Box-Muller, sum of 4 "
            "normals). Best of 5.",
            "",
            "| model | parameters | torch.normal ms | secure ms |",
            "|---|---|---|---|",
            *rows,
            "",
            "Inside DP-SGD (demo UNet, expected batch 250 of 2,000 images, 4 steps; step and noise timed in the same run):",
            "",
            "| noise | ms per step | of which adding noise, ms | share |",
            "|---|---|---|---|",
            *lines,
        ]
    )


def _median_ms(fn: Callable[[], object], device: torch.device, rounds: int) -> float:
    def once() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t) * 1e3

    once()  # warm-up: buffers, keys on the device, kernels
    return statistics.median(once() for _ in range(rounds))


def keystream_matches_cryptography(device: torch.device) -> bool:
    """ChaCha20 computed on `device` equals `cryptography`'s (OpenSSL) for a fresh key and nonce,
    4,096 blocks from
    block 2^32 - 2,048 (the counter word wraps; cryptography's 16-byte nonce is the counter then the nonce)."""
    import os

    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    from synth.tools.device_noise import _words, chacha20_blocks

    key, nonce, start = os.urandom(32), os.urandom(12), 2**32 - 2048
    words = chacha20_blocks(
        torch.tensor(_words(key), device=device),
        torch.tensor(_words(nonce), device=device),
        torch.arange(start, start + 4096, device=device),
    )
    got = words.cpu().numpy().astype("<u4").tobytes()
    first = Cipher(algorithms.ChaCha20(key, start.to_bytes(4, "little") + nonce), None).encryptor()
    n0 = (int.from_bytes(nonce[:4], "little") + 1) % 2**32
    carried = Cipher(
        algorithms.ChaCha20(key, bytes(4) + n0.to_bytes(4, "little") + nonce[4:]), None
    ).encryptor()
    return got == first.update(bytes(64 * 2048)) + carried.update(bytes(64 * 2048))


def paths(
    device: torch.device, n: int = MILLION, rounds: int = 5, compiled: bool = False
) -> list[dict]:
    """ms per million standard normals and per million DP noise values (sum of 4, halved), every
    path, rounds
    interleaved path by path so that the machine's load hits them alike; medians. The device's ChaCha20 keystream
    is checked against `cryptography` first, its verdict in every row. `compiled`: the eager and the
    torch.compile'd ChaCha20 only (compiling takes a while: the GPU script runs it last, on its own)."""
    checked = keystream_matches_cryptography(device)
    aes, chacha, gen = SecureGaussian(), ChaChaGaussian(), torch.Generator(device).manual_seed(0)
    fast = ChaChaGaussian(compiled=True) if compiled else None
    cases: dict[str, tuple[str, Callable[[], object], Callable[[], object]]] = {
        "AES-256-CTR keystream (OpenSSL, host), float64 Box-Muller": (
            "secure",
            lambda: aes.standard_normal(n, device),
            lambda: aes.noise((n,), 1.0, device),
        ),
        "ChaCha20 in torch integer ops on the device, float64 Box-Muller": (
            "secure",
            lambda: chacha.standard_normal(n, device),
            lambda: chacha.noise((n,), 1.0, device),
        ),
        "ChaCha20 on the device, block function torch.compile'd, float64 Box-Muller": (
            "secure",
            lambda: fast.standard_normal(n, device),
            lambda: fast.noise((n,), 1.0, device),
        ),
        "torch.randn float64 (not secure)": (
            "reference",
            lambda: torch.randn(n, generator=gen, device=device, dtype=torch.float64),
            lambda: (
                torch.randn(4, n, generator=gen, device=device, dtype=torch.float64)
                .sum(0)
                .mul_(0.5)
            ),
        ),
        "torch.randn float32 (not secure)": (
            "reference",
            lambda: torch.randn(n, generator=gen, device=device),
            lambda: torch.randn(4, n, generator=gen, device=device).sum(0).mul_(0.5),
        ),
    }
    if compiled:
        cases = {k: v for k, v in cases.items() if k.startswith("ChaCha20")}
    else:
        cases = {k: v for k, v in cases.items() if "compile" not in k}
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in cases}
    for _ in range(rounds):
        for name, (_, normals, noise) in cases.items():
            times[name][0].append(_median_ms(normals, device, 1))
            times[name][1].append(_median_ms(noise, device, 1))
    scale = MILLION / n
    return [
        {
            "path": name,
            "kind": kind,
            "device": _device_name(device),
            "n": n,
            "ms_per_million_normals": round(statistics.median(times[name][0]) * scale, 3),
            "ms_per_million_noise_values": round(statistics.median(times[name][1]) * scale, 3),
            "chacha20_on_device_matches_cryptography": checked,
            "when": today(),
        }
        for name, (kind, _, _) in cases.items()
    ]


def _device_name(device: torch.device) -> str:
    return "CPU" if device.type == "cpu" else torch.cuda.get_device_name(device)


def render_paths(rows: list[dict]) -> str:
    lines = [
        f"| {r['path']} | {r['device']} | {r['ms_per_million_normals']:.1f} | {r['ms_per_million_noise_values']:.1f} |"
        for r in rows
    ]
    check = "equals" if rows[0]["chacha20_on_device_matches_cryptography"] else "DIFFERS FROM"
    return "\n".join(
        [
            f"{today()}, {machine()}, {torch.get_num_threads()} torch thread(s), n = {rows[0]['n']:,}, "
            "median of rounds (`python -m benchmarks.secure_noise_bench --paths`). The device's ChaCha20 "
            f"keystream {check} `cryptography`'s.",
            "",
            "| path | device | ms per million normals | ms per million DP noise values (sum of 4) |",
            "|---|---|---|---|",
            *lines,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--paths", action="store_true", help="cost per million normals of every path, side by side"
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (with --paths)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--tiny", action="store_true", help="2^14 values, 1 round: checks that every path runs"
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="ChaCha20 eager against its torch.compile'd block function (with --paths)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    args = parser.parse_args()
    if not args.paths:
        print(run())
        return
    rows = paths(
        torch.device(args.device),
        1 << 14 if args.tiny else MILLION,
        1 if args.tiny else args.rounds,
        args.compiled,
    )
    print(render_paths(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
