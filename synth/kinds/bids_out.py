"""Writing a released BIDS dataset: the released heads at their source paths
(`sub-*/[ses-*/]anat/`), each with its scrubbed sidecar, and `dataset_description.json` (a
derivative: GeneratedBy privrelease, its version, the mechanism and the release id;
SourceDatasets the source's DOI where it has one), a README, and `participants.tsv` reduced to
the columns the steward allowed (participant_id alone by default).

`bids_index.json` in the release's folder lists what was written (the images in record order,
then the other files), so the release is read back, fingerprinted, audited and bundled from it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from synth.kinds.bids_layout import BidsLayout
from synth.kinds.volume import Volume

TREE = "bids"  # the released tree, in the release's folder and under data/ in the bundle
INDEX = "bids_index.json"
BIDS_VERSION = "1.9.0"  # the version of the specification the written tree follows


def tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("privrelease")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without installing
        return "unknown"


def _description(layout: BidsLayout, release_id: str) -> dict:
    what = {"deface": "face removed", "reface": "face replaced"}.get(layout.mechanism, "released")
    desc: dict = {
        "Name": f"Head MRI, {what} (privrelease release {release_id})",
        "BIDSVersion": BIDS_VERSION,
        "DatasetType": "derivative",
        "GeneratedBy": [
            {
                "Name": "privrelease",
                "Version": tool_version(),
                "Description": (
                    f"{layout.mechanism or 'volume'} release {release_id}: every brain voxel "
                    "as acquired, the face "
                    + ("cut away" if layout.mechanism == "deface" else "replaced")
                    + "; sidecars scrubbed to acquisition parameters. The signed manifest and "
                    "dataset card beside this tree describe and verify it."
                ),
            }
        ],
    }
    if layout.source_doi:
        desc["SourceDatasets"] = [{"DOI": layout.source_doi}]
    return desc


def _readme(layout: BidsLayout, release_id: str) -> str:
    s = layout.summary()
    kept = ", ".join(s["sidecar_fields_kept"]) or "none"
    columns = ", ".join(["participant_id", *s["participants_columns"]])
    return (
        f"# Head MRI released by privrelease ({release_id})\n\n"
        f"{s['subjects']} subjects, {s['sessions']} subject/sessions, {s['images']} images "
        f"({', '.join(s['suffixes'])}), released by `{layout.mechanism}`: the brain is bit-for-bit "
        "the original's, the face is "
        + ("cut away" if layout.mechanism == "deface" else "replaced by another face")
        + ".\n\n"
        f"JSON sidecars keep only these acquisition parameters: {kept}. Dates, times, names, "
        "institutions, operators, device serial numbers and free text were removed. "
        f"participants.tsv holds: {columns}. NIfTI headers hold geometry, data type and scaling "
        "only.\n\nThe dataset card and the signed manifest of the bundle this tree came in say "
        "how it was made and checked; verify the bundle before use.\n"
    )


def write_tree(
    folder: Path, layout: BidsLayout, volumes: Iterable[Volume], release_id: str
) -> list[str]:
    """The released tree under folder/TREE and its index; returns every written file's path
    relative to the tree (images first, in record order)."""
    from synth.kinds.nifti import write_volume

    root = folder / TREE
    images: list[str] = []
    others: list[str] = []
    for record, volume in zip(layout.records, volumes, strict=True):
        path = root / record.path
        path.parent.mkdir(parents=True, exist_ok=True)
        write_volume(volume, path)
        images.append(record.path)
        sidecar = record.path.removesuffix(".gz").removesuffix(".nii") + ".json"
        (root / sidecar).write_text(json.dumps(dict(record.sidecar), indent=2, sort_keys=True))
        others.append(sidecar)
    (root / "dataset_description.json").write_text(
        json.dumps(_description(layout, release_id), indent=2)
    )
    (root / "README").write_text(_readme(layout, release_id))
    rows = ["\t".join(["participant_id", *layout.participant_columns])]
    values = dict(layout.participants)
    for sub in sorted(set(layout.subjects)):
        rows.append("\t".join([f"sub-{sub}", *values.get(sub, ())]))
    (root / "participants.tsv").write_text("\n".join(rows) + "\n")
    others += ["dataset_description.json", "README", "participants.tsv"]
    (folder / INDEX).write_text(json.dumps({"images": images, "files": others}))
    return images + others


def read_index(folder: Path) -> tuple[list[str], list[str]] | None:
    """(images, other files) of a release written as a BIDS tree; None for a flat one."""
    index = folder / INDEX
    if not index.is_file():
        return None
    data = json.loads(index.read_text())
    images, files = list(data["images"]), list(data["files"])
    for path in images + files:  # paths inside the tree only (the index is read back from disk)
        parts = Path(path).parts
        if not parts or Path(path).is_absolute() or ".." in parts:
            raise ValueError(f"{index}: {path!r} is not a path inside the released tree")
    return images, files
