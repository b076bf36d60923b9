"""Importing privrelease changes no process state (logging levels, environment variables)."""

import os
import subprocess
import sys

CHECK = """
import os
from absl import logging as absl_logging
before = absl_logging.get_verbosity()
import accounting.epsilon, accounting.calibration, audit, audit.expectations, release.manager, release.runner
import release.cli, synth.registry
assert absl_logging.get_verbosity() == before, ("absl verbosity changed at import", before, absl_logging.get_verbosity())
assert "GX_ANALYTICS_ENABLED" not in os.environ, "os.environ changed at import"
from accounting.calibration import calibrate_dpsgd_sigma
calibrate_dpsgd_sigma(2.0, 1e-5, 0.01, 100)
from accounting.epsilon import epsilon_rdp
from accounting.events import DpSgd
epsilon_rdp([DpSgd(0.0625, 0.716073, 300)], 1e-5)  # probes orders where dp-accounting fails to converge
assert absl_logging.get_verbosity() == before, "calibration left absl silenced"
print("clean")
"""


def test_imports_and_calibration_leave_process_state_alone():
    env = {k: v for k, v in os.environ.items() if k != "GX_ANALYTICS_ENABLED"}
    p = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().endswith("clean")
    assert (
        "failed to converge" not in p.stderr
    )  # dp-accounting's expected convergence noise stays out
