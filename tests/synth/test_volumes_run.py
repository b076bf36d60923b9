"""deface and reface through the runner on a throw-away workspace: plan refusals, charging,
refund before reading, the reservation kept after reading, the brain left bit-for-bit."""

from __future__ import annotations

import dataclasses
import functools
import shutil
from pathlib import Path

import numpy as np
import pytest

from accounting import ledger, trail
from accounting.errors import InvalidParameterError, PrivReleaseError
from accounting.events import NonPrivateRelease
from accounting.store import Store, Workspace
from release import runner
from release.data import load_registered, register_from_source
from release.planning import dataset_info
from synth import registry
from synth.kinds.datasets import load_data, uci_digits
from synth.mechanisms.deface_reface import run as volumes_run
from synth.mechanisms.deface_reface.config import DefaceConfig, RefaceConfig
from synth.tools.mri.atlas import atlases
from tests.support.heads import cohort, each_head_registered_once, needs_templates

pytestmark = needs_templates


@pytest.fixture(scope="module", autouse=True)
def heads_registered_once():
    """The same two heads are registered at admission, by every run (deface, reface) and by the
    tests' own checks of the brain: 19 registrations, about 0.5 s each. Registration is
    deterministic (tests/synth/test_registration_reproducible.py), so in this module each head is
    registered to each atlas once, by the real code on first use, and the same Registration handed
    back after (as tests/audit/test_audit_volumes.py does)."""
    with each_head_registered_once():
        yield


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> Path:
    return cohort(tmp_path_factory.mktemp("heads"), 2)


@pytest.fixture(scope="module")
def cache(head_atlas_cache: Path) -> Path:
    return head_atlas_cache


