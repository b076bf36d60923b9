"""Face-surface renders: what a person sees of a head scan, as a photograph-like picture.

The skin surface is the isosurface of the head at an air/tissue level (Otsu's threshold of the
subject's intensities). It is rendered by casting parallel rays from in front of the face towards
the back of the head: each ray stops where the intensity first crosses the level (linear
interpolation between voxels, so the surface is sub-voxel), giving a depth map; the depth map's
normals lit from the front-above (Lambert shading) give the picture. Volumes are first resampled
onto a grid aligned with the world axes (RAS: right, anterior, superior), the subject's own world
or a template's (`on_grid`), so that a render shows the face from the front whatever the scan's
voxel order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from synth.kinds.volume import Volume

LIGHT = np.array([-0.3, 1.0, 0.5])  # from the front, a little above and to the subject's right


@dataclass(frozen=True)
class Grid:
    """An axis-aligned world box (RAS millimetres) sampled every `mm`."""

    lo: tuple[float, float, float]
    hi: tuple[float, float, float]
    mm: float = 2.0

    @property
    def shape(self) -> tuple[int, int, int]:
        n = np.floor((np.asarray(self.hi) - np.asarray(self.lo)) / self.mm).astype(int) + 1
        return int(n[0]), int(n[1]), int(n[2])

    @classmethod
    def around(cls, volume: Volume, mm: float = 2.0, margin: float = 10.0) -> Grid:
        """The world box of `volume`'s field of view, plus a margin."""
        corners = np.array(np.meshgrid(*[[0, s - 1] for s in volume.shape], indexing="ij"))
        pts = volume.affine[:3, :3] @ corners.reshape(3, -1) + volume.affine[:3, 3:4]
        lo, hi = pts.min(1) - margin, pts.max(1) + margin
        return cls(tuple(map(float, lo)), tuple(map(float, hi)), mm)  # type: ignore[arg-type]


def on_grid(volume: Volume, grid: Grid, values: np.ndarray | None = None, transform=None):
    """`volume`'s intensities (or `values` on its voxels) sampled on `grid`, indexed (R, A, S).
    `transform` (SimpleITK, grid world -> volume world in ITK's LPS convention) places the grid in
    another space, e.g. a template's; None: the volume's own world."""
    import SimpleITK as sitk

    from synth.tools.mri.registration import from_sitk, to_sitk

    src = to_sitk(volume, None if values is None else np.asarray(values, np.float32))
    lps_origin = (-grid.lo[0], -grid.lo[1], grid.lo[2])
    ref = sitk.Image(list(grid.shape), sitk.sitkFloat32)
    ref.SetSpacing([grid.mm] * 3)
    # index i along x steps towards +R = -L: LPS direction diag(-1, -1, 1)
    ref.SetDirection((-1.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 1.0))
    ref.SetOrigin(lps_origin)
    out = sitk.Resample(
        src,
        ref,
        transform if transform is not None else sitk.Transform(),
        sitk.sitkLinear,
        0.0,
        sitk.sitkFloat32,
    )
    return from_sitk(out)


