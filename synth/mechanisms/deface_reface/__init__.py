"""De-identification of head MRI volumes, released as NIfTI: `deface` (cut the face away: the
quickshear plane or pydeface's registered face mask) and `reface` (put a template face in its
place). Both leave every voxel of the brain bit-for-bit as it was and claim no epsilon: their
guarantee kind is "empirical" (judged by the audit's checks and re-identification attack)."""
