"""One photograph's faces replaced by generated ones (FALCO's method at the scale that exists
offline).

For each detected face: align it to the generator's 64 x 64 template, invert the generator (the
latent whose image is closest), then try candidates between that inversion and prior faces of a
similar pose and lighting, each pasted into the photograph (one affine map on the 5 points, Poisson
cloning) and measured by every searched recogniser with its own alignment, as an attacker would. A
candidate passes when each recogniser puts it at least its target distance from the original; of
those, the most realistic is kept (YuNet finds it, its 5 points moved least). A face no candidate
moves far enough (short of a halfway margin), or one too small to align, is pixelated instead, and
counted.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.face_deid.generator import (
    SIZE,
    FaceGenerator,
    LatentBank,
    invert,
    nearest_latents,
    render,
    slerp,
)
from synth.tools import face_models as fm
from synth.tools import face_recognisers as fr

PIXEL_BLOCKS = 5  # blocks across a pixelated face (at 8, dlib still verified one of 9)


@dataclass(frozen=True)
class FaceOutcome:
    """What happened to one face (internal: computed from the sensitive photograph)."""

    box: tuple[float, float, float, float]
    # "averaged" (k-Same-M) | "generated" (DCGAN) | "pixelated" (search failed) | "pixelated-small"
    method: str
    distance: float | None  # identity distance of the released face to the original
    landmark_shift: float | None  # mean landmark displacement / inter-ocular distance
    candidates: int  # latents tried
    inversion_loss: float | None
    cluster: int | None = None  # the k-Same-M cluster whose face replaced it (averaged)
    factor: float | None = None  # the shape's move towards the cluster's (1 = strict)
    fallback: str | None = None  # why an averaged release gave this face the DCGAN's

    def as_dict(self) -> dict:
        return {
            "cluster": self.cluster,
            "factor": self.factor,
            "fallback": self.fallback,
            "box": [round(float(v), 1) for v in self.box],
            "method": self.method,
            "distance": self.distance,
            "landmark_shift": self.landmark_shift,
            "candidates": self.candidates,
            "inversion_loss": self.inversion_loss,
        }


@dataclass(frozen=True)
class Tools:
    """The public models a run uses (loaded before it reads sensitive data)."""

    generator: FaceGenerator
    bank: LatentBank
    recognisers: tuple[fr.Recogniser, ...]  # searched against
    targets: tuple[float, ...]  # the distance each released face must reach, per recogniser
    config: FaceDeidConfig


def _region(lm: np.ndarray, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The part of the photo a face's paste touches: its landmarks' box grown by half."""
    (x0, y0), (x1, y1) = lm.min(0), lm.max(0)
    gx, gy = 0.5 * (x1 - x0), 0.6 * (y1 - y0)
    h, w = shape[:2]
    return (
        max(0, int(x0 - gx)),
        max(0, int(y0 - gy)),
        min(w, int(np.ceil(x1 + gx))),
        min(h, int(np.ceil(y1 + gy))),
    )


def face_mask(
    lm: np.ndarray, region: tuple[int, int, int, int], feather: float, scale: float = 1.0
) -> np.ndarray:
    """Feathered mask (float, region-sized) over the face: the jaw line and the brows lifted by
    0.3 inter-ocular distances (the forehead), grown by `scale` about the face's centre; the
    feather (a Gaussian of `feather` inter-ocular distances) is centred on that outline."""
    from scipy.ndimage import gaussian_filter
    from skimage.draw import polygon

    x0, y0, x1, y1 = region
    iod = fm.inter_ocular(lm)
    brows = lm[17:27][::-1] - np.array([0.0, 0.3 * iod])
    outline = np.concatenate([lm[0:17], brows])
    centre = outline.mean(0)
    outline = centre + (outline - centre) * scale - np.array([x0, y0])
    binary = np.zeros((y1 - y0, x1 - x0), bool)
    rr, cc = polygon(outline[:, 1], outline[:, 0], binary.shape)
    binary[rr, cc] = True
    return np.clip(gaussian_filter(binary.astype(np.float64), max(1.0, feather * iod)), 0.0, 1.0)


