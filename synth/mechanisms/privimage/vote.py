"""The private vote: which generated images look like the sensitive ones (one round of Private
Evolution, Lin et al., ICLR 2024, microsoft/DPSDA).

The DP generator draws `vote_pool` candidates per image to release. Each sensitive image votes for
the one candidate of its own class nearest to it; Gaussian noise of std `vote_sigma` is added to
every candidate's count, and the most-voted candidates of each class are released. Adding or
removing one sensitive image changes one count by 1, so the vote histogram has L2 sensitivity 1 and
is charged as one Gaussian query (noise multiplier `vote_sigma`). With `vote_neighbours` k > 1 each
sensitive image instead adds 1/sqrt(k) to each of its k nearest candidates of its class: it changes
k counts by 1/sqrt(k), still an L2 norm of 1, so the charge is the same, while the votes' total
weight against the noise is sqrt(k) times larger. The candidates are post-processing
of the DP model; the selection is post-processing of the noisy histogram, which stays in the
internal report.

"Nearest" is measured in one of two spaces (`vote_space`): "pixel", L2 distance of the pixels;
"embedding", cosine similarity of the pooled features of the ImageNet-pretrained EfficientNet-Lite0
(synth.tools.pretrained_cnn; Private Evolution votes on Inception features). The network is public
and frozen,
and each image's features depend on that image alone (inference mode, fixed-shape batches), so each
sensitive image still casts exactly one vote: the sensitivity, and so the charge, is the same in
both spaces.

With `vote_rounds` > 1 this is Private Evolution proper: each later round votes on variations of the
previous round's winners (drawn by the DP model, so post-processing too) and is charged as one more
Gaussian query.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from accounting.errors import InvalidParameterError, LedgerStateError
from synth.mechanisms.privimage.config import VOTE_SPACES
from synth.mechanisms.privimage.state import VOTE as VOTE_FILE
from synth.tools.secure_noise import SecureGaussian

if TYPE_CHECKING:
    import torch

# sensitive images per distance block (bounds memory at _CHUNK x candidates-of-a-class floats)
_CHUNK = 512
# input pixels of the embedding: 28 px upsampled; 224 px is too slow on CPUs (BENCHMARKS.md)
EMBED_SIZE = 64
_EMBED_BATCH = {"cpu": 64}  # per forward pass; elsewhere (a GPU) 512
_EMBED_CHUNK = 4096  # images converted to float at a time (bounds memory on 60,000-image sets)

# uint8 images -> (N, D) float32 vectors compared by L2
Featurize = Callable[[np.ndarray], np.ndarray]


def pixel_features(images: np.ndarray) -> np.ndarray:
    """The pixels in [0, 1], flattened: nearest by L2 in pixel space."""
    return images.reshape(len(images), -1).astype(np.float32) / 255.0


def embedding_features(device: str | torch.device = "cpu", precision: str = "float32") -> Featurize:
    """EfficientNet-Lite0's pooled features (grey repeated to RGB, upsampled to EMBED_SIZE px),
    L2-normalised: nearest by L2 between unit vectors is nearest by cosine. `precision` "bfloat16"
    runs the network under autocast (3x faster on a CPU with native bfloat16; the features agree
    with float32 to cosine 0.998)."""
    import torch
    import torch.nn.functional as F

    from synth.mechanisms.privimage.data import to_tensor
    from synth.mechanisms.privimage.precision import autocast
    from synth.tools.pretrained_cnn import embed

    dev = torch.device(device)

    def featurize(images: np.ndarray) -> np.ndarray:
        parts = []
        for start in range(0, len(images), _EMBED_CHUNK):
            with autocast(dev, precision):
                f = embed(
                    to_tensor(images[start : start + _EMBED_CHUNK]),
                    dev,
                    batch=_EMBED_BATCH.get(dev.type, 512),
                    size=EMBED_SIZE,
                    fixed_batch=True,
                )
            parts.append(F.normalize(f.float(), dim=1).numpy())
        return np.concatenate(parts) if parts else np.zeros((0, 1280), dtype=np.float32)

    return featurize


def features_for(
    space: str, device: str | torch.device = "cpu", precision: str = "float32"
) -> Featurize:
    """The vote's features in `space` ("pixel" or "embedding")."""
    if space not in VOTE_SPACES:
        raise InvalidParameterError(f"vote_space must be one of {VOTE_SPACES}, got {space!r}.")
    return pixel_features if space == "pixel" else embedding_features(device, precision)


def nearest_votes(
    sensitive: np.ndarray,
    sensitive_pos: np.ndarray,
    candidates: np.ndarray,
    candidate_pos: np.ndarray,
    neighbours: int = 1,
) -> np.ndarray:
    """Votes per candidate from feature vectors (N, D): each sensitive row adds 1 to the candidate
    of its own class position at the smallest L2 distance, or with `neighbours` k > 1 adds
    1/sqrt(k) to each of its k nearest (float64 counts; L2 sensitivity 1 either way)."""
    k = int(neighbours)
    votes = np.zeros(len(candidates), dtype=np.int64 if k == 1 else np.float64)
    for cls in np.unique(sensitive_pos):
        ci = np.flatnonzero(candidate_pos == cls)
        if len(ci) == 0:
            raise InvalidParameterError(
                f"No candidate of class position {cls} to vote for; draw a larger pool."
            )
        if len(ci) < k:
            raise InvalidParameterError(
                f"Class position {cls} has {len(ci)} candidate(s) for votes to the {k} nearest; "
                "draw a larger pool or lower vote_neighbours."
            )
        c = candidates[ci]
        c2 = (c**2).sum(1)
        si = np.flatnonzero(sensitive_pos == cls)
        for start in range(0, len(si), _CHUNK):
            # |s|^2: the same along a row
            d2 = c2[None, :] - 2.0 * sensitive[si[start : start + _CHUNK]] @ c.T
            if k == 1:
                np.add.at(votes, ci[d2.argmin(1)], 1)
            else:
                # stable sort: ties go to the lower index, whatever the other rows hold
                nearest = np.argsort(d2, axis=1, kind="stable")[:, :k]
                np.add.at(votes, ci[nearest.ravel()], 1.0 / np.sqrt(k))
    return votes


