"""face-deid through the runner on a throw-away workspace with real photos: plan refusals, the
acknowledgement, a full run (a photo without a face withheld, one with two faces), refunds before
reading, the reservation kept after."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accounting import ledger, trail
from accounting.errors import DataFormatError, InvalidParameterError, PrivReleaseError
from accounting.events import NonPrivateRelease
from accounting.fingerprint import dataset_fingerprint
from accounting.store import Store, Workspace
from release import runner
from release.planning import dataset_info
from synth import registry
from synth.kinds.datasets import ImageDataset, load_source
from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.face_deid.run import MECHANISM, load_tools
from synth.registry import DatasetInfo
from synth.tools import face_models as fm
from synth.tools import face_recognisers as fr

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> ImageDataset:
    from tests.support import face_photos

    folder = face_photos.write_folder(tmp_path_factory.mktemp("photos"))
    return load_source(f"photos-192:{folder}")  # portrait, portrait, no face, two faces


@pytest.fixture(scope="module")
def tools():
    return load_tools(FaceDeidConfig.tiny())


@pytest.fixture(scope="module")
def public() -> None:
    """What the runner passes when the spec names no donor pool (face-deid's default)."""
    return None


@pytest.fixture
def store(tmp_path, photos) -> Store:
    ws = Workspace(tmp_path / "ws")
    ws.init()
    st = Store(ws)
    ledger.register_dataset(
        st,
        name="faces",
        source="photos-192:/somewhere",
        fingerprint=dataset_fingerprint(ws.hmac_key(), photos.images, photos.labels),
        record_count=len(photos),
        labels=[0],
        image_shape=list(photos.image_shape),
        epsilon_cap=8.0,
        delta_cap=1e-5,
    )
    return st


def _plan(store, public, cfg):
    b = ledger.budget(store, "faces")
    return MECHANISM.plan(cfg, dataset_info(b.dataset), b.history, public)


def _run(store, photos, public, cfg, run_id, tmp_path, *, tools, ack=True, progress=None):
    import dataclasses
    import functools

    from synth.mechanisms.face_deid.run import run

    # the registered entry with the test's loaded models handed to its run
    mech = dataclasses.replace(MECHANISM, run=functools.partial(run, tools=tools))
    return runner.run_charged(
        store,
        run_id=run_id,
        dataset="faces",
        data=photos,
        public=public,
        mechanism=mech,
        config=cfg,
        plan=_plan(store, public, cfg),
        workdir=tmp_path / "w",
        acknowledge_non_dp=ack,
        actor="alice",
        progress=progress or (lambda *a: None),
    )


def _info(shape: tuple[int, ...]) -> DatasetInfo:
    return DatasetInfo("ds-1", "faces", 4, (0,), shape, 1e-5)


def test_the_plan_claims_no_dp_and_needs_acknowledgement(public) -> None:
    plan = MECHANISM.plan(FaceDeidConfig(), _info((192, 192, 3)), [], public)
    assert plan.guarantee_kind == "empirical" and plan.requires_acknowledgement
    assert plan.events == (NonPrivateRelease("empirical face de-identification (face-deid)"),)
    assert plan.expected_count == 4 and plan.output_shape == (192, 192, 3)
    assert "NO differential-privacy guarantee" in plan.warnings[0]
    assert "withheld" in plan.warnings[1]
    # the search's recognisers and their targets, and what release/ holds the audit against
    assert "sface 0.85, facenet 1.3" in plan.detail["guarantee_description"]
    assert plan.detail["searched_recognisers"] == ["sface", "facenet"]
    assert plan.detail["search_targets"] == {"sface": 0.85, "facenet": 1.3}
    assert plan.detail["no_held_out_acknowledged"] is False


@pytest.mark.parametrize(
    ("shape", "config", "message"),
    [
        ((192, 192), {}, "colour photographs"),
        ((48, 48, 3), {}, "at least 64 x 64"),
        ((192, 192, 3), {"recognisers": ("arcface",)}, "Unknown face recogniser 'arcface'"),
        # a target at or below the threshold would release faces still verified as the original
        ((192, 192, 3), {"identity_targets": {"sface": 0.5}}, "above its same-person threshold"),
        ((192, 192, 3), {"generator_weights": "/nowhere/g.pt"}, "is not a file"),
    ],
)
def test_plan_refusals(public, shape, config, message) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        MECHANISM.plan(FaceDeidConfig.create(**config), _info(shape), [], public)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"no_face": "blur"}, 'no_face must be one of "withhold", "refuse", got "blur"'),
        ({"search_strengths": []}, "search_strengths must list"),
        ({"identity_threshold": float("nan")}, "finite"),
        ({"identity_margin": 1e308}, "between 0 and 10"),
        ({"inversion_steps": True}, "whole number from 0 to 10,000, got True"),
        ({"colour": 1}, "Unknown \\[face-deid\\] parameter"),
        ({"embedder": "dlib"}, "Unknown \\[face-deid\\] parameter.*recognisers"),
        ({"recognisers": []}, "recognisers must list"),
        ({"recognisers": [3]}, "recognisers must list"),
        ({"identity_targets": {"sface": float("inf")}}, "finite"),
        ({"identity_targets": {"sface": -1}}, "between 0 and 10"),
        ({"identity_targets": "far"}, "identity_targets must map"),
        ({"acknowledge_no_held_out": "yes"}, "true or false"),
    ],
)
def test_config_refusals(params, message) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        MECHANISM.make_config(params, _info((192, 192, 3)), None, "default")


