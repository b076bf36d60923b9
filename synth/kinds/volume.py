"""`Volume` and `VolumeDataset`: a set of 3D head scans as they are stored (NIfTI).

A volume keeps its voxels exactly as the file stores them (`data`, the on-disk dtype, never
rescaled) plus the scaling NIfTI applies on reading (`slope`, `inter`) and the voxel-to-world
`affine`. Keeping the stored values is what lets a mechanism promise, and the audit check, that
the brain is bit-for-bit the original's: a copy made through floats and back would not be.

A registered folder is held by reference (`VolumeRef`: the file and the sha256 of its canonical
bytes), so that neither the coordinator nor a Dask task carries every head's voxels: whoever uses
a head reads it from its file then, and refuses it if it is no longer the content that was checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, overload, runtime_checkable

import numpy as np

from accounting.errors import DataFormatError

if TYPE_CHECKING:
    from synth.kinds.bids_layout import BidsLayout


@dataclass(frozen=True)
class Volume:
    data: np.ndarray  # (X, Y, Z), the stored dtype (e.g. int16, uint8, float32)
    affine: np.ndarray  # (4, 4) voxel index -> world millimetres (RAS)
    slope: float = 1.0  # physical value = data * slope + inter
    inter: float = 0.0
    name: str = ""  # where it came from (never released: file names can identify people)

    def __post_init__(self) -> None:
        data, affine = np.asarray(self.data), np.asarray(self.affine, dtype=np.float64)
        if data.ndim != 3 or 0 in data.shape:
            raise DataFormatError(
                f"{self.name or 'volume'}: expected a 3D volume, got {data.shape}."
            )
        if affine.shape != (4, 4) or not np.isfinite(affine).all():
            raise DataFormatError(
                f"{self.name or 'volume'}: the affine must be a finite 4x4 matrix."
            )
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "affine", affine)

    @property
    def shape(self) -> tuple[int, int, int]:
        x, y, z = self.data.shape
        return int(x), int(y), int(z)

    @property
    def zooms(self) -> tuple[float, float, float]:
        """Voxel sizes in millimetres (the lengths of the affine's columns)."""
        x, y, z = np.sqrt((self.affine[:3, :3] ** 2).sum(0))
        return float(x), float(y), float(z)

    def physical(self) -> np.ndarray:
        """The intensities as NIfTI readers see them (float32)."""
        out = self.data.astype(np.float32)
        if (self.slope, self.inter) != (1.0, 0.0):
            out = out * np.float32(self.slope) + np.float32(self.inter)
        return out

    def to_stored(self, values: np.ndarray) -> np.ndarray:
        """Physical intensities back to this volume's stored dtype (rounded, clipped to its
        range): how a mechanism writes new voxels into a copy of the stored array."""
        raw = (np.asarray(values, np.float64) - self.inter) / self.slope
        dtype = self.data.dtype
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            return np.clip(np.rint(raw), info.min, info.max).astype(dtype)
        return raw.astype(dtype)

    def with_data(self, data: np.ndarray) -> Volume:
        """The same geometry and scaling holding other stored voxels (same shape and dtype)."""
        data = np.asarray(data)
        if data.shape != self.data.shape or data.dtype != self.data.dtype:
            raise DataFormatError(
                f"{self.name or 'volume'}: new voxels {data.dtype} {data.shape} do not match the "
                f"stored {self.data.dtype} {self.data.shape}."
            )
        return Volume(data, self.affine, self.slope, self.inter, self.name)

    def stored_bytes(self) -> bytes:
        """The canonical bytes of what a mechanism reads: dtype, shape, voxels (C order), affine
        and scaling. Fingerprints and content hashes are taken over these."""
        head = repr((self.data.dtype.str, self.shape, self.slope, self.inter)).encode()
        return (
            head
            + np.ascontiguousarray(self.affine, dtype="<f8").tobytes()
            + np.ascontiguousarray(self.data).tobytes()
        )

    def digest(self) -> str:
        """The sha256 (hex) of `stored_bytes`: what a reference to this volume records, checks."""
        return hashlib.sha256(self.stored_bytes()).hexdigest()


@runtime_checkable
class VolumeRef(Protocol):
    """A record held by reference (`synth.kinds.nifti.VolumeFile`): its shape and stored size from
    its header, the sha256 of its canonical bytes (`Volume.stored_bytes`), and `read()`, which reads
    the voxels again and refuses content whose sha256 is not this one."""

    @property
    def name(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def shape(self) -> tuple[int, int, int]: ...
    @property
    def nbytes(self) -> int: ...
    def read(self) -> Volume: ...


Record = Volume | VolumeRef  # what a per-item function is handed: a volume, or its reference


def open_record(record: Record) -> Volume:
    """The volume itself: read (and checked against its digest) when held by reference."""
    return record if isinstance(record, Volume) else record.read()


class LazyVolumes(Sequence[Volume]):
    """Volumes read on demand from their references, one at a time and never kept: iterating N
    heads holds one head's voxels at a time (the caller's), not N."""

    def __init__(self, refs: Sequence[VolumeRef]) -> None:
        self.refs = tuple(refs)

    def __len__(self) -> int:
        return len(self.refs)

    @overload
    def __getitem__(self, i: int) -> Volume: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Volume]: ...
    def __getitem__(self, i: int | slice) -> Volume | Sequence[Volume]:
        if isinstance(i, slice):
            return LazyVolumes(self.refs[i])
        return self.refs[i].read()

    def __iter__(self) -> Iterator[Volume]:
        for ref in self.refs:
            yield ref.read()


@dataclass
class VolumeDataset:
    """Registered (or public) head volumes, in record order (sorted file names): held in memory
    (`volumes` a sequence of Volume: the public templates, a mechanism's output) or by reference
    (`VolumeDataset.by_reference`: a registered folder, each volume read from its file when it is
    used, checked against the digest taken when the folder was read)."""

    volumes: Sequence[Volume]
    source: str = ""
    names: list[str] = field(default_factory=list)  # public names for public sets (templates)
    # a BIDS dataset's subjects, sessions, paths and scrubbed sidecars (synth.kinds.bids); None
    # for a flat folder, where each record is its own subject
    layout: BidsLayout | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.volumes, LazyVolumes):
            self.volumes = tuple(self.volumes)
        if not len(self.volumes):
            raise DataFormatError(f"{self.source or 'volumes'}: no volumes.")
        if not all(isinstance(v, Volume | VolumeRef) for v in self.records):
            raise DataFormatError(f"{self.source or 'volumes'}: every record must be a Volume.")
        if self.layout is not None and len(self.layout.records) != len(self.volumes):
            raise DataFormatError(
                f"{self.source or 'volumes'}: {len(self.layout.records)} BIDS records for "
                f"{len(self.volumes)} volumes."
            )

    @classmethod
    def by_reference(
        cls, refs: Sequence[VolumeRef], source: str = "", layout: BidsLayout | None = None
    ) -> VolumeDataset:
        return cls(LazyVolumes(refs), source, layout=layout)

    def with_key(self, key: bytes) -> VolumeDataset:
        """The dataset as registered under the workspace's secret `key`: a BIDS layout that asked
        for it with its subject labels re-keyed (`BidsLayout.rekeyed_under`)."""
        if self.layout is None or not self.layout.rekey:
            return self
        from dataclasses import replace

        layout = self.layout.rekeyed_under(key)
        # records (and volumes) in the new labels' path order: the release's row order must not
        # follow the source's labels
        order = sorted(range(len(layout.records)), key=lambda i: layout.records[i].path)
        layout = replace(layout, records=tuple(layout.records[i] for i in order))
        if isinstance(self.volumes, LazyVolumes):
            return VolumeDataset(
                LazyVolumes([self.volumes.refs[i] for i in order]), self.source, self.names, layout
            )
        return VolumeDataset([self.volumes[i] for i in order], self.source, self.names, layout)

    @property
    def subjects(self) -> list[str]:
        """Each record's subject (the privacy unit): its BIDS subject, else the record itself."""
        if self.layout is not None:
            return self.layout.subjects
        return [str(i) for i in range(len(self.volumes))]

    def subject_heads(self) -> list[int]:
        """One record per subject (its first T1w, else its first record), in subject order: what
        counts subjects and stands for each in the re-identification audit's gallery."""
        first: dict[str, int] = {}
        suffixes = [r.suffix for r in self.layout.records] if self.layout else []
        for i, sub in enumerate(self.subjects):
            if sub not in first or (suffixes[first[sub]] != "T1w" and suffixes[i] == "T1w"):
                first[sub] = i
        return sorted(first.values())

    @property
    def records(self) -> tuple[Record, ...]:
        """The records as a per-item function is handed them: references when the volumes are
        held by reference (a worker reads its head itself), else the volumes."""
        if isinstance(self.volumes, LazyVolumes):
            return self.volumes.refs
        return tuple(self.volumes)

    def __len__(self) -> int:
        return len(self.volumes)

    def __getitem__(self, i: int) -> Volume:
        return self.volumes[i]

    @property
    def labels(self) -> np.ndarray:
        """Volumes carry no class labels (the runner and audit ask every dataset for them)."""
        return np.zeros(len(self.volumes), np.int64)

    @property
    def shapes(self) -> list[tuple[int, int, int]]:
        """Each record's (X, Y, Z), without reading voxels held by reference."""
        return [r.shape for r in self.records]

    @property
    def stored_nbytes(self) -> int:
        """The stored voxel bytes of every record together."""
        return sum(r.data.nbytes if isinstance(r, Volume) else r.nbytes for r in self.records)

    @property
    def image_shape(self) -> tuple[int, ...]:
        """The common (X, Y, Z) when every volume has one shape, else () (shapes vary)."""
        shapes = set(self.shapes)
        return next(iter(shapes)) if len(shapes) == 1 else ()

    def record_digests(self) -> list[bytes]:
        """The sha256 of each record's canonical bytes (`Volume.stored_bytes`), in record order:
        the ones taken when the folder was read for records held by reference (no file is read
        again), else computed."""
        return [
            bytes.fromhex(r.digest()) if isinstance(r, Volume) else bytes.fromhex(r.sha256)
            for r in self.records
        ]

    def named(self, name: str) -> Volume:
        """A volume of a public set by its public name (templates)."""
        if name not in self.names:
            raise DataFormatError(f"{self.source}: holds no volume named {name!r} ({self.names}).")
        return self.volumes[self.names.index(name)]

    def content_sha256(self) -> str:
        """A plain hash of the content: for PUBLIC volumes only (sensitive ones get an HMAC)."""
        h = hashlib.sha256(b"privrelease volumes v1")
        for name, digest in zip(self.names or [""] * len(self), self.record_digests(), strict=True):
            h.update(name.encode() + b"\0")
            h.update(digest)
        return h.hexdigest()
