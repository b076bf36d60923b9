"""The RDP curve memo: dp-accounting's own numbers, computed once per (q, sigma, orders)."""

from __future__ import annotations

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as rdp_module

from accounting import rdp_memo
from accounting.epsilon import RDP_ORDERS, epsilon_rdp, rdp_accountant
from accounting.events import DpSgd, GaussianQuery


def test_dp_accounting_still_has_the_function_the_memo_wraps() -> None:
    """dp-accounting is pinned; a release that moves the private function fails here."""
    rdp_accountant()
    assert rdp_memo.installed()
    assert rdp_memo.install()  # once is enough: installing again changes nothing


def test_memoised_curves_are_dp_accountings_bit_for_bit_and_never_shared() -> None:
    rdp_accountant()
    original = rdp_module._compute_rdp_poisson_subsampled_gaussian.__wrapped__
    orders = list(RDP_ORDERS)
    first = rdp_module._compute_rdp_poisson_subsampled_gaussian(0.0123, 1.37, orders)
    before = rdp_memo.stats()["hits"]
    again = rdp_module._compute_rdp_poisson_subsampled_gaussian(0.0123, 1.37, orders)
    assert rdp_memo.stats()["hits"] == before + 1
    assert np.array_equal(first, original(0.0123, 1.37, orders))
    assert np.array_equal(again, first) and again is not first
    again += 1.0  # what the accountant does with it
    third = rdp_module._compute_rdp_poisson_subsampled_gaussian(0.0123, 1.37, orders)
    assert np.array_equal(third, first)


def test_epsilon_with_the_memo_equals_a_fresh_accountant_without_it() -> None:
    history = [GaussianQuery(5.0), DpSgd(0.01, 1.1, 300), DpSgd(0.01, 1.1, 300)]
    ours = [epsilon_rdp(history, 1e-5) for _ in range(2)]  # the second from memory
    plain = dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS))
    wrapped = rdp_module._compute_rdp_poisson_subsampled_gaussian
    try:
        rdp_module._compute_rdp_poisson_subsampled_gaussian = wrapped.__wrapped__
        for event in history:
            plain.compose(event.to_dp_event())
        reference = plain.get_epsilon(1e-5)
    finally:
        rdp_module._compute_rdp_poisson_subsampled_gaussian = wrapped
    assert ours[0] == ours[1] == reference
