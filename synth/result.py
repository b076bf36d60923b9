"""What every mechanism returns to the release manager."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from accounting.events import MechanismEvent


@dataclass
class SynthResult:
    images: np.ndarray                      # uint8 (N, H, W) or (N, H, W, C): the releasable images
    labels: np.ndarray                      # int64 (N,): released labels (majority label for k-anonymous)
    mechanism: str                          # "privimage" | "ksalsa"
    guarantee: dict[str, Any]               # {"type": "dp", "epsilon_rdp", "epsilon_pld", "delta"} or {"type": "k-anonymity", "k"}
    executed_events: list[MechanismEvent]   # what was committed to the ledger
    parameters: dict[str, Any]              # public parameters that may go into the manifest
    # Computed from sensitive data and NOT releasable as such (e.g. cluster memberships, per-class
    # histograms): for the audit and for stewards/auditors only, never for the consumer bundle.
    internal: dict[str, Any] = field(default_factory=dict)
    label_distributions: np.ndarray | None = None  # (N, n_classes) for k-anonymous releases
    artifacts: dict[str, str] = field(default_factory=dict)  # name -> path (checkpoints, samples)
