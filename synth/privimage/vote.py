"""The private vote: which generated images look like the sensitive ones (one round of Private Evolution,
Lin et al., ICLR 2024, microsoft/DPSDA).

The DP generator draws `vote_pool` candidates per image to release. Each sensitive image votes for the one
candidate of its own class nearest to it in pixel space; Gaussian noise of std `vote_sigma` is added to every
candidate's count, and the most-voted candidates of each class are released. Adding or removing one sensitive
image changes one count by 1, so the vote histogram has L2 sensitivity 1 and is charged as one Gaussian query
(noise multiplier `vote_sigma`). The candidates are post-processing of the DP model; the selection is
post-processing of the noisy histogram, which stays in the internal report.

With `vote_rounds` > 1 this is Private Evolution proper: each later round votes on variations of the previous
round's winners (drawn by the DP model, so post-processing too) and is charged as one more Gaussian query.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from accounting.errors import InvalidParameterError, LedgerStateError
from synth.privimage.state import VOTE as VOTE_FILE
from synth.secure_noise import SecureGaussian

_CHUNK = 512  # sensitive images per distance block (bounds memory at _CHUNK x candidates-of-a-class floats)


def _flat(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), -1).astype(np.float32) / 255.0


def nearest_candidate_votes(sensitive: np.ndarray, sensitive_pos: np.ndarray, candidates: np.ndarray,
                            candidate_pos: np.ndarray) -> np.ndarray:
    """Votes per candidate: each sensitive image (uint8, same format as the candidates) adds 1 to the
    candidate of its own class position with the smallest pixel-space L2 distance."""
    if sensitive.shape[1:] != candidates.shape[1:]:
        raise InvalidParameterError(f"Sensitive images {sensitive.shape[1:]} and candidates {candidates.shape[1:]} "
                                    "must have the same format to vote.")
    votes = np.zeros(len(candidates), dtype=np.int64)
    cand = _flat(candidates)
    for cls in np.unique(sensitive_pos):
        ci = np.flatnonzero(candidate_pos == cls)
        if len(ci) == 0:
            raise InvalidParameterError(f"No candidate of class position {cls} to vote for; draw a larger pool.")
        c, c2 = cand[ci], (cand[ci] ** 2).sum(1)
        si = np.flatnonzero(sensitive_pos == cls)
        for start in range(0, len(si), _CHUNK):
            s = _flat(sensitive[si[start:start + _CHUNK]])
            d2 = c2[None, :] - 2.0 * s @ c.T  # |s|^2 is the same for every candidate of this row
            np.add.at(votes, ci[d2.argmin(1)], 1)
    return votes


def noisy_votes(votes: np.ndarray, sigma: float) -> np.ndarray:
    """The DP histogram: votes + N(0, sigma^2) per candidate, from the hardened CSPRNG sampler."""
    noise = SecureGaussian().noise((len(votes),), sigma).numpy()
    return votes.astype(np.float64) + noise


def select_by_votes(noisy: np.ndarray, candidate_pos: np.ndarray, wanted_pos: np.ndarray) -> np.ndarray:
    """Indices of the released candidates: for each class position, as many as `wanted_pos` holds, the
    highest noisy counts first; returned grouped the way `wanted_pos` orders its classes."""
    keep = []
    for cls, n in zip(*np.unique(wanted_pos, return_counts=True), strict=True):
        ci = np.flatnonzero(candidate_pos == cls)
        if len(ci) < n:
            raise InvalidParameterError(f"Class position {cls} has {len(ci)} candidates for {n} images to release.")
        keep.append(ci[np.argsort(-noisy[ci], kind="stable")[:n]])
    return np.concatenate(keep) if keep else np.zeros(0, dtype=np.int64)


def vote_and_select(sensitive: np.ndarray, sensitive_pos: np.ndarray, candidates: np.ndarray,
                    candidate_pos: np.ndarray, wanted_pos: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(indices of the candidates to release, the noisy histogram)."""
    noisy = noisy_votes(nearest_candidate_votes(sensitive, sensitive_pos, candidates, candidate_pos), sigma)
    return select_by_votes(noisy, candidate_pos, wanted_pos), noisy


VaryFn = Callable[[np.ndarray, np.ndarray, int], np.ndarray]   # (winners, their positions, round) -> variations
RoundFn = Callable[[int, np.ndarray, np.ndarray], None]         # (round, kept indices, noisy histogram)


def evolve(sensitive: np.ndarray, sensitive_pos: np.ndarray, candidates: np.ndarray, candidate_pos: np.ndarray,
           wanted_pos: np.ndarray, sigmas: Sequence[float], vary: VaryFn, copies: int,
           saved: Sequence[np.ndarray] = (), on_round: RoundFn = lambda r, keep, noisy: None
           ) -> tuple[np.ndarray, np.ndarray]:
    """One vote per entry of `sigmas`: round 0 on `candidates`, round r > 0 on `copies` variations of each
    winner of round r - 1 (`vary`, image i's copies in rows i*copies..). The kept indices of the first
    len(`saved`) rounds are reused instead of voting again (a resumed run); every new round is reported to
    `on_round` before the next starts. Returns the winners of the last round and their class positions."""
    for r, sigma in enumerate(sigmas):
        if r > 0:
            candidates, candidate_pos = vary(candidates, candidate_pos, r), np.repeat(candidate_pos, copies)
        if r < len(saved):
            keep = np.asarray(saved[r], dtype=np.int64)
            if len(keep) and keep.max() >= len(candidates):
                raise LedgerStateError(f"The saved vote ({VOTE_FILE}) of round {r + 1} selects candidates this "
                                       "run did not draw; re-plan the release.")
        else:
            keep, noisy = vote_and_select(sensitive, sensitive_pos, candidates, candidate_pos, wanted_pos, sigma)
            on_round(r, keep, noisy)
        candidates, candidate_pos = candidates[keep], candidate_pos[keep]
    return candidates, candidate_pos
