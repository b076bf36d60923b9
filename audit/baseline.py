"""A release against the dataset's earlier DP releases by other mechanisms (a fast DP-MERF release
is the usual one): does it train better classifiers on the same held-out images? The answer goes to
the card; it never blocks publication (a release may be worth publishing for other reasons)."""

from __future__ import annotations

from dataclasses import dataclass

from audit.report import CheckResult

CHECK = "baseline_comparison"


@dataclass(frozen=True)
class Baseline:
    """An earlier release of the same dataset: its id, mechanism and the best downstream accuracy
    its audit measured on the same held-out source."""

    release_id: str
    mechanism: str
    accuracy: float


def compare(best: float, baselines: list[Baseline]) -> CheckResult:
    """Pass when this release's best downstream accuracy is at least every baseline's."""
    top = max(baselines, key=lambda b: b.accuracy)
    beats = best >= top.accuracy
    return CheckResult(
        CHECK,
        "comparison",
        beats,
        f"best downstream accuracy {best:.3f} against {top.accuracy:.3f} of {top.release_id} "
        f"({top.mechanism}), the best earlier DP release of this dataset by another mechanism"
        + ("" if beats else " — this release does not beat it (the card says so)"),
        {
            "best": best,
            "baselines": [b.__dict__ for b in baselines],
            "note": "informs the card; never blocks publication",
        },
    )
