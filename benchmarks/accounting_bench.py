"""Accounting speed: epsilon of histories of 1, 100 and 10,000 events; 1,000 reserve+commit charges."""
from __future__ import annotations

import random
import tempfile
from pathlib import Path

from accounting import ledger
from accounting.epsilon import epsilon_pld, epsilon_rdp
from accounting.events import DpSgd, GaussianQuery
from accounting.store import Store, Workspace
from benchmarks.common import md_table, timer


def _history(n: int, distinct: int, seed: int = 0) -> list:
    """n charges drawn from `distinct` parameter settings (a steward re-running a few configurations)."""
    rng = random.Random(seed)
    kinds = [DpSgd(round(rng.uniform(0.001, 0.02), 4), round(rng.uniform(0.8, 3.0), 3), rng.randint(10, 200))
             if i % 2 else GaussianQuery(round(rng.uniform(50, 500), 1)) for i in range(distinct)]
    return [kinds[i % distinct] for i in range(n)]


def run(quick: bool = True) -> str:
    rows = []
    for n, distinct in [(1, 1), (100, 100), (10_000, 10), (10_000, 100)]:
        history = _history(n, distinct)
        with timer() as t_rdp:
            e_rdp = epsilon_rdp(history, 1e-5)
        with timer() as t_pld:
            e_pld = epsilon_pld(history, 1e-5)
        rows.append([n, distinct, f"{t_rdp[0] * 1000:.1f}", f"{t_pld[0] * 1000:.1f}", f"{e_rdp:.3f}", f"{e_pld:.3f}"])
    n_charges = 1000
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(Path(tmp) / "ws")
        ws.init()
        store = Store(ws)
        ledger.register_dataset(store, name="bench", source="bench", fingerprint="f", record_count=100_000,
                                labels=[0], image_shape=[8, 8], epsilon_cap=1e9, delta_cap=1e-6)
        event = GaussianQuery(1e4)
        with timer() as t_charges:
            for i in range(n_charges):
                ledger.reserve(store, "bench", [event], f"r{i}")
                ledger.commit(store, f"r{i}", [event])
    per = t_charges[0] / n_charges * 1000
    return "\n".join([
        "## Accounting and ledger",
        "",
        "Epsilon (delta = 1e-5) of a history of charges, by RDP (dp-accounting RdpAccountant, 156 orders) and PLD "
        "(dp-accounting PLDAccountant, discretisation 1e-4). Identical events are grouped into one SelfComposedDpEvent "
        "before accounting (exact by definition of composition), so cost grows with the number of *distinct* events.",
        "",
        md_table(["events", "distinct", "RDP ms", "PLD ms", "epsilon RDP", "epsilon PLD"], rows),
        "",
        f"Reserve + commit through the locked DuckDB store, each with its audit-trail entries: {n_charges} charges in "
        f"{t_charges[0]:.1f} s = **{per:.1f} ms per charge** (each reserve recomputes the composed epsilon of the "
        "whole history, which grows with the charges).",
    ])
