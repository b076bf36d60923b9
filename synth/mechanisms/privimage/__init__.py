"""PrivImage (Li et al., USENIX Security 2024): DP semantic query over public classes -> selection
of public images -> diffusion pre-training on them -> DP-SGD fine-tuning on the sensitive data ->
DDIM sampling, every step charged by release/runner.py."""

from synth.mechanisms.privimage.config import PrivImageConfig
from synth.mechanisms.privimage.model import per_sample_diffusion_loss
from synth.mechanisms.privimage.plan import PrivImagePlan, plan_privimage

__all__ = ["PrivImageConfig", "PrivImagePlan", "plan_privimage", "per_sample_diffusion_loss"]
