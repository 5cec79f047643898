"""How a configuration section is typed, checked and built from plain data.

A section is a frozen dataclass; each field's type hint is its schema
(:func:`coerce` reads plain data as that type, naming the dotted key in every
error) and :func:`field` attaches a range check (one of the checks here:
:func:`positive`, :func:`at_least`, :func:`one_of`, ...) or a builder of its
own. :func:`build_section` builds a section from a mapping, refusing an
unknown key with the closest known one. A new key is a new field of its
section: a type hint, a default and, where it has a range, a check; a key
whose value needs building of its own (e.g. an algorithm's parameters,
whose schema depends on the algorithm's name) gives ``field(..., build=f)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import types
import typing
from collections import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpfl._validate import parse_number, shown
from dpfl.errors import InvalidParameterError

__all__ = [
    "INT_RANGE",
    "Check",
    "ConfigError",
    "at_least",
    "between",
    "build_section",
    "check_numbers",
    "check_options",
    "coerce",
    "field",
    "finite_nonnegative",
    "finite_positive",
    "nonnegative",
    "one_of",
    "positive",
    "unknown_key",
]

#: A range check: ``None`` when the value is fine, else what it must be.
Check = Callable[[Any], "str | None"]

#: The integers a configuration may hold anywhere (free-form ``options``
#: included): 64-bit, what numpy and torch take. NaN is refused anywhere too.
INT_RANGE = (-(2**63), 2**63 - 1)


class ConfigError(InvalidParameterError):
    """A configuration key is unknown, has the wrong type, or is out of range."""


# -- range checks (attached to fields as metadata) ------------------------------
def positive(v: Any) -> str | None:
    """``> 0`` (``None`` passes)."""
    return None if v is None or v > 0 else "must be > 0"


def at_least(m: int) -> Check:
    """``>= m`` (``None`` passes)."""

    def check(v: Any) -> str | None:
        return None if v is None or v >= m else f"must be >= {m}"

    return check


def nonnegative(v: Any) -> str | None:
    """``>= 0`` (``None`` passes)."""
    return None if v is None or v >= 0 else "must be >= 0"


def finite_positive(v: Any) -> str | None:
    """``> 0`` and finite (``None`` passes)."""
    return None if v is None or 0 < v < math.inf else "must be > 0 and finite"


def finite_nonnegative(v: Any) -> str | None:
    """``>= 0`` and finite (``None`` passes)."""
    return None if v is None or 0 <= v < math.inf else "must be >= 0 and finite"


def one_of(choices: Sequence[str | None]) -> Check:
    """One of ``choices``."""

    def check(v: Any) -> str | None:
        return None if v in choices else f"must be one of {list(choices)}"

    return check


def between(low: int, high: int, why: str = "") -> Check:
    """In ``[low, high]`` (``None`` passes); ``why`` ends the message."""

    def check(v: Any) -> str | None:
        return (
            None
            if v is None or low <= v <= high
            else f"must be in [{low}, {high}]{why}"
        )

    return check


def field(
    default: Any = dataclasses.MISSING,
    check: Check | None = None,
    *,
    default_factory: Callable[[], Any] | None = None,
    build: Callable[[Any, str], Any] | None = None,
) -> Any:
    """A section's field with its range ``check`` and/or its own ``build``.

    ``build(value, prefix)`` builds the field's value from plain data instead
    of :func:`coerce` (``prefix``: the dotted key and a dot).
    """
    meta: dict[str, Any] = {}
    if check is not None:
        meta["check"] = check
    if build is not None:
        meta["build"] = build
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# -- building ---------------------------------------------------------------------
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def coerce(key: str, value: Any, tp: Any) -> Any:
    """Return ``value`` as type ``tp`` or raise a ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            with contextlib.suppress(ConfigError):
                return coerce(key, value, a)
        raise ConfigError(
            f"{key} must be {_type_name(tp)}; got {shown(value)} "
            f"({type(value).__name__})"
        )
    if tp is Any:
        return value
    if origin in (list, tuple, abc.Sequence) or tp in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key} must be a list; got {shown(value)}")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        return [coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value)]
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(
                f"{key} must be one of {list(typing.get_args(tp))}; got {shown(value)}"
            )
        return value
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key} must be a mapping; got {shown(value)}")
        return {str(k): v for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{key} must be a mapping (a section); got {shown(value)}"
            )
        return build_section(tp, value, key + ".")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false; got {shown(value)}")
        return value
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be an integer; got {shown(value)}")
        if isinstance(value, str):
            value = _spelled(key, value, integer=True)
        if isinstance(value, int):
            if not INT_RANGE[0] <= value <= INT_RANGE[1]:
                raise ConfigError(f"{key} must be a 64-bit integer; got {shown(value)}")
            return value
        if isinstance(value, float) and value.is_integer():
            if not INT_RANGE[0] <= value <= INT_RANGE[1]:
                raise ConfigError(f"{key} must be a 64-bit integer; got {shown(value)}")
            return int(value)
        raise ConfigError(
            f"{key} must be an integer; got {shown(value)} ({type(value).__name__})"
        )
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key} must be a number; got {shown(value)}")
        if isinstance(value, str):
            value = _spelled(key, value, integer=False)
        if not isinstance(value, int | float):
            raise ConfigError(
                f"{key} must be a number; got {shown(value)} ({type(value).__name__})"
            )
        if isinstance(value, int) and abs(value) > 1e300:  # float() would overflow
            raise ConfigError(f"{key} must be a number below 1e300; got {shown(value)}")
        if math.isnan(value):
            raise ConfigError(f"{key} must not be NaN; got {shown(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(
                f"{key} must be a string; got {shown(value)} ({type(value).__name__})"
            )
        return value
    return value  # pragma: no cover - every field type is handled above


