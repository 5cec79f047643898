"""DP-FedAvg's parameters (the ``algorithm.params`` section) and their schedules.

:class:`DpFedAvgParams` validates them; ``cohort_size`` may follow a per-round
schedule (:func:`schedule_value`: a constant, a list, or a linear ramp), and
:meth:`DpFedAvgParams.update_noise_multiplier` splits the run's one σ
between the update sum and adaptive clipping's count (Andrew et al. 2021,
Thm. 1). The algorithm is :class:`dpfl.sim.algorithms.dp_fedavg.DpFedAvg`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from dpfl._validate import (
    check_count,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.errors import InvalidParameterError
from dpfl.sim.algorithms.base import (
    AlgorithmParams,
)
from dpfl.sim.objectives import make_objective
from dpfl.sim.server_opt import check_server_optimizer

__all__ = ["CLIPPINGS", "DpFedAvgParams", "SAMPLINGS", "ScheduleSpec", "schedule_value"]


ScheduleSpec = float | int | Sequence[float] | Mapping[str, float]


CLIPPINGS = ("fixed", "median", "adaptive")


SAMPLINGS = ("fixed", "poisson")


# ----------------------------------------------------------------- schedules
def schedule_value(spec: ScheduleSpec, round_index: int, *, name: str) -> float:
    """The value of a per-round schedule at ``round_index``.

    Parameters
    ----------
    spec : float, int, sequence or mapping
        A constant; a sequence (value of round ``t`` is ``spec[t]``, the last
        value is held after the end); or a linear ramp
        ``{"start": a, "stop": b, "rounds": n}`` going from ``a`` at round 0
        to ``b`` at round ``n - 1`` and held there.
    round_index : int
        The round (>= 0).
    name : str
        The schedule's parameter name, for error messages.

    Returns
    -------
    float
        The scheduled value.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the spec is malformed (empty list, missing ramp keys, bad type).
    """
    t = check_count("round_index", round_index, minimum=0)
    if isinstance(spec, bool):
        raise InvalidParameterError(f"{name} must be a number; got {spec!r}")
    if isinstance(spec, int | float | np.integer | np.floating):
        return float(spec)
    if isinstance(spec, Mapping):
        missing = {"start", "stop", "rounds"} - set(spec)
        if missing or set(spec) - {"start", "stop", "rounds"}:
            raise InvalidParameterError(
                f"{name} as a ramp needs exactly the keys start, stop, rounds; "
                f"got {sorted(spec)}"
            )
        n = check_count(f"{name}['rounds']", spec["rounds"], minimum=1)
        a, b = float(spec["start"]), float(spec["stop"])
        frac = 1.0 if n == 1 else min(t / (n - 1), 1.0)
        return a + (b - a) * frac
    if isinstance(spec, Sequence | np.ndarray) and not isinstance(spec, str):
        if len(spec) == 0:
            raise InvalidParameterError(f"{name} must not be an empty list")
        return float(spec[min(t, len(spec) - 1)])
    raise InvalidParameterError(
        f"{name} must be a number, a list or a ramp mapping; got {spec!r}"
    )


# --------------------------------------------------------------- parameters
def _freeze_schedule(spec: Any) -> Any:
    """A schedule as immutable data: a list becomes a tuple, a ramp a plain dict."""
    if isinstance(spec, Mapping):
        return dict(spec)
    if isinstance(spec, Sequence | np.ndarray) and not isinstance(spec, str):
        return tuple(spec.tolist() if isinstance(spec, np.ndarray) else spec)
    return spec


@dataclasses.dataclass(frozen=True)
class DpFedAvgParams(AlgorithmParams):
    """Parameters of client-level DP-FedAvg (the ``algorithm.params`` section).

    σ is not a parameter: it is the run's ``privacy.noise_multiplier`` (see
    the module docstring for how adaptive clipping splits it).

    Attributes
    ----------
    cohort_size : int, list or ramp
        m_t: clients per round (constant, per-round list or
        ``{"start", "stop", "rounds"}`` ramp; rounded to integers, >= 1).
    local_epochs : int
        E, local epochs per round (>= 1).
    batch_size : int
        B, local mini-batch size (>= 1).
    learning_rate : float
        η, local SGD step size (> 0).
    clipping : {"fixed", "median", "adaptive"}
        How the clipping bound S is chosen.
    clip : float
        The fixed bound S, or the initial bound C_0 for ``"adaptive"`` (> 0).
    target_quantile : float
        γ in (0, 1) of the adaptive bound (Andrew et al.: 0.5).
    clip_learning_rate : float
        η_C >= 0 of the adaptive bound's geometric update (Andrew et al.: 0.2).
    count_noise_multiplier : float or None
        σ_b > 0, the noise std of the adaptive bound's count; default ``m_t/20``.
    sampling : {"fixed", "poisson"}
        Fixed-size cohorts (Algorithm 1) or Poisson client sampling at m_t/K.
    server_learning_rate : float
        η, the server optimiser's step size (paper: 1, with SGD).
    server_optimizer : dict
        How the server steps from the noisy average:
        ``{"name": "sgd"}`` (default, the paper's ``w += η · average``),
        ``momentum`` (DP-FedAvgM), ``adam`` (DP-FedAdam), ``yogi`` or
        ``adagrad``, with their options (:mod:`dpfl.sim.server_opt`). It is
        post-processing of the noisy average: the guarantee does not depend
        on it.
    local_objective : dict
        What clients minimise locally: ``{"name": "erm"}`` (default) or a
        registered objective with its options (:mod:`dpfl.sim.objectives`),
        e.g. ``{"name": "proximal", "mu": 0.01}``. The update is clipped as a
        whole, so the guarantee does not depend on it.
    """

    cohort_size: ScheduleSpec = 10
    local_epochs: int = 1
    batch_size: int = 10
    learning_rate: float = 0.1
    clipping: str = "fixed"
    clip: float = 1.0
    target_quantile: float = 0.5
    clip_learning_rate: float = 0.2
    count_noise_multiplier: float | None = None
    sampling: str = "fixed"
    server_learning_rate: float = 1.0
    local_objective: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"name": "erm"}
    )
    server_optimizer: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"name": "sgd"}
    )

    def __post_init__(self) -> None:
        self._set("server_optimizer", check_server_optimizer(self.server_optimizer))
        self._set("cohort_size", _freeze_schedule(self.cohort_size))
        self.cohort_at(0)  # validates the schedule's form
        make_objective(self.local_objective)  # validates its name and options
        self._set(
            "local_epochs", check_count("local_epochs", self.local_epochs, minimum=1)
        )
        self._set("batch_size", check_count("batch_size", self.batch_size, minimum=1))
        self._set("learning_rate", check_positive("learning_rate", self.learning_rate))
        for label, value, allowed in (
            ("clipping", self.clipping, CLIPPINGS),
            ("sampling", self.sampling, SAMPLINGS),
        ):
            if value not in allowed:
                raise InvalidParameterError(
                    f"{label} must be one of {allowed}; got {value!r}"
                )
        self._set("clip", check_positive("clip", self.clip))
        self._set(
            "target_quantile",
            check_probability("target_quantile", self.target_quantile, allow_one=False),
        )
        self._set(
            "clip_learning_rate",
            check_nonnegative("clip_learning_rate", self.clip_learning_rate),
        )
        if self.count_noise_multiplier is not None:
            self._set(
                "count_noise_multiplier",
                check_positive("count_noise_multiplier", self.count_noise_multiplier),
            )
        self._set(
            "server_learning_rate",
            check_positive("server_learning_rate", self.server_learning_rate),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (a list schedule as a list)."""
        out = super().to_dict()
        if isinstance(out["cohort_size"], tuple):
            out["cohort_size"] = list(out["cohort_size"])
        return out

    def cohort_at(self, round_index: int, num_clients: int | None = None) -> int:
        """m_t of round ``round_index`` (checked against K when given).

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If the schedule is malformed or m_t is not in ``[1, K]``.
        """
        raw = schedule_value(self.cohort_size, round_index, name="cohort_size")
        if not math.isfinite(raw):
            raise InvalidParameterError(
                f"cohort_size (round {round_index}) must be a finite count; got {raw!r}"
            )
        m = check_count(f"cohort_size (round {round_index})", round(raw), minimum=1)
        if num_clients is not None and m > num_clients:
            raise InvalidParameterError(
                f"cohort_size (round {round_index}) must be <= the number of "
                f"clients ({num_clients}); got {m}"
            )
        return m

    def peak_cohort(self) -> int:
        """The largest m_t the ``cohort_size`` schedule reaches in any round.

        A list's largest entry, a ramp's larger end, or the constant: what a
        round can hold at once, for memory and time estimates.
        """
        spec = self.cohort_size
        ends: tuple[int, ...]
        if isinstance(spec, Mapping):
            ends = (0, max(int(spec["rounds"]) - 1, 0))
        elif isinstance(spec, tuple):
            ends = tuple(range(len(spec)))
        else:
            ends = (0,)
        return max(self.cohort_at(t) for t in ends)

    def count_noise(self, cohort_size: int) -> float:
        """σ_b of a round with cohort m_t (``count_noise_multiplier`` or m_t/20)."""
        if self.count_noise_multiplier is not None:
            return float(self.count_noise_multiplier)
        return cohort_size / 20.0

    def update_noise_multiplier(
        self, noise_multiplier: float, cohort_size: int
    ) -> float:
        """σ_Δ of the update sum for the run's σ (= σ unless clipping is adaptive).

        Adaptive: ``σ_Δ = (σ⁻² − (2σ_b)⁻²)^(-1/2)``, so that the update sum and
        the count together are one Gaussian of multiplier σ (Andrew et al.
        2021, Thm. 1).

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If adaptive clipping's ``2σ_b <= σ`` (no σ_Δ exists).
        """
        if self.clipping != "adaptive":
            return noise_multiplier
        sb = self.count_noise(cohort_size)
        rest = noise_multiplier**-2 - (2.0 * sb) ** -2
        if rest <= 0:
            raise InvalidParameterError(
                f"adaptive clipping needs 2 * count_noise_multiplier > "
                f"noise_multiplier; got count_noise_multiplier={sb!r}, "
                f"noise_multiplier={noise_multiplier!r} (cohort {cohort_size})"
            )
        return float(rest**-0.5)
