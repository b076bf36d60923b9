"""The volume audit's [policy] keys (audit/volumes.py): the section the head-volume kind declares
(audit/kinds/builtin.py). Users write them in the flat [policy] table beside the core keys
(audit/policy.py)."""

from __future__ import annotations

from dataclasses import dataclass

from accounting.errors import InvalidParameterError
from audit.policy import check_number


@dataclass(frozen=True)
class VolumePolicy:
    # head volume releases (deface, reface). Every brain voxel must be unchanged (no threshold:
    # exactly 0). The face region's *detail* (intensity minus its 2 mm Gaussian blur) must not
    # correlate with the original's above this; the plain correlation of any two aligned faces is
    # ~0.8 (air in front, skin, tissue behind), so it is reported, not gated.
    volume_max_face_correlation: float | None = 0.3
    # re-identification of face renders among the originals: fails when rank-1 matches are
    # significantly above chance (one-sided binomial test at this level)
    volume_reid_alpha: float = 0.05
    volume_min_subjects: int = 5  # fewer: the test cannot tell a match from chance (not run)
    # subjects the re-identification draws (with the policy's seed) as its probes and gallery:
    # it compares every probe with every gallery face (N x N), so an archive of thousands of heads
    # is attacked on a sample; a smaller gallery makes matching easier, not harder
    volume_reid_samples: int = 500

    def __post_init__(self) -> None:
        if self.volume_max_face_correlation is not None:
            check_number(
                "volume_max_face_correlation", self.volume_max_face_correlation, share=True
            )
        check_number("volume_reid_alpha", self.volume_reid_alpha, share=True)
        if not 0 < self.volume_reid_alpha < 1:
            raise InvalidParameterError(
                "audit policy volume_reid_alpha must be strictly between 0 and 1, got "
                f"{self.volume_reid_alpha}."
            )
        check_number("volume_min_subjects", self.volume_min_subjects, count=True)
        check_number("volume_reid_samples", self.volume_reid_samples, count=True)
        if self.volume_reid_samples < self.volume_min_subjects:
            raise InvalidParameterError(
                f"audit policy volume_reid_samples ({self.volume_reid_samples}) must be at least "
                f"volume_min_subjects ({self.volume_min_subjects}): the re-identification would "
                "never run."
            )
        if self.volume_min_subjects < 2:
            raise InvalidParameterError(
                "audit policy volume_min_subjects must be >= 2 (rank-1 needs a choice), got "
                f"{self.volume_min_subjects}."
            )
