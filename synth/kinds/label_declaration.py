"""The label set a dataset of images is registered with: declared by the steward (public metadata),
never read off the data. The data's labels must be a subset of the declaration, and everything
downstream (the classes a mechanism generates, the released label set) uses the declaration, so a
class held by one record is not revealed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from accounting.errors import DataFormatError
from synth.kinds.datasets import BUILTINS, MAX_LABEL
from synth.kinds.image_dataset import ImageDataset
from synth.kinds.photos import FLAT_CLASS, is_photos

LabelDeclaration = str | Sequence[int] | Sequence[str] | None
DECLARE_HELP = (
    "Declare the label set with --labels: label values such as `0-9` or `0,1,2,5` for .npz/Parquet "
    "data, the class subfolder names (e.g. `cat,dog`) for a folder. List every class the data may "
    "hold, including classes with no images."
)


def _parse_values(text: str) -> list[int]:
    """`0-9`, `0,1,2,5`, `0-4,7`: label values, each in 0..MAX_LABEL (checked before any range is
    built)."""
    values: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        lo, sep, hi = part.partition("-")
        try:
            a, b = (int(lo), int(hi)) if sep else (int(part), int(part))
        except ValueError:
            raise DataFormatError(
                f"--labels: {part!r} is not a label value or range. {DECLARE_HELP}"
            ) from None
        if not 0 <= a <= b <= MAX_LABEL:
            raise DataFormatError(
                f"--labels: {part!r} is not within 0..{MAX_LABEL} (low to high). {DECLARE_HELP}"
            )
        values.update(range(a, b + 1))
    return sorted(values)


def _folder_labels(data: ImageDataset, names: list[str]) -> list[int]:
    """A folder's classes are its subfolders (labels by sorted name); the declared names must be
    exactly those, an empty subfolder standing for a declared class without images."""
    missing, extra = (
        sorted(set(names) - set(data.class_names)),
        sorted(set(data.class_names) - set(names)),
    )
    if missing or extra:
        raise DataFormatError(
            f"{data.source}: the declared classes must be the class subfolders. "
            + (
                f"No subfolder for {missing}: create an empty one for a class without images. "
                if missing
                else ""
            )
            + (
                f"Subfolders {extra} are not declared: add them to --labels or move them out. "
                if extra
                else ""
            )
        )
    return list(range(len(data.class_names)))


def declared_labels(source: str, data: ImageDataset, declaration: LabelDeclaration) -> list[int]:
    """The label set to register: the declaration (a built-in's own when none is given), checked to
    cover every label in the data."""
    photo_folder = is_photos(source)
    if declaration is None or (isinstance(declaration, str) and not declaration.strip()):
        if source in BUILTINS:
            return list(data.label_set)
        if photo_folder and data.class_names == [FLAT_CLASS]:  # one flat folder: one class
            return [0]
        raise DataFormatError(f"{source}: no label set was declared. {DECLARE_HELP}")
    items = (
        [s.strip() for s in declaration.split(",")]
        if isinstance(declaration, str)
        else list(declaration)
    )
    is_folder = photo_folder or (not source.startswith("builtin:") and Path(source).is_dir())
    if is_folder:
        labels = _folder_labels(data, [str(s) for s in items])
    elif isinstance(declaration, str):
        labels = _parse_values(declaration)
    else:
        labels = _parse_values(
            ",".join(str(int(v)) if isinstance(v, (int, np.integer)) else str(v) for v in items)
        )
    data.with_declared(labels)  # refuses labels in the data outside the declaration
    return labels
