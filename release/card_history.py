"""The dataset's whole ledger history for the signed predicate, and the recipe that recomputes its
epsilon.

The predicate of a bundle carries every charge of the source dataset as of publication, in ledger
order, with each charge's counted events in Google dp-accounting's DpEvent JSON. The stated epsilon
is computed here exactly as the card's recipe computes it, with dp-accounting alone: one
ComposedDpEvent of the distinct events (each self-composed as often as it occurs, as the ledger
does), RDP on the ledger's orders and PLD at the ledger's discretisation, so a consumer can
reproduce the numbers without privrelease.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

NEIGHBOURING = "add_or_remove_one"


def ledger_history(store: Any, dataset_id: str) -> dict[str, Any]:
    """Every charge of `dataset_id` (position, run id, state, counted events) and the composed
    epsilon."""
    from accounting import ledger
    from accounting.epsilon import PLD_DISCRETIZATION, RDP_ORDERS
    from accounting.events import event_to_json

    budget = ledger.budget(store, dataset_id)
    entries = [
        {
            "position": c.position,
            "run_id": c.run_id,
            "state": c.state,
            "events": [event_to_json(e) for e in c.counted_events],
        }
        for c in budget.charges
    ]
    history = {
        "dataset_id": budget.dataset.dataset_id,
        "delta": float(budget.dataset.delta_cap),
        "neighbouring_relation": NEIGHBOURING,
        "rdp_orders": [float(a) for a in RDP_ORDERS],
        "pld_value_discretization_interval": float(PLD_DISCRETIZATION),
        "entries": entries,
    }
    history.update(recompute_epsilon(history))
    return history


def recompute_epsilon(history: dict[str, Any]) -> dict[str, float | None]:
    """RDP and PLD epsilon of the history's events (None: no DP guarantee)."""
    import dp_accounting

    counts = Counter(
        _dp_event(e["dp_event"]) for entry in history["entries"] for e in entry["events"]
    )
    composed = dp_accounting.ComposedDpEvent(
        [dp_accounting.SelfComposedDpEvent(ev, n) if n > 1 else ev for ev, n in counts.items()]
    )
    rdp = dp_accounting.rdp.RdpAccountant(orders=history["rdp_orders"])
    rdp.compose(composed)
    pld = dp_accounting.pld.PLDAccountant(
        value_discretization_interval=history["pld_value_discretization_interval"]
    )
    pld.compose(composed)

    def finite(x: float) -> float | None:  # JSON has no infinity: null means no DP guarantee
        return float(x) if math.isfinite(x) else None

    return {
        "epsilon_rdp": finite(rdp.get_epsilon(history["delta"])),
        "epsilon_pld": finite(pld.get_epsilon(history["delta"])),
    }


def _dp_event(data: Any) -> Any:
    """A DpEvent from its JSON (the same few lines the card's recipe shows)."""
    from dp_accounting import dp_event as dpe

    if isinstance(data, list):
        return tuple(_dp_event(v) for v in data)  # tuples keep events hashable (for grouping)
    if not isinstance(data, dict):
        return data
    fields = dict(data)
    return getattr(dpe, fields.pop("type"))(**{k: _dp_event(v) for k, v in fields.items()})


RECIPE = """\
import json, dp_accounting
from collections import Counter
from dp_accounting import dp_event as dpe

def event(d):  # a DpEvent from its JSON: {"type": class name, fields...}
    if isinstance(d, list):
        return tuple(event(v) for v in d)
    if not isinstance(d, dict):
        return d
    d = dict(d)
    return getattr(dpe, d.pop("type"))(**{k: event(v) for k, v in d.items()})

statement = json.load(open("{root}/manifest.intoto.json"))  # after verifying the bundle
history = statement["predicate"]["history"]
# Composition does not depend on order; identical events are grouped, as the ledger does, so a long
# history costs one accountant call per distinct event.
counts = Counter(event(e["dp_event"]) for entry in history["entries"] for e in entry["events"])
composed = dp_accounting.ComposedDpEvent(
    [dp_accounting.SelfComposedDpEvent(ev, n) if n > 1 else ev for ev, n in counts.items()])
rdp = dp_accounting.rdp.RdpAccountant(orders=history["rdp_orders"])
rdp.compose(composed)
pld = dp_accounting.pld.PLDAccountant(
    value_discretization_interval=history["pld_value_discretization_interval"])
pld.compose(composed)
print("epsilon RDP", rdp.get_epsilon(history["delta"]), "PLD", pld.get_epsilon(history["delta"]))
"""


def history_section(root: str, history: dict[str, Any]) -> list[str]:
    """Card lines: what the signed history holds and the dp-accounting recipe that recomputes it."""
    n_events = sum(len(e["events"]) for e in history["entries"])
    lines = [
        "## Recompute the privacy loss yourself",
        "",
        "The signed manifest (`manifest.intoto.json`, predicate `history`) lists all "
        f"{len(history['entries'])} charge(s) of the source dataset as of publication ({n_events} "
        "mechanism event(s)), in ledger order with their positions, each event in Google "
        "dp-accounting's DpEvent JSON. Refunded charges are listed with no events; a charge "
        "still `reserved` counts its planned events (conservative). With delta = "
        f"{history['delta']:g} they compose to epsilon {_fmt(history.get('epsilon_rdp'))} (RDP) "
        f"and {_fmt(history.get('epsilon_pld'))} (PLD). This recomputes both with dp-accounting "
        "alone (`pip install dp-accounting`):",
        "",
        "```python",
        RECIPE.replace("{root}", root).rstrip(),
        "```",
        "",
    ]
    return lines


def _fmt(x: float | None) -> str:
    return "∞ (no DP guarantee)" if x is None else f"{x:.6g}"
