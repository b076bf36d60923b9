"""Parameters of a face de-identification release (`mechanism = "face-deid"`), validated up
front."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from numbers import Integral, Real
from typing import Any

from accounting.errors import InvalidParameterError

NO_FACE_RULES = ("withhold", "refuse")


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidParameterError(f"[face-deid] {name} must be an integer, got {value!r}.")
    if not low <= int(value) <= high:
        raise InvalidParameterError(
            f"[face-deid] {name} must be between {low} and {high}, got {value}."
        )
    return int(value)


def _float(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise InvalidParameterError(f"[face-deid] {name} must be a finite number, got {value!r}.")
    if not low <= float(value) <= high:
        raise InvalidParameterError(
            f"[face-deid] {name} must be between {low:g} and {high:g}, got {float(value):g}."
        )
    return float(value)


@dataclass
class FaceDeidConfig:
    """generator_weights: a DCGAN state dict (None = the packaged DigiFace-1M DCGAN);
    recognisers: the face recognisers the search measures with (synth.tools.face_recognisers); each
    released face must be at least its target distance from the original for every one of them:
    dlib's is identity_threshold + identity_margin, the others' are in identity_targets (a
    recogniser not listed there gets its own threshold grown by dlib's relative margin); at
    least one recogniser of the audit should be left out, so that the audit holds out one the
    mechanism never measured (acknowledge_no_held_out to search against all of them);
    search_strengths: how far each round moves from the inversion (slerp towards a prior face of a
    similar pose, 1 = that face); no_face: what happens to a photo without a detectable face
    ("withhold": not released, counted; "refuse": the run fails)."""

    generator_weights: str | None = None
    latent_dim: int = 100
    generator_features: int = 64
    # SFace and FaceNet: with dlib held out, all three audit recognisers stay at chance on the
    # real photographs (with FaceNet held out instead, FaceNet still verified 1 of 9 faces)
    recognisers: tuple[str, ...] = ("sface", "facenet")
    identity_threshold: float = 0.6
    identity_margin: float = 0.15
    # about where pairs of different people lie: SFace's same-person boundary is cosine 0.363
    # (distance 0.637), 0.85 is cosine 0.15; FaceNet's is 1.04, 1.3 is its threshold grown by
    # dlib's relative margin (0.75 / 0.6)
    identity_targets: tuple[tuple[str, float], ...] = (("facenet", 1.3), ("sface", 0.85))
    acknowledge_no_held_out: bool = False
    inversion_steps: int = 10
    inversion_restarts: int = 2
    bank_size: int = 1024  # prior latents: the inversion's starts and the pose-matched partners
    inversion_lr: float = 0.05
    search_strengths: tuple[float, ...] = (0.75, 1.0, 1.0, 1.0)
    candidates_per_round: int = 4
    feather: float = (
        0.05  # mask feather, in inter-ocular distances (Poisson blending does the rest)
    )
    mask_scale: float = 1.25  # the replaced region: jaw line and forehead, grown by this factor
    # a round whose passing candidates all moved the landmarks more than this (inter-ocular
    # distances) does not end the search
    landmark_tolerance: float = 0.05
    min_face_size: int = 24  # pixels; smaller faces are pixelated
    max_faces_per_photo: int = 32
    no_face: str = "withhold"
    detection_threshold: float = 0.5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.generator_weights is not None and (
            not isinstance(self.generator_weights, str) or not self.generator_weights.strip()
        ):
            raise InvalidParameterError(
                "[face-deid] generator_weights must be the path of a DCGAN state dict, or left out "
                "for the packaged generator."
            )
        self.latent_dim = _int("latent_dim", self.latent_dim, 1, 4096)
        self.generator_features = _int("generator_features", self.generator_features, 1, 1024)
        names = (self.recognisers,) if isinstance(self.recognisers, str) else self.recognisers
        if (
            not isinstance(names, (tuple, list))
            or not names
            or not all(isinstance(n, str) and n for n in names)
        ):
            raise InvalidParameterError(
                '[face-deid] recognisers must list recogniser names, e.g. ["dlib", "sface"]; got '
                f"{self.recognisers!r}."
            )
        self.recognisers = tuple(dict.fromkeys(names))
        targets = self.identity_targets
        pairs = list(targets.items()) if isinstance(targets, dict) else targets
        if not isinstance(pairs, (list, tuple)) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) for p in pairs
        ):
            raise InvalidParameterError(
                "[face-deid] identity_targets must map recogniser names to distances, e.g. "
                f"{{ sface = 0.85 }}; got {targets!r}."
            )
        self.identity_targets = tuple(
            sorted((k, _float(f"identity_targets.{k}", v, 0.0, 10.0)) for k, v in pairs)
        )
        if not isinstance(self.acknowledge_no_held_out, bool):
            raise InvalidParameterError(
                "[face-deid] acknowledge_no_held_out must be true or false, got "
                f"{self.acknowledge_no_held_out!r}."
            )
        self.identity_threshold = _float("identity_threshold", self.identity_threshold, 0.0, 10.0)
        self.identity_margin = _float("identity_margin", self.identity_margin, 0.0, 10.0)
        self.inversion_steps = _int("inversion_steps", self.inversion_steps, 0, 10_000)
        self.inversion_restarts = _int("inversion_restarts", self.inversion_restarts, 1, 64)
        self.bank_size = _int("bank_size", self.bank_size, 1, 100_000)
        self.inversion_lr = _float("inversion_lr", self.inversion_lr, 1e-6, 10.0)
        strengths = tuple(self.search_strengths)
        if not strengths or len(strengths) > 20:
            raise InvalidParameterError(
                "[face-deid] search_strengths must list 1 to 20 strengths, e.g. [0.35, 0.55, 1.0]."
            )
        self.search_strengths = tuple(
            _float("search_strengths entry", s, 0.01, 1.0) for s in strengths
        )
        self.candidates_per_round = _int("candidates_per_round", self.candidates_per_round, 1, 64)
        self.feather = _float("feather", self.feather, 0.0, 1.0)
        self.mask_scale = _float("mask_scale", self.mask_scale, 0.5, 2.0)
        self.landmark_tolerance = _float("landmark_tolerance", self.landmark_tolerance, 0.0, 10.0)
        self.min_face_size = _int("min_face_size", self.min_face_size, 8, 4096)
        self.max_faces_per_photo = _int("max_faces_per_photo", self.max_faces_per_photo, 1, 1000)
        if self.no_face not in NO_FACE_RULES:
            raise InvalidParameterError(
                f"[face-deid] no_face must be one of {', '.join(NO_FACE_RULES)}; got "
                f"{self.no_face!r}."
            )
        self.detection_threshold = _float(
            "detection_threshold", self.detection_threshold, 0.05, 0.99
        )
        self.seed = _int("seed", self.seed, 0, 2**31 - 1)

    @classmethod
    def demo(cls) -> FaceDeidConfig:
        """The defaults: sized for 2 CPU cores (100 photos in minutes, BENCHMARKS.md)."""
        return cls()

    @classmethod
    def tiny(cls) -> FaceDeidConfig:
        """For tests: a few seconds a face."""
        return cls(
            inversion_steps=5,
            inversion_restarts=1,
            bank_size=64,
            search_strengths=(0.75, 1.0),
            candidates_per_round=2,
        )

    def targets(self, recognisers: tuple[Any, ...]) -> tuple[float, ...]:
        """The distance each released face must reach, per recogniser (in its own units)."""
        listed = dict(self.identity_targets)
        relative = self.target_distance / max(self.identity_threshold, 1e-9)
        return tuple(
            self.target_distance if r.key == "dlib" else listed.get(r.key, r.threshold * relative)
            for r in recognisers
        )

    @property
    def max_candidates(self) -> int:
        """Faces tried at most for one original: the inversion, then every round's candidates."""
        return 1 + len(self.search_strengths) * self.candidates_per_round

    @property
    def target_distance(self) -> float:
        return self.identity_threshold + self.identity_margin

    def with_(self, **changes: Any) -> FaceDeidConfig:
        return replace(self, **changes)

    def public_parameters(self) -> dict[str, Any]:
        d = asdict(self)
        d["search_strengths"] = list(self.search_strengths)
        d["recognisers"] = list(self.recognisers)
        d["identity_targets"] = dict(self.identity_targets)
        return d
