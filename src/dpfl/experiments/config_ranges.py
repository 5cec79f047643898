"""The value ranges of a run configuration's own keys.

Each function takes a key's value (already of the key's type) and returns
``None`` if it is in range, else what the value must be, which
:mod:`dpfl.experiments.config` puts into its one-line error beside the key
and the value.
"""

from __future__ import annotations

import math
from typing import Any

from dpfl._validate import MAX_EPSILON, MIN_DELTA, NOISE_RANGE

__all__ = [
    "MAX_NAME_LENGTH",
    "address_problem",
    "delta_problem",
    "directory_problem",
    "epsilon_problem",
    "name_problem",
    "noise_problem",
]


def address_problem(v: Any) -> str | None:
    """``ray.address``: null (local), ``auto``, ``ray://...`` or host:port."""
    if v is None or v == "auto" or v.startswith("ray://"):
        return None
    host, sep, port = v.rpartition(":")
    if sep and host and port.isascii() and port.isdigit() and 0 < int(port) < 65536:
        return None
    return "must be null (a local Ray instance), 'auto' or 'host:port'"


def epsilon_problem(v: Any) -> str | None:
    """``privacy.epsilon``: in (0, MAX_EPSILON] or infinite."""
    if 0 < v <= MAX_EPSILON or v == math.inf:
        return None
    return f"must be in (0, {MAX_EPSILON:g}] (e^epsilon must stay finite) or .inf"


def noise_problem(v: Any) -> str | None:
    """``privacy.noise_multiplier``: null (calibrate), 0 or in the noise range."""
    if v is None or v == 0 or NOISE_RANGE[0] <= v <= NOISE_RANGE[1]:
        return None
    return (
        f"must be null (calibrate), 0 (no noise) or in [{NOISE_RANGE[0]:g}, "
        f"{NOISE_RANGE[1]:g}] (below, the privacy loss overflows; above, every "
        "epsilon is 0)"
    )


def delta_problem(v: Any) -> str | None:
    """``privacy.delta``: in [MIN_DELTA, 1)."""
    if MIN_DELTA <= v < 1:
        return None
    return (
        f"must be in [{MIN_DELTA:g}, 1) (below {MIN_DELTA:g} the accounting's "
        "double-precision rounding exceeds delta)"
    )


#: The longest run name (a folder name; most file systems allow 255 bytes).
MAX_NAME_LENGTH = 200


def name_problem(v: Any) -> str | None:
    """A run name is one folder inside ``output_dir``: it cannot leave it."""
    if (
        not v
        or not v.strip()
        or any(c in v for c in "/\\:")
        or v in (".", "..")
        or not v.isprintable()
        or len(v) > MAX_NAME_LENGTH
    ):
        return (
            "must be one folder name inside output_dir: non-empty, printable, at "
            f"most {MAX_NAME_LENGTH} characters, without '/', '\\' or ':', and "
            "not '.' or '..'"
        )
    return None


def directory_problem(v: Any) -> str | None:
    """``output_dir``: a non-empty, printable path."""
    if not v or not v.strip() or not v.isprintable():
        return "must be a non-empty, printable path"
    return None
