"""Reading a BIDS dataset of head scans (`bids:/data/ds000xyz`, or any folder whose top level holds
`dataset_description.json`) into a `VolumeDataset` that keeps each scan's subject, session and
BIDS path (`BidsLayout`).

The tree is read with ancpBIDS (`ancpbids.load_dataset`: the files' entities, the sidecars'
metadata with BIDS inheritance, participants.tsv); every image is then read and checked like a
flat folder's (`synth.kinds.nifti.index_volume`). What is selected: every `*_T1w` and `*_T2w`
image of an `anat` folder by default; a query after the path narrows it by entity or suffix
(`bids:/data/ds?suffix=T1w&acq=mprage&ses=1`, comma-separated values) and names the participants.tsv
columns to release (`participants=age,sex`; none by default); `rekey=true` relabels the subjects
sub-01, sub-02, ... in an order only the workspace's secret key maps back (`label_map`).

One subject is the privacy unit: sessions and contrasts of a person are records of one subject,
counted once for the minimum number of subjects and in the re-identification audit's gallery.

Sidecars are carried over scrubbed: only the acquisition parameters of `KEPT_FIELDS` (numbers, or
short names for the scanner's make and model), never dates, times, names, institutions, device
serial numbers or free text. Every refusal is a DataFormatError naming the file and the fix, so
nothing is registered (or charged) from a tree that fails here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from accounting.errors import DataFormatError
from synth.kinds.bids_layout import BidsLayout, BidsRecord
from synth.kinds.bids_layout import label_map as label_map

PREFIX = "bids:"
DESCRIPTION = "dataset_description.json"
DEFAULT_SUFFIXES = ("T1w", "T2w")
MIN_SUBJECTS = 5  # the re-identification audit cannot tell a match from chance below this
# BIDS entities a query may filter on (their short keys, as in file names)
ENTITIES = ("sub", "ses", "acq", "ce", "rec", "run", "part", "echo", "inv", "mt")
# sidecar fields a consumer needs to use the images, kept when numeric (str: the scanner's make
# and model and named sequence types, short and free of digits-only serials)
KEPT_FIELDS: Mapping[str, type] = {
    "RepetitionTime": float,
    "EchoTime": float,
    "InversionTime": float,
    "FlipAngle": float,
    "MagneticFieldStrength": float,
    "SliceThickness": float,
    "SpacingBetweenSlices": float,
    "PixelBandwidth": float,
    "ParallelReductionFactorInPlane": float,
    "Manufacturer": str,
    "ManufacturersModelName": str,
    "MRAcquisitionType": str,
    "ScanningSequence": str,
    "SequenceVariant": str,
    "PulseSequenceType": str,
}
MAX_TEXT = 40  # characters of a kept text field
MAX_JSON_BYTES = 1 << 20  # a sidecar larger than this is not a sidecar
FIELD_NAME = re.compile(r"[A-Z][A-Za-z0-9]{1,63}")  # a sidecar key the card may name


@dataclass(frozen=True)
class BidsQuery:
    """What a `bids:` source selects: entity values (empty: any), suffixes, participants.tsv
    columns to release."""

    root: Path
    entities: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    suffixes: tuple[str, ...] = DEFAULT_SUFFIXES
    participants: tuple[str, ...] = ()
    rekey: bool = False


def is_bids_source(source: str) -> bool:
    """`bids:PATH`, or a folder whose top level holds dataset_description.json."""
    if source.startswith(PREFIX):
        return True
    path = Path(source)
    return not source.startswith("builtin:") and (path / DESCRIPTION).is_file()


def parse_source(source: str) -> BidsQuery:
    """The folder and selection of a BIDS source (`bids:PATH?key=v1,v2&...`)."""
    text = source.removeprefix(PREFIX)
    path, _, query = text.partition("?")
    if Path(text).is_dir():  # a folder whose name holds '?'
        path, query = text, ""
    allowed = {*ENTITIES, "suffix", "participants", "rekey"}
    entities: dict[str, tuple[str, ...]] = {}
    suffixes: tuple[str, ...] = DEFAULT_SUFFIXES
    participants: tuple[str, ...] = ()
    rekey = False
    for key, values in parse_qs(query, keep_blank_values=True, strict_parsing=bool(query)).items():
        if key not in allowed:
            raise DataFormatError(
                f"{source}: unknown selection {key!r}; use entities ({', '.join(ENTITIES)}), "
                "`suffix`, `participants` or `rekey`, e.g. bids:/data/ds?suffix=T1w&ses=1."
            )
        items = tuple(v.strip() for value in values for v in value.split(",") if v.strip())
        if key == "suffix":
            suffixes = items or DEFAULT_SUFFIXES
        elif key == "participants":
            participants = items
        elif key == "rekey":
            if items not in ((), ("true",), ("false",)):
                raise DataFormatError(f"{source}: rekey is true or false, not {values}.")
            rekey = items != ("false",)
        else:
            entities[key] = tuple(v.removeprefix(f"{key}-") for v in items)
    return BidsQuery(Path(path), entities, suffixes, participants, rekey)


def _json(path: Path, what: str) -> Any:
    if path.stat().st_size > MAX_JSON_BYTES:
        raise DataFormatError(f"{path}: {what} of {path.stat().st_size:,} bytes; not a sidecar.")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataFormatError(
            f"{path}: the {what} is not valid JSON ({exc}). Fix or remove it (the BIDS "
            "validator names the same problem), then register again. Nothing was registered."
        ) from exc


def _check_tree(root: Path) -> dict[str, Any]:
    """The dataset description, and every JSON file of the tree parsed (a broken sidecar is
    refused here, by name, before the BIDS library reads it)."""
    if not root.is_dir():
        raise DataFormatError(f"{root}: no such folder.")
    description = root / DESCRIPTION
    if not description.is_file():
        raise DataFormatError(
            f"{root}: not a BIDS dataset: no {DESCRIPTION} at its top level. BIDS requires one "
            '(at least {"Name": "...", "BIDSVersion": "1.9.0"}); add it, or register a flat folder '
            "of NIfTI files without the bids: prefix. Nothing was registered."
        )
    desc = _json(description, DESCRIPTION)
    if not isinstance(desc, dict):
        raise DataFormatError(f"{description}: must hold a JSON object (Name, BIDSVersion).")
    for path in sorted(root.rglob("*.json")):
        parts = path.relative_to(root).parts
        if any(p.startswith(".") for p in parts) or parts[0] in ("derivatives", "sourcedata"):
            continue
        _json(path, "JSON sidecar")
    return desc


def scrub(metadata: Mapping[str, Any]) -> tuple[tuple[tuple[str, Any], ...], set[str]]:
    """The sidecar fields kept (KEPT_FIELDS with a value of the right type) and the names of
    those dropped."""
    kept: list[tuple[str, Any]] = []
    dropped: set[str] = set()
    for key, value in metadata.items():
        want = KEPT_FIELDS.get(key)
        if want is float and isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value):
                kept.append((key, value))
                continue
        elif want is str and isinstance(value, str) and _plain_name(value):
            kept.append((key, value))
            continue
        dropped.add(key)
    return tuple(sorted(kept)), dropped


def _plain_name(value: str) -> bool:
    """A short scanner or sequence name: letters, spaces and a few marks, at most MAX_TEXT
    characters and fewer than 5 digits (no serial number, date or identifier)."""
    return (
        0 < len(value) <= MAX_TEXT
        and sum(c.isdigit() for c in value) < 5
        and all(c.isalnum() or c in " _-.+/" for c in value)
    )


def _selected(query: BidsQuery) -> list[Any]:
    """The images ancpBIDS finds with the query's suffixes, in anat folders, filtered by entity."""
    import ancpbids

    try:
        dataset = ancpbids.load_dataset(str(query.root))
        found: list[Any] = dataset.query(suffix=list(query.suffixes), extension=[".nii", ".nii.gz"])
    except Exception as exc:  # the library raises many types on a tree it cannot read
        raise DataFormatError(
            f"{query.root}: the BIDS library (ancpBIDS) cannot read this tree "
            f"({type(exc).__name__}: {exc}); run the BIDS validator on it and fix what it names."
        ) from exc
    out = []
    for artifact in found:
        rel = Path(artifact.get_relative_path())
        if rel.parts[0] in ("derivatives", "sourcedata") or rel.parent.name != "anat":
            continue
        ents = dict(artifact.get_entities())
        if all(ents.get(k) in values for k, values in query.entities.items()):
            out.append((rel, ents, artifact))
    return sorted(out, key=lambda t: str(t[0]))


