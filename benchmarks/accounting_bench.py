"""Accounting speed: epsilon of histories from scratch (RDP, PLD) and from the running RDP curve;
the cost of
one charge (reserve + commit) at 0, 10,000 and 100,000 prior charges."""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from accounting import curve, ledger
from accounting.epsilon import epsilon_pld, epsilon_rdp
from accounting.events import DpSgd, GaussianQuery
from accounting.store import Store, Workspace
from benchmarks.common import md_table, timer


def _history(n: int, distinct: int, seed: int = 0) -> list:
    """n charges drawn from `distinct` parameter settings (a steward re-running a few configurations)."""
    rng = random.Random(seed)
    kinds = [
        DpSgd(
            round(rng.uniform(0.001, 0.02), 4),
            round(rng.uniform(0.8, 3.0), 3),
            rng.randint(10, 200),
        )
        if i % 2
        else GaussianQuery(round(rng.uniform(50, 500), 1))
        for i in range(distinct)
    ]
    return [kinds[i % distinct] for i in range(n)]


def _prefill(store: Store, history: list) -> None:
    """`history` as committed charges (one event each), with the rows and chained trail entries a
    ledger
    built one charge at a time holds, written in one transaction by `ledger.charge_many`."""
    ledger.charge_many(store, "bench", [[ev] for ev in history], run_prefix="pre-", actor="bench")


def _charge_ms(store: Store, n: int, tag: str) -> float:
    """Median wall time of one reserve + commit (two locked transactions, each with its trail entry)."""
    ev, times = DpSgd(0.004, 1.1, 50), []
    for i in range(n):
        t = time.perf_counter()
        ledger.reserve(store, "bench", [ev], f"{tag}-{i}")
        ledger.commit(store, f"{tag}-{i}", [ev])
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def _empty_transaction_ms(store: Store, n: int = 20) -> float:
    """The store's fixed cost per transaction: BEGIN + COMMIT on the connection the process keeps open."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        with store.transaction():
            pass
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


def _fdatasync_ms(folder: Path, n: int = 20) -> float:
    """The disk's cost of making one small write durable: DuckDB's COMMIT of a write does one
    fdatasync of its WAL,
    so a charge (two write transactions) cannot be faster than twice this."""
    path, times = folder / "fsync.probe", []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(n):
            os.write(fd, b"x" * 256)
            t = time.perf_counter()
            os.fdatasync(fd)
            times.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times) * 1000


def _scale_rows(sizes: list[int], charges: int) -> list[list]:
    rows = []
    for prior in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            ws = Workspace(Path(tmp) / "ws")
            ws.init()
            store = Store(ws)
            ds, _ = ledger.register_dataset(
                store,
                name="bench",
                source="bench",
                fingerprint="f",
                record_count=10_000_000,
                labels=[0],
                image_shape=[8, 8],
                epsilon_cap=1000,
                delta_cap=1e-8,
            )
            if prior:
                _prefill(store, _history(prior, 100))
            _charge_ms(store, 2, "warm")
            per_charge = _charge_ms(store, charges, "t")
            with timer() as t_first:
                eps = ledger.budget(store, "bench").spent_rdp if prior <= 10_000 else None
            with timer() as t_again:
                ledger.budget(store, "bench") if prior <= 10_000 else None
            with store.transaction() as con:
                t0 = time.perf_counter()
                running = curve.load(con, ds.dataset_id).epsilon(1e-8)
                t_curve = time.perf_counter() - t0
            with timer() as t_verify:
                with store.transaction() as con:
                    ok = curve.verify(con)[0]["agree"]
            rows.append(
                [
                    f"{prior:,}",
                    f"{per_charge:.1f}",
                    f"{_empty_transaction_ms(store):.2f}",
                    f"{_fdatasync_ms(Path(tmp)):.1f}",
                    f"{t_curve * 1000:.2f}",
                    f"{running:.3f}",
                    f"{t_verify[0]:.1f}",
                    "yes" if ok else "NO",
                    f"{t_first[0]:.1f} / {t_again[0]:.1f}" if eps is not None else "-",
                ]
            )
    return rows


def run(quick: bool = True) -> str:
    rows = []
    for n, distinct in [(1, 1), (100, 100), (10_000, 10), (10_000, 100)]:
        history = _history(n, distinct)
        with timer() as t_rdp:
            e_rdp = epsilon_rdp(history, 1e-5)
        with timer() as t_pld:
            e_pld = epsilon_pld(history, 1e-5)
        with timer() as t_curve:
            e_curve = curve.curve_of(history).epsilon(
                1e-5
            )  # per-event curves cached after the first
        rows.append(
            [
                n,
                distinct,
                f"{t_rdp[0] * 1000:.1f}",
                f"{t_pld[0] * 1000:.1f}",
                f"{e_rdp:.3f}",
                f"{e_pld:.3f}",
                f"{abs(e_curve - e_rdp):.1e}",
            ]
        )
    scale = _scale_rows([0, 10_000, 100_000], 15 if quick else 50)
    return "\n".join(
        [
            "## Accounting and ledger",
            "",
            "Epsilon (delta = 1e-5) of a history composed from scratch, by RDP (dp-accounting RdpAccountant, 156 orders) "
            "and PLD (dp-accounting PLDAccountant, discretisation 1e-4). Identical events are grouped into one "
            "SelfComposedDpEvent before accounting, so cost grows with the number of *distinct* events. The last column is "
            "the difference from the same epsilon taken from a sum of per-event RDP curves (the running curve's method).",
            "",
            md_table(
                [
                    "events",
                    "distinct",
                    "RDP ms",
                    "PLD ms",
                    "epsilon RDP",
                    "epsilon PLD",
                    "curve minus RDP",
                ],
                rows,
            ),
            "",
            "The ledger keeps a **running per-order RDP curve** per dataset, updated in each charge's own transaction, so a "
            "charge and a budget read no longer re-compose the history. Prior charges are written in one transaction by "
            "`ledger.charge_many` (each reserved and committed, with its two chained trail entries; 100 distinct "
            "DP-SGD/Gaussian settings), then charges are timed one by one "
            "(reserve + commit of one DP-SGD event: two locked DuckDB transactions, each with its audit-trail entry). "
            "`empty transaction ms` is the store's fixed cost per transaction (BEGIN + COMMIT: the process keeps its DuckDB "
            "connection and the file lock across a burst of transactions and lets go when another process waits or after "
            "50 ms idle, instead of connecting and checkpointing each time). `fdatasync ms` is this disk's cost of one "
            "durable small write: each write transaction's COMMIT does one, so a charge costs at least twice that. "
            "`epsilon from curve` is reading the stored curve and converting it (delta 1e-8); `budget verify` recomputes "
            "every curve from the stored events.",
            "",
            md_table(
                [
                    "prior charges",
                    "charge ms (median)",
                    "empty transaction ms",
                    "fdatasync ms",
                    "epsilon from curve ms",
                    "epsilon RDP",
                    "budget verify s",
                    "curve = recomputed",
                    "budget() s: 1st (PLD computed) / 2nd (cached)",
                ],
                scale,
            ),
        ]
    )
