"""A mechanism and an output kind defined here alone, added as ARCHITECTURE.md's "Adding a
mechanism" and "Adding an output kind" say (`synth.registry.register`, `release.kinds.register`),
then planned, approved, run, audited, published and verified with the real store and ledger: the
proof that release/ and the audit reach a kind through its OutputKind, never by name.

The toy releases a DP histogram of the labels as text lines ("LABEL<TAB>COUNT"): one Gaussian
query of L2 sensitivity 1 (one record changes one count by 1), its noise calibrated to the spec's
epsilon, charged through the ledger. Its kind saves the lines as lines.txt, fingerprints them,
bundles them (data/lines.txt and a `line` column), writes a card section and audits them with its
own checks, which read a [policy] key of the kind's own (`lines_max_count`), validated by the core."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from accounting import ledger
from accounting.calibration import calibrate_gaussian_sigma
from accounting.errors import InvalidParameterError, PermissionDeniedError, TamperError
from accounting.events import GaussianQuery
from audit import AuditInputs, AuditPolicy, AuditReport, CheckResult, load_report
from audit.kinds import KindAudit
from audit.policy import check_number
from release import artifacts, keys, kinds, manager
from release.bundle import read_bundle_data
from release.data import register_from_source
from release.kinds import BundleParts, OutputKind, arrays_sha256, files_sha256
from release.spec import ReleaseSpec
from release.verify import verify_bundle
from synth import config as checks
from synth import registry
from synth.config import MechanismConfig
from synth.kinds.datasets import load_source
from synth.progress import ProgressFn
from synth.registry import (
    DatasetInfo,
    MechanismDescription,
    MechanismOutput,
    MechanismPlan,
    RunContext,
)

NAME = "toy-lines"  # the mechanism
KIND = "text-lines"  # its output kind
LINES = "lines.txt"
PICTURE = (8, 32)  # one bar picture per line: what the bundle's image column shows


# ------------------------------------------------------------------ the mechanism
@dataclass(frozen=True)
class ToyConfig(MechanismConfig):
    epsilon: float
    delta: float
    # a broken implementation: releases a label outside the declared set (its audit must fail)
    broken: bool = False

    @classmethod
    def checked(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "epsilon": checks.epsilon("epsilon", values["epsilon"]),
            "delta": checks.delta("delta", values["delta"]),
            "broken": checks.flag("broken", values["broken"]),
        }


def make_config(
    params: dict[str, Any], dataset: DatasetInfo, n_images: int | None, preset: str
) -> ToyConfig:
    params = {k: v for k, v in params.items() if k != "public"}
    return registry.build_config(ToyConfig, NAME, preset, {"delta": dataset.delta_cap}, params)


def plan(
    config: ToyConfig, dataset: DatasetInfo, prior: Sequence[Any], public: Any
) -> MechanismPlan:
    sigma = calibrate_gaussian_sigma(config.epsilon, config.delta, 1.0, prior)
    return MechanismPlan(
        events=(GaussianQuery(sigma, 1.0),),
        expected_count=len(dataset.labels),
        output_shape=PICTURE,
        guarantee_kind=registry.DP,
        parameters={"epsilon": config.epsilon, "sigma": sigma, "labels": list(dataset.labels)},
        detail={
            "sigma": sigma,
            "choices": [f"noise sigma {sigma:.3f} for epsilon {config.epsilon}"],
        },
    )


def run(config: ToyConfig, data: Any, ctx: RunContext) -> MechanismOutput:
    labels = list(ctx.plan.parameters["labels"])
    sigma = float(ctx.plan.parameters["sigma"])
    ctx.on_sensitive_access()
    images = registry.images_only(data, NAME)
    counts = np.array([np.sum(images.labels == y) for y in labels], dtype=np.float64)
    noisy = np.maximum(0, np.rint(counts + np.random.default_rng().normal(0, sigma, len(counts))))
    released = [(y + 100 if config.broken else y) for y in labels]
    lines = tuple(f"{y}\t{int(c)}" for y, c in zip(released, noisy, strict=True))
    top = max(1.0, float(noisy.max()))
    pictures = np.zeros((len(lines), *PICTURE), np.uint8)
    for i, c in enumerate(noisy):
        pictures[i, :, : int(round(PICTURE[1] * c / top))] = 255
    return MechanismOutput(
        images=pictures,
        labels=np.asarray(labels, np.int64),
        parameters={"epsilon": config.epsilon, "sigma": sigma},
        payload=lines,
    )


def describe(
    parameters: Mapping[str, Any], guarantee: Mapping[str, Any], n: int
) -> MechanismDescription:
    return MechanismDescription(
        what=f"A differentially private histogram of the labels: {n} lines, one per class.",
        guarantee="the released counts (one Gaussian query)",
        collection="Label counts with Gaussian noise, from a sensitive image dataset.",
    )


MECHANISM = registry.MechanismEntry(
    name=NAME,
    config_type=ToyConfig,
    default_public="builtin:uci-digits",
    make_config=make_config,
    plan=plan,
    run=run,
    describe=describe,
    output_kind=KIND,
)


# ------------------------------------------------------------------ the output kind
def _lines_path(folder: Path) -> Path:
    return folder / LINES


def save_lines(folder: Path, ids: Sequence[str], output: MechanismOutput) -> None:
    lines = output.payload
    if not isinstance(lines, tuple) or len(lines) != len(ids):
        raise TypeError(f"a {KIND} release's payload is one line per row, got {lines!r}")
    _lines_path(folder).write_text(
        "".join(f"{i}\t{line}\n" for i, line in zip(ids, lines, strict=True))
    )


def load_lines(folder: Path, ids: Sequence[str]) -> tuple[str, ...]:
    rows = [r.split("\t", 1) for r in _lines_path(folder).read_text().splitlines()]
    if [r[0] for r in rows] != list(ids):
        raise TamperError(f"{_lines_path(folder)} does not hold the release's rows in order")
    return tuple(r[1] for r in rows)


def lines_sha256(folder: Path, ids: Sequence[str]) -> str:
    return files_sha256([_lines_path(folder)], arrays_sha256(folder))


def bundle_lines(folder: Path, ids: Sequence[str]) -> BundleParts:
    return BundleParts(
        columns={"line": np.array(load_lines(folder, ids))},
        files={f"data/{LINES}": _lines_path(folder)},
    )


def card_section(parameters: Mapping[str, Any], n: int) -> list[str]:
    return [
        "## Text lines",
        "",
        f"`data/{LINES}`: {n} lines `ID<TAB>LABEL<TAB>COUNT`, the noisy count of each class "
        f"(Gaussian noise, sigma {float(parameters['sigma']):.3f}).",
        "",
    ]


def audit_files(folder: Path, ids: Sequence[str]) -> list[Path]:
    return [_lines_path(folder)]


@dataclass(frozen=True)
class LinesPolicy:
    """The kind's [policy] keys: users write them beside the core keys."""

    # the largest count a line may hold (None: twice the dataset's size)
    lines_max_count: int | None = None

    def __post_init__(self) -> None:
        if self.lines_max_count is not None:
            check_number("lines_max_count", self.lines_max_count, count=True)


