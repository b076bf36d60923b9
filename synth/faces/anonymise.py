"""One photograph's faces replaced by generated ones (FALCO's method at the scale that exists
offline).

For each detected face: align it to the generator's 64 x 64 template, invert the generator (the
latent whose image is closest), then search the latent space away from that inversion until the
identity embedding of the *composited photograph* is at least `identity_threshold + identity_margin`
from the original's, keeping the candidate whose landmarks moved least and whose coarse structure
(pose, lighting, colour layout) stays closest. The generated face is put back with the inverse
alignment, a piecewise-affine warp that puts its 68 landmarks where the original's were (pose and
expression kept), the original's colour statistics, and a feathered mask over the face. A face the
search cannot move past the verification threshold, or one too small to align, is pixelated instead,
and counted.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from synth import face_models as fm
from synth.faces.config import FaceDeidConfig
from synth.faces.generator import SIZE, FaceGenerator, LatentBank, invert, render, slerp

PIXEL_BLOCKS = 8  # a pixelated face keeps this many blocks across


@dataclass(frozen=True)
class FaceOutcome:
    """What happened to one face (internal: computed from the sensitive photograph)."""

    box: tuple[float, float, float, float]
    method: str  # "generated" | "pixelated" (search failed) | "pixelated-small"
    distance: float | None  # identity distance of the released face to the original
    landmark_shift: float | None  # mean landmark displacement / inter-ocular distance
    candidates: int  # latents tried
    inversion_loss: float | None

    def as_dict(self) -> dict:
        return {
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
    embedder: fm.Embedder
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


def generated_landmarks(gen64: np.ndarray, face: fm.Face, tform: Any) -> np.ndarray:
    """The generated face's 68 landmarks in photo coordinates: predicted on the 64 x 64 image
    enlarged four times, in the box where the original face's box falls in the aligned frame."""
    from PIL import Image

    x0, y0, x1, y1 = face.box
    corners = tform(np.array([[x0, y0], [x1, y0], [x0, y1], [x1, y1]]))
    (a, b), (c, d) = corners.min(0) * 4, corners.max(0) * 4
    big = np.asarray(Image.fromarray(gen64).resize((SIZE * 4, SIZE * 4), Image.Resampling.BICUBIC))
    return tform.inverse(fm.landmarks(big, (a, b, c, d)) / 4.0)


@dataclass(frozen=True)
class FaceGeometry:
    """What every candidate for one face shares: the region of the photo it touches, the feathered
    mask, the alignment, and the Delaunay triangulation of the original's 68 landmarks plus the
    region's border, with each region pixel's triangle and barycentric coordinates (a candidate's
    piecewise-affine warp is then one weighted sum of its own landmarks)."""

    face: fm.Face
    region: tuple[int, int, int, int]
    mask: np.ndarray  # (h, w) float in [0, 1]
    tform: Any  # photo -> 64 x 64 aligned frame
    points: np.ndarray  # (68 + 8, 2) the landmarks and the border, region coordinates
    vertices: np.ndarray  # (h * w, 3) point indices of each pixel's triangle (-1: outside)
    weights: np.ndarray  # (h * w, 3) barycentric coordinates
    grid: np.ndarray  # (h * w, 2) region pixel (x, y)

    @classmethod
    def of(
        cls, face: fm.Face, shape: tuple[int, ...], feather: float, mask_scale: float
    ) -> FaceGeometry:
        from scipy.spatial import Delaunay

        region = _region(face.landmarks, shape)
        x0, y0, x1, y1 = region
        w, h = x1 - x0, y1 - y0
        border = np.array(
            [[0, 0], [w / 2, 0], [w, 0], [0, h / 2], [w, h / 2], [0, h], [w / 2, h], [w, h]]
        )
        points = np.concatenate([face.landmarks - np.array([x0, y0]), border])
        tri = Delaunay(points)
        cols, rows = np.meshgrid(np.arange(w, dtype=np.float64), np.arange(h, dtype=np.float64))
        grid = np.stack([cols.ravel(), rows.ravel()], 1)
        simplex = tri.find_simplex(grid)
        t = tri.transform[simplex]
        b = np.einsum("nij,nj->ni", t[:, :2], grid - t[:, 2])
        weights = np.concatenate([b, 1 - b.sum(1, keepdims=True)], 1)
        vertices = np.where(simplex[:, None] >= 0, tri.simplices[simplex], -1)
        return cls(
            face,
            region,
            face_mask(face.landmarks, region, feather, mask_scale),
            fm.alignment(face.landmarks, SIZE),
            points,
            vertices,
            weights,
            grid,
        )

    def warp(self, gen64: np.ndarray, gen_lm: np.ndarray) -> np.ndarray:
        """The generated face in photo coordinates over the region (float RGB in [0, 1]): each
        pixel moved from where the original face's landmarks are to where the generated face's are
        (`gen_lm`, photo coordinates; piecewise affine), then through the inverse alignment into
        the 64 x 64 image."""
        from scipy.ndimage import map_coordinates

        x0, y0, x1, y1 = self.region
        offset = np.array([x0, y0], dtype=np.float64)
        dst = self.points.copy()  # the border points stay where they are
        dst[:68] = gen_lm - offset
        inside = self.vertices[:, 0] >= 0
        moved = self.grid.copy()
        moved[inside] = (self.weights[inside][..., None] * dst[self.vertices[inside]]).sum(1)
        xy = self.tform(moved + offset)
        img = gen64.astype(np.float64) / 255.0
        out = np.stack(
            [
                map_coordinates(img[..., c], [xy[:, 1], xy[:, 0]], order=1, mode="nearest")
                for c in range(3)
            ],
            -1,
        )
        return out.reshape(y1 - y0, x1 - x0, 3)


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
        a[..., c] = (a[..., c] - s.mean()) * min(r.std() / max(s.std(), 1e-6), 4.0) + r.mean()
    a[..., 0] = np.clip(a[..., 0], 0.0, 100.0)
    with warnings.catch_warnings():  # out-of-gamut colours are clipped: what we want
        warnings.filterwarnings("ignore", message=".*negative Z values.*")
        return np.clip(lab2rgb(a), 0.0, 1.0)


