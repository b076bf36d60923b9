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
    embedder: the identity embedding the search and the audit measure with (synth.face_models);
    identity_threshold + identity_margin: the distance each released face must reach from its
    original; search_strengths: how far each round moves from the inversion (slerp towards a
    random latent, 1 = an unrelated face); no_face: what happens to a photo without a detectable
    face ("withhold": not released, counted; "refuse": the run fails)."""

    generator_weights: str | None = None
    latent_dim: int = 100
    generator_features: int = 64
    embedder: str = "dlib"
    identity_threshold: float = 0.6
    identity_margin: float = 0.1
    inversion_steps: int = 10
    inversion_restarts: int = 2
    bank_size: int = 256  # prior latents the inversion starts from
    inversion_lr: float = 0.05
    search_strengths: tuple[float, ...] = (0.5, 0.75, 1.0)
    candidates_per_round: int = 2
    feather: float = 0.12  # mask feather, in inter-ocular distances
    mask_scale: float = 1.1  # the replaced region: jaw line and forehead, grown by this factor
    landmark_refinements: int = 2  # corrections of the warp by the landmarks seen in the composite
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
        if not isinstance(self.embedder, str):
            raise InvalidParameterError(
                f"[face-deid] embedder must be a name, got {self.embedder!r}."
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
        self.landmark_refinements = _int("landmark_refinements", self.landmark_refinements, 0, 10)
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
            bank_size=16,
            search_strengths=(0.6, 1.0),
            candidates_per_round=1,
        )

    @property
    def target_distance(self) -> float:
        return self.identity_threshold + self.identity_margin

    def with_(self, **changes: Any) -> FaceDeidConfig:
        return replace(self, **changes)

    def public_parameters(self) -> dict[str, Any]:
        d = asdict(self)
        d["search_strengths"] = list(self.search_strengths)
        return d
