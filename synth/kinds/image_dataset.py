"""The `ImageDataset` object every loader returns, and the check of its labels.

uint8 images (N, H, W) for grey or (N, H, W, 3) for colour, int64 labels, class names, and (for
registered or built-in data) the declared label set. The declared set is public metadata;
`label_set` returns it, never the labels that happen to occur in the data, so a class with a single
record is not revealed by its presence. Its own module so that the built-ins (synth.kinds.datasets)
and
user data (synth.kinds.user_data) share it without importing each other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from accounting.errors import DataFormatError

# label values are class indices; bounded so nothing sized by a label allocates GBs
MAX_LABEL = 9_999


def check_label_values(labels: np.ndarray, where: str) -> np.ndarray:
    """Labels as int64 class indices in 0..MAX_LABEL; anything else (strings, NaN, 2.5, -1, 1e12) is
    refused."""
    labels = np.asarray(labels)
    if labels.dtype.kind in "US":
        sample = f" such as {labels.ravel()[0]!r}" if labels.size else f" (dtype {labels.dtype})"
        raise DataFormatError(
            f"{where}: labels must be integer class indices, got text{sample}. Map class names to "
            "0..K-1 and declare them at registration (`--labels 0-9`), or use a folder of class "
            "subfolders, whose names are the classes."
        )
    if (
        labels.dtype.kind == "c"
        or labels.dtype.kind == "b"
        or not np.issubdtype(labels.dtype, np.number)
    ):
        raise DataFormatError(
            f"{where}: labels must be integer class indices, got dtype {labels.dtype}."
        )
    if labels.dtype.kind == "f":
        bad = (
            labels[~np.isfinite(labels) | (labels != np.round(labels))]
            if labels.size
            else labels[:0]
        )
        if bad.size:
            raise DataFormatError(
                f"{where}: labels must be whole numbers, got "
                f"{bad[0].item()!r}. Clean or drop those rows."
            )
    if labels.size and labels.min() < 0:
        raise DataFormatError(
            f"{where}: labels must be non-negative class indices, got {labels.min().item()!r}."
        )
    if labels.size and labels.max() > MAX_LABEL:
        raise DataFormatError(
            f"{where}: label {labels.max().item()!r} is above the limit {MAX_LABEL}; labels are "
            "class indices 0..K-1. Renumber the classes."
        )
    return labels.astype(np.int64)


@dataclass
class ImageDataset:
    images: np.ndarray  # uint8, (N, H, W) or (N, H, W, 3)
    labels: np.ndarray  # int64, (N,)
    class_names: list[str] = field(default_factory=list)  # indexed by label value
    source: str = ""
    # the public label set; None for unregistered user data
    declared_labels: list[int] | None = None

    def __post_init__(self) -> None:
        where = self.source or "images"
        self.images = np.asarray(self.images)
        if self.images.dtype != np.uint8:
            raise DataFormatError(f"{where}: expected uint8 pixels, got {self.images.dtype}.")
        ok_shape = self.images.ndim == 3 or (self.images.ndim == 4 and self.images.shape[3] == 3)
        if not ok_shape or len(self.images) == 0 or 0 in self.images.shape:
            raise DataFormatError(
                f"{where}: expected a non-empty stack of images (N, H, W) grey or (N, H, W, 3) "
                f"colour, got shape {self.images.shape}."
            )
        if np.shape(self.labels) != (len(self.images),):
            raise DataFormatError(
                f"{where}: {len(self.images)} images but labels of shape {np.shape(self.labels)}."
            )
        self.labels = check_label_values(self.labels, where)
        if self.declared_labels is not None:
            self._check_declared()
        top = max([int(self.labels.max())] + list(self.declared_labels or []))
        if len(self.class_names) <= top:  # names are indexed by label value: pad with the numbers
            self.class_names = list(self.class_names) + [
                str(c) for c in range(len(self.class_names), top + 1)
            ]

    def _check_declared(self) -> None:
        declared = sorted(
            {
                int(v)
                for v in check_label_values(np.asarray(self.declared_labels), "declared labels")
            }
        )
        if not declared:
            raise DataFormatError(f"{self.source or 'dataset'}: the declared label set is empty.")
        undeclared = sorted(set(self.observed_labels) - set(declared))
        if undeclared:
            raise DataFormatError(
                f"{self.source or 'dataset'}: the data has labels {undeclared[:10]} that are not "
                f"in the declared set {_short(declared)}. Register it again with --labels listing "
                "every class the data may hold."
            )
        self.declared_labels = declared

    def __len__(self) -> int:
        return len(self.images)

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(self.images.shape[1:])

    @property
    def label_set(self) -> list[int]:
        """The declared (public) label set; for unregistered data, the labels that occur."""
        return (
            list(self.declared_labels) if self.declared_labels is not None else self.observed_labels
        )

    @property
    def observed_labels(self) -> list[int]:
        """The labels that occur in the data: depends on the records, so never release it."""
        return sorted(int(x) for x in np.unique(self.labels))

    def with_declared(self, labels: list[int]) -> ImageDataset:
        return ImageDataset(
            self.images, self.labels, list(self.class_names), self.source, list(labels)
        )

    def content_sha256(self) -> str:
        """A plain hash of images and labels: for PUBLIC data only (sensitive data gets an
        HMAC)."""
        h = hashlib.sha256()
        for arr in (np.ascontiguousarray(self.images), np.ascontiguousarray(self.labels)):
            h.update(str((arr.dtype.str, arr.shape)).encode())
            h.update(arr.tobytes())
        return h.hexdigest()

    def subset(self, idx: np.ndarray) -> ImageDataset:
        return ImageDataset(
            self.images[idx],
            self.labels[idx],
            list(self.class_names),
            self.source,
            self.declared_labels,
        )

    def as_float(self) -> np.ndarray:
        """Pixels in [-1, 1], channels first: (N, C, H, W) float32, the convention of our models."""
        x = self.images.astype(np.float32) / 127.5 - 1.0
        return x[:, None] if x.ndim == 3 else np.moveaxis(x, -1, 1)


def _short(values: list[int]) -> str:
    return (
        str(values)
        if len(values) <= 12
        else f"[{values[0]}, {values[1]}, ..., {values[-1]}] ({len(values)} labels)"
    )
