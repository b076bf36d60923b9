"""The public models of a face-deid run, loaded once per process (the coordinator, or a Dask
worker), and each photo's seed: shared by the DCGAN search and the k-Same-M path's fallback."""

from __future__ import annotations

import numpy as np
import torch

from accounting.errors import DataFormatError
from synth.mechanisms.face_deid.anonymise import Tools
from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.face_deid.generator import (
    SIZE,
    FaceGenerator,
    LatentBank,
    latent_bank,
    load_generator,
    render,
)
from synth.tools import face_models as fm
from synth.tools import face_recognisers as fr


def plausible_faces(generator: FaceGenerator, bank: LatentBank) -> LatentBank:
    """The bank's latents whose faces an independent detector (YuNet) finds with confidence >= 0.9
    and eyes level within 10 degrees: the DCGAN also draws broken faces, and a replacement drawn
    near one looks broken in the photo. Public: computed from the generator alone."""
    faces = render(generator, bank.z)
    keep = []
    for face in faces:
        rows = fr.yunet_detect(face, threshold=0.9)
        if len(rows):
            eyes = fr.yunet_points(rows[0])[:2]
            tilt = np.degrees(np.arctan2(*(eyes[1] - eyes[0])[::-1]))
            keep.append(abs(tilt) <= 10.0)
        else:
            keep.append(False)
    index = torch.from_numpy(np.flatnonzero(keep))
    if len(index) < max(8, len(bank.z) // 10):  # a user's generator the detector dislikes
        return bank
    return LatentBank(bank.z[index], bank.views[index])


def load_tools(config: FaceDeidConfig) -> Tools:
    """The public models of a run (generator, its latent bank of plausible faces, the searched
    recognisers; the detectors warmed)."""
    generator = load_generator(
        config.generator_weights, config.latent_dim, config.generator_features
    )
    bank = plausible_faces(generator, latent_bank(generator, config.bank_size, config.seed))
    fm.detect(np.zeros((SIZE, SIZE, 3), np.uint8))  # loads the detector and landmark models
    recognisers = tuple(fr.recogniser(k) for k in config.recognisers)
    for rec in recognisers:  # loads each model now: a missing file is refunded
        rec.sightings(np.zeros((SIZE, SIZE, 3), np.uint8))
    return Tools(generator, bank, recognisers, config.targets(recognisers), config)


# the public models of each config, loaded once per process (the coordinator, or a Dask worker)
_TOOLS: dict[str, Tools] = {}


def tools_for(config: FaceDeidConfig) -> Tools:
    """`config`'s public models, loaded on first use in this process and kept."""
    key = repr(config)
    if key not in _TOOLS:
        _TOOLS.clear()  # one config at a time: models are hundreds of MB
        _TOOLS[key] = load_tools(config)
    return _TOOLS[key]


def photo_seed(config: FaceDeidConfig, index: int) -> int:
    """The seed of photo `index`'s searches: from the config's seed and the record's index, so a
    photo gets the same faces whichever worker, and in whichever order, processes it."""
    return int(np.random.SeedSequence([config.seed, index]).generate_state(1, np.uint64)[0] >> 1)


def no_face_refused(index: int) -> DataFormatError:
    """The error a photo without a detectable face stops the run with, under no_face = "refuse"."""
    return DataFormatError(
        f'photo {index} has no detectable face, and no_face = "refuse". '
        "Remove it from the dataset (and register again), or set no_face = "
        '"withhold" to leave such photos out of the release.'
    )
