"""Distance to closest record compares equal-sized sets: a training set four times the held-out set
must not make an independent release look "closer to training" (issue: 0.96 on a healthy release)."""

import numpy as np

from audit.images import rms_nearest
from audit.memorisation import closer_to_train, run_memorisation
from audit.policy import AuditPolicy
from synth.kinds.datasets import load_source


def test_bigger_training_set_alone_no_longer_looks_closer():
    sens = load_source("builtin:mnist5k").subset(np.arange(0, 4000, 2))  # 2,000 training images
    pool = load_source("builtin:mnist5k-heldout")
    release, ho = (
        pool.subset(np.arange(0, 1000, 5)),
        pool.subset(np.setdiff1d(np.arange(1000), np.arange(0, 1000, 5))),
    )
    ho = ho.subset(np.arange(500))  # 500 held-out, 200 released
    d_tr, j = rms_nearest(release.images, sens.images)
    d_ho = rms_nearest(release.images, ho.images)[0]
    unequal = float(np.mean(d_tr < d_ho))  # what comparing against the whole training set reports
    assert unequal > 0.6  # size alone: the release is independent of both sets
    spread = closer_to_train(
        release.images, sens.images, d_ho, len(ho), 5, np.random.default_rng(0)
    )
    assert 0.35 < spread["mean"] < 0.65 and spread["min"] <= spread["mean"] <= spread["max"]
    assert spread["repeats"] == 5 and spread["n_per_set"] == 500
    res = run_memorisation(
        release.images,
        sens,
        ho,
        d_tr,
        j,
        AuditPolicy(max_closer_to_train_fraction=0.6, dcr_repeats=5),
        None,
        features=False,
    )
    assert res.details["checks"]["closer_to_train"] is True, res.summary
    assert "equal-size sets, 5 draws" in res.summary
