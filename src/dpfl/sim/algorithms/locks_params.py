"""LOCKS's parameters (the ``algorithm.params`` section) and what its ledger records.

:class:`LocksParams` validates them (the estimator, the step-size schedule,
which norms set the second-stage probabilities); :func:`recorded_max_p2` is
the realised largest second-stage probability as a ledger entry records it.
The algorithm is :class:`dpfl.sim.algorithms.locks.Locks`.
"""

from __future__ import annotations

import dataclasses
import decimal
import math

from dpfl._validate import (
    check_count,
    check_positive,
    check_probability,
)
from dpfl.errors import InvalidParameterError
from dpfl.sim.algorithms.base import (
    AlgorithmParams,
)

__all__ = [
    "ESTIMATORS",
    "LocksParams",
    "MAX_P2_DIGITS",
    "NORM_SOURCES",
    "SCHEDULES",
    "recorded_max_p2",
]


ESTIMATORS = ("unbiased", "weighted")


#: Significant digits of the realised max p2 in a ledger entry.
MAX_P2_DIGITS = 4


def recorded_max_p2(value: float) -> float:
    """The realised max p2 as the ledger records it: rounded up to 4 digits.

    p2 derives from the released noisy norms, which the executors (one
    client at a time, or the cohort at once) and devices compute from the
    same numbers by float operations in other orders: on a GPU they differ
    in the tenth significant digit or so (float32 rounding of the trained
    updates). A ledger entry is a record of the round that every executor
    must write alike (the contract), so the value goes there at a precision
    that rounding cannot reach, and rounded up: an upper bound of the
    realised value (the cap, 1, stays 1).

    Parameters
    ----------
    value : float
        max_k p2_k in [0, 1].

    Returns
    -------
    float
        The smallest number of :data:`MAX_P2_DIGITS` significant decimal
        digits that is >= ``value`` (``value`` itself when it is 0).
    """
    if value <= 0.0 or not math.isfinite(value):
        return float(value)
    # The shortest decimal that reads back as ``value`` (0.1, not the double's
    # 0.1000000000000000055...), rounded up: reading it back gives >= value.
    shortest = decimal.Decimal(repr(float(value)))
    step = decimal.Decimal(1).scaleb(shortest.adjusted() - (MAX_P2_DIGITS - 1))
    return float(shortest.quantize(step, rounding=decimal.ROUND_CEILING))


SCHEDULES = ("variance", "constant", "inverse-sqrt")


NORM_SOURCES = ("current", "stale")


@dataclasses.dataclass(frozen=True)
class LocksParams(AlgorithmParams):
    """Parameters of LOCKS.

    σ_g is not a parameter: it is the run's noise multiplier
    (``privacy.noise_multiplier``), and the norm noise is ``σ_n =
    norm_noise_ratio · σ_g``, so the two scales move together when σ is
    calibrated.

    Attributes
    ----------
    first_stage_probability : float
        q1 in (0, 1]: each client joins S1 w.p. q1.
    second_stage_size : int
        m2 >= 1: expected size of S2 when no cap binds (Lemma 4.1).
    norm_noise_ratio : float
        σ_n / σ_g > 0: each released norm carries noise of std
        ``norm_noise_ratio · σ_g · clip``.
    clip : float
        C > 0, clip norm of each client's update.
    norm_floor : float or None
        ν > 0, the floor of a released norm; ``None``: ``0.01 · clip``.
    local_steps : int
        E >= 1 local SGD steps.
    batch_size : int
        b >= 1 records per step, drawn with replacement (proof of Thm 5.1).
    local_learning_rate : float
        Local step size (> 0).
    server_learning_rate : float
        Base server step η (> 0).
    server_schedule : {"variance", "constant", "inverse-sqrt"}
        The server step schedule (module docstring).
    estimator : {"unbiased", "weighted"}
        (A) ``1/(K q1 p2_k)`` scaling or (B) ``1/m2`` weighting.
    norm_source : {"current", "stale"}
        Which update's norm a client releases: the one it computes this
        round, or the one it computed the last time it was in S1 (module
        docstring).
    """

    first_stage_probability: float = 0.2
    second_stage_size: int = 10
    norm_noise_ratio: float = 4.0
    clip: float = 1.0
    norm_floor: float | None = None
    local_steps: int = 1
    batch_size: int = 16
    local_learning_rate: float = 0.1
    server_learning_rate: float = 1.0
    server_schedule: str = "variance"
    estimator: str = "unbiased"
    norm_source: str = "current"

    def __post_init__(self) -> None:
        self._set(
            "first_stage_probability",
            check_probability("first_stage_probability", self.first_stage_probability),
        )
        self._set(
            "second_stage_size",
            check_count("second_stage_size", self.second_stage_size, minimum=1),
        )
        self._set(
            "norm_noise_ratio",
            check_positive("norm_noise_ratio", self.norm_noise_ratio),
        )
        self._set("clip", check_positive("clip", self.clip))
        if self.norm_floor is not None:
            self._set("norm_floor", check_positive("norm_floor", self.norm_floor))
        self._set(
            "local_steps", check_count("local_steps", self.local_steps, minimum=1)
        )
        self._set("batch_size", check_count("batch_size", self.batch_size, minimum=1))
        self._set(
            "local_learning_rate",
            check_positive("local_learning_rate", self.local_learning_rate),
        )
        self._set(
            "server_learning_rate",
            check_positive("server_learning_rate", self.server_learning_rate),
        )
        if self.server_schedule not in SCHEDULES:
            raise InvalidParameterError(
                f"server_schedule must be one of {SCHEDULES}; got "
                f"{self.server_schedule!r}"
            )
        if self.estimator not in ESTIMATORS:
            raise InvalidParameterError(
                f"estimator must be one of {ESTIMATORS}; got {self.estimator!r}"
            )
        if self.norm_source not in NORM_SOURCES:
            raise InvalidParameterError(
                f"norm_source must be one of {NORM_SOURCES}; got {self.norm_source!r}"
            )

    @property
    def floor(self) -> float:
        """ν: ``norm_floor``, or ``0.01 · clip`` when it is ``None``."""
        return 0.01 * self.clip if self.norm_floor is None else float(self.norm_floor)
