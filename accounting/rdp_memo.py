"""The RDP curve of one Poisson-sampled Gaussian step, computed once per (q, sigma, orders).

dp-accounting recomputes it every time an accountant composes an event: a calibration's ~30
evaluations each compose the whole history again (the prior events' curves included, unchanged), a
plan's epsilon report and the bisection for the largest target that fits ask again for curves the
search already had. At fractional orders each curve is a series summed in Python (about 0.1 s for
our orders), so the same numbers were recomputed hundreds of times a plan.

`install()` wraps dp-accounting's own function (the one its accountant calls for
PoissonSampledDpEvent(Gaussian) and GaussianDpEvent) with a memo of its results: the values are
dp-accounting's, bit for bit; only repeats are answered from memory. It is installed by the first
accountant made (`accounting.epsilon.rdp_accountant`), never at import. The function is private to
dp-accounting, so `install` checks that it is there with the signature it wraps and, if a later
release moved it, leaves dp-accounting as it is (slower, never wrong); tests/accounting pin both.
"""

from __future__ import annotations

import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _rdp

_NAME = "_compute_rdp_poisson_subsampled_gaussian"
_MAX = 4096  # curves kept (a curve is ~100 floats)
_lock = threading.Lock()
_memo: OrderedDict[tuple[float, float, tuple[float, ...]], np.ndarray] = OrderedDict()
_stats = {"hits": 0, "misses": 0}


def _memoised(original: Callable[..., Any]) -> Callable[..., Any]:
    def curve(q: float, noise_multiplier: float, orders: Sequence[float]) -> Any:
        key = (float(q), float(noise_multiplier), tuple(float(o) for o in np.atleast_1d(orders)))
        with _lock:
            known = _memo.get(key)
            if known is not None:
                _memo.move_to_end(key)
                _stats["hits"] += 1
        if known is not None:
            return known.copy()  # the accountant adds into what it gets (`+=`): never the memo's
        value = original(q, noise_multiplier, orders)
        if np.ndim(value) == 0:  # a scalar order: nothing worth keeping
            return value
        with _lock:
            _memo[key] = np.array(value, dtype=float)
            _stats["misses"] += 1
            if len(_memo) > _MAX:
                _memo.popitem(last=False)
        return value

    curve.__wrapped__ = original  # type: ignore[attr-defined]
    return curve


def installed() -> bool:
    return hasattr(getattr(_rdp, _NAME, None), "__wrapped__")


def install() -> bool:
    """Wrap dp-accounting's curve function with the memo (once); False when it cannot be."""
    with _lock:
        current = getattr(_rdp, _NAME, None)
        if current is None:
            return False
        if hasattr(current, "__wrapped__"):
            return True
        if list(inspect.signature(current).parameters) != ["q", "noise_multiplier", "orders"]:
            return False
        setattr(_rdp, _NAME, _memoised(current))
        return True


def stats() -> dict[str, int]:
    """Hits and misses so far (benchmarks and tests)."""
    with _lock:
        return dict(_stats, kept=len(_memo))
