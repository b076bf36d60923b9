"""Output kinds: what a mechanism releases (MechanismEntry.output_kind names one), written once
per kind. release/ saves, reads back, fingerprints, bundles, cards and audits every release through
its kind and names none: the built-in kinds are registered by release/kinds/builtin.py; another
kind by `register` (a plug-in, a test), which also gives the
audit its checks (audit.kinds).

What every kind shares stays in release/artifacts.py and release/publish.py: release.npz (one
picture and one label per released row, extra image columns), internal.json, the bundle's Parquet
rows. A kind adds what it releases beside them (MechanismOutput.payload): files in the release's
folder (artifacts/REL/), the bundle's columns and files, the card's section, the audit's inputs and
checks."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from accounting.errors import InvalidParameterError
from audit.kinds import KindAudit, register_audit, unregister_audit
from synth import registry
from synth.registry import MechanismOutput

RELEASE_ARRAYS = "release.npz"  # the rows every kind releases (release/artifacts.py writes them)


@dataclass(frozen=True)
class BundleParts:
    """What a kind adds to the bundle: Parquet columns (one value per row) and files (bundle
    path -> file in the release's folder, copied and signed like the rest)."""

    columns: Mapping[str, np.ndarray] = field(default_factory=dict)
    files: Mapping[str, Path] = field(default_factory=dict)


def _nothing_saved(folder: Path, ids: Sequence[str], output: MechanismOutput) -> None:
    return None


def _nothing_loaded(folder: Path, ids: Sequence[str]) -> Any:
    return None


def _no_bundle_parts(folder: Path, ids: Sequence[str]) -> BundleParts:
    return BundleParts()


def _no_card_section(parameters: Mapping[str, Any], n: int) -> list[str]:
    return []


def _no_audit_files(folder: Path, ids: Sequence[str]) -> list[Path] | None:
    return None


def arrays_sha256(folder: Path) -> str:
    """SHA-256 of the rows every kind releases (release.npz's arrays: dtype, shape and bytes of
    each, by name)."""
    h = hashlib.sha256()
    with np.load(folder / RELEASE_ARRAYS) as z:
        for name in sorted(z.files):
            arr = np.ascontiguousarray(z[name])
            h.update(name.encode() + b"\0" + str((arr.dtype.str, arr.shape)).encode())
            h.update(arr.tobytes())
    return h.hexdigest()


def files_sha256(paths: Sequence[Path], start: str = "") -> str:
    """SHA-256 over `start` and each file's name and bytes, in order."""
    h = hashlib.sha256(start.encode())
    for p in paths:
        h.update(p.name.encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True, kw_only=True)
class OutputKind:
    """One output kind, each part written once (module-level functions, keyword-only; `folder` is
    the release's artifacts/REL/, `ids` its row ids in release order):

    - save(folder, ids, output): write what the kind releases beside release.npz
      (output.payload), e.g. one file per row;
    - load(folder, ids) -> the payload again (MechanismOutput.payload), None where there is none;
    - fingerprint(folder, ids) -> SHA-256 of what is released (release.npz's rows and the kind's
      files): recorded when the output is saved and checked whenever it is read back;
    - bundle(folder, ids) -> BundleParts: the bundle's extra columns and files;
    - card_section(public parameters, n) -> lines of the card's section on the kind's files;
    - audit_files(folder, ids) -> the files the audit checks as written
      (AuditInputs.released_files);
    - audit: the audit's checks of the kind (audit.kinds.KindAudit)."""

    name: str
    fingerprint: Callable[[Path, Sequence[str]], str]
    audit: KindAudit
    save: Callable[[Path, Sequence[str], MechanismOutput], None] = _nothing_saved
    load: Callable[[Path, Sequence[str]], Any] = _nothing_loaded
    bundle: Callable[[Path, Sequence[str]], BundleParts] = _no_bundle_parts
    card_section: Callable[[Mapping[str, Any], int], list[str]] = _no_card_section
    audit_files: Callable[[Path, Sequence[str]], list[Path] | None] = _no_audit_files


_KINDS: dict[str, OutputKind] = {}


def _known() -> dict[str, OutputKind]:
    if not _KINDS:
        from release.kinds.builtin import BUILTIN_KINDS

        for kind in BUILTIN_KINDS:
            _KINDS.setdefault(kind.name, kind)
    return _KINDS


def register(kind: OutputKind) -> OutputKind:
    """Make `kind` known under `kind.name`, its checks with it (audit.kinds.register_audit);
    refuses a name already known."""
    if not isinstance(kind, OutputKind):
        raise TypeError(f"{kind!r} is not an OutputKind")
    known = _known()
    if kind.name in known:
        raise InvalidParameterError(f"An output kind named {kind.name!r} is already known.")
    register_audit(kind.name, kind.audit)
    known[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Forget a kind `register` made known, and its checks (built-ins stay)."""
    from release.kinds.builtin import BUILTIN_KINDS

    if name not in {k.name for k in BUILTIN_KINDS}:
        _known().pop(name, None)
        unregister_audit(name)


def names() -> tuple[str, ...]:
    return tuple(_known())


def get(name: str) -> OutputKind:
    known = _known()
    if name not in known:
        raise InvalidParameterError(
            f"Unknown output kind {name!r}; known: {', '.join(known)}. Register it with "
            "release.kinds.register."
        )
    return known[name]


def of_mechanism(mechanism: str) -> OutputKind:
    """The kind mechanism `mechanism` releases (its entry's output_kind); a mechanism not
    installed here (a bundle from another publisher) is read as images."""
    return get(registry.get(mechanism).output_kind if mechanism in registry.names() else "images")
