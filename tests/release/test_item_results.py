"""`map_items(..., lazy=True)` (release/executor.py): the results stay in the run's work folder and
come back as a sequence that reads item i when asked, keeping nothing; items are taken from the
input sequence as they are handed out. What lets a release of 10,000 heads fit through one
coordinator (issue 56)."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from accounting.errors import InvalidParameterError
from release.executor import InProcess, StoredResults, map_items

LOG: list[str] = []
MADE: list[weakref.ref] = []


def _big(config: int, item: int) -> np.ndarray:
    """A result of 80 KB, tracked by a weak reference."""
    LOG.append(f"fn {item}")
    out = np.full(10_000, item * config, dtype=np.float64)
    MADE.append(weakref.ref(out))
    return out


class _Items(Sequence[int]):
    """Items 0..n-1 that log when each is taken."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        LOG.append(f"get {i}")
        return int(i)


def _map(tmp_path, n: int, **kw: Any) -> Sequence[Any]:
    LOG.clear()
    MADE.clear()
    return map_items(
        InProcess(), tmp_path, _big, 3, _Items(n), label="t", progress=lambda *a: None, **kw
    )


def test_lazy_results_equal_the_eager_ones_and_none_is_kept(tmp_path) -> None:
    eager = _map(tmp_path / "eager", 6)
    assert isinstance(eager, list) and sum(r() is not None for r in MADE) == 6  # all held
    lazy = _map(tmp_path / "lazy", 6, lazy=True)
    assert isinstance(lazy, StoredResults) and len(lazy) == 6
    assert all(r() is None for r in MADE)  # every result let go once saved
    assert [a.tolist() for a in lazy] == [a.tolist() for a in eager]
    assert lazy[-1].tolist() == eager[5].tolist() and len(lazy[1:3]) == 2
    with pytest.raises(IndexError):
        lazy[6]


def test_items_are_taken_as_they_are_handed_out(tmp_path) -> None:
    _map(tmp_path, 3, lazy=True)
    assert LOG == ["get 0", "fn 0", "get 1", "fn 1", "get 2", "fn 2"]


def test_a_resumed_lazy_map_reads_what_was_saved_and_redoes_nothing(tmp_path) -> None:
    first = [a.tolist() for a in _map(tmp_path, 4, lazy=True)]
    again = _map(tmp_path, 4, lazy=True)
    assert LOG == [] and [a.tolist() for a in again] == first


def test_lazy_needs_the_results_kept(tmp_path) -> None:
    with pytest.raises(InvalidParameterError, match="lazy=True.*needs keep=True"):
        _map(tmp_path, 2, lazy=True, keep=False)