def audit_lines(inputs: AuditInputs, policy: AuditPolicy, progress: ProgressFn) -> AuditReport:
    """The kind's own checks: the file holds exactly the released lines, one per declared class,
    each a declared label and a count no larger than the dataset could plausibly give."""
    report = AuditReport(inputs.release_id)
    lines = inputs.released
    files = inputs.released_files or []
    written = files[0].read_text().splitlines() if files else []
    report.results.append(
        CheckResult(
            "lines_as_written",
            "expectations",
            [w.split("\t", 1)[1] for w in written] == list(lines),
            f"{LINES} holds the {len(lines)} released lines in release order",
        )
    )
    parsed = [line.split("\t") for line in lines]
    labels = [int(p[0]) for p in parsed]
    counts = [int(p[1]) for p in parsed]
    most = policy.section(LinesPolicy).lines_max_count or 2 * len(inputs.sensitive)
    ok = (
        len(lines) == inputs.expected_count
        and sorted(labels) == sorted(inputs.label_set)
        and all(0 <= c <= most for c in counts)
    )
    report.results.append(
        CheckResult(
            "lines_declared",
            "expectations",
            ok,
            f"one line per declared class ({inputs.expected_count}), counts within 0..{most}",
            {"labels": labels, "undeclared": sorted(set(labels) - set(inputs.label_set))},
        )
    )
    return report


TEXT_LINES = OutputKind(
    name=KIND,
    save=save_lines,
    load=load_lines,
    fingerprint=lines_sha256,
    bundle=bundle_lines,
    card_section=card_section,
    audit_files=audit_files,
    audit=KindAudit(run=audit_lines, policy=LinesPolicy),
)


# ------------------------------------------------------------------ the release
@pytest.fixture
def toy():
    kinds.register(TEXT_LINES)
    registry.register(MECHANISM)
    yield
    registry.unregister(NAME)
    kinds.unregister(KIND)


@pytest.fixture
def digits(tmp_path, store):
    train = load_source("builtin:mnist5k")
    np.savez(tmp_path / "train.npz", images=train.images[:200], labels=train.labels[:200])
    keys.create_identity(store, "alice", "steward")
    keys.ensure_release_key(store.workspace)
    register_from_source(
        store, "digits", str(tmp_path / "train.npz"), epsilon_cap=10.0, delta_cap=1e-5, labels="0-9"
    )
    return train.labels[:200]


def _run(store, policy: dict[str, Any] | None = None, **params: Any):
    spec = {
        "release": {"dataset": "digits", "mechanism": NAME},
        NAME: {"epsilon": 2.0, **params},
        "policy": policy or {},
    }
    rel = manager.create_plan(store, ReleaseSpec.from_dict(spec), "alice")
    manager.approve(store, rel.release_id, "alice", digest=rel.plan_digest)
    return manager.run_release(store, rel.release_id, "alice")


