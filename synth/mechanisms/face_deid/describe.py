"""What a face de-identification release is, in the words of its dataset card (no torch: read at
publication)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from synth.registry import MechanismDescription


def targets_text(targets: Mapping[str, float]) -> str:
    """'dlib 0.75, sface 0.85': each searched recogniser and the distance it had to reach."""
    return ", ".join(f"{k} {float(v):g}" for k, v in targets.items())


def guarantee_line(targets: Mapping[str, float]) -> str:
    """The one-line guarantee the plan, card and dashboard show."""
    return (
        "faces replaced until each is at least the target distance from its original for every "
        f"searched recogniser ({targets_text(targets)}; each recogniser's same-person threshold "
        "lies below its target)"
    )


def describe(
    parameters: Mapping[str, Any], guarantee: Mapping[str, Any], n: int
) -> MechanismDescription:
    threshold = float(parameters.get("identity_threshold", 0.6))
    margin = float(parameters.get("identity_margin", 0.1))
    # releases made before the recogniser ensemble searched with dlib alone
    targets = parameters.get("search_targets") or {"dlib": threshold + margin}
    held_out = parameters.get("held_out_recognisers")
    withheld = int(parameters.get("n_withheld", 0))
    pixelated = int(parameters.get("n_faces_pixelated", 0))
    generator = parameters.get("generator", "a face generator")
    if parameters.get("replacement") == "average":
        return _describe_average(parameters, targets, held_out, n)
    return MechanismDescription(
        what=(
            f"{n} photographs in which **every detected face was replaced** by a face from "
            f"{generator}, put in place by one affine map on the original's eyes, nose and mouth "
            "(pose and expression kept) and blended by Poisson cloning (lighting and colour kept); "
            "the `face` column holds each photo's largest face, aligned, at 64 x 64. "
            f"{withheld} photograph(s) with no detectable face were withheld (not released); "
            f"{pixelated} face(s) the generator could not move far enough, or too small to "
            "align, were pixelated instead."
        ),
        guarantee=(
            "**Empirical de-identification, not differential privacy.** Each face was replaced "
            "until every recogniser the mechanism searched against put it at least its target "
            f"distance from the original ({targets_text(targets)}), and the audit's face "
            "re-identification attack (verification and rank-1 identification against the "
            "original photos, by each recogniser with its own detection)"
            + (
                f" passed, including {', '.join(held_out)}, which the mechanism never measured"
                if held_out
                else " passed (the card's table says which recognisers were held out from the "
                "search)"
            )
            + ". That is evidence against these recognisers, not a proof: another recogniser, "
            "the hair, clothes, background and the rest of each photo, or an undetected face can "
            "still identify a person. The source dataset's earlier DP guarantees no longer hold "
            "after this release."
        ),
        collection=(
            "Photographs whose detected faces were replaced by generated faces (FALCO-style "
            "latent optimisation on a 64 x 64 DCGAN), checked by a face re-identification attack."
        ),
        collection_type="Derived (de-identified) data",
        tags=("face-anonymization", "de-identification", "anonymized"),
    )


def _describe_average(
    p: Mapping[str, Any], targets: Mapping[str, float], held_out: Any, n: int
) -> MechanismDescription:
    """The card of a k-Same-M release: the averaging, its bound and the bound's limits."""
    if p.get("donor_pool"):
        return _describe_pool(p, targets, held_out, n)
    k, geometry = int(p.get("k", 5)), str(p.get("geometry", "strict"))
    sizes = [int(s) for s in p.get("cluster_sizes", [])]
    fallback = int(p.get("n_faces_fallback", 0))
    bound = (
        f"In `strict` geometry every member of a cluster received the same face (the cluster's "
        f"mean shape and texture, re-posed), so a recogniser matching a released face region "
        f"against the originals can pick its person with probability at most 1/k = 1/{k} "
        "(the k-Same bound, Newton, Sweeney and Malin 2005). The bound covers the face region "
        "only: the hair, ears, outline, the face's own low-frequency lighting and everything "
        "else in the photo are the person's own; a person in two releases, or in two photos "
        "counted as two people, is not covered."
        if geometry == "strict"
        else "In `attribute` geometry each face keeps part of its own shape (moved towards the "
        "cluster's mean by the factor the search chose): its privacy is empirical only, as "
        "measured by the audit, with no k-Same bound."
    )
    return MechanismDescription(
        what=(
            f"{n} photographs in which **every detected face was replaced by the average face of "
            f"a cluster of at least k = {k} different people of this release** (k-Same-M: shape "
            "and texture averaged separately on a 468-point face mesh, drawn at the photo's own "
            "resolution with the face's own lighting, blended on the face oval). "
            f"{len(sizes)} cluster(s) of {', '.join(map(str, sizes)) or 'no'} faces; people were "
            f"told apart by {p.get('people_counted_by', 'the searched recognisers')}. "
            f"{int(p.get('n_withheld', 0))} photograph(s) with no detectable face were withheld; "
            f"{fallback} face(s) no cluster fitted were given a DCGAN face instead (flagged: "
            f"{', '.join(p.get('fallback_reasons', [])) or 'none'}); "
            f"{int(p.get('n_faces_pixelated', 0))} face(s) were pixelated."
        ),
        guarantee=(
            "**Empirical de-identification, not differential privacy.** " + bound + " Each face "
            "was also checked against every recogniser the mechanism searched with "
            f"({targets_text(targets)}), and the audit's face re-identification and donor "
            "re-identification attacks"
            + _held_out_text(held_out)
            + ". The donors (the cluster's other members) are data subjects of this same "
            "release: their faces contribute to the average drawn in other people's photos. The "
            "source dataset's earlier DP guarantees no longer hold after this release."
        ),
        collection=(
            "Photographs whose detected faces were replaced by k-anonymous average faces "
            "(k-Same-M on a dense face mesh), checked by face re-identification attacks."
        ),
        collection_type="Derived (de-identified) data",
        tags=("face-anonymization", "de-identification", "anonymized", "k-same"),
    )


