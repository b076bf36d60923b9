"""The Great Expectations suite over the release table: each expectation fails on a crafted bad release
and names the offending rows; a good release passes all of them."""

from __future__ import annotations

import numpy as np
import pytest

from accounting.fingerprint import record_fingerprints
from audit.expectations import build_suite, release_table, validate_table
from audit.images import rms_nearest

KEY = b"k" * 32


@pytest.fixture(scope="module")
def data():
    from synth.kinds.datasets import uci_digits

    digits = uci_digits()  # quick to load; 28x28 uint8
    return digits.subset(np.arange(0, 1000, 10)), digits.subset(
        np.arange(1000, 1400, 20)
    )  # 100 / 20


def _validate(images, labels, ids, sens, expected_count=None, label_set=range(10)):
    usable = images.dtype == np.uint8 and images.shape[1:] == sens.image_shape
    d = rms_nearest(images, sens.images)[0] if usable else np.zeros(len(images))
    table = release_table(images, labels, ids, KEY, d)
    suite = build_suite(
        len(images) if expected_count is None else expected_count,
        list(label_set),
        sens.image_shape,
        record_fingerprints(KEY, sens.images),
    )
    return {r.name: r for r in validate_table(table, suite)}


def _failed(results):
    return {name for name, r in results.items() if not r.passed}


def test_good_release_passes_every_expectation(data):
    sens, ho = data
    res = _validate(ho.images, ho.labels, [f"r{i}" for i in range(len(ho))], sens)
    assert len(res) >= 15
    assert _failed(res) == set()
    assert all(r.kind == "expectations" for r in res.values())


def test_wrong_count_fails(data):
    sens, ho = data
    res = _validate(
        ho.images, ho.labels, [f"r{i}" for i in range(len(ho))], sens, expected_count=len(ho) + 1
    )
    assert _failed(res) == {"expect_table_row_count_to_equal"}
    r = res["expect_table_row_count_to_equal"]
    assert r.details["observed_value"] == len(ho) and "expected" in r.summary


def test_nan_pixels_fail_and_name_rows(data):
    sens, ho = data
    images = ho.images.astype(np.float32)
    images[3, 5, 5] = np.nan
    res = _validate(images, ho.labels, [f"r{i}" for i in range(len(ho))], sens)
    assert "expect_column_values_to_not_be_null(mean_pixel)" in _failed(res)
    assert res["expect_column_values_to_not_be_null(mean_pixel)"].details["offending_ids"] == ["r3"]
    assert "expect_column_values_to_be_in_set(dtype)" in _failed(
        res
    )  # floats are not a uint8 release


def test_copied_training_image_fails_via_hmac(data):
    sens, ho = data
    images = ho.images.copy()
    images[7] = sens.images[42]
    res = _validate(images, ho.labels, [f"r{i}" for i in range(len(ho))], sens)
    assert _failed(res) == {"expect_column_values_to_not_be_in_set(sha256)"}
    r = res["expect_column_values_to_not_be_in_set(sha256)"]
    assert r.details["offending_ids"] == ["r7"] and "r7" in r.summary


def test_label_out_of_set_fails(data):
    sens, ho = data
    labels = ho.labels.copy()
    labels[2] = 12
    res = _validate(ho.images, labels, [f"r{i}" for i in range(len(ho))], sens)
    assert _failed(res) == {"expect_column_values_to_be_in_set(label)"}
    assert res["expect_column_values_to_be_in_set(label)"].details["offending_ids"] == ["r2"]


def test_duplicate_ids_and_wrong_shape_fail(data):
    sens, ho = data
    ids = [f"r{i}" for i in range(len(ho))]
    ids[5] = "r4"
    res = _validate(ho.images, ho.labels, ids, sens)
    assert _failed(res) == {"expect_column_values_to_be_unique(id)"}
    assert set(res["expect_column_values_to_be_unique(id)"].details["offending_ids"]) == {"r4"}
    small = ho.images[:, :20, :20].copy()
    res = _validate(small, ho.labels, [f"r{i}" for i in range(len(ho))], sens)
    assert _failed(res) == {"expect_column_values_to_be_in_set(shape)"}


def test_sha256_column_is_hmac_not_plain_hash(data):
    import hashlib

    sens, ho = data
    table = release_table(
        ho.images, ho.labels, [f"r{i}" for i in range(len(ho))], KEY, np.zeros(len(ho))
    )
    plain = hashlib.sha256(ho.images[0].tobytes()).hexdigest()
    assert table["sha256"][0] != plain
    assert table["synthetic_sha256"][0] == plain
    assert table["sha256"][0] == record_fingerprints(KEY, ho.images[:1])[0]
