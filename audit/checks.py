"""Running a check safely: one that cannot run for lack of inputs, or that crashes, still gives a
verdict (shared by the image audit, audit/run.py, and the output kinds' own audits, audit.kinds)."""

from __future__ import annotations

import traceback
from collections.abc import Callable

from audit.policy import AuditPolicy
from audit.report import CheckResult


def _cannot_run(name: str, kind: str, reason: str, policy: AuditPolicy) -> CheckResult:
    if policy.require_attacks and kind == "attack":
        return CheckResult(
            name,
            kind,
            False,
            f"not run: {reason} (policy require_attacks = true)",
            {"reason": reason},
        )
    return CheckResult(name, kind, None, f"not run: {reason}", {"reason": reason})


def _guard(
    name: str, kind: str, fn: Callable[[], CheckResult | list[CheckResult]]
) -> list[CheckResult]:
    try:
        out = fn()
    except Exception as exc:  # a crashing check must block publication, not vanish
        return [
            CheckResult(
                name,
                kind,
                False,
                f"check failed to run: {type(exc).__name__}: {exc}",
                {"error": str(exc), "traceback": traceback.format_exc(limit=5)},
            )
        ]
    return out if isinstance(out, list) else [out]
