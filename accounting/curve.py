"""The running RDP curve of each dataset: the sum, order by order, of the RDP of every counted
event.

RDP composes by addition at each order, so the composed history's curve is the sum of its events'
curves, and epsilon follows from the curve alone (dp-accounting's `compute_epsilon`, the same
conversion its RdpAccountant uses). Keeping that sum per dataset, updated in the same transaction as
the charge that changes it, makes a charge cost one event's curve instead of the whole history's.
`verify` recomputes every curve from the stored events (the auditor's check).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import duckdb
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

from accounting.epsilon import RDP_ORDERS, rdp_accountant
from accounting.events import (
    DpSgd,
    MechanismEvent,
    NonPrivateRelease,
    event_to_json,
    events_from_text,
)
from accounting.store import RDP_CURVES_TABLE

TABLE = RDP_CURVES_TABLE
ORDERS_KEY = json.dumps(list(RDP_ORDERS))
# Relative float error allowed between the running sum and a fresh composition (10,000 additions of
# doubles drift by ~1e-12 relative; anything near 1e-6 is a wrong curve, not rounding).
REL_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Curve:
    rdp: np.ndarray  # RDP at each order of RDP_ORDERS, DP events only
    non_private: int = 0  # non-DP (k-anonymous) releases counted: any makes epsilon infinite
    events: int = 0

    def epsilon(self, delta: float) -> float:
        if self.non_private:
            return math.inf
        if not self.events:
            return 0.0
        return float(rdp_lib.compute_epsilon(RDP_ORDERS, self.rdp, delta)[0])

    def plus(self, other: Curve, sign: int = 1) -> Curve:
        with np.errstate(
            invalid="ignore"
        ):  # inf - inf (an order where RDP is unbounded) is caught by the caller
            rdp = self.rdp + sign * other.rdp
        return Curve(
            rdp, self.non_private + sign * other.non_private, self.events + sign * other.events
        )

    def max_difference(self, other: Curve) -> float:
        with np.errstate(invalid="ignore"):
            diff = np.abs(self.rdp - other.rdp)
        diff[self.rdp == other.rdp] = 0.0  # equal infinite orders agree
        return float(np.max(diff))

    def close_to(self, other: Curve) -> bool:
        if (self.non_private, self.events) != (other.non_private, other.events):
            return False
        return bool(np.allclose(self.rdp, other.rdp, rtol=REL_TOLERANCE, atol=1e-12))


EMPTY = Curve(np.zeros(len(RDP_ORDERS)))


@lru_cache(maxsize=4096)
def _event_curve(text: str) -> tuple[float, ...]:
    """RDP curve of one event (by its JSON), from dp-accounting's RdpAccountant; cached per
    process. DP-SGD's T steps are the one-step curve times T, the very product the accountant
    computes for its self-composed event (`count * rdp`): one step's curve is computed once for all
    step counts (a what-if over steps, a run's re-charges of lost steps)."""
    event = events_from_text(f"[{text}]")[0]
    if isinstance(event, DpSgd) and event.steps > 1:
        one = _event_curve(json.dumps(event_to_json(replace(event, steps=1)), sort_keys=True))
        return tuple(float(x) for x in event.steps * np.asarray(one))
    acc = rdp_accountant()
    acc.compose(event.to_dp_event())
    return tuple(float(x) for x in acc._rdp)  # the accountant's per-order RDP (no public getter)


def curve_of(events: Iterable[MechanismEvent]) -> Curve:
    rdp, non_private, n = np.zeros(len(RDP_ORDERS)), 0, 0
    for e in events:
        n += 1
        if isinstance(e, NonPrivateRelease):
            non_private += 1
        else:
            rdp += np.asarray(_event_curve(json.dumps(event_to_json(e), sort_keys=True)))
    return Curve(rdp, non_private, n)


def _ensure_table(con: duckdb.DuckDBPyConnection) -> None:
    """Workspaces created before the running curve get the table on their first charge."""
    con.execute(TABLE)


def _has_table(con: duckdb.DuckDBPyConnection) -> bool:
    """Reads never create it: a read (or a refused command) leaves the store as it was."""
    row = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'rdp_curves' "
        "AND table_schema = current_schema()"
    ).fetchone()
    return bool(row and row[0])