def paste(
    photo: np.ndarray, gen64: np.ndarray, geometry: FaceGeometry, refine: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """`photo` (uint8 RGB) with the generated face blended over the face, landmarks kept, and the
    landmarks the predictor finds there. The generated face's landmarks are estimated on the 64 x
    64 image, then corrected up to `refine` times by where the predictor finds them in the
    composite (a feature seen at L_c instead of L is at its estimate + (L_c - L) in the generated
    face); the composite whose landmarks are closest to the original's is kept."""
    x0, y0, x1, y1 = geometry.region
    ref = photo[y0:y1, x0:x1].astype(np.float64) / 255.0
    mask = geometry.mask[..., None]
    face = geometry.face
    gen_lm = generated_landmarks(gen64, face, geometry.tform)
    best: tuple[float, np.ndarray, np.ndarray] | None = None
    for _ in range(refine + 1):
        layer = _match_colour(geometry.warp(gen64, gen_lm), ref, geometry.mask)
        out = photo.copy()
        out[y0:y1, x0:x1] = np.clip(np.rint((ref * (1 - mask) + layer * mask) * 255), 0, 255)
        seen = fm.landmarks(out, face.box)
        shift = fm.landmark_shift(face.landmarks, seen)
        if best is None or shift < best[0]:
            best = (shift, out, seen)
        gen_lm = gen_lm + (seen - face.landmarks)
    assert best is not None
    return best[1], best[2]


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


def _structure_loss(a: np.ndarray, b: np.ndarray) -> float:
    """Mean squared difference of 16 x 16 views (pixels in [0, 1])."""

    def view(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64).reshape(16, 4, 16, 4, 3).mean((1, 3)) / 255.0

    return float(((view(a) - view(b)) ** 2).mean())


def anonymise_face(
    photo: np.ndarray, original: np.ndarray, face: fm.Face, tools: Tools, rng: torch.Generator
) -> tuple[np.ndarray, FaceOutcome]:
    """`photo` (the working copy, earlier faces already replaced) with `face` replaced; identity
    distances are measured against the face in `original`."""
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
    reference = tools.embedder.embed(original, face)
    goal = cfg.target_distance
    tried, farthest = 0, (-1.0, 0.0, photo)
    passing: list[tuple[float, float, float, np.ndarray]] = []
    for strength in (0.0, *cfg.search_strengths):  # 0: the inversion itself
        for _ in range(1 if strength == 0.0 else cfg.candidates_per_round):
            z = z0 if strength == 0.0 else slerp(z0, torch.randn(z0.shape, generator=rng), strength)
            gen64 = render(tools.generator, z)[0]
            candidate, seen_lm = paste(photo, gen64, geometry, cfg.landmark_refinements)
            seen = fm.Face(face.box, face.score, seen_lm)  # as an attacker finds it
            dist = float(np.linalg.norm(tools.embedder.embed(candidate, seen) - reference))
            shift = fm.landmark_shift(face.landmarks, seen_lm)
            tried += 1
            if dist >= goal:
                # geometry first (pose, expression), then the coarse look (lighting, colour)
                passing.append((shift + 2 * _structure_loss(gen64, target), dist, shift, candidate))
            elif dist > farthest[0]:
                farthest = (dist, shift, candidate)
        # stop at the first round with a candidate far enough, unless all of them moved the
        # landmarks more than the tolerance: then the next round may do better
        if passing and min(p[2] for p in passing) <= cfg.landmark_tolerance:
            break
    if passing:
        _, dist, shift, image = min(passing, key=lambda p: p[0])
        return image, _outcome(face, dist, shift, tried, inv_loss)
    dist, shift, image = farthest
    if dist >= cfg.identity_threshold:  # fails verification, short of the margin
        return image, _outcome(face, dist, shift, tried, inv_loss)
    return pixelate(photo, face.box), FaceOutcome(
        face.box, "pixelated", None, None, tried, inv_loss
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


def _outcome(face: fm.Face, dist: float, shift: float, tried: int, inv: float) -> FaceOutcome:
    return FaceOutcome(face.box, "generated", round(dist, 4), round(shift, 4), tried, round(inv, 4))
