"""merf admission (issue 57, item 6): a release whose run could not finish is refused before
anything is charged. `z_dim = 1e9` or `batch = 1e9` used to read the data, charge and die
allocating tens of GB; `bandwidth = 1e-300` made the features infinite and released black images
after committing epsilon; `n_samples` up to 1e7 is terabytes of images; `preset = "demo"` (merf has
none) ended in a bare AttributeError (issue 55)."""

from __future__ import annotations

import hashlib

import pytest

from accounting import ledger
from accounting.errors import InvalidParameterError
from accounting.store import Store
from synth import registry
from synth.kinds.datasets import uci_digits
from synth.mechanisms.merf import MerfConfig, admission
from synth.mechanisms.merf.run import MECHANISM
from synth.tools.kernel.fit import generator_size

MNIST = registry.DatasetInfo("d", "d", 4000, tuple(range(10)), (28, 28), 1e-5)
PHOTOS = registry.DatasetInfo("p", "p", 2000, (0,), (512, 512, 3), 1e-5)


def _plan(info: registry.DatasetInfo, **overrides) -> registry.MechanismPlan:
    cfg = MerfConfig(4.0, 1e-5, teacher_labels=False, **overrides)
    return MECHANISM.plan(cfg, info, [], uci_digits())


@pytest.mark.parametrize(
    "info, overrides, part, advice",
    [
        (MNIST, {"z_dim": 10**9}, "generator and its optimiser", "lower `z_dim` or `width`"),
        (MNIST, {"batch": 10**9}, "generator training", "lower `batch`"),
        (PHOTOS, {"n_samples": 10**7}, "drawing the released images", "lower `n_images`"),
    ],
)
def test_a_run_larger_than_the_machine_is_refused_at_plan_time_with_the_number_and_the_limit(
    info, overrides, part, advice
) -> None:
    with pytest.raises(InvalidParameterError) as refused:
        _plan(info, **overrides)
    message = str(refused.value)
    limit = admission.MEMORY_SHARE * admission.machine_memory()
    assert f"({part}: " in message and advice.capitalize() in message
    assert f"more than the {limit / 1e9:,.1f} GB a run may use here" in message
    assert "Nothing was charged" in message and "Traceback" not in message


def test_the_defaults_are_admitted_and_the_estimate_counts_what_drives_each_part() -> None:
    assert _plan(MNIST).events  # the defaults on MNIST-sized data fit a small machine
    base = dict(
        image_shape=(28, 28),
        n_records=4000,
        n_classes=10,
        size=generator_size(28, 28),
        n_features=4000,
        z_dim=60,
        width=16,
        batch=200,
        n_samples=10_000,
        perceptual_share=0.5,
        teacher_batch=None,
    )
    small = admission.memory_estimate(**base)
    assert small.total < 4e9  # measured well under: the estimate is generous, not absurd
    for key, part in [
        ("z_dim", "generator and its optimiser"),
        ("batch", "generator training"),
        ("n_samples", "drawing the released images"),
    ]:
        big = admission.memory_estimate(**{**base, key: base[key] * 1000})
        assert big.largest[0] == part
    # an explicit limit below the estimate refuses with both numbers
    with pytest.raises(InvalidParameterError, match=r"more than the 100 MB a run may use"):
        admission.check_memory(small, limit=10**8)


@pytest.mark.parametrize("bandwidth", [1e-300, 1e-3, 1e300])
def test_a_bandwidth_whose_features_are_infinite_or_meaningless_is_refused(bandwidth) -> None:
    with pytest.raises(InvalidParameterError) as refused:
        _plan(MNIST, bandwidth=bandwidth)
    message = str(refused.value)
    assert f"bandwidth = {bandwidth:g}" in message and "784-pixel images" in message
    assert "from 0.0784 to 7.84e+06" in message and "Leave `bandwidth` out" in message


def test_a_generator_that_would_train_for_days_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match=r"at most 1,000,000 generator updates"):
        MerfConfig(4.0, 1e-5, steps=10**9)


def test_the_auto_bandwidths_and_a_sane_setting_are_admitted() -> None:
    for bandwidth in (None, 10.0, 105.0):  # auto, narrow and wide for 28x28 images
        _plan(MNIST, bandwidth=bandwidth)


def test_a_run_asks_again_and_a_refusal_there_is_refunded(mnist200_store, run_merf) -> None:
    """The plan admitted a small config; a run handed a config its machine cannot hold refuses
    before reading the data, so its reservation is refunded."""
    st, data = mnist200_store
    b = ledger.budget(st, "mnist")
    from release.planning import dataset_info

    plan = MECHANISM.plan(
        MerfConfig.tiny(4.0, 1e-5, teacher_labels=False),
        dataset_info(b.dataset),
        b.history,
        uci_digits(),
    )
    huge = MerfConfig.tiny(4.0, 1e-5, teacher_labels=False, z_dim=10**9)
    with pytest.raises(InvalidParameterError, match="generator and its optimiser"):
        run_merf(st, "mnist", data, huge, "rel-huge", plan=plan)
    [charge] = ledger.budget(st, "mnist").charges
    assert charge.state == "refunded"


def test_an_unknown_preset_names_the_valid_choices() -> None:
    info = MNIST
    with pytest.raises(InvalidParameterError) as refused:
        MECHANISM.make_config({"epsilon": 4.0}, info, None, "demo")
    assert "preset = 'demo' does not exist" in str(refused.value)
    assert "'default', 'tiny'" in str(refused.value)
    assert MECHANISM.make_config({"epsilon": 4.0}, info, None, "tiny").z_dim == 8


def test_release_plan_refuses_a_huge_merf_and_leaves_the_store_as_it_was(
    mnist200_store,
) -> None:
    from release import keys, manager
    from release.spec import ReleaseSpec

    st, _ = mnist200_store
    keys.create_identity(st, "alice", "steward")

    def state(store: Store) -> str:
        store.backend.release()
        return hashlib.sha256(store.workspace.db_path.read_bytes()).hexdigest()

    before = state(st)
    for merf, says in [
        ({"z_dim": 1e9}, "generator and its optimiser"),
        ({"batch": 1e9}, "generator training"),
        ({"bandwidth": 1e-300}, "bandwidth = 1e-300"),
        ({"preset": "demo"}, "choose one of 'default', 'tiny'"),
    ]:
        # an unknown preset is refused already when the spec is read (registry.check_preset)
        with pytest.raises(InvalidParameterError, match=says):
            spec = ReleaseSpec.from_dict(
                {
                    "release": {"dataset": "mnist", "mechanism": "merf", "n_images": 100},
                    "merf": {"epsilon": 4.0, **merf},
                }
            )
            manager.create_plan(st, spec, "alice")
    assert state(st) == before
    assert manager.list_releases(st) == [] and ledger.budget(st, "mnist").charges == []