def _check_format(sensitive: np.ndarray, candidates: np.ndarray) -> None:
    if sensitive.shape[1:] != candidates.shape[1:]:
        raise InvalidParameterError(
            f"Sensitive images {sensitive.shape[1:]} and candidates {candidates.shape[1:]} must "
            "have the same format to vote."
        )


def nearest_candidate_votes(
    sensitive: np.ndarray,
    sensitive_pos: np.ndarray,
    candidates: np.ndarray,
    candidate_pos: np.ndarray,
    featurize: Featurize = pixel_features,
    neighbours: int = 1,
) -> np.ndarray:
    """Votes per candidate: each sensitive image (uint8, same format as the candidates) adds 1 to
    the candidate of its own class position nearest to it in `featurize`'s space (default: pixel
    L2), or 1/sqrt(k) to each of its `neighbours` k nearest."""
    _check_format(sensitive, candidates)
    return nearest_votes(
        featurize(sensitive), sensitive_pos, featurize(candidates), candidate_pos, neighbours
    )


def noisy_votes(votes: np.ndarray, sigma: float) -> np.ndarray:
    """The DP histogram: votes + N(0, sigma^2) per candidate, from the hardened CSPRNG sampler."""
    noise = SecureGaussian().noise((len(votes),), sigma).numpy()
    return votes.astype(np.float64) + noise


def select_by_votes(
    noisy: np.ndarray, candidate_pos: np.ndarray, wanted_pos: np.ndarray
) -> np.ndarray:
    """Indices of the released candidates: for each class position, as many as `wanted_pos` holds,
    the highest noisy counts first; returned grouped the way `wanted_pos` orders its classes."""
    keep = []
    for cls, n in zip(*np.unique(wanted_pos, return_counts=True), strict=True):
        ci = np.flatnonzero(candidate_pos == cls)
        if len(ci) < n:
            raise InvalidParameterError(
                f"Class position {cls} has {len(ci)} candidates for {n} images to release."
            )
        keep.append(ci[np.argsort(-noisy[ci], kind="stable")[:n]])
    return np.concatenate(keep) if keep else np.zeros(0, dtype=np.int64)


def vote_and_select(
    sensitive: np.ndarray,
    sensitive_pos: np.ndarray,
    candidates: np.ndarray,
    candidate_pos: np.ndarray,
    wanted_pos: np.ndarray,
    sigma: float,
    featurize: Featurize = pixel_features,
    sensitive_features: np.ndarray | None = None,
    neighbours: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """(indices of the candidates to release, the noisy histogram); `sensitive_features` saves
    featurising the sensitive images again in every round."""
    _check_format(sensitive, candidates)
    sens_f = featurize(sensitive) if sensitive_features is None else sensitive_features
    noisy = noisy_votes(
        nearest_votes(sens_f, sensitive_pos, featurize(candidates), candidate_pos, neighbours),
        sigma,
    )
    return select_by_votes(noisy, candidate_pos, wanted_pos), noisy


# (winners, their positions, round) -> variations
VaryFn = Callable[[np.ndarray, np.ndarray, int], np.ndarray]
RoundFn = Callable[[int, np.ndarray, np.ndarray], None]  # (round, kept indices, noisy histogram)


def evolve(
    sensitive: np.ndarray,
    sensitive_pos: np.ndarray,
    candidates: np.ndarray,
    candidate_pos: np.ndarray,
    wanted_pos: np.ndarray,
    sigmas: Sequence[float],
    vary: VaryFn,
    copies: int,
    saved: Sequence[np.ndarray] = (),
    on_round: RoundFn = lambda r, keep, noisy: None,
    featurize: Featurize = pixel_features,
    neighbours: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """One vote per entry of `sigmas`: round 0 on `candidates`, round r > 0 on `copies` variations
    of each winner of round r - 1 (`vary`, image i's copies in rows i*copies..). The kept indices of
    the first len(`saved`) rounds are reused instead of voting again (a resumed run); every new
    round is reported to `on_round` before the next starts. Nearness is measured in `featurize`'s
    space (the sensitive images are featurised once), each sensitive image voting for its
    `neighbours` nearest. Returns the winners of the last round and
    their class positions."""
    sens_f = None
    for r, sigma in enumerate(sigmas):
        if r > 0:
            candidates, candidate_pos = (
                vary(candidates, candidate_pos, r),
                np.repeat(candidate_pos, copies),
            )
        if r < len(saved):
            keep = np.asarray(saved[r], dtype=np.int64)
            if len(keep) and keep.max() >= len(candidates):
                raise LedgerStateError(
                    f"The saved vote ({VOTE_FILE}) of round {r + 1} selects candidates this run "
                    "did not draw; re-plan the release."
                )
        else:
            if sens_f is None:
                sens_f = featurize(sensitive)
            keep, noisy = vote_and_select(
                sensitive,
                sensitive_pos,
                candidates,
                candidate_pos,
                wanted_pos,
                sigma,
                featurize,
                sens_f,
                neighbours,
            )
            on_round(r, keep, noisy)
        candidates, candidate_pos = candidates[keep], candidate_pos[keep]
    return candidates, candidate_pos
