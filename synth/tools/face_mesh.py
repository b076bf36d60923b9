"""A dense face mesh: MediaPipe's face landmark model (468 3-D points), its triangles, a frontal
texture space ("atlas") and the piecewise-affine maps between a photo and that atlas.

The model is `mediapipe/modules/face_landmark/face_landmark.tflite` from the `mediapipe` wheel
(0.10.14, Apache-2.0; installed --no-deps for its files only: the package itself is never
imported), run by OpenCV's own TFLite reader. Model card: "MediaPipe Face Mesh" (Kartynnik et al.,
"Real-time facial surface geometry from monocular video on mobile GPUs", CVPR-W 2019). Its
triangles are the 3-cycles of the package's FACEMESH_TESSELATION edge list, plus the eye and
inner-lip openings (holes in the tessellation) filled, so that the eyes and mouth are replaced too.

The template (the atlas' frontal shape) is public: the mesh of two portraits that ship inside
installed packages (scikit-image's astronaut, matplotlib's Grace Hopper), each turned frontal,
averaged and made left-right symmetric, so that a flip of the atlas is the mirror of the face.

No torch here: the audit imports it too.
"""

from __future__ import annotations

import importlib.util
import runpy
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from accounting.errors import DataFormatError

N_POINTS = 468
INPUT = 192  # the model's input side
CROP_SCALE = 1.5  # the crop around the face, as MediaPipe's own face-detector-to-mesh step takes
# symmetric pairs (the frontal axes) and midline points of the mesh
PAIRS = ((33, 263), (133, 362), (61, 291), (234, 454), (70, 300), (58, 288))
TOP, CHIN = 10, 152
EYE_CORNERS = (33, 263)  # outer eye corners, for the inter-ocular distance
# the ring around the mesh's oval (extend): how far out it reaches, below and above the eyes
RING_BELOW, RING_ABOVE = 1.2, 1.04


def _package_dir() -> Path:
    spec = importlib.util.find_spec("mediapipe")
    if spec is None or not spec.submodule_search_locations:
        raise DataFormatError(
            "The face mesh needs the files of the Python package 'mediapipe' (0.10.14, installed "
            "with --no-deps), which is not installed. Run `make venv`, which installs it."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def model_path() -> Path:
    """The face landmark model file (bound to a release's approval by its sha256)."""
    path = _package_dir() / "modules" / "face_landmark" / "face_landmark.tflite"
    if not path.is_file():
        raise DataFormatError(
            f"{path}: the face mesh model is missing; reinstall mediapipe 0.10.14."
        )
    return path


@lru_cache(maxsize=1)
def _net() -> Any:
    import cv2

    return cv2.dnn.readNetFromTFLite(str(model_path()))


def _edges(name: str) -> frozenset[tuple[int, int]]:
    path = _package_dir() / "python" / "solutions" / "face_mesh_connections.py"
    return frozenset(runpy.run_path(str(path))[name])


def _loop(edges: frozenset[tuple[int, int]], start: int) -> list[int]:
    """The cycle of `edges` through vertex `start`, in order."""
    adj: dict[int, list[int]] = {}
    for a, b in edges:
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, []).append(a)
    loop, prev = [start], -1
    while True:
        nxt = next(v for v in adj[loop[-1]] if v != prev)
        if nxt == start:
            return loop
        prev = loop[-1]
        loop.append(nxt)


@lru_cache(maxsize=1)
def face_oval() -> np.ndarray:
    """The mesh's outline (vertex indices, in order)."""
    return np.array(_loop(_edges("FACEMESH_FACE_OVAL"), TOP))


