"""An algorithm's privacy plan: its accounting event, analysis and noise multiplier.

:func:`plan_privacy` is the one place where a run's privacy settings meet
its algorithm: ``dpfl train`` (:mod:`dpfl.experiments.runner`) and
:func:`dpfl.make_private` both call it. From the algorithm's pure event
function (:meth:`~dpfl.sim.algorithms.base.FederatedAlgorithm.round_event`;
no model is built) it

1. takes σ from the algorithm's own parameters where they set it (e.g.
   MS-PAFL's per-round local ε);
2. resolves the analysis (the scheme's default, its tightest proven one, when
   none is given) and refuses an unproven analysis or algorithm setting
   unless allowed;
3. refuses δ >= 1/n for the n privacy units (records or clients) the run
   protects unless allowed;
4. calibrates σ when it is not given
   (:func:`~dpfl.accounting.calibrate.calibrate_noise_multiplier`, with the
   ledger's bracket tolerance and, for per-participant schemes, planning for
   the guard of a run over the whole population).
"""

from __future__ import annotations

import dataclasses
import logging
import math

from dpfl.accounting import events as ev
from dpfl.accounting import schemes
from dpfl.accounting.calibrate import calibrate_noise_multiplier
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.errors import DpflError, InvalidParameterError, UnsupportedEventError
from dpfl.sim.algorithms.base import AlgorithmParams, DataStats, FederatedAlgorithm

__all__ = ["PrivacyPlan", "plan_privacy", "privacy_units"]

_log = logging.getLogger("dpfl.sim")


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """How a run is made private.

    Attributes
    ----------
    params : AlgorithmParams
        The algorithm's parameters (without a setting that fixed σ itself).
    noise_multiplier : float
        σ (0: a non-private run, nothing charged).
    analysis : str or None
        The analysis pricing each round (``None`` for a non-private run).
    event : Event or None
        One round's accounting event at σ (``None``: non-private).
    status : str or None
        The analysis' status (``"proven"``, ...).
    calibrated : bool
        Whether σ was calibrated to the target here.
    """

    params: AlgorithmParams
    noise_multiplier: float
    analysis: str | None
    event: ev.Event | None
    status: str | None
    calibrated: bool


def privacy_units(event: ev.Event, stats: DataStats) -> tuple[str, int]:
    """The privacy unit of ``event`` (plural) and how many of them the data holds."""
    unit = schemes.scheme_of(event).unit
    if unit == "client":
        return "clients", int(stats.num_clients)
    return "records", int(stats.num_records)


