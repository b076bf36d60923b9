"""One config dialect for every mechanism (issue 55): frozen configs whose checks rewrite nothing,
one set of field checks with messages that say what was wrong and what to do, presets as data,
one JSON form (`as_dict`)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from accounting.errors import InvalidParameterError
from synth import registry
from synth.mechanisms.deface_reface.config import DefaceConfig, RefaceConfig
from synth.mechanisms.face_deid.config import FaceDeidConfig
from synth.mechanisms.ksalsa.config import KSalsaConfig
from synth.mechanisms.merf.config import MerfConfig
from synth.mechanisms.privimage.config import PrivImageConfig
from synth.registry import DatasetInfo

IMAGES = DatasetInfo("d", "d", 5000, tuple(range(10)), (28, 28), 1e-5)
# a valid config of each mechanism, and one float and one whole-number field of it
CONFIGS = {
    "privimage": (PrivImageConfig.tiny(4.0, 1e-5), "lr", "batch_size"),
    "merf": (MerfConfig.tiny(4.0, 1e-5), "query_share", "z_dim"),
    "ksalsa": (KSalsaConfig.tiny(3), "lambda_content", "steps"),
    "face-deid": (FaceDeidConfig.tiny(), "identity_margin", "bank_size"),
    "deface": (DefaceConfig(), "brain_margin_mm", "quickshear_buffer"),
    "reface": (RefaceConfig(), "brain_margin_mm", None),
}


def test_every_mechanism_config_type_is_one_of_these() -> None:
    assert {registry.get(n).config_type for n in registry.names()} == {
        type(c) for c, _, _ in CONFIGS.values()
    }


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_config_is_frozen(name: str) -> None:
    config, number, _ = CONFIGS[name]
    assert dataclasses.is_dataclass(config) and type(config).__dataclass_params__.frozen
    before = getattr(config, number)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(config, number, 0.5)
    assert getattr(config, number) == before


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_infinite_numbers_are_refused_naming_the_field(name: str, bad: float) -> None:
    config, number, _ = CONFIGS[name]
    with pytest.raises(InvalidParameterError) as refused:
        config.with_(**{number: bad})
    message = str(refused.value)
    said = "NaN" if math.isnan(bad) else "infinite"
    assert message.startswith(f"{number} is {said}; give a finite number"), message


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_negative_numbers_are_refused_saying_the_valid_range(name: str) -> None:
    config, number, count = CONFIGS[name]
    for field in (f for f in (number, count) if f is not None):
        with pytest.raises(InvalidParameterError) as refused:
            config.with_(**{field: -1})
        message = str(refused.value)
        assert message.startswith(f"{field} must be a") and "got -1" in message, message
        assert "finite number" in message or "whole number" in message, message


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_direct_construction_is_checked_too(name: str) -> None:
    config, number, _ = CONFIGS[name]
    with pytest.raises(InvalidParameterError, match=f"^{number} is NaN"):
        dataclasses.replace(config, **{number: math.nan})


def test_a_valid_value_in_another_form_is_refused_naming_its_canonical_form() -> None:
    """__post_init__ rewrites nothing: a list where a tuple belongs is refused, and create()
    writes it canonically."""
    with pytest.raises(InvalidParameterError, match=r"must be written \(16, 32\)"):
        PrivImageConfig(epsilon=1.0, delta=1e-5, unet_channels=[16, 32])  # type: ignore[arg-type]
    built = PrivImageConfig.create(epsilon=1.0, delta=1e-5, unet_channels=[16, 32])
    assert built.unet_channels == (16, 32)
    assert FaceDeidConfig.create(recognisers=["sface", "sface"]).recognisers == ("sface",)


def test_an_unknown_field_names_the_valid_ones() -> None:
    with pytest.raises(InvalidParameterError) as refused:
        MerfConfig.create(epsilon=1.0, delta=1e-5, n_featurez=64)
    message = str(refused.value)
    assert "['n_featurez']" in message and "'n_features'" in message and "'z_dim'" in message
    with pytest.raises(InvalidParameterError) as refused:
        registry.get("ksalsa").make_config({"k": 3, "gird": 2}, IMAGES, None, "default")
    assert "Unknown [ksalsa] parameter(s) ['gird']" in str(refused.value)
    assert "'grid'" in str(refused.value)


def test_an_unknown_preset_names_the_valid_ones() -> None:
    with pytest.raises(InvalidParameterError) as refused:
        registry.get("privimage").make_config({"epsilon": 1.0}, IMAGES, None, "huge")
    assert str(refused.value) == (
        "[privimage] preset = 'huge' does not exist for this mechanism; choose one of 'default', "
        "'demo', 'tiny', or leave `preset` out (default)."
    )
    with pytest.raises(
        InvalidParameterError, match=r"^\[merf\] preset = 'demo'.*'default', 'tiny'"
    ):
        registry.check_preset("merf", "demo")
    with pytest.raises(InvalidParameterError, match="choose one of 'default', 'tiny'"):
        MerfConfig.demo(1.0, 1e-5)


def test_presets_are_data_listed_without_building_a_config(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("listing presets built a config")

    for name in registry.names():
        monkeypatch.setattr(registry.get(name).config_type, "create", refuse)
    assert {n: registry.presets(n) for n in registry.names()} == {
        "privimage": ("default", "demo", "tiny"),
        "ksalsa": ("default", "demo", "tiny"),
        "merf": ("default", "tiny"),
        "deface": ("default", "demo", "tiny"),
        "reface": ("default", "demo", "tiny"),
        "face-deid": ("default", "demo", "tiny"),
    }
    assert MerfConfig.PRESETS["tiny"]["n_features"] == 256


def test_a_preset_is_its_overrides_on_the_defaults() -> None:
    for cls, first in ((PrivImageConfig, (4.0, 1e-5)), (MerfConfig, (4.0, 1e-5))):
        for preset, overrides in cls.PRESETS.items():
            built = cls.preset(preset, *first)
            plain = cls.create(*first)
            for field in cls.field_names():
                expected = overrides.get(field, getattr(plain, field))
                assert getattr(built, field) == expected, (cls.__name__, preset, field)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_as_dict_is_json_and_reads_back(name: str) -> None:
    config, _, _ = CONFIGS[name]
    d = config.as_dict()
    assert not any(isinstance(v, tuple) for v in d.values())
    assert type(config).from_dict(d) == config
    assert not hasattr(config, "public_parameters")
