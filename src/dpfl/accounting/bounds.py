"""Results of an analysis: a bracketing :class:`Bound` and a :class:`Guarantee`.

A number reported by dpfl is an interval ``[lower, upper]`` around the true
value of the stated divergence; ``upper`` is the certified (pessimistic) value
used by plots and calibration, ``lower`` is what a tighter computation of the
*same* analysis could at best reach (equal to ``upper`` for closed forms).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

__all__ = ["Bound", "Guarantee"]


@dataclasses.dataclass(frozen=True, slots=True)
class Bound:
    """An interval bracketing a privacy parameter.

    Attributes
    ----------
    lower : float
        A value the true parameter is known to be at least.
    estimate : float
        The best point estimate (closed form, or the midpoint of the bracket).
    upper : float
        The certified (pessimistic) value; this is what dpfl reports.
    method : str
        Which computation answered (e.g. ``"gaussian-exact"``,
        ``"gdp-mixture"``, ``"pld"``, ``"pld-coarse"``, ``"rdp-fallback"``);
        empty where not recorded. Not part of equality.
    """

    lower: float
    estimate: float
    upper: float
    method: str = dataclasses.field(default="", compare=False)

    def __post_init__(self) -> None:
        if not (self.lower <= self.estimate <= self.upper) and not any(
            math.isnan(v) for v in (self.lower, self.estimate, self.upper)
        ):
            raise ValueError(
                f"Bound must satisfy lower <= estimate <= upper; got {self!r}"
            )

    @classmethod
    def exact(cls, value: float, method: str = "") -> Bound:
        """Return a degenerate bound for a value known in closed form."""
        v = float(value)
        return cls(v, v, v, method)

    @classmethod
    def trivial(cls, *, for_delta: bool, method: str = "no-guarantee") -> Bound:
        """What always holds: ε in [0, ∞], or δ in [0, 1] (loss too heavy to price)."""
        top = 1.0 if for_delta else math.inf
        return cls(0.0, top, top, method)

    @property
    def gap(self) -> float:
        """Relative width ``(upper - lower) / upper`` of the bracket (0 if exact)."""
        if self.upper == self.lower:
            return 0.0
        if self.upper == 0 or math.isinf(self.upper):
            return math.inf
        return (self.upper - self.lower) / abs(self.upper)


@dataclasses.dataclass(frozen=True)
class Guarantee:
    """A privacy guarantee with every term it depends on named.

    Attributes
    ----------
    unit : str
        ``"record"`` or ``"client"``.
    neighbouring : str
        ``"add/remove"`` or ``"replace-one"``.
    adversary : str
        Who observes what, e.g. ``"sees the noisy aggregate, not who took part"``.
    analysis : str
        The analysis that produced the numbers (``"sound"``, ``"paper"``, ...).
    values : dict
        The numbers (``epsilon``, ``delta``, ``mu``, ...); bounds as :class:`Bound`.
    notes : tuple of str
        Caveats, e.g. that a paper's bound is not a valid worst case.
    """

    unit: str
    neighbouring: str
    adversary: str
    analysis: str
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict: the terms, the upper values, and the brackets."""
        out: dict[str, Any] = {
            "unit": self.unit,
            "neighbouring": self.neighbouring,
            "adversary": self.adversary,
            "analysis": self.analysis,
        }
        for key, val in self.values.items():
            if isinstance(val, Bound):
                out[key] = val.upper
                out[f"{key}_lower"] = val.lower
            else:
                out[key] = val
        if self.notes:
            out["notes"] = list(self.notes)
        return out