def test_n_images_is_refused() -> None:
    with pytest.raises(InvalidParameterError, match="remove n_images"):
        MECHANISM.make_config({}, _info((192, 192, 3)), 10, "default")


def test_refuses_without_acknowledgement(store, photos, public, tools, tmp_path) -> None:
    with pytest.raises(PrivReleaseError, match="acknowledge"):
        _run(store, photos, public, FaceDeidConfig.tiny(), "r0", tmp_path, tools=tools, ack=False)
    assert ledger.get_charge(store, "r0") is None


@pytest.mark.smoke
def test_full_run_replaces_every_face_and_withholds_the_photo_without_one(
    store, photos, public, tools, tmp_path
) -> None:
    bars = []
    res = _run(
        store,
        photos,
        public,
        FaceDeidConfig.tiny(),
        "run-1",
        tmp_path,
        tools=tools,
        progress=lambda s, d, t: bars.append((s, d, t)),
    )
    out = res.output
    assert out.images.shape == (3, 192, 192, 3) and out.images.dtype == np.uint8
    assert out.withheld == {2: "no face detected"}  # the cup
    assert [c.tolist() for c in out.clusters] == [[0], [1], [3]]  # each photo's source record
    assert out.extra_images["face"].shape == (3, 64, 64, 3)
    p = res.parameters
    assert (p["n_photos"], p["n_released"], p["n_withheld"], p["n_faces"]) == (4, 3, 1, 4)
    assert p["photos_with_several_faces"] == 1
    assert p["n_faces_generated"] + p["n_faces_pixelated"] == 4
    assert ("face-deid: photos", 4, 4) in bars
    faces = out.internal["faces"]
    assert len(faces["3"]) == 2 and faces["2"] == []
    assert p["searched_recognisers"] == ["sface", "facenet"]
    # every released face fails verification for each searched recogniser, measured here with
    # each one's own pipeline on the whole photo (not the search's window)
    for key in ("sface", "facenet"):
        rec = fr.recogniser(key)
        for row, src in enumerate([0, 1, 3]):
            assert not np.array_equal(out.images[row], photos.images[src])
            for face in fm.detect(photos.images[src]):
                before = rec.at(photos.images[src], face.box)
                after = rec.at(out.images[row], face.box)
                if before is None or after is None:
                    continue
                assert rec.distances(after.embedding, before.embedding)[0] >= rec.threshold
    assert res.guarantee.kind == "empirical" and "sface 0.85" in res.guarantee.description
    charge = ledger.get_charge(store, "run-1")
    assert charge.state == "committed" and ledger.budget(store, "faces").dp_void
    assert any(e["action"] == "run.sensitive_access" for e in trail.entries(store))


