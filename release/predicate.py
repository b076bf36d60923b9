"""The signed release predicate: what a bundle's in-toto statement asserts about the release.

Built once (`publish.release_predicate`, when `manager.publish` publishes), signed into the bundle,
read back by `verify`, the card and the dashboard. Its version is the one in the statement's
`predicateType` (`https://privrelease.dev/release/v1`); the JSON of a version never changes, so
bundles already published keep verifying. A new version gets a new type URI and a reader for it
here; a reader refuses a version it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from accounting.errors import InvalidParameterError

VERSION = 1
TYPE_PREFIX = "https://privrelease.dev/release/v"
PREDICATE_TYPE = f"{TYPE_PREFIX}{VERSION}"


class UnsupportedPredicateError(InvalidParameterError):
    """A predicate of another version or shape than this privrelease reads."""


def version_of(predicate_type: str) -> int:
    """The version in a predicate type URI (`.../release/v1` -> 1).

    Raises:
        UnsupportedPredicateError: not a privrelease release predicate type, or a version this
            tool does not read.
    """
    tail = predicate_type[len(TYPE_PREFIX) :] if isinstance(predicate_type, str) else ""
    if not predicate_type.startswith(TYPE_PREFIX) or not tail.isdigit():
        raise UnsupportedPredicateError(
            f"The statement's predicate type {predicate_type!r} is not a privrelease release "
            f"predicate ({PREDICATE_TYPE}); this is not a privrelease bundle."
        )
    if int(tail) != VERSION:
        raise UnsupportedPredicateError(
            f"The bundle's release predicate is version {int(tail)}; this privrelease reads "
            f"version {VERSION}. Install the privrelease version that published it (its card names "
            "it) and verify with that."
        )
    return int(tail)


@dataclass(frozen=True)
class LedgerPosition:
    """Where the release's charge sits in the ledger and the trail's head when it was published."""

    charge_position: int | None
    trail_seq: int
    trail_head_sha256: str


@dataclass(frozen=True)
class Approval:
    plan_digest: str
    steward: tuple[str, ...]  # who approved the plan


@dataclass(frozen=True)
class ReleasePredicate:
    """Version 1 of the predicate. JSON-valued fields (parameters, guarantee, events, verdicts,
    history) stay JSON: their keys vary with the mechanism; `events` are dp-accounting DpEvent
    JSON."""

    release_id: str
    dataset_id: str
    mechanism: str
    parameters: dict[str, Any]
    guarantee: dict[str, Any]
    released_image_count: int
    privacy_unit: str
    dataset_size_public: bool
    events: list[dict[str, Any]]
    ledger_position: LedgerPosition
    approval: Approval
    audit_verdicts: dict[str, str]
    tool: dict[str, str]
    # the dataset's whole ledger (consumers recompute epsilon from it)
    history: dict[str, Any] | None = None
    # keys of a v1 predicate this reader does not name
    extra: dict[str, Any] = field(default_factory=dict)

    predicate_type = PREDICATE_TYPE

    @property
    def is_dp(self) -> bool:
        return self.guarantee.get("type") == "dp"

    def to_json(self) -> dict[str, Any]:
        """The wire form (what is signed)."""
        out: dict[str, Any] = {
            "release_id": self.release_id,
            "dataset_id": self.dataset_id,
            "mechanism": self.mechanism,
            "parameters": self.parameters,
            "guarantee": self.guarantee,
            "released_image_count": self.released_image_count,
            "privacy_unit": self.privacy_unit,
            "dataset_size_public": self.dataset_size_public,
            "events": self.events,
            "ledger_position": {
                "charge_position": self.ledger_position.charge_position,
                "trail_seq": self.ledger_position.trail_seq,
                "trail_head_sha256": self.ledger_position.trail_head_sha256,
            },
            "approval": {
                "plan_digest": self.approval.plan_digest,
                "steward": list(self.approval.steward),
            },
            "audit_verdicts": self.audit_verdicts,
            "tool": self.tool,
        }
        if self.history is not None:
            out["history"] = self.history
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Any, predicate_type: str = PREDICATE_TYPE) -> ReleasePredicate:
        """Read a signed predicate of type `predicate_type`.

        Raises:
            UnsupportedPredicateError: another version, or a predicate missing what version 1
                always holds.
        """
        version_of(predicate_type)
        if not isinstance(data, dict):
            raise UnsupportedPredicateError(
                "The release predicate is not a JSON object; this "
                "is not a privrelease bundle, or it is damaged."
            )
        try:
            lp, ap = data["ledger_position"], data["approval"]
            known = {f for f in cls.__dataclass_fields__ if f != "extra"} | {"history"}
            return cls(
                release_id=data["release_id"],
                dataset_id=data["dataset_id"],
                mechanism=data["mechanism"],
                parameters=data["parameters"],
                guarantee=data["guarantee"],
                released_image_count=data["released_image_count"],
                privacy_unit=data["privacy_unit"],
                dataset_size_public=data["dataset_size_public"],
                events=data["events"],
                ledger_position=LedgerPosition(
                    lp["charge_position"], lp["trail_seq"], lp["trail_head_sha256"]
                ),
                approval=Approval(ap["plan_digest"], tuple(ap["steward"])),
                audit_verdicts=data["audit_verdicts"],
                tool=data["tool"],
                history=data.get("history"),
                extra={k: v for k, v in data.items() if k not in known},
            )
        except (KeyError, TypeError) as exc:
            raise UnsupportedPredicateError(
                f"The release predicate lacks {exc} (or has it in another "
                f"shape), which every version {VERSION} predicate holds: the "
                "bundle was not published by privrelease, or it is damaged."
            ) from None
