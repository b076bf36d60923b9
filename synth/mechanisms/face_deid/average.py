"""k-Same-M on a dense mesh: the face of a cluster of k people, drawn into each member's photo at
the photo's own resolution (Gross, Sweeney, de la Torre, Baker, "Model-based face
de-identification", CVPR-W 2006; the rendering after Bitouk et al., "Face swapping", SIGGRAPH 2008).

Shape and texture are averaged apart, so the average does not ghost:

- texture: each member's face unwrapped into the mesh's frontal atlas (synth.tools.face_mesh, a
  piecewise-affine warp per triangle), its lighting taken out (CIELAB minus its low frequencies),
  texels weighted by how squarely they were seen (cos^2 of the view angle), unseen ones filled
  from the mirrored side; the cluster's texture is the weighted mean;
- shape: the cluster's mean frontal shape (`strict`), or the member's own moved towards it by a
  factor (`attribute`), posed like the member's head;
- render: only the triangles seen from the camera, with the member's own low-frequency shading
  and colour put back, its sharpness and grain matched, blended by a Laplacian pyramid on the
  eroded face oval (the hairline, ears and outline stay the photo's own).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.tools import face_mesh as fmesh

SEEN_POWER = 2.0  # texel weight: cos^p of the view angle
MIN_SEEN = 0.15  # texels seen less squarely than this are filled from the mirrored side
MAX_GAIN = 2.0  # the most the mean detail's contrast is raised


@dataclass(frozen=True)
class Unwrapped:
    """One face in the atlas: its lighting-free detail (CIELAB, float32), each texel's weight,
    and its frontal shape (468 x 3, the template's frame)."""

    detail: np.ndarray
    weight: np.ndarray
    shape: np.ndarray


def to_lab(rgb01: np.ndarray) -> np.ndarray:
    import cv2

    return cv2.cvtColor(np.clip(rgb01, 0, 1).astype(np.float32), cv2.COLOR_RGB2Lab)


def to_rgb(lab: np.ndarray) -> np.ndarray:
    import cv2

    return np.clip(cv2.cvtColor(lab.astype(np.float32), cv2.COLOR_Lab2RGB), 0.0, 1.0)


def masked_blur(x: np.ndarray, weight: np.ndarray, sigma: float) -> np.ndarray:
    """A Gaussian low-pass of `x` (h, w, c) counting each pixel by `weight` (normalised
    convolution): unseen pixels take their seen neighbours' value."""
    import cv2

    w = weight.astype(np.float32)
    num = cv2.GaussianBlur(x * w[..., None], (0, 0), sigma)
    den = cv2.GaussianBlur(w, (0, 0), sigma)[..., None]
    return num / np.maximum(den, 1e-6)


def shading_sigma(tpl: fmesh.Template, iod_fraction: float) -> float:
    """The low-pass width in atlas pixels for `iod_fraction` inter-ocular distances."""
    return max(1.0, iod_fraction * fmesh.inter_ocular(tpl.atlas_xy))


def unwrap_face(
    photo: np.ndarray, points: np.ndarray, pose: fmesh.Pose, tpl: fmesh.Template, sigma_iod: float
) -> Unwrapped:
    """The face's atlas detail (lighting out), with unseen texels filled from the mirror side."""
    tex, seen = fmesh.unwrap(photo, points, tpl)
    lab = to_lab(tex)
    weight = np.where(seen >= MIN_SEEN, seen, 0.0) ** SEEN_POWER
    detail = lab - masked_blur(lab, weight, shading_sigma(tpl, sigma_iod))
    # each member's contrast normalised (per CIELAB channel over its seen face), so that no
    # harshly lit or high-contrast member dominates the mean; the target's own contrast is put
    # back when it is drawn
    seen_face = (weight > 0) & ~tpl.ring
    if seen_face.sum() > 16:
        detail = detail / np.maximum(detail[seen_face].std(0), 1e-3)
    mirrored_w, mirrored_d = weight[:, ::-1], detail[:, ::-1]
    total = weight + mirrored_w
    filled = (detail * weight[..., None] + mirrored_d * mirrored_w[..., None]) / np.maximum(
        total, 1e-6
    )[..., None]
    inside = tpl.inside
    return Unwrapped(
        np.where(inside[..., None], filled, 0.0).astype(np.float32),
        np.where(inside, np.maximum(weight, mirrored_w), 0.0).astype(np.float32),
        pose.frontal(points),
    )


def mean_face(members: list[Unwrapped]) -> Unwrapped:
    """The cluster's texture (weighted mean detail) and its mean shape."""
    w = np.stack([m.weight for m in members])
    d = np.stack([m.detail for m in members])
    detail = (d * w[..., None]).sum(0) / np.maximum(w.sum(0), 1e-6)[..., None]
    # averaging k faces flattens what they do not share (by about 1 / sqrt(k)): the mean detail
    # is brought back to unit contrast (the members' own, normalised), at most MAX_GAIN
    inside = w.sum(0) > 0
    if inside.any():
        gain = np.clip(1.0 / np.maximum(detail[inside].std(0), 1e-6), 1.0, MAX_GAIN)
        detail = detail * gain
    return Unwrapped(
        detail.astype(np.float32),
        w.mean(0).astype(np.float32),
        np.mean([m.shape for m in members], axis=0),
    )


def posed_shape(own: np.ndarray, mean: np.ndarray, factor: float, pose: fmesh.Pose) -> np.ndarray:
    """The rendered mesh in the photo: the member's frontal shape moved `factor` of the way to the
    cluster's (1 = the cluster's, `strict`), in the member's head pose."""
    return pose.apply(own + factor * (mean - own))


def region_of(points: list[np.ndarray], shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The photo box both meshes lie in, grown by a quarter a side."""
    xy = np.concatenate([p[:, :2] for p in points])
    lo, hi = xy.min(0), xy.max(0)
    grow = 0.25 * (hi - lo)
    h, w = shape[:2]
    x0, y0 = np.maximum(np.floor(lo - grow), 0).astype(int)
    x1, y1 = np.minimum(np.ceil(hi + grow), [w, h]).astype(int)
    return int(x0), int(y0), int(x1), int(y1)


def oval_mask(points: np.ndarray, region: tuple[int, int, int, int]) -> np.ndarray:
    """The extended mesh's outline filled (uint8 0/1, region-sized)."""
    import cv2

    x0, y0, x1, y1 = region
    mask = np.zeros((y1 - y0, x1 - x0), np.uint8)
    poly = np.round((points[fmesh.outline(), :2] - [x0, y0]) * 16).astype(np.int32)
    cv2.fillPoly(mask, [poly], 1, lineType=cv2.LINE_8, shift=4)
    return mask


def render_face(
    photo: np.ndarray,
    target: np.ndarray,
    rendered: np.ndarray,
    texture: np.ndarray,
    tpl: fmesh.Template,
    sigma_iod: float,
    erode_iod: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """`photo` (uint8 RGB) with the face at mesh `target` replaced: `texture` (the cluster's
    atlas detail) plus the target's own low-frequency shading, drawn on the `rendered` mesh,
    sharpness and grain matched, blended on the eroded face oval."""
    import cv2

    tex, seen = fmesh.unwrap(photo, target, tpl)
    own = to_lab(tex)
    weight = np.where(seen >= MIN_SEEN, seen, 0.0) ** SEEN_POWER
    low = masked_blur(own, np.maximum(weight, 1e-3 * tpl.inside), shading_sigma(tpl, sigma_iod))
    atlas = to_rgb(_own_contrast(texture, own - low, (weight > 0) & ~tpl.ring, tpl) + low)
    region = region_of([target, rendered], photo.shape)
    x0, y0, x1, y1 = region
    where, covered = fmesh.render_map(rendered, tpl, region)
    drawn = cv2.remap(
        atlas, where[..., 0], where[..., 1], cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )
    ref = photo[y0:y1, x0:x1].astype(np.float32) / 255.0
    drawn = np.where(covered[..., None], drawn, ref)
    iod = fmesh.inter_ocular(target)
    mask = oval_mask(target, region) & oval_mask(rendered, region) & covered.astype(np.uint8)
    size = max(1, int(round(erode_iod * iod)))
    mask = cv2.erode(mask, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * size + 1,) * 2))
    if mask.sum() < 16:
        return photo
    drawn = match_detail(drawn, ref, mask.astype(bool), rng)
    blended = pyramid_blend(drawn, ref, mask.astype(np.float32), iod)
    out = photo.copy()
    out[y0:y1, x0:x1] = np.clip(np.rint(blended * 255), 0, 255).astype(np.uint8)
    return out


def _own_contrast(
    texture: np.ndarray, own_detail: np.ndarray, seen: np.ndarray, tpl: fmesh.Template
) -> np.ndarray:
    """The cluster's (unit-contrast) detail scaled per CIELAB channel to the target's own spread
    of detail over its seen face (a grey photo's face stays grey, a soft one is not given harsh
    lines); on the ring around the oval, where members' hair and background mix, at half that."""
    if seen.sum() < 16:
        return texture
    scale = own_detail[seen].std(0)
    out = texture * scale
    return np.where(tpl.ring[..., None], 0.5 * out, out).astype(np.float32)


def _grey(x: np.ndarray) -> np.ndarray:
    return x @ np.array([0.299, 0.587, 0.114], np.float32)


def sharpness(x: np.ndarray, mask: np.ndarray) -> float:
    """The spread of the grey image's Laplacian inside `mask` (what a softer face loses)."""
    import cv2

    lap = cv2.Laplacian(_grey(x.astype(np.float32)), cv2.CV_32F)
    return float(lap[mask].std()) if mask.any() else 0.0


def noise_level(x: np.ndarray, mask: np.ndarray) -> float:
    """The grain: the robust spread (1.4826 MAD) of the grey image minus its 3 x 3 median."""
    import cv2

    g = _grey(x.astype(np.float32))
    r = (g - cv2.medianBlur(g, 3))[mask]
    return float(1.4826 * np.median(np.abs(r - np.median(r)))) if len(r) else 0.0


def match_detail(
    drawn: np.ndarray, ref: np.ndarray, mask: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """`drawn` sharpened or softened until its Laplacian spread inside `mask` is nearest the
    original's there, then given the original's grain (Gaussian noise to the missing level)."""
    import cv2

    goal = sharpness(ref, mask)
    best, best_gap = drawn, abs(np.log(max(sharpness(drawn, mask), 1e-6) / max(goal, 1e-6)))
    soft = cv2.GaussianBlur(drawn, (0, 0), 1.0)
    for amount in (0.5, 1.0, 1.5, 2.0, 3.0, -0.5, -1.0):
        if amount > 0:
            trial = np.clip(drawn + amount * (drawn - soft), 0, 1)
        else:
            trial = cv2.GaussianBlur(drawn, (0, 0), -amount)
        gap = abs(np.log(max(sharpness(trial, mask), 1e-6) / max(goal, 1e-6)))
        if gap < best_gap:
            best, best_gap = trial, gap
    missing = noise_level(ref, mask) ** 2 - noise_level(best, mask) ** 2
    if missing > 0:
        grain = rng.normal(0.0, np.sqrt(missing), best.shape[:2]).astype(np.float32)
        best = np.clip(best + grain[..., None] * mask[..., None], 0, 1)
    return best.astype(np.float32)


def pyramid_blend(a: np.ndarray, b: np.ndarray, mask: np.ndarray, iod: float) -> np.ndarray:
    """`a` inside `mask`, `b` outside, blended band by band (Burt and Adelson's Laplacian
    pyramid), the coarsest band about a third of the inter-ocular distance wide."""
    import cv2

    levels = int(np.clip(np.log2(max(iod, 2.0) / 3.0), 1, 5))
    ga, gb, gm = [a], [b], [mask]
    for _ in range(levels):
        ga.append(cv2.pyrDown(ga[-1]))
        gb.append(cv2.pyrDown(gb[-1]))
        gm.append(cv2.pyrDown(gm[-1]))
    out = ga[-1] * gm[-1][..., None] + gb[-1] * (1 - gm[-1][..., None])
    for i in range(levels - 1, -1, -1):
        size = (ga[i].shape[1], ga[i].shape[0])
        la = ga[i] - cv2.pyrUp(ga[i + 1], dstsize=size)
        lb = gb[i] - cv2.pyrUp(gb[i + 1], dstsize=size)
        m = gm[i][..., None]
        out = cv2.pyrUp(out, dstsize=size) + la * m + lb * (1 - m)
    return np.clip(out, 0.0, 1.0)
