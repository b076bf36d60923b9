"""Checks of releases: Great Expectations suite over the release table, attack tests (membership
inference, memorisation, k-anonymity attacks), fidelity and utility. Results are internal (computed
on sensitive data); only AuditReport.verdicts() may reach a consumer (ARCHITECTURE.md rule 4)."""

from audit.policy import AuditPolicy
from audit.report import (
    AuditReport,
    CheckResult,
    load_report,
    render_report,
    report_text,
    save_report,
)
from audit.run import AuditInputs, run_audit

__all__ = [
    "AuditPolicy",
    "AuditInputs",
    "AuditReport",
    "CheckResult",
    "run_audit",
    "save_report",
    "load_report",
    "render_report",
    "report_text",
]