def test_a_new_output_kind_is_planned_run_audited_published_and_verified(toy, store, digits):
    rel = _run(store)
    assert rel.state == "checked", load_report(store, rel.release_id).failures
    rid = rel.release_id
    # a real DP charge, through the ledger
    b = ledger.budget(store, "digits")
    assert [c.state for c in b.charges] == ["committed"]
    assert 0 < b.spent_rdp <= 2.0 + 1e-9 and not b.dp_void
    assert rel.result.guarantee["type"] == "dp"
    # saved once by its kind, read back typed
    folder = artifacts.release_dir(store, rid)
    assert json.loads((folder / "output.json").read_text())["output_kind"] == KIND
    out = artifacts.load_output(store, rid)
    assert len(out.payload) == 10 and out.payload[3].startswith("3\t")
    counts = {int(a): int(c) for a, c in (line.split("\t") for line in out.payload)}
    true = np.bincount(digits, minlength=10)
    assert (
        sum(abs(counts[y] - true[y]) for y in range(10)) < 10 * 6 * rel.result.parameters["sigma"]
    )
    report = load_report(store, rid)
    assert report.verdicts() == {"lines_as_written": "pass", "lines_declared": "pass"}

    rel = manager.publish(store, rid, "alice")
    bundle = rel.result.bundle
    v = verify_bundle(bundle["tarball"], keys.public_key_path(store.workspace, "release"))
    assert v.ok, v.problems
    path = Path(bundle["path"])
    assert (path / "data" / LINES).read_text() == (folder / LINES).read_text()
    images, labels, ids = read_bundle_data(path)
    assert images.shape == (10, *PICTURE) and list(labels) == list(range(10))
    card = (path / "README.md").read_text()
    assert "## Text lines" in card and "histogram of the labels" in card


def test_its_own_checks_fail_a_wrong_release_and_publication_is_refused(toy, store, digits):
    rel = _run(store, broken=True)
    report = load_report(store, rel.release_id)
    assert report.verdicts()["lines_declared"] == "fail" and not report.passed
    assert ledger.budget(store, "digits").charges[0].state == "committed"  # it was charged
    with pytest.raises(PermissionDeniedError, match="lines_declared"):
        manager.publish(store, rel.release_id, "alice")


def test_a_changed_saved_output_is_refused_by_its_kinds_fingerprint(toy, store, digits):
    rel = _run(store)
    lines = artifacts.release_dir(store, rel.release_id) / LINES
    lines.write_text(lines.read_text().replace("\t", "\t1", 1))
    with pytest.raises(TamperError, match="changed since its run saved it"):
        artifacts.load_output(store, rel.release_id)
    with pytest.raises(TamperError):
        manager.publish(store, rel.release_id, "alice")


def test_a_mechanism_whose_kind_is_not_registered_is_refused_before_it_is_charged(store, digits):
    registry.register(MECHANISM)
    try:
        with pytest.raises(InvalidParameterError, match="Unknown output kind"):
            _run(store)
        assert ledger.budget(store, "digits").charges == []
    finally:
        registry.unregister(NAME)


def test_its_own_policy_key_is_validated_by_the_core_and_read_by_its_checks(toy, store, digits):
    with pytest.raises(InvalidParameterError, match="lines_max_count must be a positive integer"):
        _run(store, policy={"lines_max_count": 0})
    with pytest.raises(InvalidParameterError, match="valid keys are .*'lines_max_count'") as exc:
        _run(store, policy={"lines_max_cnt": 5})
    assert "face_samples" in str(exc.value) and "mia_max_auc" in str(exc.value)  # all of them
    assert ledger.budget(store, "digits").charges == []  # refused before anything was charged
    policy = AuditPolicy.from_dict({"lines_max_count": 5})
    assert (
        policy.section(LinesPolicy) == LinesPolicy(5) and policy.to_dict()["lines_max_count"] == 5
    )
    # about 20 records per class: a ceiling of 5 fails a right release
    report = load_report(store, _run(store, policy={"lines_max_count": 5}).release_id)
    assert report.verdicts()["lines_declared"] == "fail"


def test_a_kinds_policy_keys_go_with_it(toy):
    with pytest.raises(InvalidParameterError, match="already"):  # a key the core declares
        clash = KindAudit(run=audit_lines, policy=_Clash)
        kinds.register(OutputKind(name="clashing", fingerprint=lines_sha256, audit=clash))
    assert "clashing" not in kinds.names()
    kinds.unregister(KIND)
    with pytest.raises(InvalidParameterError, match="Unknown audit policy key"):
        AuditPolicy.from_dict({"lines_max_count": 5})


@dataclass(frozen=True)
class _Clash:
    mia_max_auc: float = 0.5
