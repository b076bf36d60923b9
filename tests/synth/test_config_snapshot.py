"""Every mechanism's config, built from a spec table for each preset, holds exactly the values (and
the JSON types) it held before the configs became one frozen dialect (issue 55): the snapshot in
config_snapshot.json was written by the code before that change, so plans, digests and `make demo`
read the same parameters. Changed in it since, deliberately: PrivImage's new vote_neighbours (1; 4 in
the demo preset, issue 63), the demo preset's vote_sigma (2 -> 1.75, issue 63) and PrivImage's new
sampler ("ddim"; "dpm-solver++" at 12 steps instead of DDIM's 25 in the demo preset, issue 63)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from accounting.errors import InvalidParameterError
from synth import registry
from synth.registry import DatasetInfo

SNAPSHOT = json.loads((Path(__file__).parent / "config_snapshot.json").read_text())
IMAGES = DatasetInfo("d", "d", 5000, tuple(range(10)), (28, 28), 1e-5)
DATASETS = {
    "face-deid": DatasetInfo("f", "f", 10, (0,), (128, 128, 3), 1e-5),
    "deface": DatasetInfo("v", "v", 3, (0,), (), 1e-5, data_kind="volumes"),
    "reface": DatasetInfo("v", "v", 3, (0,), (), 1e-5, data_kind="volumes"),
}


def _built(name: str, preset: str, i: int) -> dict:
    params_list, n_images = SNAPSHOT["cases"][name]
    entry = registry.get(name)
    try:
        cfg = entry.make_config(dict(params_list[i]), DATASETS.get(name, IMAGES), n_images, preset)
    except InvalidParameterError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    d = cfg.as_dict()
    return {
        "type": type(cfg).__name__,
        "params": d,
        "types": {k: type(v).__name__ for k, v in d.items()},
    }


@pytest.mark.parametrize("key", sorted(SNAPSHOT["configs"]))
def test_built_config_equals_the_snapshot(key: str) -> None:
    name, preset, i = key.split("/")
    # JSON round trip: what the plan stores (tuples as lists, float 3.0 as 3.0)
    assert json.loads(json.dumps(_built(name, preset, int(i)))) == SNAPSHOT["configs"][key]
