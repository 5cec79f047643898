"""Input validation at the public boundary, shared by every layer of dpfl.

Each check raises :class:`dpfl.errors.InvalidParameterError` whose message
names the parameter, the constraint and the value received.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from numbers import Integral, Real

from dpfl.errors import InvalidParameterError

#: The most characters of a user's value an error message echoes.
ECHO_LIMIT = 80

#: The most rounds a command or a run configuration accepts: the range in
#: which the accounting answers within its time and memory bounds (composing
#: T rounds of a subsampled mechanism; T <= 1e5).
MAX_ROUNDS = 100_000

#: The noise multipliers a command or a run accepts (besides a run's 0, no
#: noise): below 1e-3 the privacy loss of a Gaussian overflows double
#: precision; above 1e6 every analysis reports epsilon = 0.
NOISE_RANGE = (1e-3, 1e6)

#: The largest finite epsilon a command or a run accepts: e^epsilon must be
#: a finite double (it overflows past 709), and no guarantee is left long
#: before that.
MAX_EPSILON = 500.0

#: The largest ε a noise multiplier is calibrated to. Past it no guarantee is
#: left (e^100 is about 2.7e43), and the noise such a budget allows is so
#: small that the accounting's cost to price it grows without bound (calibrating
#: DP-FedAvg to ε = 500 searched for minutes). A budget up to
#: :data:`MAX_EPSILON` may still guard a run whose σ is given.
MAX_CALIBRATED_EPSILON = 100.0

#: The largest seed: numpy's and torch's generators take 64-bit seeds.
MAX_SEED = 2**63 - 1

#: The smallest δ a command or a run accepts. The accounting computes δ in
#: double precision, whose rounding (about 1e-16 of the probability mass,
#: accumulated over a composition) it cannot tell apart from a smaller δ.
MIN_DELTA = 1e-15

# -- the spelling of a number ------------------------------------------------------
#: An integer: an optional sign and ASCII digits.
INT_PATTERN = r"[-+]?[0-9]+"
#: A decimal number: an optional sign, ASCII digits with an optional point,
#: an optional exponent (``1e-5``, ``.5``, ``2.``, ``-3.0E+2``).
FLOAT_PATTERN = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
#: Infinity, as YAML (``.inf``) or Python (``inf``) spell it, any case.
INF_PATTERN = r"[-+]?\.?(?:[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)"
#: Not a number, as YAML (``.nan``) or Python (``nan``) spell it: read as
#: NaN so that the refusal says so.
NAN_PATTERN = r"\.?[nN][aA][nN]"
#: The longest spelling read (longer text is not a number dpfl takes).
NUMBER_CHARS = 100

_INT_RE = re.compile(INT_PATTERN)
_REAL_RE = re.compile(f"{FLOAT_PATTERN}|{INF_PATTERN}|{NAN_PATTERN}")


def parse_number(text: str, *, integer: bool = False) -> int | float:
    """Read a number spelled in text: the one rule of configurations and flags.

    The rule: ASCII digits ``0``-``9`` only, with an optional sign, decimal
    point and exponent (``3``, ``-0.5``, ``1e-5``, ``.5``), or ``inf`` /
    ``.inf`` (any case, with a sign) and ``nan``; nothing else. No spaces
    (not even around the number), no ``_`` between digits, no hexadecimal or
    octal, no other script's digits (full-width, Arabic-Indic, ...), no
    no-break space: each of those is refused, never guessed.

    Parameters
    ----------
    text : str
        The spelling.
    integer : bool
        Read an integer: any spelling above whose value is a whole number
        (``100``, ``1e3``, ``100.0``), read exactly.

    Returns
    -------
    int or float
        An int (an integer's spelling, or ``integer``), else a float (NaN and
        infinities included: range checks are the caller's).

    Raises
    ------
    ValueError
        If ``text`` is not a number by this rule, spells a finite number
        that a double cannot hold (``1e400``, ``1e-400``), or (``integer``)
        is not a whole finite number below 2**63 in size.
    """
    if not isinstance(text, str) or len(text) > NUMBER_CHARS:
        raise ValueError("not a number")
    if _INT_RE.fullmatch(text):
        return int(text)
    if not _REAL_RE.fullmatch(text):
        raise ValueError("not a number")
    if not re.fullmatch(FLOAT_PATTERN, text):  # an infinity or NaN
        if integer:
            raise ValueError("not a whole number")
        if "nan" in text.lower():
            return math.nan
        return -math.inf if text.startswith("-") else math.inf
    if not integer:
        value = float(text)
        if math.isinf(value) or (
            value == 0 and re.search(r"[1-9]", text.split("e")[0].split("E")[0])
        ):
            raise ValueError("outside the range of a double")
        return value
    exact = Decimal(text)
    if abs(exact) >= 2**63 or exact != exact.to_integral_value():
        raise ValueError("not a whole number")
    return int(exact)


def shown(value: object, limit: int = ECHO_LIMIT) -> str:
    """``repr(value)``, cut to ``limit`` characters for an error message.

    A value a user typed (or a YAML file holds) may be megabytes long, or a
    structure whose repr is (a YAML alias bomb); an error names it by its
    start and its length, on one line.

    Parameters
    ----------
    value : object
        The value to show.
    limit : int
        The most characters kept.

    Returns
    -------
    str
        E.g. ``'abc'``, or ``'99999999...' (5000 characters)``.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > 4 * limit:  # repr of a huge int is slow
            return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    if isinstance(value, (list, tuple, dict, set)) and _size(value, limit) > limit:
        return f"a {type(value).__name__} too large to show"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 3]}... ({len(text)} characters)"


def _size(value: object, limit: int, depth: int = 0) -> int:
    """A lower bound on the repr length of a container, stopping past ``limit``."""
    if depth > 20:
        return limit + 1
    total = 2
    items = value.items() if isinstance(value, dict) else value
    for item in items:  # type: ignore[attr-defined]
        parts = item if isinstance(value, dict) else (item,)
        for part in parts:
            if isinstance(part, (list, tuple, dict, set)):
                total += _size(part, limit, depth + 1)
            else:
                total += len(shown(part, limit))
            if total > limit:
                return total
    return total


def _real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidParameterError(f"{name} must be a real number; got {shown(value)}")
    x = float(value)
    if math.isnan(x):
        raise InvalidParameterError(f"{name} must not be NaN; got {shown(value)}")
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
        raise InvalidParameterError(f"{name} must be in {lo}, {hi}; got {shown(value)}")
    return x


def check_delta(name: str, value: object) -> float:
    """Check that a δ lies in the open interval (0, 1)."""
    return check_probability(name, value, allow_zero=False, allow_one=False)


def check_positive(name: str, value: object, *, allow_inf: bool = False) -> float:
    """Check that ``value`` is a real number > 0 (finite unless ``allow_inf``)."""
    x = _real(name, value)
    if not x > 0 or (math.isinf(x) and not allow_inf):
        raise InvalidParameterError(
            f"{name} must be > 0 and finite; got {shown(value)}"
        )
    return x


def check_nonnegative(name: str, value: object) -> float:
    """Check that ``value`` is a finite real number >= 0."""
    x = _real(name, value)
    if not (x >= 0 and math.isfinite(x)):
        raise InvalidParameterError(
            f"{name} must be >= 0 and finite; got {shown(value)}"
        )
    return x


def check_count(name: str, value: object, *, minimum: int = 0) -> int:
    """Check that ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InvalidParameterError(
                f"{name} must be an integer; got {shown(value)}"
            )
    if int(value) < minimum:
        raise InvalidParameterError(f"{name} must be >= {minimum}; got {shown(value)}")
    return int(value)