def _fill(loop: list[int], xy: np.ndarray) -> list[tuple[int, int, int]]:
    """Triangles covering the polygon `loop` (vertex indices; positions `xy`), by ear clipping."""
    idx = list(loop)
    area = sum(
        xy[idx[i], 0] * xy[idx[i - 1], 1] - xy[idx[i - 1], 0] * xy[idx[i], 1]
        for i in range(len(idx))
    )
    sign = 1.0 if area > 0 else -1.0
    out = []
    while len(idx) > 3:
        for i in range(len(idx)):
            a, b, c = idx[i - 1], idx[i], idx[(i + 1) % len(idx)]
            cross = (xy[b, 0] - xy[a, 0]) * (xy[c, 1] - xy[a, 1]) - (xy[b, 1] - xy[a, 1]) * (
                xy[c, 0] - xy[a, 0]
            )
            if cross * sign < 0:  # a convex corner (the polygon's own orientation)
                out.append((a, b, c))
                idx.pop(i)
                break
        else:  # degenerate: fan the rest
            out += [(idx[0], idx[j], idx[j + 1]) for j in range(1, len(idx) - 1)]
            break
    out.append((idx[0], idx[1], idx[2]))
    return out


@dataclass(frozen=True)
class Template:
    """The frontal shape (468 x 3, inter-ocular distance 1, centred), its triangles (each wound to
    face the camera, -z), each vertex's mirror partner, and the atlas: a `size` x `size` image of
    the frontal shape, with each pixel's triangle (-1 outside) and barycentric coordinates."""

    shape: np.ndarray
    triangles: np.ndarray  # (T, 3) int
    mirror: np.ndarray  # (468,) int
    size: int
    atlas_xy: np.ndarray  # (468, 2) vertex positions in atlas pixels
    atlas_tri: np.ndarray  # (size, size) int, -1 outside the face
    atlas_bary: np.ndarray  # (size, size, 3) float32

    @property
    def inside(self) -> np.ndarray:
        return self.atlas_tri >= 0

    @property
    def ring(self) -> np.ndarray:
        """The atlas pixels of the ring around the oval (its triangles come last)."""
        return self.atlas_tri >= len(self.triangles) - 2 * len(face_oval())


def run_mesh(image: np.ndarray, centre: np.ndarray, side: float, angle: float) -> np.ndarray:
    """The model on the square crop of `image` (uint8 RGB) centred at `centre`, `side` pixels
    wide, turned by `angle` degrees: 468 x 3 points (x, y in image pixels; z in the same units,
    larger is farther from the camera)."""
    import cv2

    m = np.asarray(
        cv2.getRotationMatrix2D((float(centre[0]), float(centre[1])), angle, INPUT / side),
        dtype=np.float64,
    )
    m[:, 2] += INPUT / 2 - np.asarray(centre, dtype=np.float64)
    crop = cv2.warpAffine(
        image, m, (INPUT, INPUT), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )
    net = _net()
    net.setInput(cv2.dnn.blobFromImage(crop, 1 / 255.0, (INPUT, INPUT)))
    out = np.asarray(net.forward(), dtype=np.float64).reshape(N_POINTS, 3)
    inv = cv2.invertAffineTransform(m)
    xy = out[:, :2] @ inv[:, :2].T + inv[:, 2]
    return np.c_[xy, out[:, 2] * side / INPUT]


def mesh(image: np.ndarray, landmarks68: np.ndarray, refine: int = 2) -> np.ndarray:
    """The face's 468-point mesh, starting from dlib's 68 landmarks (eyes level, 1.5 x the face),
    then re-cropped `refine - 1` times around the mesh itself (MediaPipe's tracking step)."""
    lm = np.asarray(landmarks68, dtype=np.float64)
    eyes = lm[42:48].mean(0) - lm[36:42].mean(0)
    centre = 0.5 * (lm.min(0) + lm.max(0))
    side = CROP_SCALE * float(np.ptp(lm, axis=0).max())
    pts = np.zeros((N_POINTS, 3))
    for _ in range(max(1, refine)):
        angle = float(np.degrees(np.arctan2(eyes[1], eyes[0])))
        pts = run_mesh(image, centre, max(side, 8.0), angle)
        xy = pts[:, :2]
        eyes = xy[EYE_CORNERS[1]] - xy[EYE_CORNERS[0]]
        centre = 0.5 * (xy.min(0) + xy.max(0))
        side = CROP_SCALE * float(np.ptp(xy, axis=0).max())
    return pts


