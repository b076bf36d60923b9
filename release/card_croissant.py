"""Croissant metadata (JSON-LD, with its Responsible-AI fields) for a bundle, written with
MLCommons' mlcroissant.

`croissant.json` describes the Parquet files (with their sha256), one record set (image, label, id
and any extra columns, read straight from the Parquet columns) and the RAI properties: how the data
was made, its limitations and biases, what it reveals about people, and its intended use.
mlcroissant validates it offline and can read the records from the extracted bundle.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from synth import registry

CROISSANT_FILE = "croissant.json"


def _field(name: str, data_type: Any, transforms: list | None = None, description: str = "") -> Any:
    import mlcroissant as mlc

    return mlc.Field(
        id=f"default/{name}",
        name=name,
        description=description,
        data_types=[data_type],
        source=mlc.Source(
            file_set="parquet-files", extract=mlc.Extract(column=name), transforms=transforms or []
        ),
    )


def _record_set(features: list[dict[str, Any]]) -> Any:
    import mlcroissant as mlc

    fields = [
        _field("image", mlc.DataType.IMAGE_OBJECT, [mlc.Transform(json_path="bytes")], "PNG image"),
        _field("label", mlc.DataType.INTEGER, description="class index (names in README.md)"),
        _field("id", mlc.DataType.TEXT, description="row id"),
    ]
    for f in features[3:]:  # extra columns, e.g. label_distribution
        if f.get("dtype") == "image":  # e.g. an aligned crop per row
            fields.append(
                _field(
                    f["name"],
                    mlc.DataType.IMAGE_OBJECT,
                    [mlc.Transform(json_path="bytes")],
                    f"PNG image ({f['name'].replace('_', ' ')})",
                )
            )
            continue
        numeric = f.get("sequence", f.get("dtype"))
        dtype = (
            mlc.DataType.TEXT
            if numeric == "string"
            else mlc.DataType.FLOAT
            if "float" in str(numeric)
            else mlc.DataType.INTEGER
        )
        field = _field(f["name"], dtype, description=f["name"].replace("_", " "))
        if "sequence" in f:
            field.repeated = True
        fields.append(field)
    return mlc.RecordSet(id="default", name="default", fields=fields)


def _rai(predicate: dict[str, Any]) -> dict[str, str | list[str]]:
    g = predicate.get("guarantee") or {}
    about = registry.describe(
        str(predicate.get("mechanism") or "unknown"),
        predicate.get("parameters") or {},
        g,
        int(predicate.get("released_image_count") or 0),
    )
    how, kind = about.collection, about.collection_type
    if g.get("type") == registry.DP:
        privacy = (
            "No record of the sensitive dataset is released; the images are covered by (epsilon, "
            f"delta)-differential privacy (RDP epsilon {g.get('epsilon_rdp')}, delta "
            f"{g.get('delta')}; README.md, 'Privacy guarantee')."
        )
    else:
        privacy = about.guarantee.replace("**", "").replace("*", "")
    return {
        "data_collection": how + " See README.md, 'How it was made'.",
        "data_collection_type": [kind],
        "personal_sensitive_information": privacy,
        "data_limitations": (
            "Lower fidelity than the source images; the dataset size is treated as public; the "
            "guarantee is per record of the source dataset (README.md, 'Limitations')."
        ),
        "data_biases": (
            "Inherits the biases of the source dataset and of the public data used for "
            "pre-training; noise and clipping can under-represent small classes."
        ),
        "data_use_cases": (
            "Prototyping, teaching, method development and benchmarking where the original images "
            "cannot be shared; not for clinical or individual decisions, nor re-identification."
        ),
    }


def croissant_jsonld(
    root: Path,
    *,
    release_id: str,
    meta: dict[str, Any],
    body: str,
    features: list[dict[str, Any]],
    predicate: dict[str, Any],
    digests: dict[str, str],
) -> dict:
    """The Croissant JSON-LD for the bundle at `root` (its Parquet files already written, `digests`
    their sha256)."""
    import mlcroissant as mlc

    parquet = sorted(n for n in digests if n.endswith(".parquet"))
    distribution = [
        mlc.FileObject(
            id=n,
            name=n,
            content_url=n,
            encoding_formats=["application/x-parquet"],
            sha256=digests[n],
        )
        for n in parquet
    ]
    distribution.append(
        mlc.FileSet(
            id="parquet-files",
            name="parquet-files",
            encoding_formats=["application/x-parquet"],
            includes=["data/*.parquet"],
        )
    )
    published = re.search(r"Published: (\d{4}-\d{2}-\d{2})", body)
    cite = re.search(r"```bibtex\n(.*?)```", body, re.S)
    metadata = mlc.Metadata(
        name=release_id,
        description=str(meta.get("pretty_name", release_id)),
        license=[str(meta.get("license"))],
        url=f"{release_id}.tar.gz",
        version="1.0.0",
        keywords=list(meta.get("tags", [])),
        date_published=published.group(1) if published else None,
        cite_as=cite.group(1).strip() if cite else None,
        distribution=distribution,
        record_sets=[_record_set(features)],
        **_rai(predicate),
    )
    return json.loads(json.dumps(metadata.to_json(), default=str))
