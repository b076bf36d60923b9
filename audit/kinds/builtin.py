"""The audit checks of the built-in output kinds (audit.kinds): 2D images and photographs get
the image audit plus the face re-identification attack where the data are faces (required on an
empirical release: face-deid's guarantee rests on it); head volumes get the volume audit in
place of the image audit (brain voxels unchanged, headers, face removal, re-identification of
face renders). A plan whose search measured every recogniser of the face attack is refused
(audit/held_out.py). Each check module is imported when a release of its kind is audited (they load
detectors, atlases); the kinds' [policy] keys (audit/face_policy.py, audit/volume_policy.py) are
registered with them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from audit.face_policy import FacePolicy
from audit.kinds import KindAudit
from audit.volume_policy import VolumePolicy

if TYPE_CHECKING:
    from audit.inputs import AuditInputs
    from audit.policy import AuditPolicy
    from audit.report import AuditReport, CheckResult
    from synth.progress import ProgressFn


def _face_attacks(
    inputs: AuditInputs, images: np.ndarray, policy: AuditPolicy
) -> list[CheckResult]:
    from audit.face_reid import face_attacks

    return face_attacks(inputs, images, policy)


def _face_note(check: str, parameters: Mapping[str, Any]) -> str:
    from audit.face_reid import face_check_note

    return face_check_note(check, parameters)


def _held_out(mechanism: str, detail: Mapping[str, Any], policy: AuditPolicy) -> None:
    from audit.held_out import check_held_out

    check_held_out(mechanism, detail, policy.section(FacePolicy).face_recognisers)


def _volume_audit(inputs: AuditInputs, policy: AuditPolicy, progress: ProgressFn) -> AuditReport:
    from audit.volumes import run_volume_audit

    return run_volume_audit(inputs, policy, progress)


_FACES = KindAudit(
    attacks=_face_attacks, check_note=_face_note, check_plan=_held_out, policy=FacePolicy
)

BUILTIN_AUDITS: dict[str, KindAudit] = {
    "images": _FACES,
    "photographs": _FACES,
    "volumes": KindAudit(run=_volume_audit, policy=VolumePolicy),
}