def test_no_face_refuse_fails_after_reading_and_stays_charged(
    store, photos, public, tools, tmp_path
) -> None:
    cfg = FaceDeidConfig.tiny().with_(no_face="refuse")
    with pytest.raises(
        DataFormatError, match='photo 2 has no detectable face, and no_face = "refuse"'
    ):
        _run(store, photos, public, cfg, "r-x", tmp_path, tools=tools)
    assert ledger.get_charge(store, "r-x").state == "reserved"
    assert ledger.budget(store, "faces").dp_void


def test_a_bad_generator_file_is_refunded_before_reading(store, photos, public, tmp_path) -> None:
    bad = tmp_path / "g.pt"
    bad.write_bytes(b"not a checkpoint")
    cfg = FaceDeidConfig.tiny().with_(generator_weights=str(bad))
    with pytest.raises(DataFormatError, match="not a PyTorch checkpoint"):
        runner.run_charged(
            store,
            run_id="r-gen",
            dataset="faces",
            data=photos,
            public=public,
            mechanism="face-deid",
            config=cfg,
            plan=_plan(store, public, cfg),
            workdir=tmp_path / "w2",
            acknowledge_non_dp=True,
            actor="alice",
        )
    assert ledger.get_charge(store, "r-gen").state == "refunded"
    assert not ledger.budget(store, "faces").dp_void


def test_weights_of_another_architecture_are_named(tmp_path) -> None:
    from synth.mechanisms.face_deid.generator import load_generator

    other = tmp_path / "small.pt"
    torch.save({"netG_state_dict": {"main.0.weight": torch.zeros(3, 3)}}, other)
    with pytest.raises(DataFormatError, match="do not fit a DCGAN generator with latent_dim=100"):
        load_generator(str(other), 100, 64)


def test_the_mechanism_is_registered_with_its_card_words() -> None:
    assert "face-deid" in registry.names()
    about = registry.describe(
        "face-deid",
        {"identity_threshold": 0.6, "identity_margin": 0.1, "n_withheld": 1},
        {"type": "empirical"},
        3,
    )
    assert about.guarantee.startswith("**Empirical de-identification, not differential privacy.**")
    assert "1 photograph(s) with no detectable face were withheld" in about.what
    assert "differential-privacy" not in about.tags


def test_generator_weights_swapped_after_approval_are_refused_before_reading(
    store, photos, public, tmp_path
) -> None:
    """Issue 57, item 5: the plan binds every file the run reads besides the data (the generator's
    weights, the searched recognisers' models) by sha256; a file changed after the plan stops the
    run before it reads a photo (refunded), naming the file."""
    from accounting.errors import TamperError
    from synth.mechanisms.face_deid.generator import packaged_weights

    mine = tmp_path / "mine.pt"
    mine.write_bytes(packaged_weights().read_bytes())
    cfg = FaceDeidConfig.tiny().with_(generator_weights=str(mine))
    approved = _plan(store, public, cfg)
    assert str(mine) in approved.detail["bound_files"]
    assert len(approved.detail["bound_files"]) == 4  # weights, YuNet, SFace, FaceNet
    state = torch.load(mine, map_location="cpu", weights_only=True)
    weights = state.get("netG_state_dict", state)
    name = next(k for k, v in weights.items() if v.is_floating_point())
    weights[name] = weights[name] + 0.01  # another generator of the same architecture
    torch.save(state, mine)
    with pytest.raises(TamperError, match="mine.pt changed after the release was approved"):
        runner.run_charged(
            store,
            run_id="r-swap",
            dataset="faces",
            data=photos,
            public=public,
            mechanism="face-deid",
            config=cfg,
            plan=approved,
            workdir=tmp_path / "w3",
            acknowledge_non_dp=True,
            actor="alice",
        )
    assert ledger.get_charge(store, "r-swap").state == "refunded"
    assert not any(e["action"] == "run.sensitive_access" for e in trail.entries(store))