@pytest.fixture(scope="module")
def registered(tmp_path_factory, heads, cache) -> Path:
    """A workspace with the heads registered, once a module (registration reads and fits every head);
    each test works on its own copy."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PRIVRELEASE_CACHE", str(cache))
        ws = Workspace(tmp_path_factory.mktemp("registered") / "ws")
        ws.init()
        st = Store(ws)
        register_from_source(st, "heads", str(heads), 10.0, 1e-5, actor="alice")
        st.backend.release()
    return ws.root


@pytest.fixture
def store(tmp_path, registered, cache, monkeypatch) -> Store:
    monkeypatch.setenv("PRIVRELEASE_CACHE", str(cache))
    shutil.copytree(registered, tmp_path / "ws")
    return Store(Workspace(tmp_path / "ws"))


def _plan(store, name, cfg, public=None):
    b = ledger.budget(store, "heads")
    mech = registry.get(name)
    return mech.plan(
        cfg, dataset_info(b.dataset), b.history, public or load_data(mech.default_public)
    )


def _run(store, name, cfg, run_id, tmp_path, *, ack=True, **inject):
    _, data = load_registered(store, "heads")
    run = volumes_run.run_reface if name == "reface" else volumes_run.run_deface
    mech = (
        dataclasses.replace(registry.get(name), run=functools.partial(run, **inject))
        if inject
        else name
    )
    return runner.run_charged(
        store,
        run_id=run_id,
        dataset="heads",
        data=data,
        public=load_data(registry.get(name).default_public),
        mechanism=mech,
        config=cfg,
        plan=_plan(store, name, cfg),
        workdir=tmp_path / run_id,
        acknowledge_non_dp=ack,
        actor="alice",
    )


def test_plan_is_empirical_and_needs_acknowledgement(store) -> None:
    plan = _plan(store, "deface", DefaceConfig())
    assert plan.guarantee_kind == "empirical" and plan.requires_acknowledgement
    assert plan.events == (NonPrivateRelease("empirical de-identification by deface"),)
    assert "defaced (quickshear" in plan.detail["guarantee_description"]
    assert plan.expected_count == 2
    assert any("at least 5 subjects" in w for w in plan.warnings)  # the audit cannot tell


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: DefaceConfig(method="scalpel"), "method must be one of"),
        (lambda: DefaceConfig(brain_margin_mm=float("nan")), "finite number"),
        (lambda: DefaceConfig(brain_margin_mm=1e308), "between 0 and 30"),
        (lambda: DefaceConfig(brain_margin_mm=-1.0), "between 0 and 30"),
        (
            lambda: DefaceConfig(quickshear_buffer=2.5),
            r"whole number from 0 to 100, got 2.5 \(voxels\)",
        ),
        (lambda: RefaceConfig(face=""), "plugin name"),
    ],
)
def test_bad_parameters_are_refused(make, message) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        make()


def test_plan_refusals(store) -> None:
    with pytest.raises(InvalidParameterError, match="'cgan' is not installed; available: template"):
        _plan(store, "reface", RefaceConfig(face="cgan"))
    with pytest.raises(InvalidParameterError, match="public must be 'builtin:head-templates'"):
        _plan(store, "deface", DefaceConfig(), public=uci_digits())
    info = dataset_info(ledger.get_dataset(store, "heads"))
    with pytest.raises(InvalidParameterError, match="one volume per registered record"):
        volumes_run.make_deface_config({}, info, 7, "default")
    images = registry.DatasetInfo("ds-1", "digits", 100, tuple(range(10)), (28, 28), 1e-5)
    with pytest.raises(InvalidParameterError, match="works on volumes.*holds images"):
        registry.get("deface").plan(DefaceConfig(), images, [], load_data("builtin:head-templates"))
    with pytest.raises(InvalidParameterError, match="works on images.*holds volumes"):
        registry.check_data_kind("ksalsa", info)


def test_the_registry_knows_each_mechanisms_data_kind_without_importing_it() -> None:
    for name in ("deface", "reface", "ksalsa"):
        assert registry.kind_of(name) == registry.get(name).data_kind


def test_refused_without_acknowledgement_and_nothing_charged(store, tmp_path) -> None:
    with pytest.raises(PrivReleaseError, match="acknowledge"):
        _run(store, "deface", DefaceConfig(method="mask"), "r0", tmp_path, ack=False)
    assert ledger.get_charge(store, "r0") is None


@pytest.mark.smoke
@pytest.mark.parametrize(
    "name,cfg",
    [
        ("deface", DefaceConfig(method="mask")),
        ("deface", DefaceConfig()),
        ("reface", RefaceConfig()),
    ],
    ids=["mask", "quickshear", "reface"],
)
def test_a_run_commits_and_leaves_the_brain_bit_for_bit(store, tmp_path, name, cfg, cache) -> None:
    res = _run(store, name, cfg, f"run-{name}", tmp_path)
    _, data = load_registered(store, "heads")
    assert res.output.volumes is not None and len(res.output.volumes) == 2
    assert res.images.shape == (2, 128, 128)  # one face picture per released volume
    face_atlas, _ = atlases(cache)
    for before, after in zip(data.volumes, res.output.volumes.volumes, strict=True):
        assert after.data.dtype == before.data.dtype and after.shape == before.shape
        masks = face_atlas.on(before, face_atlas.register(before))
        assert np.array_equal(after.data[masks.brain], before.data[masks.brain])
        assert (after.data != before.data).any()  # the face did change
    assert res.guarantee.kind == "empirical"
    charge = ledger.get_charge(store, f"run-{name}")
    assert charge.state == "committed" and ledger.budget(store, "heads").dp_void
    assert any(e["action"] == "run.sensitive_access" for e in trail.entries(store))


def test_a_failure_before_reading_is_refunded(store, tmp_path, monkeypatch) -> None:
    def broken(cache_dir=None):
        raise RuntimeError("templates unreadable")

    monkeypatch.setattr(volumes_run, "atlases", broken)
    with pytest.raises(RuntimeError, match="templates unreadable"):
        _run(store, "deface", DefaceConfig(method="mask"), "r-early", tmp_path)
    assert ledger.get_charge(store, "r-early").state == "refunded"
    assert not ledger.budget(store, "heads").dp_void


def test_a_face_model_failing_after_reading_stays_charged(store, tmp_path) -> None:
    def bad_model(request):
        return np.full(request.region.shape, np.nan, np.float32)  # a broken plugin

    with pytest.raises(InvalidParameterError, match="NaN or infinite"):
        _run(store, "reface", RefaceConfig(), "r-mid", tmp_path, model=bad_model)
    assert ledger.get_charge(store, "r-mid").state == "reserved"
    assert ledger.budget(store, "heads").dp_void


def test_a_face_model_sees_the_subject_defaced(store, tmp_path) -> None:
    seen = []

    def spy(request):
        seen.append(request)
        return request.template_face

    _run(store, "reface", RefaceConfig(), "r-spy", tmp_path, model=spy)
    assert seen and all((r.defaced[r.region] == 0).all() and r.region.any() for r in seen)