def _spelled(key: str, text: str, *, integer: bool) -> int | float:
    """A number written as a string, read by the one rule of dpfl's numbers.

    (:func:`dpfl._validate.parse_number`: ASCII digits, sign, point and
    exponent; no ``_``, spaces or other scripts' digits.)
    """
    try:
        return parse_number(text, integer=integer)
    except ValueError:
        what = "an integer" if integer else "a number"
        raise ConfigError(
            f"{key} must be {what} written in ASCII digits (e.g. "
            f"{'100 or 1e3' if integer else '0.5 or 1e-5'}; no '_', spaces or "
            f"other digits); got {shown(text)} (str)"
        ) from None


def unknown_key(prefix: str, key: str, known: Sequence[str]) -> ConfigError:
    """The error for an unknown key, with the closest known one."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.5)
    hint = f"; did you mean {prefix + close[0]!r}?" if close else ""
    return ConfigError(
        f"unknown configuration key {shown(prefix + key)}{hint} "
        f"(known keys{' of ' + prefix.rstrip('.') if prefix else ''}: "
        f"{', '.join(known)})"
    )


def build_section(cls: type, data: Mapping[str, Any], prefix: str = "") -> Any:
    """Build section ``cls`` from ``data``, naming ``prefix + key`` in errors."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str) or key not in fields:
            raise unknown_key(prefix, str(key), list(fields))
        dotted = prefix + key
        build = fields[key].metadata.get("build")
        if build is not None:
            kwargs[key] = build(value, dotted + ".")
            continue
        v = coerce(dotted, value, hints[key])
        check = fields[key].metadata.get("check")
        if check is not None:
            problem = check(v)
            if problem:
                raise ConfigError(f"{dotted} {problem}; got {shown(value)}")
        kwargs[key] = v
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except InvalidParameterError as exc:
        # A section's own validation (e.g. an algorithm's Params): name the key.
        raise ConfigError(f"{prefix}{exc}") from None


def check_options(
    prefix: str,
    options: Mapping[str, Any],
    schema: Mapping[str, tuple[Any, bool]],
    given: Mapping[str, str],
) -> dict[str, Any]:
    """Check free-form ``options`` against the keywords of what receives them.

    Each option must be a keyword of the data loader or model (``schema``:
    name to type hint and whether it is required), of its type: a boolean is
    ``true`` or ``false`` (never a string such as ``"yes"``), a number follows
    the one rule of numbers; an option that a section key already sets
    (``given``: option to that key) is refused, as a key given twice.
    Numbers come back as the type their keyword takes.
    """
    out: dict[str, Any] = {}
    for key, value in options.items():
        dotted = f"{prefix}.{key}"
        if key in given:
            raise ConfigError(
                f"{dotted} is set by {given[key]}: a key given in two places is "
                f"refused; keep one; got {shown(value)}"
            )
        if key not in schema:
            raise unknown_key(
                prefix + ".", key, sorted(k for k in schema if k not in given)
            )
        checked = coerce(dotted, value, schema[key][0])
        plain = isinstance(checked, int | float) and not isinstance(checked, bool)
        out[key] = checked if plain else value
        if plain and isinstance(checked, float) and math.isnan(checked):
            raise ConfigError(f"{dotted} must not be NaN; got {shown(value)}")
    return out


def check_numbers(node: Any, key: str) -> None:
    """Refuse NaN or an integer outside 64 bits anywhere, naming the key."""
    if isinstance(node, Mapping):
        for k, v in node.items():
            check_numbers(v, f"{key}.{k}" if key else str(k))
    elif isinstance(node, list | tuple):
        for i, v in enumerate(node):
            check_numbers(v, f"{key}[{i}]")
    elif isinstance(node, int) and not INT_RANGE[0] <= node <= INT_RANGE[1]:
        raise ConfigError(
            f"{key[:60]} must be a 64-bit integer (at most {INT_RANGE[1]} in size); "
            f"got {shown(node)}"
        )
    elif isinstance(node, float) and math.isnan(node):
        raise ConfigError(f"{key[:60]} must not be NaN; got nan")
