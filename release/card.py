"""The dataset card (README.md of a bundle): what was released, what the guarantee means, how to use
it.

The card follows the Hugging Face dataset-card layout: a YAML front matter (license, task, size,
`dataset_info` features with a ClassLabel, `configs` pointing at `data/*.parquet`) so that
`datasets.load_dataset(<bundle dir>)` returns decoded images with named labels, then sections for
the guarantee, how the data was made, limitations, intended use, version, citation and license.
`dataset_card` writes what the release knows; `finish_card` (called while the bundle is written)
adds what only the bundle knows: the data features, the signing key's fingerprints and the recipes
to verify the bundle and recompute its epsilon.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import yaml

from release import kinds
from release.card_history import history_section
from release.predicate import ReleasePredicate
from synth import registry
from synth.registry import MechanismDescription

DEFAULT_LICENSE = "other"
BASELINE_CHECK = "baseline_comparison"  # audit.baseline.CHECK
BASELINE_NOT_BEATEN = (
    "**Below its baseline.** Classifiers trained on this release were less accurate on the "
    "publisher's real held-out images than those trained on an earlier differentially private "
    "release of the same dataset by a simpler mechanism. For training "
    "classifiers, ask the publisher for that release. (Like the utility gate, this comparison is "
    "computed from the two releases and the held-out images only: it spends no budget of the "
    "registered dataset and reveals about one bit about the held-out images.)"
)
MAX_CLASS_NAMES = 10_000  # beyond this a label is typed as a plain integer, not a ClassLabel
_SIZES = (
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
    (10_000_000, "1M<n<10M"),
)


def _eps(x: float | None) -> str:
    return "∞" if x is None or not math.isfinite(x) else f"{x:.3f}"


def size_category(n: int) -> str:
    return next((name for bound, name in _SIZES if n < bound), "n>10M")


def label_feature(labels: list[int], names: dict[int, str] | None = None) -> dict[str, Any]:
    """The `label` column as a Hugging Face ClassLabel over 0..max(labels) (names default to the
    numbers)."""
    top = max(labels, default=0)
    if min(labels, default=0) < 0 or top >= MAX_CLASS_NAMES:
        return {"name": "label", "dtype": "int64"}
    names = names or {}
    return {
        "name": "label",
        "dtype": {"class_label": {"names": {str(i): str(names.get(i, i)) for i in range(top + 1)}}},
    }


def _front_matter(
    release: dict[str, Any], dataset: dict[str, Any], result: dict[str, Any], n: int
) -> dict:
    rel = release["spec"]["release"]
    return {
        "license": rel.get("license") or DEFAULT_LICENSE,
        "pretty_name": (
            f"{release['release_id']}: {result['mechanism']} release of {dataset['dataset_id']}"
        ),
        "task_categories": ["image-classification"],
        "size_categories": [size_category(n)],
        "tags": ["privrelease", *describe_release(result, n).tags],
        "dataset_info": {"features": [label_feature(list(dataset.get("labels") or []))]},
    }


def dataset_card(
    release: dict[str, Any],
    dataset: dict[str, Any],
    result: dict[str, Any],
    n_records: int,
    verdicts: dict[str, str],
    *,
    history: dict[str, Any] | None = None,
    published_at: datetime | None = None,
) -> str:
    """The card's text: YAML front matter and the sections a consumer needs to judge and cite the
    data."""
    meta = _front_matter(release, dataset, result, n_records)
    lines = [
        "---",
        yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip(),
        "---",
        "",
        f"# {meta['pretty_name']}",
        "",
    ]
    if release["spec"]["release"].get("description"):
        lines += [release["spec"]["release"]["description"], ""]
    lines += _guarantee(dataset, result, n_records, history)
    lines += _how_made(release, result)
    lines += kinds.of_mechanism(result["mechanism"]).card_section(
        result.get("parameters") or {}, n_records
    )
    lines += _limitations_and_use()
    lines += [
        "## Checks before publication",
        "",
        "Audit verdicts (details are internal to the publisher):",
        "",
    ]
    parameters = result.get("parameters") or {}
    lines += [
        f"- {name}: {v}" + (f"; {note}" if (note := verdict_note(name, parameters)) else "")
        for name, v in sorted(verdicts.items())
    ]
    if verdicts.get(BASELINE_CHECK) == "fail":
        lines += ["", BASELINE_NOT_BEATEN]
    if (
        verdicts.get("downstream_accuracy") == "pass"
    ):  # the publication decision depended on the gate
        from audit.policy import UTILITY_GATE_CHANNEL

        lines += ["", UTILITY_GATE_CHANNEL]
    lines += _version_citation(release, dataset, meta["license"], published_at or datetime.now(UTC))
    return "\n".join(lines) + "\n"


def verdict_note(check: str, parameters: dict[str, Any]) -> str:
    """What a check's row adds beside its verdict, from the output kind that owns the check
    (audit.kinds.check_note; "" otherwise)."""
    from audit.kinds import check_note

    return check_note(check, parameters)


def card_for(release: dict[str, Any], dataset: dict[str, Any], predicate: ReleasePredicate) -> str:
    """The card of a release being published, from its signed predicate (what the card states is
    what is signed)."""
    return dataset_card(
        release,
        dataset,
        predicate.to_json(),
        predicate.released_image_count,
        predicate.audit_verdicts,
        history=predicate.history,
    )


def describe_release(result: dict[str, Any], n: int) -> MechanismDescription:
    """The mechanism's own account of this release (synth.registry.describe)."""
    return registry.describe(result["mechanism"], result["parameters"], result["guarantee"], n)


