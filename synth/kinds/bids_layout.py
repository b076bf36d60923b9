"""What a BIDS dataset holds beside its voxels (`BidsLayout`: each record's path, subject,
session, suffix and scrubbed sidecar; the participants columns allowed), and re-keying its subject
labels under the workspace's secret key. Read by synth.kinds.bids, written by
synth.kinds.bids_out, carried by a VolumeDataset."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class BidsRecord:
    """One selected image: its path in the tree (relative, '/'-separated), subject and session
    labels (without `sub-`/`ses-`; session '' when the tree has none), suffix, and its sidecar
    scrubbed to KEPT_FIELDS (sorted items, JSON values)."""

    path: str
    subject: str
    session: str
    suffix: str
    sidecar: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class BidsLayout:
    """What a BIDS dataset releases beside its voxels, per record and for the whole: the records'
    paths and scrubbed sidecars, the participants.tsv columns allowed and their values per subject,
    the sidecar fields seen and dropped (names only), the source's BIDSVersion and DOI, and, for a
    DICOM study, how it was converted. `mechanism` is set by the mechanism that releases it."""

    records: tuple[BidsRecord, ...]
    bids_version: str = "1.9.0"
    source_doi: str = ""
    participant_columns: tuple[str, ...] = ()
    participants: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (subject, allowed values)
    dropped_fields: tuple[str, ...] = ()
    conversion: tuple[tuple[str, Any], ...] = ()
    mechanism: str = ""
    rekey: bool = False  # subject labels to be re-keyed under the workspace's key
    rekeyed: bool = False  # ... and they are

    @property
    def subjects(self) -> list[str]:
        """Each record's subject, in record order."""
        return [r.subject for r in self.records]

    def digest(self) -> bytes:
        """The sha256 of everything the layout releases beside the voxels (fingerprinted with
        them: a changed sidecar or participants.tsv changes the dataset)."""
        text = json.dumps(asdict(replace(self, mechanism="")), sort_keys=True, default=str)
        return hashlib.sha256(b"privrelease bids layout v1\0" + text.encode()).digest()

    def summary(self) -> dict[str, Any]:
        """The public description of what is released beside the voxels (the card's, the
        plan's): field names and counts, no values."""
        kept = sorted({k for r in self.records for k, _ in r.sidecar})
        sessions = {(r.subject, r.session) for r in self.records}
        return {
            "layout": "BIDS",
            "subjects": len(set(self.subjects)),
            "sessions": len(sessions),
            "images": len(self.records),
            "suffixes": sorted({r.suffix for r in self.records}),
            "sidecar_fields_kept": kept,
            "sidecar_fields_dropped": list(self.dropped_fields),
            "participants_columns": list(self.participant_columns),
            "subject_labels": "re-keyed (the steward's key maps them back)"
            if self.rekeyed
            else "as in the source",
            **({"conversion": dict(self.conversion)} if self.conversion else {}),
        }

    def rekeyed_under(self, key: bytes) -> BidsLayout:
        """The layout with its subjects relabelled sub-01, sub-02, ... in the order of an HMAC of
        each label under `key` (the workspace's secret): a random-looking order that only the
        holder of the key can map back (`label_map`). Unchanged unless `rekey` was asked for.
        The records keep their order (the volumes'); `VolumeDataset.with_key` then puts both in
        the new paths' order, so that no released order follows the source's labels."""
        if not self.rekey or self.rekeyed:
            return self
        new = label_map(sorted(set(self.subjects)), key)
        records = tuple(
            replace(r, path=_relabel(r.path, r.subject, new[r.subject]), subject=new[r.subject])
            for r in self.records
        )
        participants = tuple(sorted((new[s], v) for s, v in self.participants))
        return replace(self, records=records, participants=participants, rekeyed=True)


def label_map(subjects: Sequence[str], key: bytes) -> dict[str, str]:
    """Source subject label -> released label (without `sub-`), under the workspace's key."""

    def tag(label: str) -> bytes:
        return hmac.new(key, b"privrelease subject label v1\0" + label.encode(), "sha256").digest()

    width = max(2, len(str(len(subjects))))
    order = sorted(subjects, key=tag)
    return {label: f"{i + 1:0{width}d}" for i, label in enumerate(order)}


def _relabel(path: str, old: str, new: str) -> str:
    parts = path.split("/")
    parts[0] = f"sub-{new}"
    parts[-1] = f"sub-{new}" + parts[-1].removeprefix(f"sub-{old}")
    return "/".join(parts)
