"""Input data kinds: what a registered sensitive source holds (`MechanismEntry.data_kind`), and
everything that differs between them when a source is registered and loaded back: how a source is
recognised, loaded (checked on reading), given its label set, fingerprinted and turned into what
mechanisms read. release/data.py registers and loads any source through these and names no kind;
the kinds are the built-ins of `synth/kinds/inputs/builtin.py` (volumes, then images).
Registration-time checks that need a mechanism's models (the head volumes' registration fit) are
the mechanisms' own (`synth.registry.admit`), not the kind's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accounting.errors import InvalidParameterError
from synth.kinds.label_declaration import LabelDeclaration


@dataclass(frozen=True, kw_only=True)
class InputKind:
    """One input data kind. Sources are matched against the kinds in order; the last (images)
    takes whatever no other kind recognises."""

    name: str  # one of synth.registry.DATA_KINDS
    what: str  # the source in words, for messages ("a folder of NIfTI volumes")
    recognises: Callable[[str], bool]  # whether a source holds this kind (looks, loads nothing)
    load: Callable[[str], Any]  # the source's data, every reading check applied
    holds: Callable[[Any], bool]  # whether loaded data is of this kind
    # the label set to register: the declaration checked against the data (or refused)
    declare: Callable[[str, Any, LabelDeclaration], list[int]]
    fingerprint: Callable[[bytes, Any], str]  # HMAC-SHA256 under the workspace key
    as_registered: Callable[[Any, list[int]], Any]  # loaded data given its registered label set
    labelled: bool  # registered with a label set: how a registered dataset's kind is read back
    privacy_unit: str  # the privacy unit's default wording
    # the privacy unit's wording for loaded data, where it depends on the data (None: the above)
    unit_of: Callable[[Any], str] | None = None
    # loaded data as registered under the workspace's secret key (e.g. a BIDS dataset's subject
    # labels re-keyed); None: as loaded
    keyed: Callable[[Any, bytes], Any] | None = None

    def with_key(self, data: Any, key: bytes) -> Any:
        return self.keyed(data, key) if self.keyed is not None else data

    def unit(self, data: Any) -> str:
        return self.unit_of(data) if self.unit_of is not None else self.privacy_unit


_KINDS: dict[str, InputKind] = {}


def _known() -> dict[str, InputKind]:
    if not _KINDS:
        from synth.kinds.inputs.builtin import BUILTIN_INPUT_KINDS

        for kind in BUILTIN_INPUT_KINDS:
            _KINDS[kind.name] = kind
    return _KINDS


def for_source(source: str) -> InputKind:
    """The kind of data `source` holds (the first kind that recognises it)."""
    for kind in _known().values():
        if kind.recognises(source):
            return kind
    raise InvalidParameterError(f"{source}: no input kind reads this source.")  # pragma: no cover


def of_data(data: Any) -> InputKind:
    """The kind of loaded data."""
    for kind in _known().values():
        if kind.holds(data):
            return kind
    raise InvalidParameterError(f"No input kind holds a {type(data).__name__}.")


def registered_as(labelled: bool) -> InputKind:
    """The kind a dataset was registered as, from whether it was registered with a label set."""
    for kind in _known().values():
        if kind.labelled == labelled:
            return kind
    raise InvalidParameterError(  # pragma: no cover - the built-ins cover both
        f"No input kind is registered {'with' if labelled else 'without'} a label set."
    )