def _guarantee(dataset: dict, result: dict, n: int, history: dict | None) -> list[str]:
    g = result["guarantee"]
    about = describe_release(result, n)
    head = ["## What this is", "", about.what, "", "## Privacy guarantee", ""]
    if g["type"] != registry.DP:
        return [*head, about.guarantee, ""]
    rdp, pld, delta = g.get("epsilon_rdp"), g.get("epsilon_pld"), g["delta"]
    if history is not None:
        rdp, pld, delta = history.get("epsilon_rdp"), history.get("epsilon_pld"), history["delta"]
    return [
        *head,
        "(epsilon, delta)-differential privacy for the whole history of releases from "
        f"the source dataset {'as of publication ' if history is not None else ''}(this "
        f"one included), with delta = {delta:g}:",
        "",
        f"- epsilon by RDP (reference accountant): **{_eps(rdp)}**",
        f"- epsilon by PLD (tighter accountant): **{_eps(pld)}**",
        "",
        f"The privacy unit is **{dataset['privacy_unit']}** (add/remove one record). It covers "
        f"{about.guarantee}.",
        "",
        *_adaptive_cap(dataset),
    ]


def _adaptive_cap(dataset: dict) -> list[str]:
    """The figures above compose the history as if it had been fixed in advance; releases are in
    fact chosen one after another. What holds under that adaptive choice is the ledger's cap,
    enforced by a privacy filter."""
    if dataset.get("epsilon_cap") is None:
        return []
    return [
        "Releases from this dataset are chosen one after another, each after seeing the earlier "
        "ones. The publisher's ledger admitted each only through a privacy filter with cap "
        f"epsilon = {dataset['epsilon_cap']:g}, delta = {dataset['delta_cap']:g} (a multi-order "
        "Rényi filter, after Feldman & Zrnic 2021): under that adaptive choice, every release "
        f"from this dataset, past and future, is together ({dataset['epsilon_cap']:g}, "
        f"{dataset['delta_cap']:g})-differentially private.",
        "",
    ]


def _how_made(release: dict, result: dict) -> list[str]:
    spec = release["spec"]
    mech = result["mechanism"]
    params = spec.get(mech, {}) if isinstance(spec.get(mech), dict) else {}
    lines = [
        "## How it was made",
        "",
        f"- Mechanism: {mech}",
        f"- Preset: {params.get('preset', 'default')}",
        f"- Public data: {params.get('public', 'the mechanism default')} "
        "(public; not covered by the guarantee)",
    ]
    chosen = result["parameters"].get("selected_public_classes")
    if chosen is not None:
        lines.append(f"- Public classes selected by the DP query: {chosen}")
    pretrained = result["parameters"].get("public_pretraining")
    if pretrained is not None:  # a shipped checkpoint says it saw public data only
        lines.append(f"- Public pre-training: {pretrained}")
    lines += (
        ["", "Parameters:", ""]
        + [f"- {k}: {v}" for k, v in sorted(result["parameters"].items())]
        + [""]
    )
    return lines


def _limitations_and_use() -> list[str]:
    return [
        "## Limitations",
        "",
        "- The dataset size is treated as public (it is not protected by the guarantee).",
        "- Synthetic or averaged images have lower fidelity "
        "than the originals; check the utility for your task.",
        "- The guarantee is about records of the source dataset; it says nothing about people who "
        "appear in several records unless the privacy unit covers them.",
        "- The publication itself depended on pass/fail audit checks computed on the sensitive "
        "data; see the checks below.",
        "",
        "## Intended use",
        "",
        "Prototyping, teaching, method development and benchmarking "
        "where the original images cannot be shared. Not for clinical "
        "or individual decisions, and not for re-identifying anyone.",
        "",
    ]


def _version_citation(release: dict, dataset: dict, license_id: str, when: datetime) -> list[str]:
    rid = release["release_id"]
    stamp = when.astimezone(UTC)
    license_text = (
        f"`{license_id}`"
        if license_id != DEFAULT_LICENSE
        else (
            "`other`: the publisher set no license in the "
            "release spec; ask them before redistributing"
        )
    )
    return [
        "",
        "## Version",
        "",
        f"- Release id: `{rid}` (also the bundle's name, bound by the signature)",
        f"- Source dataset id: `{dataset['dataset_id']}`",
        f"- Published: {stamp.strftime('%Y-%m-%d %H:%M UTC')}",
        "",
        "## License",
        "",
        license_text,
        "",
        "## Citation",
        "",
        "```bibtex",
        f"@misc{{{rid.replace('-', '_')},",
        f"  title = {{{{{rid}}}: privacy-preserving release of dataset {dataset['dataset_id']}}},",
        f"  year = {{{stamp.year}}},",
        f"  note = {{Release id {rid}, published {stamp.date().isoformat()}}}",
        "}",
        "```",
        "",
    ]


