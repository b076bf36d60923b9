"""The typed release record: one row of the store's `releases` table, as the release manager, the
CLI and the dashboard see it, and the reads of the `releases` and `approvals` tables. Frozen: a
state change is a new row read back from the store (release.manager writes them)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from accounting import replay
from accounting.errors import PrivReleaseError, TamperError
from accounting.store import Store
from release.spec import Plan

if TYPE_CHECKING:
    from release.keys import Identity

# The lifecycle (README, "Walkthrough of a release"): planned -> approved -> running -> checked ->
# published, or rejected / failed on the way.
STATES = ("planned", "approved", "rejected", "running", "checked", "published", "failed")


@dataclass(frozen=True)
class RunRecord:
    """What a release's run produced, as stored in its `result` column (JSON). `guarantee`,
    `parameters`, `executed_events` (DpEvent JSON) and `artifacts` stay JSON: their keys vary with
    the mechanism."""

    mechanism: str
    guarantee: dict[str, Any]
    parameters: dict[str, Any]
    executed_events: list[dict[str, Any]]
    generator: str | None = None  # path of the released generator, if the mechanism keeps one
    artifacts: dict[str, Any] = field(default_factory=dict)
    count: int | None = None  # images released (None in records older than the count)
    # the ledger charge that paid for the run (older records: the release id)
    charge_id: str | None = None
    # once published: path, tarball, tarball_sha256, manifest_digest, key_id, public_key
    bundle: dict[str, str] | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunRecord:
        """Raises KeyError or TypeError on a record privrelease did not write."""
        return cls(
            mechanism=d["mechanism"],
            guarantee=dict(d["guarantee"]),
            parameters=dict(d["parameters"]),
            executed_events=list(d["executed_events"]),
            generator=d.get("generator"),
            artifacts=dict(d.get("artifacts") or {}),
            count=d.get("count"),
            charge_id=d.get("charge_id"),
            bundle=d.get("bundle"),
        )

    def to_json(self) -> dict[str, Any]:
        """The stored form (and `release show --json`'s `result`)."""
        out = {
            "mechanism": self.mechanism,
            "guarantee": self.guarantee,
            "parameters": self.parameters,
            "executed_events": self.executed_events,
            "generator": self.generator,
            "artifacts": self.artifacts,
        }
        optional = {"count": self.count, "charge_id": self.charge_id, "bundle": self.bundle}
        return {**out, **{k: v for k, v in optional.items() if v is not None}}


@dataclass(frozen=True)
class Release:
    """A release as stored. `plan` is the signed plan, typed; `result` what its run produced (None
    before)."""

    release_id: str
    dataset_id: str
    mechanism: str
    state: str
    spec: dict[str, Any]
    plan: Plan
    plan_digest: str
    created_by: str
    created_at: str
    updated_at: str
    reason: str | None = None
    result: RunRecord | None = None

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise TamperError(
                f"Release {self.release_id} has state {self.state!r}, which is none of {STATES}: "
                "the store was edited. Run `privrelease audit verify`."
            )

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Release:
        """A `releases` row (spec, plan and result are JSON text) as a typed record."""
        try:
            plan = Plan.from_json(json.loads(row["plan"]))
            spec = json.loads(row["spec"])
            result = RunRecord.from_json(json.loads(row["result"])) if row.get("result") else None
        except (
            TypeError,
            ValueError,
            KeyError,
        ) as exc:  # not JSON, or missing/unknown keys: not what this tool wrote
            raise TamperError(
                f"Release {row['release_id']}: the stored plan, spec or result is not what "
                f"privrelease writes ({exc}); the store was edited. Re-plan from the spec."
            ) from exc
        return cls(
            release_id=row["release_id"],
            dataset_id=row["dataset_id"],
            mechanism=row["mechanism"],
            state=row["state"],
            spec=spec,
            plan=plan,
            plan_digest=row["plan_digest"],
            created_by=row["created_by"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            reason=row.get("reason"),
            result=result,
        )

    @property
    def guarantee(self) -> dict[str, Any]:
        """The achieved guarantee once synthesised ({} before)."""
        return dict(self.result.guarantee) if self.result else {}

    @property
    def bundle(self) -> dict[str, Any] | None:
        """The published bundle's paths and digests (None until published)."""
        return self.result.bundle if self.result else None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form `privrelease release show --json` prints (plan as its stored JSON)."""
        return {
            "release_id": self.release_id,
            "dataset_id": self.dataset_id,
            "mechanism": self.mechanism,
            "state": self.state,
            "spec": self.spec,
            "plan": self.plan.to_json(),
            "plan_digest": self.plan_digest,
            "created_by": self.created_by,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "reason": self.reason,
            "result": self.result.to_json() if self.result else None,
        }


def get_release(store: Store, release_id: str) -> Release:
    rows = store.query("SELECT * FROM releases WHERE release_id = ?", [release_id])
    if not rows:
        raise PrivReleaseError(f"Unknown release {release_id!r}. See `privrelease release list`.")
    return Release.from_row(rows[0])


def refuse_unless_recorded(con, release_id: str) -> None:
    """The release's row (state, plan digest, dataset) must be what the audit trail recorded: a
    state set back behind privrelease's back (rejected -> approved) must not let it run."""
    problems = replay.release_problems(con, release_id)
    if problems:
        raise TamperError(
            f"Release {release_id} in the store is not what the audit trail recorded ("
            + "; ".join(problems[:2])
            + "): nothing was done. Run `privrelease audit verify`; restore the store from a "
            "backup or a signed checkpoint."
        )


def recorded_release(store: Store, release_id: str) -> Release:
    """The release, checked against the audit trail (every action that changes it starts here)."""
    rel = get_release(store, release_id)
    with store.transaction() as con:
        refuse_unless_recorded(con, release_id)
    return rel


def list_releases(store: Store, viewer: Identity | None = None) -> list[Release]:
    """All releases, newest first; a consumer sees only published ones."""
    rows = [
        Release.from_row(r) for r in store.query("SELECT * FROM releases ORDER BY created_at DESC")
    ]
    if viewer is not None and viewer.role == "consumer":
        rows = [r for r in rows if r.state == "published"]
    return rows


def approvals(store: Store, release_id: str) -> list[dict]:
    return store.query(
        "SELECT * FROM approvals WHERE release_id = ? ORDER BY decided_at", [release_id]
    )
