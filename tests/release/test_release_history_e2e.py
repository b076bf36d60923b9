"""Issue 15: after three real releases from one dataset, a consumer holding only the third bundle and the
release key verifies it, extracts it, and recomputes the card's RDP and PLD epsilon with dp-accounting alone
from the whole ledger history in the signed predicate. Tiny presets: the point is the accounting."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from test_release_e2e import POLICY, _release, _setup, small_data  # noqa: F401  (small_data is a fixture)

from accounting import ledger
from release import keys, manager
from release.verify import verify_bundle


def _recipe(card: str) -> str:
    section = card.split("## Recompute the privacy loss yourself", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_consumer_recomputes_epsilon_after_three_releases(store, small_data, tmp_path):  # noqa: F811
    _setup(store, small_data)
    # Tiny presets produce noise: the utility gate (and the slow one-run DP-SGD audit) are off here, as the
    # point is the accounting; the gate has its own tests.
    policy = {**POLICY, "min_utility_gain": None, "one_run_canaries": None}
    published = []
    for target in (3.0, 5.0, 7.0):  # each target bounds the composed history so far
        spec = {
            "release": {
                "dataset": "digits",
                "mechanism": "privimage",
                "n_images": 20,
                "heldout": str(small_data / "heldout.npz"),
            },
            "privimage": {"epsilon": target, "preset": "tiny", "public": "builtin:uci-digits"},
            "policy": policy,
        }
        rel = _release(store, spec)
        published.append(manager.publish(store, rel.release_id, "alice").result.bundle)
    consumer = tmp_path / "consumer"
    consumer.mkdir()
    tarball = shutil.copy(published[-1]["tarball"], consumer)
    shutil.copy(keys.public_key_path(store.workspace, "release"), consumer / "release.pub")

    r = verify_bundle(tarball, consumer / "release.pub", extract_to=consumer)
    assert r.ok, r.problems
    history = r.predicate["history"]
    positions = [e["position"] for e in history["entries"]]
    assert positions == sorted(positions) and sum(1 for e in history["entries"] if e["events"]) >= 3
    # The history only grows: the first bundle's signed history is a prefix of the third's.
    first = verify_bundle(published[0]["tarball"], consumer / "release.pub").predicate["history"][
        "entries"
    ]
    assert history["entries"][: len(first)] == first and len(first) < len(history["entries"])

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    card = (r.extracted / "README.md").read_text()
    out = subprocess.run(
        [sys.executable, "-c", _recipe(card)], cwd=consumer, capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    rdp, pld = map(float, re.search(r"epsilon RDP (\S+) PLD (\S+)", out.stdout).groups())
    assert rdp == pytest.approx(history["epsilon_rdp"], rel=1e-12)
    assert pld == pytest.approx(history["epsilon_pld"], rel=1e-12)
    spent = ledger.budget(store, "digits").spent
    assert rdp == pytest.approx(spent.epsilon_rdp, rel=1e-9) and rdp <= 7.0 + 1e-9
    assert pld <= rdp and f"**{rdp:.3f}**" in card
