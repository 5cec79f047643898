"""MS-PAFL's parameters (the ``algorithm.params`` section).

:class:`MsPaflParams` validates them (how updates are clipped and
aggregated, how the per-round local ε is calibrated). The algorithm is
:class:`dpfl.sim.algorithms.ms_pafl.MsPafl`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dpfl._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.errors import InvalidParameterError
from dpfl.sim.algorithms.base import (
    AlgorithmParams,
)

__all__ = ["AGGREGATIONS", "CALIBRATIONS", "CLIP_MODES", "MsPaflParams"]


CLIP_MODES = ("update", "parameters")


AGGREGATIONS = ("update", "model", "ratio")


CALIBRATIONS = ("analytic", "lemma1")


@dataclasses.dataclass(frozen=True)
class MsPaflParams(AlgorithmParams):
    """Parameters of MS-PAFL.

    Attributes
    ----------
    checkin_probability : float or tuple of float
        p_k in (0, 1]: one value for all clients, or one per client (checked
        against the number of clients when the algorithm or event is built).
    clip : float
        Clip norm C (> 0) of the public update (or public parameters).
    local_epsilon : float or None
        Per-round local ε of one message; when given, σ is calibrated from it
        by :meth:`~dpfl.sim.algorithms.ms_pafl.MsPafl.resolve_noise` (with
        Δ = 2C) in place of the run's ``noise_multiplier``.
    local_delta : float
        Per-round local δ (of the calibration and of the paper's figures).
    calibration : {"analytic", "lemma1"}
        How σ is found from (``local_epsilon``, ``local_delta``): the analytic
        Gaussian mechanism (Balle-Wang, any ε) or Lemma 1 (ε < 1 only); also
        how the paper's report reads the local ε back from σ.
    local_steps : int
        E >= 1 local SGD steps per round.
    batch_size : int
        b >= 1 records per step.
    replacement : bool
        Draw each batch with replacement (WR) instead of without (WOR).
    learning_rate : float
        Local step size η (> 0).
    weight_decay : float
        λ >= 0 of the regularised loss (MS-PAFL eq. 24): the step adds λw.
    private_fraction : float
        Fraction in [0, 1) of the flat parameter vector kept private (the
        first coordinates; the paper: 0.5).
    clip_mode : {"update", "parameters"}
        What is clipped (see the module docstring).
    aggregation : {"update", "model", "ratio"}
        How the server aggregates (see the module docstring).
    xi : float
        Hoeffding parameter ξ in (0, 1) of the paper's Theorem 2 (reports only).
    eval_clients : int
        Number of clients (evenly spaced) whose personalised models
        :meth:`~dpfl.sim.algorithms.ms_pafl.MsPafl.evaluate` averages over.
    """

    checkin_probability: float | tuple[float, ...] = 0.5
    clip: float = 1.0
    local_epsilon: float | None = None
    local_delta: float = 1e-5
    calibration: str = "analytic"
    local_steps: int = 5
    batch_size: int = 16
    replacement: bool = False
    learning_rate: float = 0.1
    weight_decay: float = 0.0
    private_fraction: float = 0.5
    clip_mode: str = "update"
    aggregation: str = "update"
    xi: float = 0.5
    eval_clients: int = 100

    def __post_init__(self) -> None:
        p = self.checkin_probability
        if isinstance(p, (Sequence, np.ndarray)) and not isinstance(p, str):
            values = tuple(float(v) for v in np.asarray(p, dtype=float).reshape(-1))
            if not values:
                raise InvalidParameterError(
                    "checkin_probability must be a float or one value per client; "
                    "got an empty sequence"
                )
            for k, pk in enumerate(values):
                check_probability(f"checkin_probability[{k}]", pk)
            self._set("checkin_probability", values)
        else:
            self._set(
                "checkin_probability", check_probability("checkin_probability", p)
            )
        self._set("clip", check_positive("clip", self.clip))
        self._set("local_delta", check_delta("local_delta", self.local_delta))
        if self.calibration not in CALIBRATIONS:
            raise InvalidParameterError(
                f"calibration must be one of {CALIBRATIONS}; got {self.calibration!r}"
            )
        if self.local_epsilon is not None:
            eps = check_positive("local_epsilon", self.local_epsilon)
            if self.calibration == "lemma1" and eps >= 1:
                raise InvalidParameterError(
                    "local_epsilon must be < 1 with calibration='lemma1' (the "
                    f"classic Gaussian formula); got {eps!r}. Use 'analytic'."
                )
            self._set("local_epsilon", eps)
        self._set(
            "local_steps", check_count("local_steps", self.local_steps, minimum=1)
        )
        self._set("batch_size", check_count("batch_size", self.batch_size, minimum=1))
        self._set("replacement", bool(self.replacement))
        self._set("learning_rate", check_positive("learning_rate", self.learning_rate))
        self._set("weight_decay", check_nonnegative("weight_decay", self.weight_decay))
        fraction = check_probability(
            "private_fraction", self.private_fraction, allow_zero=True
        )
        if fraction >= 1:
            raise InvalidParameterError(
                f"private_fraction={self.private_fraction!r} leaves no public "
                "coordinate; it must be < 1"
            )
        self._set("private_fraction", fraction)
        if self.clip_mode not in CLIP_MODES:
            raise InvalidParameterError(
                f"clip_mode must be one of {CLIP_MODES}; got {self.clip_mode!r}"
            )
        if self.aggregation not in AGGREGATIONS:
            raise InvalidParameterError(
                f"aggregation must be one of {AGGREGATIONS}; got {self.aggregation!r}"
            )
        self._set("xi", check_probability("xi", self.xi, allow_one=False))
        self._set(
            "eval_clients", check_count("eval_clients", self.eval_clients, minimum=1)
        )