def head_level(values: np.ndarray) -> float:
    """The air/tissue intensity level (Otsu's threshold over the non-zero voxels)."""
    from skimage.filters import threshold_otsu

    v = np.asarray(values, np.float32)
    v = v[v > 0] if (v > 0).sum() > 100 else v.ravel()
    return float(threshold_otsu(v[:: max(1, v.size // 500_000)]))


def depth_map(ras: np.ndarray, level: float) -> np.ndarray:
    """Distance in voxels from the front of the (R, A, S) grid to the surface along each ray
    (rows: superior at the top; columns: the subject's right on the viewer's left); NaN where a
    ray meets nothing."""
    above = ras >= level  # (R, A, S)
    front = above[:, ::-1, :]  # rays enter at the anterior end
    hit = front.any(axis=1)
    first = np.argmax(front, axis=1)  # (R, S) index of the first voxel at or above the level
    a = ras[:, ::-1, :]
    rows, cols = np.indices(first.shape)
    prev = np.clip(first - 1, 0, None)
    v0, v1 = a[rows, prev, cols], a[rows, first, cols]
    frac = np.where((first > 0) & (v1 > v0), (level - v0) / np.maximum(v1 - v0, 1e-6), 0.0)
    depth = np.where(hit, first - 1 + np.clip(frac, 0, 1), np.nan)
    # (R, S) -> image rows S descending, columns R descending (viewer faces the subject)
    return depth.T[::-1, ::-1]


def surface_in(region: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Which pixels of a depth map (from `depth_map` on the same grid) show a surface point lying
    inside `region` (bool, (R, A, S)): e.g. the face, as opposed to the ears or the scalp."""
    rev = region[:, ::-1, :]
    img = np.isfinite(depth)
    d = np.nan_to_num(depth.T[::-1, ::-1], nan=0.0)  # back to (R, S)
    idx = np.clip(np.ceil(d).astype(int), 0, rev.shape[1] - 1)
    r, s = np.indices(idx.shape)
    inside = rev[r, idx, s]
    return inside.T[::-1, ::-1] & img


def shade(depth: np.ndarray) -> np.ndarray:
    """Lambert shading of a depth map (uint8; background black)."""
    d = np.nan_to_num(depth, nan=np.nanmax(depth) if np.isfinite(depth).any() else 0.0)
    dz, dx = np.gradient(d)
    normal = np.stack([dx, np.ones_like(d), -dz], axis=-1)  # towards the viewer is +A
    normal /= np.linalg.norm(normal, axis=-1, keepdims=True)
    light = LIGHT / np.linalg.norm(LIGHT)
    lit = 0.15 + 0.85 * np.clip(normal @ np.array([light[0], light[1], light[2]]), 0, 1)
    lit[~np.isfinite(depth)] = 0.0
    return np.clip(lit * 255, 0, 255).astype(np.uint8)


def render_face(
    volume: Volume,
    grid: Grid | None = None,
    *,
    level: float | None = None,
    transform=None,
    values: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(shaded picture uint8, depth map) of the face of `volume` seen from the front."""
    grid = grid or Grid.around(volume)
    ras = on_grid(volume, grid, values, transform)
    level = head_level(volume.physical() if values is None else values) if level is None else level
    depth = depth_map(ras, level)
    return shade(depth), depth


def picture_grid(rows: list[list[np.ndarray]], gap: int = 4) -> np.ndarray:
    """Pictures (uint8, each its own size) laid out in rows, padded to a common cell size."""
    h = max(p.shape[0] for r in rows for p in r)
    w = max(p.shape[1] for r in rows for p in r)
    cols = max(len(r) for r in rows)
    out = np.zeros((len(rows) * (h + gap) + gap, cols * (w + gap) + gap), np.uint8)
    for i, r in enumerate(rows):
        for j, p in enumerate(r):
            y, x = gap + i * (h + gap), gap + j * (w + gap)
            out[y : y + p.shape[0], x : x + p.shape[1]] = p
    return out


PICTURE_SIDE = 128  # pixels of a release's picture of each volume
PICTURE_MM = 2.0  # 128 x 2 mm = a 256 mm field of view, a whole head


def picture(volume: Volume, side: int = PICTURE_SIDE, mm: float = PICTURE_MM) -> np.ndarray:
    """A fixed-size (`side` pixels square, `mm` per pixel: 128 x 2 mm by default) face render of
    `volume`, centred on its field of view: the picture a release shows of each volume
    (dashboard, bundle, sample grid)."""
    corners = np.array(np.meshgrid(*[[0, s - 1] for s in volume.shape], indexing="ij"))
    pts = volume.affine[:3, :3] @ corners.reshape(3, -1) + volume.affine[:3, 3:4]
    centre = (pts.min(1) + pts.max(1)) / 2
    half = mm * (side - 1) / 2
    lo = (centre[0] - half, pts.min(1)[1] - 10.0, centre[2] - half)
    hi = (centre[0] + half, pts.max(1)[1] + 10.0, centre[2] + half)
    pic, _ = render_face(volume, Grid(lo, hi, mm))
    out = np.zeros((side, side), np.uint8)
    h, w = min(side, pic.shape[0]), min(side, pic.shape[1])
    out[:h, :w] = pic[:h, :w]
    return out