def inter_ocular(points: np.ndarray) -> float:
    return float(np.linalg.norm(points[EYE_CORNERS[1], :2] - points[EYE_CORNERS[0], :2]))


@dataclass(frozen=True)
class Pose:
    """A similarity from the template's frame to the photo's: x = scale * rotation @ t + shift."""

    scale: float
    rotation: np.ndarray  # (3, 3)
    shift: np.ndarray  # (3,)

    def apply(self, shape: np.ndarray) -> np.ndarray:
        return self.scale * shape @ self.rotation.T + self.shift

    def frontal(self, points: np.ndarray) -> np.ndarray:
        """Photo points in the template's frame (the pose taken out)."""
        return (points - self.shift) @ self.rotation / self.scale

    @property
    def yaw_pitch(self) -> tuple[float, float]:
        """Degrees: turned left/right (yaw) and up/down (pitch)."""
        r = self.rotation
        return float(np.degrees(np.arcsin(np.clip(-r[2, 0], -1, 1)))), float(
            np.degrees(np.arctan2(r[2, 1], r[2, 2]))
        )


def fit_pose(source: np.ndarray, target: np.ndarray) -> Pose:
    """The least-squares similarity taking `source` points to `target` (Umeyama 1991)."""
    ms, mt = source.mean(0), target.mean(0)
    a, b = source - ms, target - mt
    u, s, vt = np.linalg.svd(b.T @ a / len(a))
    d = np.ones(3)
    d[2] = np.sign(np.linalg.det(u @ vt)) or 1.0
    rot = u @ np.diag(d) @ vt
    scale = float((s * d).sum() / (a**2).sum(1).mean())
    return Pose(scale, rot, mt - scale * ms @ rot.T)


def _frontal_axes(points: np.ndarray) -> np.ndarray:
    """Rows x (left to right), y (top to chin), z of a face's own frame, from its symmetric pairs
    and midline."""
    x = np.mean([points[b] - points[a] for a, b in PAIRS], axis=0)
    x /= np.linalg.norm(x)
    y = points[CHIN] - points[TOP]
    y -= x * (y @ x)
    y /= np.linalg.norm(y)
    return np.stack([x, y, np.cross(x, y)])


def frontal(points: np.ndarray) -> np.ndarray:
    """A mesh turned frontal, centred, inter-ocular distance 1."""
    p = (points - points.mean(0)) @ _frontal_axes(points).T
    return p / inter_ocular(p)


def outline() -> np.ndarray:
    """The extended mesh's outer outline: the ring's vertex indices, in order."""
    return N_POINTS + np.arange(len(face_oval()))


def extend(shape: np.ndarray) -> np.ndarray:
    """A frontal 468-point shape with the ring around its oval appended: each oval vertex pushed
    out from the oval's centre, by RING_BELOW below the eyes (jaw and cheeks: the face's outline,
    which identifies it) and RING_ABOVE above (the hairline stays the photo's own)."""
    oval = shape[face_oval()]
    centre = oval[:, :2].mean(0)
    eyes_y = 0.5 * (shape[EYE_CORNERS[0], 1] + shape[EYE_CORNERS[1], 1])
    scale = np.where(oval[:, 1] > eyes_y, RING_BELOW, RING_ABOVE)[:, None]
    ring = np.c_[centre + (oval[:, :2] - centre) * scale, oval[:, 2]]
    return np.concatenate([shape[:N_POINTS], ring])


def full(points: np.ndarray, pose: Pose) -> np.ndarray:
    """A face's mesh in the photo with its ring (the ring placed by the face's own shape and
    pose)."""
    return pose.apply(extend(pose.frontal(points[:N_POINTS])))