def plan_privacy(
    algorithm: type[FederatedAlgorithm],
    params: AlgorithmParams,
    stats: DataStats,
    *,
    epsilon: float,
    delta: float,
    rounds: int,
    noise_multiplier: float | None = None,
    analysis: str | None = None,
    guard: str = "accountant",
    allow_unproven: bool = False,
    allow_large_delta: bool = False,
    keys: str = "",
    error: type[DpflError] = InvalidParameterError,
    logger: logging.Logger | None = None,
) -> PrivacyPlan:
    """Check the privacy settings against the algorithm; fill in analysis and σ.

    Parameters
    ----------
    algorithm : type of FederatedAlgorithm
        The algorithm's class.
    params : AlgorithmParams
        Its parameters.
    stats : DataStats
        Clients and records of the data.
    epsilon, delta : float
        The run's total budget (ε may be ``inf`` when σ is given).
    rounds : int
        Rounds the budget must cover.
    noise_multiplier : float or None
        σ; ``None``: calibrate; 0: a non-private run.
    analysis : str or None
        The analysis; ``None``: the scheme's default.
    guard : str
        ``"accountant"``, or a ledger class' stop rule (its own analysis).
    allow_unproven, allow_large_delta : bool
        Accept an unproven analysis or setting; accept δ >= 1/n.
    keys : str
        Prefix of the settings' names in messages (``"privacy."`` for a
        configuration, whose messages say ``set privacy.X: true``; ``""``
        for keyword arguments, ``pass X=True``).
    error : type
        The error raised on a refused setting.
    logger : logging.Logger or None
        Where the calibration notice goes (default ``dpfl.sim``).

    Returns
    -------
    PrivacyPlan
        σ, the analysis, one round's event and its status.

    Raises
    ------
    dpfl.errors.DpflError
        ``error`` naming the setting, its constraint and value, on a refused
        setting; DpflError if no σ meets the target.
    """
    log = logger if logger is not None else _log
    config = bool(keys)

    def enable(flag: str) -> str:
        return f"set {keys}{flag}: true" if config else f"pass {flag}=True"

    own = algorithm.resolve_noise(params, stats)
    if own is not None:
        if noise_multiplier is not None:
            none = "null" if config else "None"
            raise error(
                "the algorithm's parameters set the noise multiplier themselves "
                f"({own[0]:.4g}); leave {keys}noise_multiplier {none}; got "
                f"{noise_multiplier!r}"
            )
        noise_multiplier, params = own
        log.info(
            "noise multiplier %.4f from the algorithm's parameters", noise_multiplier
        )
    if noise_multiplier == 0:
        log.info("%snoise_multiplier is 0: a NON-PRIVATE run (no noise)", keys)
        return PrivacyPlan(params, 0.0, None, None, None, calibrated=False)
    event = algorithm.round_event(params, stats, noise_multiplier or 1.0)
    valid = algorithm.valid_analyses(params)
    if guard != "accountant":
        # a paper's stop rule: the scheme table says which schemes it stops
        # and under which analysis
        try:
            resolved = schemes.scheme_of(event).guard_analysis(guard)
        except UnsupportedEventError as exc:
            raise error(f"{keys}guard: {exc} (the rounds this run releases)") from None
    elif analysis is None and valid is not None:
        # the tightest proven analysis that describes the mechanism run
        resolved = next(
            (a.name for a in schemes.scheme_of(event).analyses if a.name in valid),
            valid[0],
        )
    else:
        resolved = schemes.resolve_analysis(event, analysis)
    if valid is not None and resolved not in valid:
        raise error(
            f"{keys}analysis must be one of {list(valid)} for these algorithm "
            f"settings (any other does not describe the mechanism run); got "
            f"{resolved!r}"
        )
    info = schemes.scheme_of(event).analysis(resolved)
    reasons = []
    if not info.valid:
        reasons.append(
            f"{keys}analysis {resolved!r} is not a proven bound ({info.status}: "
            f"{info.basis})"
        )
    unproven = algorithm.unproven_reason(params)
    if unproven:
        reasons.append(unproven)
    if reasons and not allow_unproven:
        raise error(
            f"{reasons[0]}; {enable('allow_unproven')} to run anyway (every "
            "epsilon is then labelled as not a proven bound, beside the proven one)"
        )
    what, n = privacy_units(event, stats)
    if delta >= 1.0 / n and not allow_large_delta:
        raise error(
            f"{keys}delta must be < 1/n = {1.0 / n:.3g} for the n = {n} {what} "
            "this run protects (a delta that large allows releasing one of them "
            f"outright with probability delta); got {delta!r}; "
            f"{enable('allow_large_delta')} to accept it"
        )
    calibrated = noise_multiplier is None
    if noise_multiplier is None:
        if math.isinf(epsilon):
            raise error(
                f"{keys}noise_multiplier must be given when {keys}epsilon is inf "
                "(there is no budget to calibrate to); got None"
            )
        log.info(
            "calibrating the noise multiplier to (epsilon=%g, delta=%g) over %d "
            "rounds under the %r analysis",
            epsilon,
            delta,
            rounds,
            resolved,
        )
        noise_multiplier = calibrate_noise_multiplier(
            lambda s: algorithm.round_event(params, stats, s),
            epsilon=epsilon,
            delta=delta,
            rounds=rounds,
            analysis=resolved,
            population=stats.num_clients,
            bound_tolerance=PrivacyLedger(analysis=resolved).tolerance,
            tolerance=2e-3,
        )
        log.info("noise multiplier: %.4f", noise_multiplier)
        event = algorithm.round_event(params, stats, noise_multiplier)
    elif noise_multiplier != 1.0:
        event = algorithm.round_event(params, stats, noise_multiplier)
    return PrivacyPlan(
        params=params,
        noise_multiplier=float(noise_multiplier),
        analysis=resolved,
        event=event,
        status=info.status,
        calibrated=calibrated,
    )
