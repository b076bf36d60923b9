"""DP-MERF (Harder et al., AISTATS 2021): a generator trained against one differentially private
random-feature mean embedding per class. A mechanism of its own (`mechanism = "merf"`, minutes on a
laptop) and PrivImage's frequency warm-up (FETA-Pro's, Li et al. 2026)."""

from synth.mechanisms.merf.config import MerfConfig

__all__ = ["MerfConfig"]