def from_scratch(con: duckdb.DuckDBPyConnection, dataset_id: str) -> Curve:
    """The curve recomputed from the counted events of the dataset's charges table."""
    rows = con.execute(
        "SELECT state, planned_events, charged_events FROM "
        "charges WHERE dataset_id = ? ORDER BY position",
        [dataset_id],
    ).fetchall()
    counted = [
        e
        for state, planned, charged in rows
        for e in events_from_text({"reserved": planned, "committed": charged}.get(state, "[]"))
    ]
    return curve_of(counted)


def load(con: duckdb.DuckDBPyConnection, dataset_id: str) -> Curve:
    """The stored running curve; recomputed from the charges if there is none (a workspace from
    before the running curve) or the order grid changed. Writes nothing: the next charge stores
    it."""
    row = (
        con.execute(
            "SELECT rdp, non_private, events, orders FROM rdp_curves WHERE dataset_id = ?",
            [dataset_id],
        ).fetchone()
        if _has_table(con)
        else None
    )
    if row is None or row[3] != ORDERS_KEY:
        return from_scratch(con, dataset_id)
    return Curve(np.asarray(json.loads(row[0]), dtype=np.float64), int(row[1]), int(row[2]))


def save_change(
    con: duckdb.DuckDBPyConnection,
    dataset_id: str,
    before: Curve,
    add: Sequence[MechanismEvent] = (),
    remove: Sequence[MechanismEvent] = (),
) -> Curve:
    """Store `before` (loaded before the charges table changed, same transaction) + events now
    counted - events no longer counted."""
    new = before.plus(curve_of(add)).plus(curve_of(remove), -1)
    if not np.all(np.isfinite(new.rdp)) or new.events < 0:
        # an infinite order cannot be subtracted back: recompute exactly
        new = from_scratch(con, dataset_id)
    # An UPDATE, and an INSERT only where the row is missing (DuckDB's upsert costs 5x more per
    # charge); registering a dataset writes its row, so that is a workspace from before the curve.
    _ensure_table(con)
    values = [json.dumps(new.rdp.tolist()), new.non_private, new.events, ORDERS_KEY]
    updated = con.execute(
        "UPDATE rdp_curves SET rdp = ?, non_private = ?, events = ?, orders = ? "
        "WHERE dataset_id = ? RETURNING dataset_id",
        [*values, dataset_id],
    ).fetchall()
    if not updated:
        con.execute("INSERT INTO rdp_curves VALUES (?, ?, ?, ?, ?)", [dataset_id, *values])
    return new


def verify(con: duckdb.DuckDBPyConnection) -> list[dict]:
    """Per dataset: the stored running curve against one recomputed from the stored events."""
    stored = _has_table(con)
    out = []
    for dataset_id, name, delta in con.execute(
        "SELECT dataset_id, name, delta_cap FROM datasets ORDER BY name"
    ).fetchall():
        row = (
            con.execute(
                "SELECT rdp, non_private, events FROM rdp_curves WHERE dataset_id = ?",
                [dataset_id],
            ).fetchone()
            if stored
            else None
        )
        fresh = from_scratch(con, dataset_id)
        running = (
            None
            if row is None
            else Curve(np.asarray(json.loads(row[0]), dtype=np.float64), int(row[1]), int(row[2]))
        )
        agree = running.close_to(fresh) if running is not None else fresh.events == 0
        out.append(
            {
                "dataset": name,
                "dataset_id": dataset_id,
                "agree": agree,
                "epsilon_rdp_running": running.epsilon(delta) if running is not None else 0.0,
                "epsilon_rdp_recomputed": fresh.epsilon(delta),
                "max_abs_rdp_difference": running.max_difference(fresh)
                if running is not None and running.events == fresh.events
                else None,
            }
        )
    return out
