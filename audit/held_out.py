"""A held-out attacker by construction (the face attack of audit/face_reid.py; the image and
photograph kinds check it at plan time, audit.kinds.builtin): a mechanism that searches against
face recognisers (its plan's detail names them, `searched_recognisers`) must leave at least one
of the audit's recognisers out, so that the audit judges the release with a recogniser the
mechanism never measured. Checked when a plan is made, before anything is stored or charged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accounting.errors import InvalidParameterError


def held_out_recognisers(detail: Mapping[str, Any], audited: Sequence[str]) -> list[str] | None:
    """The audit's recognisers the mechanism never searched against (None: it searched none)."""
    searched = detail.get("searched_recognisers")
    if searched is None:
        return None
    return [r for r in audited if r not in set(searched)]


def check_held_out(mechanism: str, detail: Mapping[str, Any], audited: Sequence[str]) -> None:
    """Refuse a plan whose search covers every audit recogniser, unless the spec acknowledges it."""
    held_out = held_out_recognisers(detail, audited)
    if held_out is None or held_out or detail.get("no_held_out_acknowledged"):
        return
    searched = ", ".join(detail["searched_recognisers"])
    raise InvalidParameterError(
        f"The {mechanism} search measures every recogniser the audit attacks with ({searched}): "
        "the audit would then only confirm what the search already optimised, and could not "
        f"fail it. Leave one out of [{mechanism}] recognisers, add another to the [policy]'s "
        f"face_recognisers, or set acknowledge_no_held_out = true in [{mechanism}] to accept an "
        "audit without a held-out recogniser (the card says so)."
    )