@dataclass(frozen=True)
class FaceGeometry:
    """What every candidate for one face shares: the part of the photo a paste touches (the
    landmarks' box grown by half), the face's mask there (the jaw line and the forehead, grown by
    `mask_scale`), and the alignment taking photo coordinates to the generator's 64 x 64 frame."""

    face: fm.Face
    region: tuple[int, int, int, int]
    mask: np.ndarray  # (h, w) float in [0, 1], feathered
    tform: Any  # photo -> 64 x 64 aligned frame

    @classmethod
    def of(
        cls, face: fm.Face, shape: tuple[int, ...], feather: float, mask_scale: float
    ) -> FaceGeometry:
        region = _region(face.landmarks, shape)
        mask = face_mask(face.landmarks, region, feather, mask_scale)
        return cls(face, region, mask, fm.alignment(face.landmarks, SIZE))

    def warp(self, gen64: np.ndarray, anchor: np.ndarray | None) -> np.ndarray:
        """The generated face in photo coordinates over the region (float RGB in [0, 1]): one
        affine map for the whole face, taking the generated face's 5 points (YuNet's, on the 64 x
        64 image) to `anchor`, the original's 5 points in the photo (pose and expression kept),
        or, where either is missing, the inverse of the original's alignment. One map, so the
        face keeps its own proportions: no per-landmark warp to melt it."""
        import cv2

        x0, y0, x1, y1 = self.region
        shift = np.array([[1.0, 0, -x0], [0, 1.0, -y0], [0, 0, 1.0]])
        matrix = (shift @ self.tform.inverse.params)[:2]
        rows = fr.yunet_detect(gen64, threshold=0.3) if anchor is not None else np.zeros((0, 15))
        if len(rows):
            fitted, _ = cv2.estimateAffine2D(
                fr.yunet_points(rows[0]), anchor - np.array([x0, y0]), method=cv2.LMEDS
            )
            if fitted is not None and _plausible(fitted, matrix):
                matrix = fitted
            else:  # a pose the generated face cannot take by an affine map: its best similarity
                partial, _ = cv2.estimateAffinePartial2D(
                    fr.yunet_points(rows[0]), anchor - np.array([x0, y0]), method=cv2.LMEDS
                )
                if partial is not None and _plausible(partial, matrix):
                    matrix = partial
        layer = cv2.warpAffine(
            gen64,
            matrix,
            (x1 - x0, y1 - y0),
            flags=cv2.INTER_CUBIC,
            borderMode=cv2.BORDER_REPLICATE,
        )
        return layer.astype(np.float64) / 255.0


def _plausible(fitted: np.ndarray, similarity: np.ndarray) -> bool:
    """An affine fit no more than 35% away from the alignment's scale, without strong shear (a
    detection on a broken generated face can ask for anything)."""
    a = fitted[:, :2]
    ref = float(np.sqrt(abs(np.linalg.det(similarity[:, :2]))))
    sv = np.linalg.svd(a, compute_uv=False)
    return bool(
        np.linalg.det(a) > 0 and 0.65 * ref < sv[1] <= sv[0] < 1.35 * ref and sv[0] < 1.6 * sv[1]
    )