def _metadata(artifact: Any, path: Path) -> Mapping[str, Any]:
    try:
        meta = artifact.get_metadata()
    except Exception as exc:  # ancpBIDS fails on sidecars that _check_tree would have refused
        raise DataFormatError(f"{path}: its sidecar metadata cannot be read ({exc}).") from exc
    return meta if isinstance(meta, Mapping) else {}


def _check_complete(records: Sequence[BidsRecord], root: Path) -> None:
    """Refuse a mixed set: a subject (and session) lacking a contrast others have, and fewer than
    MIN_SUBJECTS subjects (sessions of one subject count once)."""
    suffixes = sorted({r.suffix for r in records})
    have: dict[tuple[str, str], set[str]] = {}
    for r in records:
        have.setdefault((r.subject, r.session), set()).add(r.suffix)
    visits = sorted(have)
    for (sub, ses), found in sorted(have.items()):
        missing = [s for s in suffixes if s not in found]
        if missing:
            where = f"sub-{sub}" + (f"/ses-{ses}" if ses else "")
            others = sum(1 for v in have.values() if set(missing) <= v)
            common = [s for s in suffixes if all(s in v for v in have.values())]
            raise DataFormatError(
                f"{root}: {where} has no {', '.join(missing)} image while {others} other "
                "subject/session(s) do: a release would be a mixed set. Add the missing scan, or "
                + (
                    f"select what every subject has (bids:{root}?suffix={','.join(common)}), or "
                    if common
                    else ""
                )
                + f"select the subjects that have it (bids:{root}?sub=...). Nothing was "
                "registered."
            )
    subjects = sorted({r.subject for r in records})
    if len(subjects) < MIN_SUBJECTS:
        raise DataFormatError(
            f"{root}: {len(subjects)} subjects ({len(records)} images in {len(visits)} "
            f"subject/session(s)); one subject is the privacy unit, so sessions and contrasts of a "
            f"person count once, and the re-identification audit needs at least {MIN_SUBJECTS} "
            "subjects to tell a match from chance. Register a dataset of more subjects. Nothing "
            "was registered."
        )


