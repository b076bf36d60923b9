"""Head MRI volumes: the `VolumeDataset` type, NIfTI reading (checked) and writing (identifying
header fields dropped), the public head templates, affine registration, face-surface renders and
the synthetic cohort. Shared by the volume mechanisms (`synth.mechanisms.deface_reface`), the audit
(`audit.volumes`) and the benchmarks; no mechanism logic lives here."""