def _held_out_text(held_out: Any) -> str:
    return (
        f" passed, including {', '.join(held_out)}, which the mechanism never measured"
        if held_out
        else " passed"
    )


def _describe_pool(
    p: Mapping[str, Any], targets: Mapping[str, float], held_out: Any, n: int
) -> MechanismDescription:
    """The card of a k-Same-M release drawn from the steward's donor pool."""
    m = int(p.get("pool_donors", 2))
    fallback = int(p.get("n_faces_fallback", 0))
    return MechanismDescription(
        what=(
            f"{n} photographs in which **every detected face was replaced by the average face of "
            f"{m} people of the donor pool {p.get('donor_pool')!r}** ({p.get('donor_pool_faces')} "
            f"faces in {p.get('donor_pool_photos')} photograph(s) the steward registered as "
            f"consented donors, {int(p.get('donor_pool_faces_barred', 0))} of them held back "
            "because a searched recogniser took them for a person of this release): shape "
            "and texture averaged separately on a 468-point face mesh, "
            "drawn at the photo's own resolution with the face's own lighting, blended on the "
            "face oval; for each face the donors the searched recognisers put farthest from it "
            f"were tried first. {int(p.get('n_withheld', 0))} photograph(s) with no detectable "
            f"face were withheld; {fallback} face(s) no donor fitted were given a DCGAN face "
            f"instead (flagged: {', '.join(p.get('fallback_reasons', [])) or 'none'}); "
            f"{int(p.get('n_faces_pixelated', 0))} face(s) were pixelated."
        ),
        guarantee=(
            "**Empirical de-identification, not differential privacy, and no k-Same bound.** No "
            "data subject's face is drawn into another's photo: the replacement faces are "
            f"averages of {m} donors from the pool, whose features appear in the released photos "
            "(that is what they consented to). Each face was checked against every recogniser "
            f"the mechanism searched with ({targets_text(targets)}), and the audit's face "
            "re-identification attack" + _held_out_text(held_out) + ". That is evidence against "
            "these recognisers, not a proof: the hair, ears, outline, the face's own "
            "low-frequency lighting and the rest of each photo are the person's own. The source "
            "dataset's earlier DP guarantees no longer hold after this release."
        ),
        collection=(
            "Photographs whose detected faces were replaced by averages of consented donors' "
            "faces (k-Same-M on a dense face mesh), checked by a face re-identification attack."
        ),
        collection_type="Derived (de-identified) data",
        tags=("face-anonymization", "de-identification", "anonymized", "donor-pool"),
    )
