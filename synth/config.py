"""The one way a mechanism's run parameters are written: frozen configs, their field checks, presets
as data, one JSON form.

A mechanism's config is a `@dataclass(frozen=True)` that inherits `MechanismConfig`:

- `checked(values) -> values` (a classmethod) is the one place its fields are checked, written with
  the checks below; it returns the canonical values (whole numbers as int, numbers as float, lists
  as tuples) and raises InvalidParameterError saying what was wrong and what to do;
- `__post_init__` (here) runs those checks on the stored values and rewrites nothing: a value that
  is valid but not canonical (a list where a tuple belongs) is refused, naming its canonical form;
  `create(**values)`, `preset(name, ...)` and `with_(...)` build configs from canonical values;
- `PRESETS` is data: preset name -> field overrides ("default" is the fields' own defaults), so a
  preset is listed (`presets()`, `registry.presets`) without building a config;
- `as_dict()` is the JSON of its parameters (the plan's and the card's), `from_dict` reads it back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from numbers import Integral, Real
from typing import Any, ClassVar, Self

from accounting.errors import InvalidParameterError
from accounting.validation import check_count, check_delta, check_epsilon, check_sigma, finite

DEFAULT_PRESET = "default"

# ------------------------------------------------------------------ field checks


def _span(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        if not low_open and not high_open:
            return f"between {low:g} and {high:g}"
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high:g}"
    return ""


def number(
    name: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    hint: str = "",
) -> float:
    """A finite number within [low, high] (either end open, or absent), as a float; `hint` says
    what the number means or what to give ("e.g. 0.999")."""
    span = _span(low, high, low_open, high_open)
    wanted = f"a finite number {span}"
    v = finite(name, value, wanted.strip())
    if (low is not None and (v < low or (low_open and v == low))) or (
        high is not None and (v > high or (high_open and v == high))
    ):
        raise InvalidParameterError(f"{name} must be {wanted.strip()}, got {v:g}{_hint(hint)}.")
    return v


def positive(name: str, value: object, high: float | None = None, hint: str = "") -> float:
    """A finite number > 0 (and <= high where given), as a float."""
    return number(name, value, 0.0, high, low_open=True, hint=hint)


def whole(name: str, value: object, low: int = 1, high: int | None = None, hint: str = "") -> int:
    """A whole number in [low, high] (no upper end where `high` is None), as an int; a float that
    is whole (3.0) is read as that int."""
    span = f"from {low:,} to {high:,}" if high is not None else f">= {low:,}"
    wanted = f"a whole number {span}"
    if isinstance(value, bool) or not isinstance(value, (Integral, Real)):
        raise InvalidParameterError(f"{name} must be {wanted}, got {value!r}{_hint(hint)}.")
    v = finite(name, value, wanted)
    if v != int(v):
        raise InvalidParameterError(f"{name} must be {wanted}, got {value!r}{_hint(hint)}.")
    if v < low or (high is not None and v > high):
        raise InvalidParameterError(f"{name} must be {wanted}, got {int(v):,}{_hint(hint)}.")
    return int(v)


def even(name: str, value: object, low: int, high: int, wanted: str = "an even number") -> int:
    """An even whole number in [low, high], as an int; `wanted` names it in the errors ("an even
    number of channels")."""
    v = whole(name, value, low, high, hint=wanted)
    if v % 2:
        raise InvalidParameterError(f"{name} must be {wanted} from {low:,} to {high:,}, got {v:,}.")
    return v


def choice(name: str, value: object, choices: Iterable[object], hint: str = "") -> Any:
    """One of `choices`, unchanged."""
    options = tuple(choices)
    # true is not 1 here: a flag where a number belongs (or the reverse) is refused
    if not any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in options):
        shown = ", ".join(_toml(c) for c in options)
        raise InvalidParameterError(
            f"{name} must be one of {shown}, got {_toml(value)}{_hint(hint)}."
        )
    return value


def flag(name: str, value: object, hint: str = "") -> bool:
    """true or false."""
    if not isinstance(value, bool):
        raise InvalidParameterError(f"{name} must be true or false, got {value!r}{_hint(hint)}.")
    return value