# ---------------------------------------------------------------- completed while the bundle is
# written


def split_front_matter(card: str) -> tuple[dict[str, Any], str]:
    """(front matter, body) of a card; an empty dict when it has none."""
    if card.startswith("---\n"):
        end = card.find("\n---\n", 4)
        if end > 0:
            meta = yaml.safe_load(card[4:end]) or {}
            if isinstance(meta, dict):
                return meta, card[end + 5 :]
    return {}, card


def finish_card(
    card: str,
    *,
    release_id: str,
    features: list[dict[str, Any]],
    n: int,
    num_bytes: int,
    key_fingerprints: tuple[str, str],
    predicate: dict[str, Any],
) -> str:
    """The card with the data's `dataset_info`/`configs`, and the load, verify and recompute
    sections."""
    meta, body = split_front_matter(card)
    declared = {f.get("name"): f for f in (meta.get("dataset_info") or {}).get("features", [])}
    meta.setdefault("license", DEFAULT_LICENSE)
    meta.setdefault("task_categories", ["image-classification"])
    meta.setdefault("size_categories", [size_category(n)])
    meta["dataset_info"] = {
        "features": [_declared_or(declared.get(f["name"]), f) for f in features],
        "splits": [{"name": "train", "num_bytes": num_bytes, "num_examples": n}],
    }
    meta["configs"] = [
        {"config_name": "default", "data_files": [{"split": "train", "path": "data/*.parquet"}]}
    ]
    tail = _use_section(release_id) + _verify_section(release_id, key_fingerprints)
    if isinstance(predicate.get("history"), dict):
        tail += history_section(release_id, predicate["history"])
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip()
    return f"---\n{front}\n---\n{body.rstrip()}\n\n" + "\n".join(tail)


def _declared_or(declared: dict | None, derived: dict) -> dict:
    """The card's declared feature (e.g. every label of the dataset, named), if it covers the data's
    values."""
    if declared is None:
        return derived

    def names(f: dict) -> list | None:
        dtype = f.get("dtype")
        return (
            (dtype or {}).get("class_label", {}).get("names") if isinstance(dtype, dict) else None
        )

    have, need = names(declared), names(derived)
    if need is not None and (have is None or len(have) < len(need)):
        return derived
    return declared


def _use_section(rid: str) -> list[str]:
    return [
        "## Files and loading",
        "",
        "- `data/part-*.parquet`: columns `image` (struct of PNG `bytes` and a `path` name, the "
        "Hugging Face Image layout), `label` (integer class), `id` (row id), and any extra "
        "columns; row groups are small enough to stream.",
        "- `sample_grid.png`: a few images per class, for a first look.",
        "- `croissant.json`: MLCommons Croissant metadata (files with sha256, fields, "
        "Responsible-AI properties), "
        'e.g. `mlcroissant.Dataset(jsonld="croissant.json").records("default")`.',
        "",
        "![sample grid](sample_grid.png)",
        "",
        "```python",
        "from datasets import load_dataset",
        f'ds = load_dataset("{rid}", split="train")   # the extracted bundle directory',
        "```",
        "",
    ]


def _verify_section(rid: str, fingerprints: tuple[str, str]) -> list[str]:
    keyid, raw_sha = fingerprints
    return [
        "## Verify",
        "",
        "The bundle is signed with the publisher's Ed25519 release key. Check its fingerprint "
        "against the one the publisher gives you out of band:",
        "",
        f"- keyid (securesystemslib default): `{keyid}`",
        f"- sha256 of the raw public key: `{raw_sha}`",
        "",
        f"`privrelease verify {rid}.tar.gz --key release.pub` checks the DSSE "
        "signature over `manifest.intoto.json`, every file's sha256 and that "
        "the archive's name is the signed release id, offline. Without "
        "privrelease, with securesystemslib and the Python standard library:",
        "",
        "```python",
        "import hashlib, json, pathlib",
        "from cryptography.hazmat.primitives.serialization import load_pem_public_key",
        "from securesystemslib.dsse import Envelope",
        "from securesystemslib.signer import SSlibKey",
        "",
        'key = SSlibKey.from_crypto(load_pem_public_key(pathlib.Path("release.pub").read_bytes()))',
        f'assert key.keyid == "{keyid}"',
        "envelope = "
        f'Envelope.from_dict(json.loads(pathlib.Path("{rid}/manifest.dsse.json").read_bytes()))',
        "envelope.verify([key], 1)  # raises unless the publisher's key signed it",
        "statement = json.loads(envelope.payload)",
        f'assert statement["predicate"]["release_id"] == "{rid}"',
        'for s in statement["subject"]:',
        f'    data = pathlib.Path("{rid}", s["name"]).read_bytes()',
        '    assert hashlib.sha256(data).hexdigest() == s["digest"]["sha256"], s["name"]',
        "```",
        "",
    ]
