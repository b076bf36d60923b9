"""A synthetic cohort of distinct head scans, made from the two real heads that ship offline.

SYNTHETIC DATA: every subject is Colin27 or pydeface's average head (`synth.kinds.head_templates`),
resampled to the chosen voxel size and deformed by a random affine transform (scale, rotation,
translation) and a random elastic deformation (torchio's RandomAffine and
RandomElasticDeformation, seeded per subject). They are distinct heads with distinct faces, but
they are not people: every table and figure made from them says so. Two consequences to keep in
mind when reading results: half the subjects are deformations of the very head whose face
refacing puts in place (their refaced faces resemble their originals more than a stranger's
would), and Colin27's field of view has no nose or mouth.

`make_cohort(folder, n)` writes subject-NN.nii.gz files (int16, with a `descrip` header field
naming the subject, which a release must strip); register the folder like any other volume data.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from synth.kinds.head_templates import COLIN_HEAD, FACE_HEAD, head_templates
from synth.kinds.nifti import write_volume
from synth.kinds.volume import Volume
from synth.progress import ProgressFn, no_progress

BASES = (COLIN_HEAD, FACE_HEAD)
LABEL = (
    "synthetic cohort (Colin27 and pydeface's average head, random affine + elastic deformations)"
)


def _resampled(volume: Volume, mm: float):
    import torch
    import torchio as tio

    image = tio.ScalarImage(tensor=torch.from_numpy(volume.physical()[None]), affine=volume.affine)
    return tio.Resample(mm)(image) if mm != 1.0 or volume.zooms != (1.0, 1.0, 1.0) else image


def subject(base: Volume, seed: int, mm: float = 1.0) -> Volume:
    """One synthetic subject: `base` at `mm` voxels, deformed with the transforms drawn from
    `seed`."""
    import torch
    import torchio as tio

    image = _resampled(base, mm)
    deform = tio.Compose(
        [
            tio.RandomAffine(scales=(0.9, 1.1), degrees=8, translation=6, isotropic=False),
            tio.RandomElasticDeformation(
                num_control_points=7, max_displacement=max(6.0, 2 * mm), locked_borders=2
            ),
        ]
    )
    torch.manual_seed(seed)
    out = deform(image)
    data = np.clip(np.rint(out.data[0].numpy()), -32768, 32767).astype(np.int16)
    return Volume(data, np.asarray(out.affine, np.float64), name=f"seed {seed}")


def make_cohort(
    folder: Path,
    n: int,
    *,
    mm: float = 1.0,
    seed: int = 0,
    progress: ProgressFn = no_progress,
    bases: tuple[str, ...] = BASES,
) -> list[Path]:
    """Write `n` synthetic subjects (alternating base heads) into `folder` as subject-NN.nii.gz;
    returns their paths. Subject i is drawn from seed `seed * 1000 + i`: the same call writes the
    same files."""
    import nibabel as nib

    templates = head_templates()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        progress("synthetic subjects", i, n)
        base = bases[i % len(bases)]
        vol = subject(templates.named(base), seed * 1000 + i, mm)
        path = folder / f"subject-{i:02d}.nii.gz"
        write_volume(vol, path)
        img = nib.load(str(path))  # a header field a release must strip: the subject's "name"
        header: Any = img.header
        header["descrip"] = f"synthetic subject {i:02d} from {base}".encode()[:79]
        nib.save(img, str(path))
        paths.append(path)
    progress("synthetic subjects", n, n)
    return paths


def cohort_labeler(n: int) -> Callable[[int], str]:
    """Which base head subject i of a cohort was made from (for tables)."""
    return lambda i: BASES[i % len(BASES)]
