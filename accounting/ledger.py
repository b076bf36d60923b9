"""The budget ledger: datasets with caps, and the charges (runs) against them.

Epsilon is always derived from the whole composed history by RDP (the reference) and PLD (reported
beside it). The cap is enforced as a privacy filter over the running RDP curve (accounting.filter:
the stop rule a theorem proves valid when each release is chosen after seeing the earlier ones). A
charge is `reserved` (its planned events count), `committed` (the executed events count) or
`refunded` (nothing counts).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from accounting import curve, trail
from accounting import filter as privacy_filter
from accounting.epsilon import EpsilonReport, epsilon_report
from accounting.errors import (
    BudgetExceededError,
    DataFormatError,
    DatasetConflictError,
    LedgerStateError,
    UnknownDatasetError,
)
from accounting.events import MechanismEvent, NonPrivateRelease, events_from_text, events_to_text
from accounting.store import Store
from accounting.validation import check_count, check_delta, check_epsilon

ACTIVE_STATES = ("reserved", "committed")


@dataclass(frozen=True)
class Dataset:
    dataset_id: str
    name: str
    source: str
    fingerprint: str
    record_count: int
    labels: list[int]
    image_shape: list[int]
    privacy_unit: str
    epsilon_cap: float
    delta_cap: float
    registered_at: str
    registered_by: str

    @classmethod
    def from_row(cls, row: dict) -> Dataset:
        row = dict(row)
        row["labels"] = json.loads(row["labels"])
        row["image_shape"] = json.loads(row["image_shape"])
        return cls(**row)


@dataclass(frozen=True)
class Charge:
    position: int
    run_id: str
    dataset_id: str
    state: str
    planned_events: list[MechanismEvent]
    charged_events: list[MechanismEvent]
    description: str
    actor: str
    reserved_at: str
    settled_at: str | None

    @property
    def counted_events(self) -> list[MechanismEvent]:
        return {"reserved": self.planned_events, "committed": self.charged_events}.get(
            self.state, []
        )

    @classmethod
    def from_row(cls, row: dict) -> Charge:
        row = dict(row)
        row["planned_events"] = events_from_text(row["planned_events"])
        row["charged_events"] = events_from_text(row["charged_events"])
        return cls(**row)


@dataclass(frozen=True)
class Budget:
    dataset: Dataset
    charges: list[Charge]
    spent_rdp: float  # RDP epsilon of the history, from the running curve (milliseconds)
    # Under adaptive choice of releases (accounting.filter): the filter's epsilon of the running
    # curve (the cap check: <= cap while the filter admits) and the odometer's bound on the spend,
    # valid at every time at once.
    filter_epsilon: float = 0.0
    odometer_epsilon: float = 0.0
    # PLD epsilon of the history: seconds for a long one, so computed (and cached) when first read
    pld: Callable[[], float] = field(default=lambda: math.nan, repr=False, compare=False)

    @cached_property
    def spent(self) -> EpsilonReport:
        """RDP and PLD epsilon of the whole history (PLD computed on first use: the runner's and
        the cap check's reads of the charges need only RDP)."""
        return EpsilonReport(self.spent_rdp, self.pld(), self.dataset.delta_cap)

    @property
    def remaining_rdp(self) -> float:
        return max(0.0, self.dataset.epsilon_cap - self.spent_rdp)

    @property
    def history(self) -> list[MechanismEvent]:
        return [e for c in self.charges for e in c.counted_events]

    @property
    def dp_void(self) -> bool:
        """True once a non-DP (k-anonymous) release was made from this dataset (rule 5)."""
        return any(isinstance(e, NonPrivateRelease) for e in self.history)


# ------------------------------------------------------------------ datasets
def register_dataset(
    store: Store,
    *,
    name: str,
    source: str,
    fingerprint: str,
    record_count: int,
    labels: Sequence[int],
    image_shape: Sequence[int],
    epsilon_cap: float,
    delta_cap: float,
    privacy_unit: str = "one image",
    actor: str = "steward",
) -> tuple[Dataset, bool]:
    """Register a dataset; returns (dataset, created). Same name + same content is a no-op;
    same name + different content is refused (the ledger would otherwise mix two datasets)."""
    record_count = _checked_registration(
        name, source, privacy_unit, epsilon_cap, delta_cap, record_count
    )
    with store.transaction() as con:
        existing = _registered_id(con, name, fingerprint)
        dataset_id = existing or "ds-" + uuid.uuid4().hex[:12]
        if existing is None:
            # the row as Dataset holds it, written once here and read back below
            new = Dataset(
                dataset_id,
                name,
                source,
                fingerprint,
                record_count,
                sorted(int(x) for x in labels),
                [int(x) for x in image_shape],
                privacy_unit,
                float(epsilon_cap),
                float(delta_cap),
                trail.now(),
                actor,
            )
            _insert_dataset(con, store, new)
    return get_dataset(store, dataset_id), existing is None


def _checked_registration(
    name: str,
    source: str,
    privacy_unit: str,
    epsilon_cap: float,
    delta_cap: float,
    record_count: int,
) -> int:
    """Refuse a bad name, non-UTF-8 text or bad caps before the store is touched; returns the
    checked record count."""
    if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise DatasetConflictError(
            f"Dataset name {name!r} must be letters, digits, '-', '_' or '.'."
        )
    for what, text in (("source", source), ("privacy unit", privacy_unit)):
        try:  # the store holds text: a name the file system kept as raw bytes fails the INSERT
            text.encode("utf-8")
        except UnicodeEncodeError:
            shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise DataFormatError(
                f"{shown}: the {what} is not valid UTF-8 (the bytes escaped here). Rename the "
                "file or folder in UTF-8 (e.g. `convmv -f latin1 -t utf8 --notest -r PATH`) and "
                "register again. Nothing was registered."
            ) from None
    check_epsilon(epsilon_cap, "epsilon cap")
    check_delta(delta_cap, "delta cap")
    record_count = check_count(record_count, "record count")
    if delta_cap >= 1.0 / record_count:
        raise DatasetConflictError(
            f"delta cap {delta_cap:g} is not below 1/n = {1 / record_count:.3g}: with that delta a "
            "mechanism may publish a whole record. Choose delta well below 1/n."
        )
    return record_count


def _registered_id(con, name: str, fingerprint: str) -> str | None:
    """The id already registered under `name` for this content (None: new); refuses the same name
    with other content, or this content under another name (it would double its budget)."""
    row = con.execute(
        "SELECT fingerprint, dataset_id FROM datasets WHERE name = ?", [name]
    ).fetchone()
    if row is not None:
        if row[0] != fingerprint:
            raise DatasetConflictError(
                f"A dataset named {name!r} is already registered with different content. Its "
                "ledger belongs to that content; register the new data under a new name."
            )
        return row[1]
    twin = con.execute("SELECT name FROM datasets WHERE fingerprint = ?", [fingerprint]).fetchone()
    if twin is not None:
        raise DatasetConflictError(
            f"This content is already registered as {twin[0]!r}. One dataset has one "
            "budget: registering it again under another name would double its privacy "
            "budget. Use the existing name."
        )
    return None


def _insert_dataset(con, store: Store, d: Dataset) -> None:
    """The new dataset's row, its empty curve and its trail entry, in the caller's transaction."""
    values = [
        d.dataset_id,
        d.name,
        d.source,
        d.fingerprint,
        d.record_count,
        json.dumps(d.labels),
        json.dumps(d.image_shape),
        d.privacy_unit,
        d.epsilon_cap,
        d.delta_cap,
        d.registered_at,
        d.registered_by,
    ]
    con.execute("INSERT INTO datasets VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", values)
    curve.save_change(con, d.dataset_id, curve.EMPTY)  # reads then find a curve, write none
    trail.append(
        con,
        store,
        d.registered_by,
        "dataset.register",
        {
            "dataset_id": d.dataset_id,
            "name": d.name,
            "record_count": d.record_count,
            "epsilon_cap": d.epsilon_cap,
            "delta_cap": d.delta_cap,
            "fingerprint": d.fingerprint,
        },
    )


def get_dataset(store: Store, name_or_id: str) -> Dataset:
    with store.transaction() as con:
        return _dataset_row(con, name_or_id)


def list_datasets(store: Store) -> list[Dataset]:
    return [
        Dataset.from_row(r) for r in store.query("SELECT * FROM datasets ORDER BY registered_at")
    ]


# ------------------------------------------------------------------ charges
def _charges(con, dataset_id: str) -> list[Charge]:
    return [
        Charge.from_row(r)
        for r in _rows(
            con, "SELECT * FROM charges WHERE dataset_id = ? ORDER BY position", [dataset_id]
        )
    ]


def _dataset_row(con, name_or_id: str) -> Dataset:
    rows = _rows(
        con, "SELECT * FROM datasets WHERE name = ? OR dataset_id = ?", [name_or_id, name_or_id]
    )
    if not rows:
        known = (
            ", ".join(r["name"] for r in _rows(con, "SELECT name FROM datasets ORDER BY name"))
            or "none yet"
        )
        raise UnknownDatasetError(
            f"Unknown dataset {name_or_id!r} (registered: {known}). "
            "Register it with `privrelease dataset register`."
        )
    return Dataset.from_row(rows[0])


def _charge_row(con, run_id: str) -> Charge | None:
    rows = _rows(con, "SELECT * FROM charges WHERE run_id = ?", [run_id])
    return Charge.from_row(rows[0]) if rows else None


def reserve(
    store: Store,
    dataset: str,
    events: Sequence[MechanismEvent],
    run_id: str,
    *,
    description: str = "",
    actor: str = "system",
    allow_non_private: bool = False,
) -> Charge:
    """Atomically check the composed epsilon (history + events) against the cap and record the
    reservation. Replaying the same run id with the same events returns the existing charge."""
    events = list(events)
    non_private = _check_events(events, allow_non_private)
    with store.transaction() as con:
        ds = _dataset_row(con, dataset)
        existing = _charge_row(con, run_id)
        if existing is not None:
            if existing.dataset_id != ds.dataset_id or events_to_text(
                existing.planned_events
            ) != events_to_text(events):
                raise LedgerStateError(
                    f"Run id {run_id!r} was already used for a "
                    "different reservation; use a new run id."
                )
            return existing  # replay: no second charge
        # the running RDP curve: no re-composition of the history
        before = curve.load(con, ds.dataset_id)
        eps = math.inf if non_private else _admitted_epsilon(ds, before, events)
        pos = con.execute("SELECT coalesce(max(position), 0) + 1 FROM charges").fetchone()[0]
        text = events_to_text(events)
        con.execute(
            "INSERT INTO charges VALUES (?, ?, ?, 'reserved', ?, '[]', ?, ?, ?, NULL)",
            [pos, run_id, ds.dataset_id, text, description, actor, trail.now()],
        )
        curve.save_change(con, ds.dataset_id, before, add=events)
        charge, record = _charge_and_record(con, run_id)
        trail.append(
            con,
            store,
            actor,
            "budget.reserve",
            {
                **record,
                "events": json.loads(text),
                "epsilon_rdp_after": None if math.isinf(eps) else eps,
                "description": description,
            },
        )
        return charge


def _check_events(events: list[MechanismEvent], allow_non_private: bool) -> bool:
    """Refuse an empty reservation, or a non-DP one without its acknowledgement, before the store
    is touched; returns whether it is non-DP."""
    if not events:
        raise LedgerStateError("A reservation needs at least one mechanism event.")
    non_private = any(isinstance(e, NonPrivateRelease) for e in events)
    if non_private and not allow_non_private:
        raise LedgerStateError(
            "This run makes a release without a DP guarantee, after which no release of this "
            "dataset keeps a DP guarantee (its epsilon becomes infinite). Nothing was charged. To "
            "accept that, approve the release with `privrelease release approve REL "
            "--acknowledge-non-dp`."
        )
    return non_private


def _admitted_epsilon(ds: Dataset, before: curve.Curve, events: list[MechanismEvent]) -> float:
    """The epsilon after adding DP `events` to the running curve, refused unless the cap's filter
    admits it."""
    after = before.plus(curve.curve_of(events))
    eps = after.epsilon(ds.delta_cap)
    if after.non_private or not privacy_filter.admits(after.rdp, ds.epsilon_cap, ds.delta_cap):
        raise BudgetExceededError(_over_cap(ds, before, after))
    return eps


CHARGE_COLUMNS = (
    "position",
    "run_id",
    "dataset_id",
    "state",
    "planned_events",
    "charged_events",
    "description",
    "actor",
    "reserved_at",
    "settled_at",
)


def charge_many(
    store: Store,
    dataset: str,
    histories: Sequence[Sequence[MechanismEvent]],
    *,
    run_prefix: str,
    description: str = "",
    actor: str = "system",
) -> list[Charge]:
    """Reserve then commit each of `histories` (one charge each, run ids `run_prefix`1, 2, ...) in
    one transaction, with the rows and trail entries `reserve` and `commit` would write one by one:
    for seeding a large ledger (benchmarks/accounting_bench.py). The cap's filter is checked once,
    on the final curve, before anything is written: RDP only grows as charges are added, so a final
    curve it admits admits every prefix.

    Raises:
        LedgerStateError: no charges, an empty one, a non-DP event, or a run id already used.
        BudgetExceededError: the charges together would pass the cap's filter (nothing is written).
    """
    histories = [list(h) for h in histories]
    _check_histories(histories)
    with store.transaction() as con:
        ds = _dataset_row(con, dataset)
        if con.execute(
            "SELECT count(*) FROM charges WHERE starts_with(run_id, ?)", [run_prefix]
        ).fetchone()[0]:
            raise LedgerStateError(
                f"Run ids starting with {run_prefix!r} are already in the ledger; use a new prefix."
            )
        before = curve.load(con, ds.dataset_id)
        after = before.plus(curve.curve_of([e for h in histories for e in h]))
        if after.non_private or not privacy_filter.admits(after.rdp, ds.epsilon_cap, ds.delta_cap):
            raise BudgetExceededError(_over_cap(ds, before, after))
        pos = con.execute("SELECT coalesce(max(position), 0) + 1 FROM charges").fetchone()[0]
        ts = trail.now()
        rows, entries = _seeded_charges(
            histories,
            pos,
            ts,
            ds,
            before,
            run_prefix=run_prefix,
            description=description,
            actor=actor,
        )
        trail._insert_many(con, "charges", CHARGE_COLUMNS, rows)
        curve.save_change(con, ds.dataset_id, before, add=[e for h in histories for e in h])
        trail.append_many(con, store, actor, entries)
        return [Charge.from_row(dict(zip(CHARGE_COLUMNS, r, strict=True))) for r in rows]


def _check_histories(histories: Sequence[Sequence[MechanismEvent]]) -> None:
    """Refuse no charges, an empty one or a non-DP event before the store is touched."""
    if not histories or not all(histories):
        raise LedgerStateError(
            "charge_many needs at least one charge, each with at least one mechanism event."
        )
    if any(isinstance(e, NonPrivateRelease) for h in histories for e in h):
        raise LedgerStateError(
            "charge_many records DP charges only; reserve a non-DP release on its own."
        )


def _seeded_charges(
    histories: Sequence[Sequence[MechanismEvent]],
    pos: int,
    ts: str,
    ds: Dataset,
    before: curve.Curve,
    *,
    run_prefix: str,
    description: str,
    actor: str,
) -> tuple[list[list], list[tuple[str, dict]]]:
    """The committed rows of `charge_many` and their reserve/commit trail entries, one pair each."""
    running, rows, entries = before, [], []
    for i, events in enumerate(histories):
        text = events_to_text(events)
        row = {
            "position": pos + i,
            "run_id": f"{run_prefix}{i + 1}",
            "dataset_id": ds.dataset_id,
            "state": "reserved",
            "planned_events": text,
            "charged_events": "[]",
            "description": description,
            "actor": actor,
            "reserved_at": ts,
            "settled_at": None,
        }
        running = running.plus(curve.curve_of(events))
        entries.append(
            (
                "budget.reserve",
                {
                    **charge_record(row),
                    "events": json.loads(text),
                    "epsilon_rdp_after": running.epsilon(ds.delta_cap),
                    "description": description,
                },
            )
        )
        row = {**row, "state": "committed", "charged_events": text, "settled_at": ts}
        entries.append(("budget.commit", {**charge_record(row), "events": json.loads(text)}))
        rows.append([row[k] for k in CHARGE_COLUMNS])
    return rows, entries


def _over_cap(ds: Dataset, before: curve.Curve, after: curve.Curve) -> str:
    if after.non_private:
        return (
            f"Dataset {ds.name!r} already had a release without a DP guarantee: no further DP "
            "release can claim a finite epsilon. Nothing was charged."
        )
    return (
        f"Budget exceeded for dataset {ds.name!r}: the cap's privacy filter, "
        "which keeps the cap valid however releases are chosen, would stop here. "
        f"This run would bring the filter's epsilon (delta={ds.delta_cap:g}) from "
        f"{privacy_filter.filter_epsilon(before.rdp, ds.delta_cap):.4g} to "
        f"{privacy_filter.filter_epsilon(after.rdp, ds.delta_cap):.4g}, over the "
        f"cap {ds.epsilon_cap:g} (RDP epsilon {after.epsilon(ds.delta_cap):.4g}). "
        "Nothing was charged. Use more noise or fewer steps (see `privrelease "
        "budget plan`), or a smaller target epsilon."
    )


def commit(
    store: Store, run_id: str, executed_events: Sequence[MechanismEvent], *, actor: str = "system"
) -> Charge:
    """Settle a run that read data: what it executed stays charged, the unexecuted remainder is
    released. Executed events may not cost more than the reservation."""
    executed = list(executed_events)
    with store.transaction() as con:
        charge = _charge_row(con, run_id)
        if charge is None:
            raise LedgerStateError(f"No reservation for run {run_id!r}; reserve before running.")
        text = events_to_text(executed)
        if charge.state == "committed":
            if events_to_text(charge.charged_events) == text:
                return charge
            raise LedgerStateError(f"Run {run_id!r} is already committed with different events.")
        if charge.state == "refunded":
            raise LedgerStateError(
                f"Run {run_id!r} was refunded; it cannot be committed. Start a new run."
            )
        ds = _dataset_row(con, charge.dataset_id)
        if not any(isinstance(e, NonPrivateRelease) for e in charge.planned_events):
            _check_within_reservation(run_id, charge.planned_events, executed, ds.delta_cap)
        before = curve.load(con, charge.dataset_id)
        con.execute(
            "UPDATE charges SET state = 'committed', "
            "charged_events = ?, settled_at = ? WHERE run_id = ?",
            [text, trail.now(), run_id],
        )
        curve.save_change(
            con, charge.dataset_id, before, add=executed, remove=charge.planned_events
        )
        charge, record = _charge_and_record(con, run_id)
        trail.append(con, store, actor, "budget.commit", {**record, "events": json.loads(text)})
        return charge


def _check_within_reservation(
    run_id: str, planned_events: list, executed: list, delta: float
) -> None:
    """The filter admitted the reserved curve; what ran must not exceed it at any order."""
    planned, actual = curve.curve_of(planned_events), curve.curve_of(executed)
    with np.errstate(invalid="ignore"):
        over = actual.rdp > planned.rdp + privacy_filter.TOLERANCE * np.maximum(
            1.0, np.abs(planned.rdp)
        )
    if actual.non_private or np.any(over):
        raise LedgerStateError(
            f"Run {run_id!r} executed more (epsilon {actual.epsilon(delta):.4g}) "
            f"than it reserved ({planned.epsilon(delta):.4g}) at some RDP order; "
            "this is a bug in the mechanism. Nothing was changed."
        )


def refund(store: Store, run_id: str, *, reason: str, actor: str = "system") -> Charge:
    """Release the reservation of a run that failed before reading sensitive data."""
    with store.transaction() as con:
        charge = _charge_row(con, run_id)
        if charge is None:
            raise LedgerStateError(f"No reservation for run {run_id!r}.")
        if charge.state == "refunded":
            return charge
        if charge.state == "committed":
            raise LedgerStateError(
                f"Run {run_id!r} is committed and cannot be refunded: it read the data, so what it "
                "executed stays charged. Nothing was changed."
            )
        before = curve.load(con, charge.dataset_id)
        con.execute(
            "UPDATE charges SET state = 'refunded', settled_at = ? WHERE run_id = ?",
            [trail.now(), run_id],
        )
        curve.save_change(con, charge.dataset_id, before, remove=charge.planned_events)
        charge, record = _charge_and_record(con, run_id)
        trail.append(con, store, actor, "budget.refund", {**record, "reason": reason})
        return charge


RECORD_FIELDS = ("run_id", "dataset_id", "position", "state", "planned_events", "charged_events")


def charge_record(row: dict) -> dict:
    """What a budget.* trail entry commits to: the charge row's accounting fields (events as parsed
    JSON) after the change. `privrelease audit verify` replays these and compares them with the
    table."""
    out = {k: row[k] for k in RECORD_FIELDS}
    out["planned_events"], out["charged_events"] = (
        json.loads(row["planned_events"]),
        json.loads(row["charged_events"]),
    )
    return out


def _charge_and_record(con, run_id: str) -> tuple[Charge, dict]:
    """The charge after a change and its trail record, from one read of the row."""
    row = _rows(con, "SELECT * FROM charges WHERE run_id = ?", [run_id])[0]
    return Charge.from_row(row), charge_record(row)


def _record(con, run_id: str) -> dict:
    return charge_record(_rows(con, "SELECT * FROM charges WHERE run_id = ?", [run_id])[0])


def get_charge(store: Store, run_id: str) -> Charge | None:
    with store.transaction() as con:
        return _charge_row(con, run_id)


def budget(store: Store, dataset: str) -> Budget:
    """The dataset's cap, its charges and the composed spend. Reading never changes the ledger."""
    with store.transaction() as con:
        ds = _dataset_row(con, dataset)
        charges = _charges(con, ds.dataset_id)
        running = curve.load(con, ds.dataset_id)
    history = [e for c in charges for e in c.counted_events]
    rdp = running.epsilon(ds.delta_cap)  # the running curve: milliseconds at any ledger length
    void = math.isinf(rdp)
    return Budget(
        ds,
        charges,
        rdp,
        filter_epsilon=math.inf
        if void
        else privacy_filter.filter_epsilon(running.rdp, ds.delta_cap),
        odometer_epsilon=math.inf if void else privacy_filter.odometer(running.rdp, ds.delta_cap),
        pld=lambda: pld_cached(store, ds.dataset_id, history, ds.delta_cap, rdp),
    )


def pld_cached(
    store: Store, dataset_id: str, history: list[MechanismEvent], delta: float, rdp: float
) -> float:
    """PLD epsilon of the history, cached by the history's content (PLD of a long history takes
    seconds; it is recomputed only when the history changed, on the first read after a charge).
    The cache is a file in the workspace (`ledger_cache`), not a table: reading the ledger, or a
    command refused after reading it, leaves the store byte for byte as it was. Stores from before
    kept it in a `pld_cache` table, which nothing reads any more."""
    key = hashlib.sha256(f"{delta!r}|{events_to_text(history)}".encode()).hexdigest()
    path = store.workspace.ledger_cache / f"pld-{dataset_id}.json"
    try:
        cached = json.loads(path.read_text())
        if cached["history_key"] == key:
            return float(cached["epsilon_pld"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, being replaced, or not ours: recompute
    value = epsilon_report(history, delta).epsilon_pld if history else 0.0
    if math.isinf(rdp):
        value = math.inf
    _write_cache(path, {"history_key": key, "epsilon_pld": value})
    return value


def _write_cache(path: Path, data: dict) -> None:
    """Replace `path` atomically (readers see the old entry or the new one); a workspace that cannot
    be written only loses the cache."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError:
        pass


def all_charges(store: Store) -> list[tuple[Dataset, Charge]]:
    with store.transaction() as con:
        datasets = {
            d["dataset_id"]: Dataset.from_row(d) for d in _rows(con, "SELECT * FROM datasets")
        }
        rows = _rows(con, "SELECT * FROM charges ORDER BY position")
    return [(datasets[r["dataset_id"]], Charge.from_row(r)) for r in rows]


def _rows(con, sql: str, params: Iterable = ()) -> list[dict]:
    cur = con.execute(sql, list(params))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