def _match_colour(src: np.ndarray, ref: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`src`'s mean and spread of lightness and of each colour axis (CIELAB) inside the mask set to
    `ref`'s: the lighting and skin tone of the photo (a grey photo stays grey)."""
    from skimage.color import lab2rgb, rgb2lab

    inside = mask > 0.5
    if inside.sum() < 16:
        return src
    a, b = rgb2lab(src), rgb2lab(ref)
    for c in range(3):
        s, r = a[..., c][inside], b[..., c][inside]
        a[..., c] = (a[..., c] - s.mean()) * _spread(r.std(), s.std(), c) + r.mean()
    a[..., 0] = np.clip(a[..., 0], 0.0, 100.0)
    with warnings.catch_warnings():  # out-of-gamut colours are clipped: what we want
        warnings.filterwarnings("ignore", message=".*negative Z values.*")
        return np.clip(lab2rgb(a), 0.0, 1.0)


def _spread(ref: float, src: float, channel: int) -> float:
    """How much a generated face's spread of lightness (channel 0) or colour is scaled: towards the
    photo's, but within [0.6, 1.6] for lightness (a flat or harsh original would otherwise turn the
    new face into a mask); colour axes may shrink to grey (a grey photo stays grey)."""
    ratio = ref / max(src, 1e-6)
    return float(np.clip(ratio, 0.4, 1.2)) if channel == 0 else float(min(ratio, 1.2))


def paste(
    photo: np.ndarray, gen64: np.ndarray, geometry: FaceGeometry, anchor: np.ndarray | None = None
) -> np.ndarray:
    """`photo` (uint8 RGB) with the generated face put over the face: aligned by one similarity,
    given the photo's colour statistics, then blended by Poisson (seamless) cloning inside the
    mask, so the face takes the photo's lighting at its border, and feathered into the photo."""
    import cv2

    x0, y0, x1, y1 = geometry.region
    ref = photo[y0:y1, x0:x1]
    layer = _match_colour(
        geometry.warp(gen64, anchor), ref.astype(np.float64) / 255.0, geometry.mask
    )
    layer8 = np.clip(np.rint(layer * 255), 0, 255).astype(np.uint8)
    inside = geometry.mask > 0.5
    blended = layer8
    ys, xs = np.nonzero(inside)
    h, w = inside.shape
    if len(ys) > 16 and ys.min() > 0 and xs.min() > 0 and ys.max() < h - 1 and xs.max() < w - 1:
        binary = inside.astype(np.uint8) * 255
        bx, by, bw, bh = cv2.boundingRect(binary)
        centre = (bx + bw // 2, by + bh // 2)
        blended = cv2.seamlessClone(
            layer8, np.ascontiguousarray(ref), binary, centre, cv2.NORMAL_CLONE
        )
    soft = geometry.mask[..., None]
    out = photo.copy()
    mixed = ref.astype(np.float64) * (1 - soft) + blended.astype(np.float64) * soft
    out[y0:y1, x0:x1] = np.clip(np.rint(mixed), 0, 255).astype(np.uint8)
    return out


def pixelate(photo: np.ndarray, box: tuple[float, ...]) -> np.ndarray:
    """The face's box, grown by a fifth, reduced to PIXEL_BLOCKS blocks across."""
    from PIL import Image

    x0, y0, x1, y1 = box
    gx, gy = 0.2 * (x1 - x0), 0.2 * (y1 - y0)
    h, w = photo.shape[:2]
    a, b = max(0, int(x0 - gx)), max(0, int(y0 - gy))
    c, d = min(w, int(np.ceil(x1 + gx))), min(h, int(np.ceil(y1 + gy)))
    if c <= a or d <= b:
        return photo
    patch = Image.fromarray(photo[b:d, a:c])
    small = patch.resize((PIXEL_BLOCKS, max(1, round(PIXEL_BLOCKS * (d - b) / (c - a)))))
    out = photo.copy()
    out[b:d, a:c] = np.asarray(small.resize(patch.size, Image.Resampling.NEAREST))
    return out


@dataclass(frozen=True)
class Window:
    """The part of the photo the recognisers look at for one face (its box grown by 60% a side):
    an attacker's detector on the whole photo sees the same face, at a fraction of the cost."""

    x0: int
    y0: int
    x1: int
    y1: int
    box: tuple[float, float, float, float]  # the face's box in window coordinates

    @classmethod
    def of(cls, box: tuple[float, ...], shape: tuple[int, ...]) -> Window:
        x0, y0, x1, y1 = box
        gx, gy = 0.6 * (x1 - x0), 0.6 * (y1 - y0)
        h, w = shape[:2]
        a, b = max(0, int(x0 - gx)), max(0, int(y0 - gy))
        c, d = min(w, int(np.ceil(x1 + gx))), min(h, int(np.ceil(y1 + gy)))
        return cls(a, b, c, d, (x0 - a, y0 - b, x1 - a, y1 - b))

    def cut(self, photo: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(photo[self.y0 : self.y1, self.x0 : self.x1])


@dataclass(frozen=True)
class Judgement:
    """One candidate as the recognisers and the realism detector see it."""

    distances: tuple[float, ...]  # per searched recogniser (inf: it found no face there)
    detection: float  # YuNet's confidence at the face (0: not found)
    shift: float  # YuNet's 5 points moved, in inter-ocular distances (inf: not found)

    def passes(self, targets: tuple[float, ...]) -> bool:
        return all(d >= t for d, t in zip(self.distances, targets, strict=True))

    def realistic(self, tolerance: float) -> bool:
        return self.detection >= fr.REALISM_DETECTION and self.shift <= tolerance

    @property
    def realism_cost(self) -> float:
        return self.shift + 0.25 * (1.0 - self.detection)


def judge(
    image: np.ndarray,
    window: Window,
    references: tuple[np.ndarray | None, ...],
    anchor: np.ndarray | None,
    recognisers: tuple[fr.Recogniser, ...],
) -> Judgement:
    """A candidate photo as the searched `recognisers` (distances to `references`) and YuNet (found
    at the face's window, its 5 points against `anchor`) see it."""
    cut = window.cut(image)
    row = fr.yunet_at(cut, window.box)  # once: the realism measure and YuNet-based recognisers
    distances = []
    for rec, ref in zip(recognisers, references, strict=True):
        if ref is None:  # this recogniser never saw the original face: nothing to move from
            distances.append(float("inf"))
            continue
        if isinstance(rec, fr.YuNetRecogniser):
            emb = None if row is None else rec.embed_row(cut, row)
        else:
            seen = rec.at(cut, window.box)
            emb = None if seen is None else seen.embedding
        distances.append(float("inf") if emb is None else float(rec.distances(emb, ref)[0]))
    if row is None or anchor is None:
        return Judgement(tuple(distances), 0.0 if row is None else float(row[14]), float("inf"))
    points = fr.yunet_points(row)
    iod = max(float(np.linalg.norm(anchor[0] - anchor[1])), 1e-9)
    shift = float(np.linalg.norm(points - anchor, axis=1).mean() / iod)
    return Judgement(tuple(distances), float(row[14]), shift)


def anonymise_face(
    photo: np.ndarray, original: np.ndarray, face: fm.Face, tools: Tools, rng: torch.Generator
) -> tuple[np.ndarray, FaceOutcome]:
    """`photo` (the working copy, earlier faces already replaced) with `face` replaced; identity
    distances are measured against the face in `original`, by every searched recogniser."""
    cfg = tools.config
    side = min(face.box[2] - face.box[0], face.box[3] - face.box[1])
    if side < cfg.min_face_size:
        return pixelate(photo, face.box), FaceOutcome(
            face.box, "pixelated-small", None, None, 0, None
        )
    geometry = FaceGeometry.of(face, photo.shape, cfg.feather, cfg.mask_scale)
    target = fm.align(original, face.landmarks, SIZE)
    z0, inv_loss = invert(
        tools.generator,
        tools.bank,
        target,
        _aligned_weight(geometry),
        cfg.inversion_steps,
        cfg.inversion_restarts,
        cfg.inversion_lr,
    )
    window = Window.of(face.box, photo.shape)
    references, anchor = references_of(original, window, tools.recognisers)
    in_photo = None if anchor is None else anchor + np.array([window.x0, window.y0])
    # candidates: the inversion moved towards prior faces of a similar pose and lighting (the
    # bank's closest coarse views to the original's), so the new face keeps the head's pose
    partners = iter(
        nearest_latents(
            tools.bank, target, len(cfg.search_strengths) * cfg.candidates_per_round, rng
        )
    )
    search = _Search(photo, geometry, window, references, anchor, in_photo, tools)
    search.run(z0, partners)
    if search.passing:
        realistic = [p for p in search.passing if p[0].realistic(cfg.landmark_tolerance)]
        judged, image = min(realistic or search.passing, key=lambda p: p[0].realism_cost)
        return image, _outcome(face, judged, search.tried, inv_loss)
    farthest = search.farthest
    if farthest is not None and farthest[1].passes(halfway(tools)):
        # short of the targets but past the halfway mark from each threshold: a face just past a
        # threshold in the search's window can fall back under it in an attacker's detection
        return farthest[2], _outcome(face, farthest[1], search.tried, inv_loss)
    return pixelate(photo, face.box), FaceOutcome(
        face.box, "pixelated", None, None, search.tried, inv_loss
    )


def references_of(
    original: np.ndarray, window: Window, recognisers: tuple[fr.Recogniser, ...]
) -> tuple[tuple[np.ndarray | None, ...], np.ndarray | None]:
    """The original face's embedding by each searched recogniser (None where it finds none) and
    YuNet's 5 landmarks of it in the window (None if not found)."""
    before = window.cut(original)
    references = tuple(
        None if (s := rec.at(before, window.box)) is None else s.embedding for rec in recognisers
    )
    anchor_row = fr.yunet_at(before, window.box)
    anchor = None if anchor_row is None else fr.yunet_points(anchor_row)
    return references, anchor


@dataclass
class _Search:
    """The search for a replacement face: the candidates judged, those that pass every target,
    and the one that came closest otherwise."""

    photo: np.ndarray
    geometry: FaceGeometry
    window: Window
    references: tuple[np.ndarray | None, ...]
    anchor: np.ndarray | None
    in_photo: np.ndarray | None
    tools: Tools
    tried: int = 0
    farthest: tuple[float, Judgement, np.ndarray] | None = None
    passing: list[tuple[Judgement, np.ndarray]] = field(default_factory=list)

    def run(self, z0: torch.Tensor, partners: Iterator[torch.Tensor]) -> None:
        """Round by round (the inversion itself, then each strength towards the partners), until
        a round has a realistic candidate far enough for every recogniser."""
        cfg = self.tools.config
        for strength in (0.0, *cfg.search_strengths):  # 0: the inversion itself
            for _ in range(1 if strength == 0.0 else cfg.candidates_per_round):
                z = z0 if strength == 0.0 else slerp(z0, next(partners), strength)
                self._try(z)
            # stop at the first round with a realistic candidate far enough for every recogniser
            if any(p[0].realistic(cfg.landmark_tolerance) for p in self.passing):
                break

    def _try(self, z: torch.Tensor) -> None:
        """Render latent `z` into the photo and judge it."""
        tools = self.tools
        gen64 = render(tools.generator, z)[0]
        candidate = paste(self.photo, gen64, self.geometry, self.in_photo)
        judged = judge(candidate, self.window, self.references, self.anchor, tools.recognisers)
        self.tried += 1
        if judged.passes(tools.targets):
            self.passing.append((judged, candidate))
        else:
            # how close the candidate came: its worst recogniser, relative to its target
            worst = min(d / t for d, t in zip(judged.distances, tools.targets, strict=True))
            if self.farthest is None or worst > self.farthest[0]:
                self.farthest = (worst, judged, candidate)


def halfway(tools: Tools) -> tuple[float, ...]:
    """Per searched recogniser, the distance halfway between its threshold and its target."""
    return tuple(
        (r.threshold + t) / 2 for r, t in zip(tools.recognisers, tools.targets, strict=True)
    )


def _aligned_weight(geometry: FaceGeometry) -> np.ndarray:
    """Where the inversion's pixel loss counts, in the aligned frame: the face (the mask) fully,
    the rest (hair, background) at a quarter."""
    from skimage.transform import AffineTransform, warp

    x0, y0, x1, y1 = geometry.region
    shifted = geometry.tform.params @ np.array([[1, 0, x0], [0, 1, y0], [0, 0, 1]], dtype=float)

    aligned = warp(
        geometry.mask,
        AffineTransform(matrix=shifted).inverse,
        output_shape=(SIZE, SIZE),
        order=1,
    )
    return 0.25 + 0.75 * aligned


def _outcome(face: fm.Face, judged: Judgement, tried: int, inv: float) -> FaceOutcome:
    finite = [d for d in judged.distances if np.isfinite(d)]
    shift = judged.shift if np.isfinite(judged.shift) else None
    return FaceOutcome(
        face.box,
        "generated",
        round(min(finite), 4) if finite else None,
        None if shift is None else round(shift, 4),
        tried,
        round(inv, 4),
    )