def _field_names(dropped: set[str]) -> tuple[str, ...]:
    """The dropped sidecar fields as the card names them: BIDS-style names (CamelCase words); any
    other key (which someone typed, so free text) only counted."""
    named = sorted(k for k in dropped if FIELD_NAME.fullmatch(k))
    other = len(dropped) - len(named)
    return tuple(named) + ((f"{other} other field(s)",) if other else ())


def _participants(
    root: Path, columns: tuple[str, ...], subjects: Sequence[str]
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The allowed participants.tsv columns' values for each selected subject ('n/a' where the
    table has none)."""
    if not columns:
        return ()
    table = root / "participants.tsv"
    if not table.is_file():
        raise DataFormatError(
            f"{root}: participants={','.join(columns)} asks for participants.tsv columns, but the "
            "dataset has no participants.tsv; remove the selection or add the table."
        )
    lines = [ln.split("\t") for ln in table.read_text(encoding="utf-8").splitlines() if ln]
    header = [h.strip() for h in lines[0]] if lines else []
    absent = [c for c in columns if c not in header or c == "participant_id"]
    if "participant_id" not in header or absent:
        raise DataFormatError(
            f"{table}: has no column(s) {absent or ['participant_id']} (columns: {header}); "
            "name columns the table holds (participant_id is always released)."
        )
    rows = {
        r[header.index("participant_id")].strip().removeprefix("sub-"): r
        for r in lines[1:]
        if len(r) == len(header)
    }
    out = []
    for sub in subjects:
        row = rows.get(sub)
        out.append((sub, tuple(row[header.index(c)].strip() if row else "n/a" for c in columns)))
    return tuple(out)


def read_layout(query: BidsQuery, conversion: Mapping[str, Any] | None = None) -> BidsLayout:
    """The selected records of a BIDS tree, every check applied (no voxel read yet)."""
    root = query.root
    desc = _check_tree(root)
    selected = _selected(query)
    if not selected:
        raise DataFormatError(
            f"{root}: no {'/'.join(query.suffixes)} image in any sub-*/[ses-*/]anat/ folder"
            + (f" matching {dict(query.entities)}" if query.entities else "")
            + "; check the selection, or that the images are named sub-<label>_..._<suffix>.nii.gz."
        )
    records, dropped = [], set()
    for rel, ents, artifact in selected:
        sidecar, gone = scrub(_metadata(artifact, rel))
        dropped |= gone
        suffix = rel.name.split(".")[0].rsplit("_", 1)[-1]
        records.append(
            BidsRecord(rel.as_posix(), ents["sub"], ents.get("ses", ""), suffix, sidecar)
        )
    _check_complete(records, root)
    subjects = sorted({r.subject for r in records})
    return BidsLayout(
        tuple(records),
        bids_version=str(desc.get("BIDSVersion") or "1.9.0"),
        source_doi=str(desc.get("DatasetDOI") or ""),
        participant_columns=query.participants,
        participants=_participants(root, query.participants, subjects),
        dropped_fields=_field_names(dropped),
        conversion=tuple(sorted((conversion or {}).items())),
        rekey=query.rekey,
    )


def load_bids(source: str, conversion: Mapping[str, Any] | None = None) -> Any:
    """A BIDS source as a VolumeDataset held by reference, its layout attached."""
    from synth.kinds.nifti import check_headers, index_volume, inside
    from synth.kinds.volume import VolumeDataset

    query = parse_source(source)
    layout = read_layout(query, conversion)
    root = query.root.resolve()
    files = [inside(query.root / r.path, root) for r in layout.records]
    check_headers(files)  # sizes bounded before any voxel is decoded
    refs = [
        replace(index_volume(f), name=r.path) for f, r in zip(files, layout.records, strict=True)
    ]
    return VolumeDataset.by_reference(refs, source, layout=layout)
