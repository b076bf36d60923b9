"""The release table (one row per image) and its Great Expectations suite.

GX runs offline in an ephemeral, in-memory context with analytics and progress bars off, created
once per process (context creation and the GX import are the slow part). Each expectation becomes
one CheckResult, so a failure names the expectation and the offending rows (image ids).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from accounting.fingerprint import record_fingerprints
from audit.report import CheckResult

COLUMNS = [
    "id",
    "label",
    "shape",
    "dtype",
    "min_pixel",
    "max_pixel",
    "mean_pixel",
    "sha256",
    "synthetic_sha256",
    "nearest_training_distance",
]
MAX_LISTED_ROWS = 50


def shape_str(shape: tuple[int, ...]) -> str:
    return "x".join(str(int(s)) for s in shape)


def _as_uint8_for_hash(images: np.ndarray) -> np.ndarray:
    if images.dtype == np.uint8:
        return images
    with np.errstate(invalid="ignore"):
        return np.clip(np.nan_to_num(np.asarray(images, dtype=np.float64)), 0, 255).astype(np.uint8)


def release_table(
    images: np.ndarray,
    labels: np.ndarray,
    ids: list[str],
    key: bytes,
    nearest_training_distance: np.ndarray,
) -> pd.DataFrame:
    """One row per released image. `sha256` is the HMAC record fingerprint (comparable with the
    sensitive set's HMACs, never a plain hash of sensitive data); `synthetic_sha256` is a plain hash
    of the released image itself."""
    images = np.asarray(images)
    x = images.reshape(len(images), int(np.prod(images.shape[1:]))).astype(np.float64)
    as_u8 = _as_uint8_for_hash(images)
    return pd.DataFrame(
        {
            "id": [str(i) for i in ids],
            "label": np.asarray(labels).astype(np.int64),
            "shape": [shape_str(images.shape[1:])] * len(images),
            "dtype": [str(images.dtype)] * len(images),
            "min_pixel": x.min(1) if x.size else np.zeros(len(x)),
            "max_pixel": x.max(1) if x.size else np.zeros(len(x)),
            "mean_pixel": x.mean(1) if x.size else np.zeros(len(x)),
            "sha256": record_fingerprints(key, as_u8),
            "synthetic_sha256": [hashlib.sha256(im.tobytes()).hexdigest() for im in as_u8],
            "nearest_training_distance": np.asarray(nearest_training_distance, dtype=np.float64),
        }
    )


def _offline() -> None:
    # before GX is first imported; audits run offline
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


@lru_cache(maxsize=1)
def _context():
    _offline()
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    ctx = gx.get_context(mode="ephemeral", project_config=config)
    asset = ctx.data_sources.add_pandas("privrelease").add_dataframe_asset("release_table")
    return ctx, asset.add_batch_definition_whole_dataframe("whole_table")


def build_suite(
    expected_count: int,
    label_set: list[int],
    image_shape: tuple[int, ...],
    sensitive_hmacs: list[str],
) -> list[Any]:
    """The expectations over a release table (GX expectation objects)."""
    _offline()
    import great_expectations.expectations as gxe

    exps = [
        gxe.ExpectTableColumnsToMatchSet(column_set=COLUMNS, exact_match=True),
        gxe.ExpectTableRowCountToEqual(value=int(expected_count)),
        gxe.ExpectColumnValuesToBeUnique(column="id"),
        gxe.ExpectColumnValuesToBeInSet(column="label", value_set=[int(v) for v in label_set]),
        gxe.ExpectColumnValuesToBeInSet(column="dtype", value_set=["uint8"]),
        gxe.ExpectColumnValuesToBeInSet(column="shape", value_set=[shape_str(image_shape)]),
        # exact copy of a sensitive record: HMAC in the sensitive set's HMACs
        gxe.ExpectColumnValuesToNotBeInSet(column="sha256", value_set=list(sensitive_hmacs)),
    ]
    for col in ("id", "label", "min_pixel", "max_pixel", "mean_pixel", "nearest_training_distance"):
        exps.append(gxe.ExpectColumnValuesToNotBeNull(column=col))
    for col in ("min_pixel", "max_pixel", "mean_pixel"):
        exps.append(gxe.ExpectColumnValuesToBeBetween(column=col, min_value=0, max_value=255))
    exps.append(gxe.ExpectColumnValuesToBeBetween(column="nearest_training_distance", min_value=0))
    return exps


def _check_name(cfg: Any) -> str:
    col = cfg.kwargs.get("column")
    return cfg.type + (f"({col})" if col else "")


def validate_table(table: pd.DataFrame, expectations: list[Any]) -> list[CheckResult]:
    """Run the suite; one CheckResult per expectation, failures listing offending ids."""
    import great_expectations as gx

    ctx, batch_def = _context()
    name = f"release-{uuid.uuid4().hex}"
    suite = ctx.suites.add(gx.ExpectationSuite(name=name, expectations=expectations))
    vd = ctx.validation_definitions.add(
        gx.ValidationDefinition(data=batch_def, suite=suite, name=name)
    )
    try:
        res = vd.run(
            batch_parameters={"dataframe": table},
            result_format={"result_format": "COMPLETE", "unexpected_index_column_names": ["id"]},
        )
    finally:
        ctx.validation_definitions.delete(name)
        ctx.suites.delete(name)
    out = []
    for r in res.results:
        cfg, result = r.expectation_config, dict(r.result or {})
        kwargs = {k: v for k, v in cfg.kwargs.items() if k not in ("value_set", "batch_id")}
        if "value_set" in cfg.kwargs:
            vs = cfg.kwargs["value_set"]
            kwargs["value_set"] = vs if len(vs) <= 20 else f"<{len(vs)} values>"
        details: dict[str, Any] = {"expectation": cfg.type, "kwargs": kwargs}
        if "observed_value" in result:
            details["observed_value"] = result["observed_value"]
        offending = [
            row.get("id")
            for row in (result.get("unexpected_index_list") or [])
            if isinstance(row, dict)
        ]
        if offending or result.get("unexpected_count"):
            details["unexpected_count"] = result.get("unexpected_count", len(offending))
            details["offending_ids"] = offending[:MAX_LISTED_ROWS]
        if r.exception_info and r.exception_info.get("raised_exception"):
            details["exception"] = str(r.exception_info.get("exception_message"))
        summary = _summary(cfg.type, kwargs, bool(r.success), details)
        out.append(CheckResult(_check_name(cfg), "expectations", bool(r.success), summary, details))
    return out


def _summary(kind: str, kwargs: dict, ok: bool, details: dict) -> str:
    what = f"{kind}" + (f" on {kwargs['column']}" if "column" in kwargs else "")
    if ok:
        return f"{what}: ok"
    if "offending_ids" in details:
        ids = details["offending_ids"][:5]
        more = (
            ""
            if details["unexpected_count"] <= 5
            else f" (+{details['unexpected_count'] - 5} more)"
        )
        return f"{what}: {details['unexpected_count']} offending row(s), ids {ids}{more}"
    if "observed_value" in details:
        expected = {k: v for k, v in kwargs.items() if k != "column"}
        return f"{what}: observed {details['observed_value']!r}, expected {expected}"
    return f"{what}: failed {details.get('exception', '')}".rstrip()
