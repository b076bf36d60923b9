"""Audit results: per-check verdicts, JSON, storage in the store's audit_results table, rendering.

Everything here except `verdicts()` is computed on sensitive data and is internal (ARCHITECTURE.md
rule 4): stewards and auditors see it; only the pass/fail strings may reach a consumer manifest.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from accounting.errors import DataFormatError, InvalidParameterError

# "comparison": against an earlier release of the same data (audit.baseline); informs the card,
# never blocks publication
KINDS = ("expectations", "attack", "fidelity", "utility", "comparison")
NON_BLOCKING = ("comparison",)


def jsonable(obj: Any, inf_as_text: bool = False) -> Any:
    """Plain JSON data from numpy scalars/arrays and nested containers; non-finite floats -> None
    (with `inf_as_text`, infinities -> "inf" / "-inf", e.g. epsilon = infinity in benchmark
    results)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v, inf_as_text) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [jsonable(v, inf_as_text) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist(), inf_as_text)
    if isinstance(obj, (np.bool_, bool)):
        return bool(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        if inf_as_text and math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v if math.isfinite(v) else None
    if obj is None or isinstance(obj, (str, int)):
        return obj
    return str(obj)


@dataclass
class CheckResult:
    name: str
    kind: str  # "expectations" | "attack" | "fidelity" | "utility"
    passed: bool | None  # None = informational (no threshold, or not applicable)
    summary: str  # one line, states the threshold
    details: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidParameterError(f"check kind must be one of {KINDS}, got {self.kind!r}")
        self.details = jsonable(self.details)

    @property
    def verdict(self) -> str:
        return "info" if self.passed is None else ("pass" if self.passed else "fail")


@dataclass
class AuditReport:
    release_id: str
    results: list[CheckResult] = field(default_factory=list)
    checked_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @property
    def passed(self) -> bool:
        """True when no thresholded check failed (informational checks never block)."""
        return not self.failures

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.passed is False and r.kind not in NON_BLOCKING]

    def verdicts(self) -> dict[str, str]:
        """Check name -> "pass" | "fail" | "info": the only part that may go to a consumer."""
        return {r.name: r.verdict for r in self.results}

    def to_dict(self) -> dict[str, Any]:
        return {
            "release_id": self.release_id,
            "checked_at": self.checked_at,
            "passed": self.passed,
            "results": [asdict(r) for r in self.results],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(jsonable(self.to_dict()), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AuditReport:
        try:
            return cls(
                d["release_id"], [CheckResult(**r) for r in d["results"]], d.get("checked_at", "")
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataFormatError(f"Not an audit report ({exc}).") from exc


# ------------------------------------------------------------------ store
def _passed_nullable(con) -> bool:
    rows = con.execute(
        "SELECT is_nullable FROM information_schema.columns WHERE table_name = 'audit_results' AND "
        "column_name = 'passed'"
    ).fetchall()
    return bool(rows) and str(rows[0][0]).upper() == "YES"


def save_report(store, report: AuditReport) -> None:
    """Replace the release's rows in audit_results, in one transaction. The verdict is also kept in
    the details JSON so an informational check stays distinguishable where `passed` is NOT NULL."""
    names = [r.name for r in report.results]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidParameterError(
            f"audit report for {report.release_id} has duplicate check names {dupes}; each check "
            "must have a unique name."
        )
    with store.transaction() as con:
        nullable = _passed_nullable(con)
        con.execute("DELETE FROM audit_results WHERE release_id = ?", [report.release_id])
        for position, r in enumerate(report.results):
            details = {
                "position": position,  # the report's order (storage order is none on PostgreSQL)
                "verdict": r.verdict,
                "kind": r.kind,
                "artifacts": r.artifacts,
                "details": r.details,
            }
            passed = r.passed if (r.passed is not None or nullable) else True  # info never blocks
            con.execute(
                "INSERT INTO audit_results VALUES (?, ?, ?, ?, ?, ?)",
                [
                    report.release_id,
                    r.name,
                    passed,
                    r.summary,
                    json.dumps(jsonable(details)),
                    report.checked_at,
                ],
            )


def load_report(store, release_id: str) -> AuditReport | None:
    rows = store.query(
        "SELECT * FROM audit_results WHERE release_id = ? ORDER BY rowid", [release_id]
    )
    if not rows:
        return None
    # In the order the report had: its position (rows saved before it was recorded: DuckDB's
    # storage order, which is insertion order there).
    parsed = sorted(
        ((json.loads(row["details"]), row) for row in rows),
        key=lambda pair: pair[0].get("position", 0),
    )
    results = []
    for d, row in parsed:
        verdict = d.get("verdict")
        passed = (
            None if verdict == "info" else (row["passed"] if verdict is None else verdict == "pass")
        )
        results.append(
            CheckResult(
                row["check_name"],
                d.get("kind", "attack"),
                passed,
                row["summary"],
                d.get("details", {}),
                d.get("artifacts", {}),
            )
        )
    return AuditReport(release_id, results, rows[0]["checked_at"])


# ------------------------------------------------------------------ rendering
_STYLE = {"pass": "green", "fail": "bold red", "info": "cyan"}


def render_report(report: AuditReport):
    """A rich Table (printable with rich.console.Console().print)."""
    from rich.table import Table

    overall = (
        "[green]PASSED[/]"
        if report.passed
        else f"[bold red]FAILED ({len(report.failures)} check(s))[/]"
    )
    table = Table(
        title=f"Audit of release {report.release_id} — {overall}  (checked {report.checked_at})",
        show_lines=False,
    )
    table.add_column("kind")
    table.add_column("check")
    table.add_column("verdict")
    table.add_column("summary", overflow="fold")
    from rich.markup import escape

    for r in report.results:
        v = r.verdict
        # names and summaries are text, not markup: "check[key]" must show
        table.add_row(r.kind, escape(r.name), f"[{_STYLE[v]}]{v}[/]", escape(r.summary))
    return table


def report_text(report: AuditReport) -> str:
    """Plain-text rendering of `render_report` (for logs and tests)."""
    from rich.console import Console

    console = Console(width=160, record=True, file=io.StringIO(), color_system=None)
    console.print(render_report(report))
    return console.export_text()
