"""What the audit of a release reads (AuditInputs): the released rows, the sensitive data they
were made of, the claim to test, and the output kind's own payload."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from accounting.errors import DataFormatError, InvalidParameterError
from audit.baseline import Baseline
from audit.items import MapItems
from synth.kinds.datasets import ImageDataset
from synth.registry import DP, GUARANTEE_KINDS

if TYPE_CHECKING:  # torch-heavy: imported only where the one-run audit runs
    from audit.dpsgd_audit import DpSgdSetting


@dataclass
class AuditInputs:
    release_id: str
    images: np.ndarray  # the release: uint8 (N, H, W[, C])
    labels: np.ndarray
    ids: list[str]
    expected_count: int  # n requested, or floor(n / k) for k-anonymous releases
    label_set: list[int]  # the registered label set
    # training (member) data, as the dataset's input data kind reads it (synth.kinds): an
    # ImageDataset for the image audit; a kind with its own audit (KindAudit.run) reads its own
    sensitive: ImageDataset | Any
    heldout: ImageDataset | None  # real held-out data (non-members, utility test set)
    record_fingerprint_key: bytes  # HMAC key for the exact-copy check
    mechanism: str  # the registry name of the mechanism that made the release
    claimed_epsilon: float | None = None
    delta: float | None = None
    k: int | None = None
    # per-sample diffusion loss
    loss_fn: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
    clusters: list[np.ndarray] | None = None  # sensitive indices per representative (k-anonymous)
    selected_public: ImageDataset | None = None  # the mechanism's selected public images (SDS)
    artifacts_dir: Path | None = None  # PNGs go here
    # models that never saw the sensitive set (e.g. the public pre-trained generator): calibrate the
    # MIA
    reference_loss_fns: list[Callable[[np.ndarray, np.ndarray], np.ndarray]] | None = None
    # the executed DP-SGD run: one-run audit of its implementation
    dpsgd: DpSgdSetting | None = None
    # what the release claims (synth.registry.GUARANTEE_KINDS): picks the attacks that test it
    guarantee_kind: str = DP
    # the output kind's released payload (MechanismOutput.payload, in the order of `sensitive`) and
    # the files the kind saved it as (OutputKind.audit_files), which its checks may read
    released: Any = None
    released_files: list[Path] | None = None
    # public files a kind's checks read, shared between releases (e.g. template atlases)
    cache_dir: Path | None = None
    # where the per-item work of a kind's checks (one released record each) runs: the run's
    # executor (release.executor.ItemMapper); None: this process (audit.items)
    map_items: MapItems | None = None
    # earlier DP releases of the same dataset by other mechanisms, measured on the same held-out
    # source (audit.baseline): compared with this release's downstream accuracy
    baselines: list[Baseline] = field(default_factory=list)
    # the recognisers a de-identification mechanism searched against (its parameters'
    # `searched_recognisers`): the kind's checks say which recognisers were held out
    searched_recognisers: list[str] | None = None
    # the output kind of the release (release.kinds; its checks: audit.kinds.kind_audit)
    output_kind: str = "images"
    # a release averaged over clusters of parts of records (per cluster, its members as [record,
    # part]) and its k, from the run's internal record: the donor re-identification attack of the
    # kind's checks; None for any other release
    part_clusters: list[list[list[int]]] | None = None
    part_cluster_k: int | None = None
    # the share of a release's replaced parts drawn, by design, with a shape not their own (from
    # the run's internal record): the kind's realism checks weigh in their own limit for them
    shape_replaced_share: float | None = None

    @property
    def sensitive_images(self) -> ImageDataset:
        if not isinstance(self.sensitive, ImageDataset):
            raise DataFormatError(
                "sensitive must be an ImageDataset for an image release, got "
                f"{type(self.sensitive).__name__}."
            )
        return self.sensitive

    def validate(self) -> None:
        self._validate_kinds()
        images = np.asarray(self.images)
        self._validate_release(images)
        self._validate_companions(images)
        self._validate_claims()

    def _validate_kinds(self) -> None:
        """The sensitive set holds images and the guarantee kind is known."""
        if not isinstance(self.sensitive, ImageDataset):
            raise DataFormatError(
                f"sensitive must be an ImageDataset, got {type(self.sensitive).__name__}."
            )
        if self.guarantee_kind not in GUARANTEE_KINDS:
            raise InvalidParameterError(
                f"guarantee_kind must be one of {sorted(GUARANTEE_KINDS)}, got "
                f"{self.guarantee_kind!r}."
            )

    def _validate_release(self, images: np.ndarray) -> None:
        """The released images, labels, ids and expected count are consistent."""
        if images.ndim not in (3, 4):
            raise DataFormatError(
                f"release images must be (N, H, W) or (N, H, W, C), got shape {images.shape}."
            )
        if np.asarray(self.labels).shape != (len(images),) or len(self.ids) != len(images):
            raise DataFormatError(
                f"release has {len(images)} images, {np.asarray(self.labels).shape} labels and "
                f"{len(self.ids)} ids; give one label and one id per image."
            )
        if not np.issubdtype(images.dtype, np.number):
            raise DataFormatError(f"release images have non-numeric dtype {images.dtype}.")
        if (
            not isinstance(self.expected_count, (int, np.integer))
            or isinstance(self.expected_count, bool)
            or self.expected_count < 0
        ):
            raise InvalidParameterError(
                f"expected_count must be a non-negative integer, got {self.expected_count!r}."
            )

    def _validate_companions(self, images: np.ndarray) -> None:
        """Held-out and selected public data are image sets like the sensitive set; k-anonymous
        clusters match the representatives."""
        for name, other in (("heldout", self.heldout), ("selected_public", self.selected_public)):
            if other is not None and not isinstance(other, ImageDataset):
                raise DataFormatError(
                    f"{name} must be an ImageDataset or None, got {type(other).__name__}."
                )
        if self.heldout is not None and self.heldout.image_shape != self.sensitive.image_shape:
            raise DataFormatError(
                f"held-out images have shape {self.heldout.image_shape} but the sensitive set "
                f"{self.sensitive.image_shape}; give held-out data of the same format."
            )
        if (
            self.guarantee_kind == "k-anonymity"
            and self.clusters is not None
            and len(self.clusters) != len(images)
        ):
            raise DataFormatError(
                f"{len(self.clusters)} clusters for {len(images)} released representatives; give "
                "one array of sensitive indices per representative, in release order."
            )

    def _validate_claims(self) -> None:
        """The registered labels, the claimed guarantee and the fingerprint key are usable."""
        if not self.label_set:
            raise InvalidParameterError("label_set is empty; give the registered dataset's labels.")
        if self.claimed_epsilon is not None and (
            not math.isfinite(self.claimed_epsilon) or self.claimed_epsilon <= 0
        ):
            raise InvalidParameterError(
                "claimed_epsilon must be a finite positive number or None, got "
                f"{self.claimed_epsilon!r}."
            )
        if self.delta is not None and not (0 <= self.delta < 1):
            raise InvalidParameterError(f"delta must be in [0, 1) or None, got {self.delta!r}.")
        if self.guarantee_kind == "k-anonymity" and (
            self.k is None or int(self.k) != self.k or self.k < 1
        ):
            raise InvalidParameterError(
                f"a k-anonymous release needs an integer k >= 1, got {self.k!r}."
            )
        if (
            not isinstance(self.record_fingerprint_key, (bytes, bytearray))
            or not self.record_fingerprint_key
        ):
            raise InvalidParameterError(
                "record_fingerprint_key must be the workspace's HMAC key (non-empty bytes)."
            )