def _public_portraits() -> list[np.ndarray]:
    import skimage.data
    from matplotlib import cbook
    from PIL import Image

    with Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)) as im:
        grace = np.asarray(im.convert("RGB"))
    return [skimage.data.astronaut(), grace]


def _mirror_of(shape: np.ndarray) -> np.ndarray:
    reflected = shape * np.array([-1.0, 1.0, 1.0])
    d = ((shape[:, None, :2] - reflected[None, :, :2]) ** 2).sum(-1)
    return np.argmin(d, axis=1)


@lru_cache(maxsize=4)
def template(size: int = 192) -> Template:
    """The public frontal template and its `size`-pixel atlas (computed once per process)."""
    from synth.tools import face_models as fm

    shapes = []
    for photo in _public_portraits():
        face = fm.detect(photo)[0]
        shapes.append(frontal(mesh(photo, face.landmarks)))
    shape = np.mean(shapes, axis=0)
    mirror = _mirror_of(shape)
    shape = 0.5 * (shape + shape[mirror] * np.array([-1.0, 1.0, 1.0]))
    shape -= shape.mean(0)
    triangles = np.concatenate([_triangles(shape), _ring_triangles(shape)])
    shape = extend(shape)
    place = {v: i for i, v in enumerate(face_oval())}
    mirror = np.concatenate([mirror, N_POINTS + np.array([place[mirror[v]] for v in face_oval()])])
    lo, hi = shape[:, :2].min(0), shape[:, :2].max(0)
    span = float((hi - lo).max())
    # the atlas: the frontal (x, y), centred on x = 0 so that a flip mirrors the face
    atlas_xy = (shape[:, :2] - np.array([0.0, (lo[1] + hi[1]) / 2])) * (0.94 * size / span)
    atlas_xy += (size - 1) / 2
    tri_map, bary = rasterise(atlas_xy, triangles, np.zeros(len(triangles)), (size, size))
    return Template(shape, triangles, mirror, size, atlas_xy, tri_map, bary)


def _triangles(shape: np.ndarray) -> np.ndarray:
    """The tessellation's triangles plus the filled eye and inner-lip openings, each wound so
    that its normal points to the camera (-z) in the frontal template."""
    edges = _edges("FACEMESH_TESSELATION")
    adj: dict[int, set[int]] = {}
    for a, b in edges:
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    tris = {tuple(sorted((a, b, c))) for a, b in edges for c in adj[a] & adj[b]}
    holes = [
        _loop(_edges("FACEMESH_LEFT_EYE"), 263),
        _loop(_edges("FACEMESH_RIGHT_EYE"), 33),
        _loop(frozenset(e for e in _edges("FACEMESH_LIPS") if 13 in e or _inner_lip(e)), 13),
    ]
    for hole in holes:
        tris |= {tuple(sorted(t)) for t in _fill(hole, shape[:, :2])}
    out = np.array(sorted(tris))
    n = normals(shape, out)
    flip = n[:, 2] > 0
    out[flip] = out[flip][:, [0, 2, 1]]
    return out


def _ring_triangles(shape: np.ndarray) -> np.ndarray:
    """Two triangles between each pair of neighbouring oval vertices and their ring vertices,
    wound like the mesh's (towards the camera in the frontal template's image plane)."""
    oval, n = face_oval(), len(face_oval())
    xy = extend(shape)[:, :2]
    out = []
    for i in range(n):
        j = (i + 1) % n
        for tri in ((oval[i], oval[j], N_POINTS + i), (oval[j], N_POINTS + j, N_POINTS + i)):
            a, b, c = (xy[v] for v in tri)
            cross = (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])
            out.append(tri if cross < 0 else (tri[0], tri[2], tri[1]))
    return np.array(out)


_INNER_LIP = {78, 95, 88, 178, 87, 14, 317, 402, 318, 324, 308, 191, 80, 81, 82, 13, 312, 311}
_INNER_LIP |= {310, 415}


