"""Parameters of a face de-identification release (`mechanism = "face-deid"`): a frozen config
(synth.config), every field checked up front."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from accounting.errors import InvalidParameterError
from synth import config as check
from synth.config import MechanismConfig

NO_FACE_RULES = ("withhold", "refuse")
REPLACEMENTS = ("average", "generated")  # k-Same-M on the mesh; the DCGAN (the fallback)
GEOMETRIES = ("strict", "attribute")


@dataclass(frozen=True)
class FaceDeidConfig(MechanismConfig):
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

    # "average": k-Same-M, each face replaced by the mean face of a cluster of k distinct people
    # of the release (synth.mechanisms.face_deid.average); "generated": the DCGAN search for every
    # face (also the fallback for a face no cluster fits)
    replacement: str = "average"
    k: int = 5
    # "strict": the cluster's mean shape (the k-Same bound holds for the face region);
    # "attribute": the face's own shape moved towards it by the first of attribute_factors that
    # passes the search's targets (empirical only)
    geometry: str = "strict"
    attribute_factors: tuple[float, ...] = (0.5, 0.75, 1.0)
    # the face's own lighting kept: its low-pass width, in inter-ocular distances (at 0.3 its
    # teeth and eye whites came through under the average's closed mouth and eyes)
    shading_sigma: float = 0.7
    erode: float = 0.08  # the face oval shrunk by this (inter-ocular distances): hairline kept
    texture_size: int = 192  # the mesh texture's side, pixels
    max_yaw: float = 60.0  # degrees; a face turned farther gets the fallback
    pose_spread: float = 60.0  # degrees of yaw and pitch between a cluster's first face and others
    # with a public donor pool (`public = "photos:DIR"` in the spec: consented photographs), each
    # face is the average of pool_donors pool faces, those the searched recognisers put farthest
    # from it first; pool_sets such donor sets are tried before the fallback. Two, not k: an
    # average of many faces is generic, and a generic face leaves the recognisers the person's
    # own hair, outline and lighting (docs/benchmarks/faces.md, "the donor pool")
    pool_donors: int = 2
    pool_sets: int = 3
    generator_weights: str | None = None
    latent_dim: int = 100
    generator_features: int = 64
    # SFace and FaceNet, dlib held out for the audit: the pair that keeps every audit recogniser at
    # chance on real photographs (BENCHMARKS.md, "Faces")
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

    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        # the defaults: sized for 2 CPU cores (100 photos in minutes, BENCHMARKS.md)
        "demo": {},
        # for tests: a few seconds a face, the DCGAN search (test photo sets hold fewer than k
        # people, which the average refuses)
        "tiny": dict(
            replacement="generated",
            inversion_steps=5,
            inversion_restarts=1,
            bank_size=64,
            search_strengths=(0.75, 1.0),
            candidates_per_round=2,
        ),
    }

    @classmethod
    def checked(cls, v: Mapping[str, Any]) -> dict[str, Any]:
        cls._check_weights(v)
        names = cls._recogniser_names(v)
        pairs = cls._target_pairs(v)
        return {
            **v,
            "latent_dim": check.whole("latent_dim", v["latent_dim"], 1, 4096),
            "generator_features": check.whole(
                "generator_features", v["generator_features"], 1, 1024
            ),
            "recognisers": tuple(dict.fromkeys(names)),  # each once, in the order given
            "identity_targets": tuple(
                sorted((k, check.number(f"identity_targets.{k}", d, 0.0, 10.0)) for k, d in pairs)
            ),
            **cls._checked_search(v),
            **cls._checked_average(v),
            **cls._checked_placement(v),
        }

    @staticmethod
    def _check_weights(v: Mapping[str, Any]) -> None:
        """generator_weights is left out or a non-empty path."""
        weights = v["generator_weights"]
        if weights is not None and (not isinstance(weights, str) or not weights.strip()):
            raise InvalidParameterError(
                "generator_weights must be the path of a DCGAN state dict, or left out "
                "for the packaged generator."
            )

    @staticmethod
    def _recogniser_names(v: Mapping[str, Any]) -> tuple[str, ...] | list[str]:
        """The recognisers' names as given (one name alone is a list of one); refused unless
        names."""
        names = v["recognisers"]
        names = (names,) if isinstance(names, str) else names
        if (
            not isinstance(names, (tuple, list))
            or not names
            or not all(isinstance(n, str) and n for n in names)
        ):
            raise InvalidParameterError(
                'recognisers must list recogniser names, e.g. ["dlib", "sface"]; got '
                f"{v['recognisers']!r}."
            )
        return names

    @staticmethod
    def _target_pairs(v: Mapping[str, Any]) -> list | tuple:
        """identity_targets as (recogniser name, distance) pairs, from a table or a list of
        pairs."""
        targets = v["identity_targets"]
        pairs = list(targets.items()) if isinstance(targets, Mapping) else targets
        if not isinstance(pairs, (list, tuple)) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) for p in pairs
        ):
            raise InvalidParameterError(
                "identity_targets must map recogniser names to distances, e.g. "
                f"{{ sface = 0.85 }}; got {targets!r}."
            )
        return pairs

    @staticmethod
    def _checked_search(v: Mapping[str, Any]) -> dict[str, Any]:
        """The identity search: thresholds, inversion, latent bank, strengths and candidates."""
        return {
            "acknowledge_no_held_out": check.flag(
                "acknowledge_no_held_out", v["acknowledge_no_held_out"]
            ),
            "identity_threshold": check.number(
                "identity_threshold", v["identity_threshold"], 0.0, 10.0
            ),
            "identity_margin": check.number("identity_margin", v["identity_margin"], 0.0, 10.0),
            "inversion_steps": check.whole("inversion_steps", v["inversion_steps"], 0, 10_000),
            "inversion_restarts": check.whole("inversion_restarts", v["inversion_restarts"], 1, 64),
            "bank_size": check.whole("bank_size", v["bank_size"], 1, 100_000),
            "inversion_lr": check.number("inversion_lr", v["inversion_lr"], 1e-6, 10.0),
            "search_strengths": check.entries(
                "search_strengths",
                v["search_strengths"],
                lambda name, x: check.number(name, x, 0.01, 1.0),
                most=20,
                example="[0.35, 0.55, 1.0]",
            ),
            "candidates_per_round": check.whole(
                "candidates_per_round", v["candidates_per_round"], 1, 64
            ),
        }

    @staticmethod
    def _checked_average(v: Mapping[str, Any]) -> dict[str, Any]:
        """The k-Same-M average: k, the geometry mode, shading, mask, texture and pose limits."""
        return {
            "replacement": check.choice("replacement", v["replacement"], REPLACEMENTS),
            "k": check.whole("k", v["k"], 2, 1000),
            "geometry": check.choice("geometry", v["geometry"], GEOMETRIES),
            "attribute_factors": check.entries(
                "attribute_factors",
                v["attribute_factors"],
                lambda name, x: check.number(name, x, 0.05, 1.0),
                most=10,
                example="[0.5, 0.75, 1.0]",
            ),
            "shading_sigma": check.number("shading_sigma", v["shading_sigma"], 0.05, 2.0),
            "erode": check.number("erode", v["erode"], 0.0, 0.5),
            "texture_size": check.whole("texture_size", v["texture_size"], 64, 1024),
            "max_yaw": check.number("max_yaw", v["max_yaw"], 0.0, 90.0),
            "pose_spread": check.number("pose_spread", v["pose_spread"], 0.0, 180.0),
            "pool_donors": check.whole("pool_donors", v["pool_donors"], 1, 100),
            "pool_sets": check.whole("pool_sets", v["pool_sets"], 1, 50),
        }

    @staticmethod
    def _checked_placement(v: Mapping[str, Any]) -> dict[str, Any]:
        """Blending into the photo, the detector's faces, photos without one, and the seed."""
        return {
            "feather": check.number("feather", v["feather"], 0.0, 1.0),
            "mask_scale": check.number("mask_scale", v["mask_scale"], 0.5, 2.0),
            "landmark_tolerance": check.number(
                "landmark_tolerance", v["landmark_tolerance"], 0.0, 10.0
            ),
            "min_face_size": check.whole("min_face_size", v["min_face_size"], 8, 4096),
            "max_faces_per_photo": check.whole(
                "max_faces_per_photo", v["max_faces_per_photo"], 1, 1000
            ),
            "no_face": check.choice("no_face", v["no_face"], NO_FACE_RULES),
            "detection_threshold": check.number(
                "detection_threshold", v["detection_threshold"], 0.05, 0.99
            ),
            "seed": check.whole("seed", v["seed"], 0, 2**31 - 1),
        }

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

    def as_dict(self) -> dict[str, Any]:
        """The parameters as JSON; identity_targets as a table (recogniser -> distance)."""
        return {**super().as_dict(), "identity_targets": dict(self.identity_targets)}
