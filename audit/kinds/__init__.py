"""How the audit checks each output kind (release.kinds.OutputKind.audit): the audit core
(audit/run.py) finds a kind's checks here by the kind's name (AuditInputs.output_kind), never by
naming a kind.

A kind either replaces the image audit with its own (`run`: every check of a release of that
kind, e.g. checks of the files the kind writes), or keeps the image audit and adds
its own attacks after the guarantee's (`attacks`). A release whose guarantee is empirical is judged
by its kind's attacks alone: a kind that has none fails it. The built-in kinds' checks are
registered by audit/kinds/builtin.py; another kind's by `register_audit` (release.kinds.register
does it for a kind it registers). A kind's own [policy] keys (`policy`, a section type) are
registered with its checks (audit.policy.register_section): the core validates tables against
them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from accounting.errors import InvalidParameterError
from audit.policy import register_section, unregister_section

if TYPE_CHECKING:
    from audit.inputs import AuditInputs
    from audit.policy import AuditPolicy
    from audit.report import AuditReport, CheckResult
    from synth.progress import ProgressFn


def _no_attacks(inputs: AuditInputs, images: np.ndarray, policy: AuditPolicy) -> list[CheckResult]:
    return []


def _no_note(check: str, parameters: Mapping[str, Any]) -> str:
    return ""


def _no_plan_check(mechanism: str, detail: Mapping[str, Any], policy: AuditPolicy) -> None:
    return None


@dataclass(frozen=True, kw_only=True)
class KindAudit:
    """The audit's part of an output kind (module-level functions, keyword-only).

    - run(inputs, policy, progress) -> AuditReport: every check of a release of this kind, in
      place of the image audit (None: the image audit runs, with `attacks` added);
    - attacks(inputs, released images, policy) -> checks: the kind's own attacks, run after the
      guarantee's; on an empirical release they are the only ones;
    - check_note(check name, public parameters) -> what a check's row adds beside its verdict on
      the card and the dashboard ("" for a check the kind does not own);
    - check_plan(mechanism, plan detail, policy): refuse (InvalidParameterError) a plan whose
      release these checks could not judge, when the plan is made, before anything is stored."""

    run: Callable[[AuditInputs, AuditPolicy, ProgressFn], AuditReport] | None = None
    attacks: Callable[[AuditInputs, np.ndarray, AuditPolicy], list[CheckResult]] = _no_attacks
    check_note: Callable[[str, Mapping[str, Any]], str] = _no_note
    check_plan: Callable[[str, Mapping[str, Any], AuditPolicy], None] = _no_plan_check
    policy: type | None = None


_AUDITS: dict[str, KindAudit] = {}


def _builtins() -> dict[str, KindAudit]:
    if not _AUDITS:
        from audit.kinds.builtin import BUILTIN_AUDITS

        for name, audit in BUILTIN_AUDITS.items():
            _add(name, audit)
    return _AUDITS


def _add(name: str, audit: KindAudit) -> None:
    if audit.policy is not None:
        register_section(name, audit.policy)  # first: a key clash refuses the whole kind
    _AUDITS[name] = audit


def register_audit(name: str, audit: KindAudit) -> None:
    """The checks of output kind `name` and its policy keys (refuses a name already registered
    with other checks, and a policy key the core or another kind declares)."""
    if not isinstance(audit, KindAudit):
        raise TypeError(f"{audit!r} is not a KindAudit")
    known = _builtins()
    if name in known and known[name] is not audit:
        raise InvalidParameterError(f"Output kind {name!r} already has audit checks.")
    _add(name, audit)


def unregister_audit(name: str) -> None:
    """Forget the checks `register_audit` gave kind `name`."""
    from audit.kinds.builtin import BUILTIN_AUDITS

    if name not in BUILTIN_AUDITS:
        _builtins().pop(name, None)
        unregister_section(name)


def kind_audit(name: str) -> KindAudit:
    """The checks of output kind `name`."""
    known = _builtins()
    if name not in known:
        raise InvalidParameterError(
            f"No audit checks for output kind {name!r}; known kinds: {', '.join(sorted(known))}."
        )
    return known[name]


def kind_names() -> tuple[str, ...]:
    return tuple(_builtins())


def check_note(check: str, parameters: Mapping[str, Any]) -> str:
    """What any kind's checks add beside check `check`'s verdict ("" when none)."""
    for audit in _builtins().values():
        if note := audit.check_note(check, parameters):
            return note
    return ""


# the built-ins are registered on import: their policy keys are valid in a [policy] table read by
# anyone who imports `audit` (audit/__init__.py imports the audit run, which imports this)
_builtins()