def entries(
    name: str,
    values: object,
    check: Callable[[str, object], Any],
    *,
    least: int = 1,
    most: int | None = None,
    example: str = "",
) -> tuple[Any, ...]:
    """A list of `least` to `most` entries, each passed through `check(name + ' entry', entry)`,
    as a tuple."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise InvalidParameterError(f"{name} must be a list{_example(example)}, got {values!r}.")
    items = tuple(values)
    if len(items) < least or (most is not None and len(items) > most):
        count = f"{least} to {most}" if most is not None else f"at least {least}"
        raise InvalidParameterError(
            f"{name} must list {count} entries{_example(example)}, got {len(items)}."
        )
    return tuple(check(f"{name} entry", v) for v in items)


def count(name: str, value: object) -> int:
    """A count of things (steps, images, a batch): a whole number from 1 to
    accounting.validation.MAX_COUNT."""
    return check_count(value, name)


def epsilon(name: str, value: object) -> float:
    """A privacy budget: finite, > 0, at most accounting.validation.MAX_EPSILON."""
    return check_epsilon(value, name)


def delta(name: str, value: object) -> float:
    """A DP delta in (0, 1)."""
    return check_delta(value, name)


def sigma(name: str, value: object) -> float:
    """A noise multiplier the accountants handle (accounting.validation.check_sigma)."""
    return check_sigma(value, name)


def device(name: str, value: object, prefixes: tuple[str, ...] = ("cpu", "cuda")) -> str:
    """ "auto", or a torch device starting with one of `prefixes` ("cuda:1")."""
    if value == "auto" or (isinstance(value, str) and value.startswith(prefixes)):
        return value
    shown = ", ".join(f"'{p}[:N]'" if p == "cuda" else f"'{p}'" for p in prefixes)
    raise InvalidParameterError(f"{name} must be 'auto', {shown}; got {value!r}.")


def _hint(hint: str) -> str:
    return f" ({hint})" if hint else ""


def _example(example: str) -> str:
    return f", e.g. {example}" if example else ""


def _toml(value: object) -> str:
    """A value as the spec's TOML writes it (true, "auto", 3)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


# ------------------------------------------------------------------ the config base


def _json(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    return value


class MechanismConfig:
    """The base of every mechanism's frozen config dataclass (see the module's docstring)."""

    # preset name -> field overrides; "default" (the fields' defaults) is always there
    PRESETS: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    @classmethod
    def checked(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every field of `values` (all the config's fields) checked, in canonical form; raises
        InvalidParameterError naming what was wrong and what to do."""
        raise NotImplementedError

    def __post_init__(self) -> None:
        given = self.field_values()
        canonical = type(self).checked(given)
        for name, value in canonical.items():
            if value != given[name]:
                raise InvalidParameterError(
                    f"{name} = {given[name]!r} is valid but must be written {value!r} in a "
                    f"{type(self).__name__}; {type(self).__name__}.create(...) writes it so."
                )

    # ---------------------------------------------------------- building
    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    @classmethod
    def create(cls, *args: Any, **values: Any) -> Self:
        """A config from field values (positional ones fill the leading fields), checked and
        written in canonical form; an unknown or missing field is refused, naming the valid
        ones."""
        names = cls.field_names()
        if len(args) > len(names):
            raise InvalidParameterError(
                f"{cls.__name__} has {len(names)} fields, got {len(args)} positional values."
            )
        values = {**dict(zip(names, args, strict=False)), **values}
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise InvalidParameterError(
                f"Unknown {cls.__name__} field(s) {unknown}; the fields are {sorted(names)}."
            )
        filled: dict[str, Any] = {}
        missing = []
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name in values:
                filled[f.name] = values[f.name]
            elif f.default is not dataclasses.MISSING:
                filled[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                filled[f.name] = f.default_factory()
            else:
                missing.append(f.name)
        if missing:
            raise InvalidParameterError(f"{cls.__name__} needs {', '.join(missing)}.")
        return cls(**cls.checked(filled))

    @classmethod
    def presets(cls) -> tuple[str, ...]:
        """The preset names, "default" first."""
        return (DEFAULT_PRESET, *cls.PRESETS)

    @classmethod
    def check_preset(cls, name: object) -> None:
        """Refuse a preset this config does not have, naming those it has."""
        if name not in cls.presets():
            raise InvalidParameterError(
                f"preset = {name!r} does not exist for this mechanism; choose one of "
                f"{', '.join(repr(p) for p in cls.presets())}, or leave `preset` out (default)."
            )

    @classmethod
    def preset(cls, name: str, *args: Any, **values: Any) -> Self:
        """Preset `name`'s overrides, then `values` (positional ones fill the leading fields)."""
        cls.check_preset(name)
        given = {**dict(zip(cls.field_names(), args, strict=False)), **values}
        return cls.create(**{**cls.PRESETS.get(name, {}), **given})

    @classmethod
    def demo(cls, *args: Any, **values: Any) -> Self:
        """The "demo" preset (CPU-sized, the demo's and the docs' settings)."""
        return cls.preset("demo", *args, **values)

    @classmethod
    def tiny(cls, *args: Any, **values: Any) -> Self:
        """The "tiny" preset, for tests: seconds, meaningless quality."""
        return cls.preset("tiny", *args, **values)

    def field_values(self) -> dict[str, Any]:
        """The field values as stored (tuples stay tuples)."""
        return {name: getattr(self, name) for name in self.field_names()}

    def with_(self, **changes: Any) -> Self:
        """This config with `changes`, checked and in canonical form."""
        return type(self).create(**{**self.field_values(), **changes})

    # ---------------------------------------------------------- JSON
    def as_dict(self) -> dict[str, Any]:
        """The parameters as JSON (tuples as lists): what the plan, the release and its card
        record."""
        return {name: _json(value) for name, value in self.field_values().items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """The config `as_dict` wrote."""
        return cls.create(**dict(data))
