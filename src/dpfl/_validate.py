"""Input validation at the public boundary, shared by every layer of dpfl.

Each check raises :class:`dpfl.errors.InvalidParameterError` whose message
names the parameter, the constraint and the value received.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

from dpfl.errors import InvalidParameterError


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidParameterError(f"{name} must be a real number; got {value!r}")
    x = float(value)
    if math.isnan(x):
        raise InvalidParameterError(f"{name} must not be NaN; got {value!r}")
    return x


def check_probability(
    name: str, value: object, *, allow_zero: bool = False, allow_one: bool = True
) -> float:
    """Return ``value`` as a float after checking it lies in (0, 1] (by default)."""
    x = _real(name, value)
    lo_ok = x >= 0 if allow_zero else x > 0
    hi_ok = x <= 1 if allow_one else x < 1
    if not (lo_ok and hi_ok):
        lo = "[0" if allow_zero else "(0"
        hi = "1]" if allow_one else "1)"
        raise InvalidParameterError(f"{name} must be in {lo}, {hi}; got {value!r}")
    return x


def check_delta(name: str, value: object) -> float:
    """Check that a δ lies in the open interval (0, 1)."""
    return check_probability(name, value, allow_zero=False, allow_one=False)


def check_positive(name: str, value: object, *, allow_inf: bool = False) -> float:
    """Check that ``value`` is a real number > 0 (finite unless ``allow_inf``)."""
    x = _real(name, value)
    if not x > 0 or (math.isinf(x) and not allow_inf):
        raise InvalidParameterError(f"{name} must be > 0 and finite; got {value!r}")
    return x


def check_nonnegative(name: str, value: object) -> float:
    """Check that ``value`` is a finite real number >= 0."""
    x = _real(name, value)
    if not (x >= 0 and math.isfinite(x)):
        raise InvalidParameterError(f"{name} must be >= 0 and finite; got {value!r}")
    return x


def check_count(name: str, value: object, *, minimum: int = 0) -> int:
    """Check that ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InvalidParameterError(f"{name} must be an integer; got {value!r}")
    if int(value) < minimum:
        raise InvalidParameterError(f"{name} must be >= {minimum}; got {value!r}")
    return int(value)
