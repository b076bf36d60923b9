"""Epsilon of a composed history: RDP (the reference) and PLD (tighter, reported beside it).

Both come from Google's dp-accounting; we never add epsilons. The add-or-remove-one neighbouring
relation is used throughout (the privacy unit is one record), as in opacus' DP-SGD analysis.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeAlias

import dp_accounting
from dp_accounting import dp_event as dpe

from accounting import rdp_memo
from accounting.events import MechanismEvent, compose
from accounting.validation import check_delta

# dp-accounting's default grid (156 orders from 1.1 to 1024).
RDP_ORDERS: tuple[float, ...] = tuple(
    float(a) for a in dp_accounting.rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS
)
PLD_DISCRETIZATION = 1e-4


class _ConvergenceNoise(logging.Filter):
    """dp-accounting logs "failed to converge" at WARNING while its bracketing search probes extreme
    orders (the order is then excluded, which is conservative); that fills the terminal during
    calibration. Only these records are dropped; absl's level is left as the process set it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


_CONVERGENCE_NOISE = _ConvergenceNoise()


def _drop_convergence_noise() -> None:
    logging.getLogger("absl").addFilter(_CONVERGENCE_NOISE)  # idempotent: the same filter object


@contextmanager
def quiet_absl() -> Iterator[None]:
    """Around dp-accounting calls that do not go through rdp_accountant()."""
    _drop_convergence_noise()
    yield


History: TypeAlias = dpe.DpEvent | Iterable[MechanismEvent]


def _as_dp_event(history: History) -> dpe.DpEvent:
    return history if isinstance(history, dpe.DpEvent) else compose(history)


def rdp_accountant() -> dp_accounting.rdp.RdpAccountant:
    _drop_convergence_noise()
    rdp_memo.install()  # the same curve is asked for again and again (accounting/rdp_memo.py)
    return dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS))


def pld_accountant() -> dp_accounting.pld.PLDAccountant:
    return dp_accounting.pld.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)


def epsilon_rdp(history: History, delta: float) -> float:
    acc = rdp_accountant()
    acc.compose(_as_dp_event(history))
    return float(acc.get_epsilon(check_delta(delta)))


def epsilon_pld(history: History, delta: float) -> float:
    acc = pld_accountant()
    acc.compose(_as_dp_event(history))
    return float(acc.get_epsilon(check_delta(delta)))


@dataclass(frozen=True)
class EpsilonReport:
    epsilon_rdp: float
    epsilon_pld: float
    delta: float

    @property
    def finite(self) -> bool:
        return math.isfinite(self.epsilon_rdp)

    def as_dict(self) -> dict[str, float | None]:
        # JSON has no infinity: a voided DP guarantee is reported as null.
        def clean(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "epsilon_rdp": clean(self.epsilon_rdp),
            "epsilon_pld": clean(self.epsilon_pld),
            "delta": self.delta,
        }


# Above this RDP epsilon the PLD is not computed (its grid grows to gigabytes for very low noise,
# and no budget is that large): the PLD figure is then the RDP one, a valid upper bound.
PLD_MAX_EPSILON = 100.0


# Reports already computed in this process, by the composed history's repr and delta: a PLD takes
# seconds and a plan asks for the same histories again (before and after, the dashboard's preview).
_REPORTS: OrderedDict[str, EpsilonReport] = OrderedDict()
_REPORTS_MAX = 256
_REPORTS_LOCK = threading.Lock()


def epsilon_report(history: History, delta: float) -> EpsilonReport:
    event = _as_dp_event(history)
    key = hashlib.sha256(f"{event!r}|{float(delta)!r}".encode()).hexdigest()
    with _REPORTS_LOCK:
        known = _REPORTS.get(key)
    if known is not None:
        return known
    rdp = epsilon_rdp(event, delta)
    pld = epsilon_pld(event, delta) if rdp <= PLD_MAX_EPSILON else rdp
    report = EpsilonReport(rdp, pld, float(delta))
    with _REPORTS_LOCK:
        _REPORTS[key] = report
        if len(_REPORTS) > _REPORTS_MAX:
            _REPORTS.popitem(last=False)
    return report