def _inner_lip(edge: tuple[int, int]) -> bool:
    return edge[0] in _INNER_LIP and edge[1] in _INNER_LIP


def normals(points: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Unit normals of the triangles (x right, y down, z away from the camera)."""
    a, b, c = (points[triangles[:, i]] for i in range(3))
    n = np.cross(b - a, c - a)
    return n / np.maximum(np.linalg.norm(n, axis=1, keepdims=True), 1e-12)


def facing(points: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Per triangle, the cosine between its normal and the direction to the camera (> 0: seen)."""
    return -normals(points, triangles)[:, 2]


def rasterise(
    xy: np.ndarray, triangles: np.ndarray, depth: np.ndarray, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Each pixel's triangle (-1: none; nearer triangles, smaller `depth`, drawn last) and its
    barycentric coordinates in it, for an image of `shape` (h, w)."""
    import cv2

    h, w = shape
    ids = np.full((h, w), -1, np.int32)
    for t in np.argsort(-depth, kind="stable"):
        pts = np.round(xy[triangles[t]] * 16).astype(np.int32)
        cv2.fillConvexPoly(ids, pts, int(t), lineType=cv2.LINE_8, shift=4)
    bary = np.zeros((h, w, 3), np.float32)
    ys, xs = np.nonzero(ids >= 0)
    if len(ys):
        t = ids[ys, xs]
        a, b, c = (xy[triangles[t, i]] for i in range(3))
        v0, v1 = b - a, c - a
        p = np.c_[xs, ys].astype(np.float64) - a
        den = v0[:, 0] * v1[:, 1] - v1[:, 0] * v0[:, 1]
        den = np.where(np.abs(den) < 1e-9, 1e-9, den)
        l1 = (p[:, 0] * v1[:, 1] - v1[:, 0] * p[:, 1]) / den
        l2 = (v0[:, 0] * p[:, 1] - p[:, 0] * v0[:, 1]) / den
        lam = np.clip(np.c_[1 - l1 - l2, l1, l2], 0.0, 1.0)
        bary[ys, xs] = lam / lam.sum(1, keepdims=True)
    return ids, bary


def unwrap(photo: np.ndarray, points: np.ndarray, tpl: Template) -> tuple[np.ndarray, np.ndarray]:
    """The face's texture in the atlas (float32 RGB in [0, 1]) and each texel's visibility (the
    cosine of its triangle's view angle, 0 where unseen or outside the face)."""
    import cv2

    inside = tpl.inside
    t = np.where(inside, tpl.atlas_tri, 0)
    pos = np.einsum("hwk,hwkc->hwc", tpl.atlas_bary, points[tpl.triangles[t]][..., :2])
    maps = pos.astype(np.float32)
    tex = cv2.remap(
        photo, maps[..., 0], maps[..., 1], cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )
    seen = np.clip(facing(points, tpl.triangles), 0.0, 1.0)[t]
    return tex.astype(np.float32) / 255.0, np.where(inside, seen, 0.0).astype(np.float32)


def render_map(
    points: np.ndarray, tpl: Template, region: tuple[int, int, int, int], min_facing: float = 0.05
) -> tuple[np.ndarray, np.ndarray]:
    """For each pixel of `region` (x0, y0, x1, y1) of the photo, where to read the atlas (float32
    map, h x w x 2) and whether the mesh covers it (a triangle seen at `min_facing` or more)."""
    x0, y0, x1, y1 = region
    seen = facing(points, tpl.triangles) >= min_facing
    tris = tpl.triangles[seen]
    depth = points[tris].mean(1)[:, 2]
    ids, bary = rasterise(points[:, :2] - np.array([x0, y0]), tris, depth, (y1 - y0, x1 - x0))
    covered = ids >= 0
    t = np.where(covered, ids, 0)
    where = np.einsum("hwk,hwkc->hwc", bary, tpl.atlas_xy[tris[t]])
    return where.astype(np.float32), covered
