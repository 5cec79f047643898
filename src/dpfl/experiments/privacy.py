"""The privacy side of a configured run: its plan, and the ledger that holds it.

:func:`resolve_privacy` checks a run's privacy settings against its algorithm
and data and fills in what the configuration leaves open (σ calibrated, the
analysis named), within time limits; :func:`build_ledger` makes the ledger
that guards the run's budget. Both are steps of assembling a run
(:mod:`dpfl.experiments.build`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

from dpfl import _deadline
from dpfl._deadline import TimeLimitExceeded, time_limit
from dpfl._validate import MAX_CALIBRATED_EPSILON
from dpfl.accounting import events as ev
from dpfl.accounting import guards
from dpfl.accounting.ledger import Budget, PrivacyLedger
from dpfl.errors import BudgetExceededError, InvalidParameterError
from dpfl.experiments.config import ConfigError, RunConfig, config_from_dict

if TYPE_CHECKING:
    from dpfl.data.dataset import FederatedDataset
    from dpfl.sim.plan import PrivacyPlan

__all__ = [
    "CALIBRATION_SECONDS",
    "build_ledger",
    "price_one_round",
    "resolve_privacy",
]

log = logging.getLogger("dpfl.experiments")

#: The longest a run's calibration of σ may take (seconds) before it is
#: refused, naming the budget: a bound on inputs no one limit catches (the
#: extreme budgets are refused at once: privacy.epsilon above
#: :data:`~dpfl._validate.MAX_CALIBRATED_EPSILON`, privacy.delta below
#: :data:`~dpfl._validate.MIN_DELTA`). Calibrations of ordinary budgets take
#: seconds to a minute or two on a laptop.
CALIBRATION_SECONDS = 600.0


def build_ledger(
    config: RunConfig,
    path: Path | None = None,
    *,
    run: str | None = None,
    key: str | None = None,
) -> PrivacyLedger:
    """The run's privacy ledger: its budget, analysis and guard.

    Parameters
    ----------
    config : RunConfig
        The run, resolved. The budget is ``(privacy.epsilon,
        privacy.delta)``; none for ``epsilon: .inf`` or a run without noise.
    path : Path or None
        Where the ledger saves itself (``None``: in memory only).
    run, key : str or None
        The run digest and the key fingerprint the ledger's header carries
        (:mod:`dpfl.experiments.rundir`).

    Returns
    -------
    PrivacyLedger
        Empty.
    """
    priv = config.privacy
    private = bool(priv.noise_multiplier)
    budget = (
        None
        if math.isinf(priv.epsilon) or not private
        else Budget(priv.epsilon, priv.delta)
    )
    return PrivacyLedger(
        budget,
        analysis=priv.analysis,
        path=path,
        run=run,
        key=key,
        guard=guards.guard(priv.guard),
    )


def resolve_privacy(
    config: RunConfig, dataset: FederatedDataset, *, started: bool = False
) -> RunConfig:
    """Check the privacy settings against the algorithm; fill in analysis and σ.

    :func:`dpfl.sim.plan.plan_privacy` (shared with :func:`dpfl.make_private`)
    reads the algorithm's pure event function (``round_event``; no model is
    built). It refuses (ConfigError, one line naming the key) an analysis the
    algorithm's scheme does not offer, an unproven analysis or mechanism
    without ``privacy.allow_unproven``, and δ >= 1/n without
    ``privacy.allow_large_delta``; it calibrates σ when it is not given,
    planning for the guard that will run. Here too: a budget above
    :data:`~dpfl._validate.MAX_CALIBRATED_EPSILON` to calibrate to is refused,
    a calibration that runs past :data:`CALIBRATION_SECONDS` is refused, a
    given σ is priced for one round as the guard will price it, within
    :data:`~dpfl._deadline.ANSWER_SECONDS` (for a run that starts: a started
    one was priced when it started), and the
    accounting's own refusals (a privacy loss it cannot price) come back as
    one line naming the keys, never its internal message.

    Parameters
    ----------
    config : RunConfig
        The run.
    dataset : FederatedDataset
        Its data (:func:`dpfl.experiments.build.build_dataset`).
    started : bool
        The run is resumed: its σ was priced when it started.

    Returns
    -------
    RunConfig
        The configuration with ``privacy.noise_multiplier`` set (calibrated
        when it was null), ``privacy.analysis`` named (under the accountant
        guard) and the algorithm's parameters as planned.

    Raises
    ------
    ConfigError
        One line naming the key, the constraint and the value.
    dpfl._deadline.TimeLimitExceeded
        When a calibration or the pricing of one round runs past its time.
    """
    from dpfl.sim.algorithms import algorithm_class
    from dpfl.sim.algorithms.base import DataStats
    from dpfl.sim.plan import plan_privacy

    priv = config.privacy
    cls, stats = algorithm_class(config.algorithm.name), DataStats.of(dataset)
    calibrates = (
        priv.noise_multiplier is None
        and cls.resolve_noise(config.algorithm.params, stats) is None
    )
    if calibrates and priv.epsilon > MAX_CALIBRATED_EPSILON:
        raise ConfigError(
            f"privacy.epsilon must be <= {MAX_CALIBRATED_EPSILON:g} when the noise "
            "multiplier is calibrated (privacy.noise_multiplier null): past it no "
            "guarantee is left, and the noise it allows is too small to price in "
            f"bounded time; got {priv.epsilon:g}; give privacy.noise_multiplier "
            "to run under a larger budget"
        )
    target = (
        f"privacy.epsilon {priv.epsilon:g} at privacy.delta {priv.delta:g} over "
        f"{config.rounds} rounds"
    )

    def planned(sigma: float | None) -> tuple[PrivacyPlan, RunConfig]:
        """The plan for noise multiplier ``sigma``, and the resolved config."""
        plan = plan_privacy(
            cls,
            config.algorithm.params,
            stats,
            epsilon=priv.epsilon,
            delta=priv.delta,
            rounds=config.rounds,
            noise_multiplier=sigma,
            analysis=priv.analysis,
            guard=priv.guard,
            allow_unproven=priv.allow_unproven,
            allow_large_delta=priv.allow_large_delta,
            keys="privacy.",
            error=ConfigError,
            logger=log,
        )
        tree = config.to_dict()
        tree["algorithm"]["params"] = plan.params.to_dict()
        tree["privacy"]["noise_multiplier"] = plan.noise_multiplier
        if plan.event is not None:
            tree["privacy"]["analysis"] = (
                plan.analysis if priv.guard == "accountant" else None
            )
        return plan, config_from_dict(tree)

    def priced_in_time(
        plan: PrivacyPlan, resolved: RunConfig, given: str, fix: str
    ) -> None:
        """Price one round as the guard will, within the answer time.

        One accounting query, as ``dpfl account`` answers one: a noise or a
        sampling so extreme that one round cannot be priced in that time
        would stall every round of the run (and every step of a
        calibration).
        """
        if plan.analysis:
            given += f", privacy.analysis {plan.analysis}"
        with time_limit(
            _deadline.ANSWER_SECONDS,
            f"one round of this run ({given}, under algorithm.params' sampling) "
            f"was not priced within {_deadline.ANSWER_SECONDS:g} s: the run would "
            f"price every round so; {fix}",
        ):
            if plan.event is not None:
                price_one_round(resolved, plan.event)

    try:
        if calibrates and not started:
            # one round at σ = 1 first: a calibration prices many noise
            # multipliers, and one round the accounting cannot price in time
            # would hold it for its whole time limit
            # (only its time counts: a loss the accounting cannot price at 1
            # may be priced at the calibrated noise)
            probe, probed = planned(1.0)
            if probe.event is not None:
                try:
                    priced_in_time(
                        probe,
                        probed,
                        "privacy.noise_multiplier null, priced at 1 before calibrating",
                        "use less extreme sampling probabilities",
                    )
                except TimeLimitExceeded:
                    raise
                except InvalidParameterError as exc:
                    if not _raised_in_accounting(exc):
                        raise
        with time_limit(
            CALIBRATION_SECONDS,
            f"the noise multiplier for {target} was not found within "
            f"{CALIBRATION_SECONDS:g} s (the accounting's cost grows as epsilon "
            "grows and delta shrinks); use a smaller privacy.epsilon, a larger "
            "privacy.delta, or give privacy.noise_multiplier",
        ):
            plan, resolved = planned(priv.noise_multiplier)
            if plan.event is not None and not plan.calibrated and not started:
                priced_in_time(
                    plan,
                    resolved,
                    f"privacy.noise_multiplier {priv.noise_multiplier:g}",
                    "use a larger privacy.noise_multiplier or less extreme "
                    "sampling probabilities",
                )
    except (ConfigError, TimeLimitExceeded):
        raise
    except InvalidParameterError as exc:
        # the algorithm's own checks against the data name a parameter
        # (e.g. second_stage_size); the accounting's internal refusals (a
        # privacy loss it cannot price) name the budget instead
        fields = {f.name for f in dataclasses.fields(config.algorithm.params)}
        first = str(exc).split(" ", 1)[0]
        if first in fields:
            raise ConfigError(f"algorithm.params.{exc}") from None
        if not _raised_in_accounting(exc):
            raise
        sigma = priv.noise_multiplier
        raise ConfigError(
            f"{target} "
            + ("" if sigma is None else f"with privacy.noise_multiplier {sigma:g} ")
            + "is beyond what the accounting can price for this algorithm (the "
            "privacy loss at such a small noise, or under such extreme sampling "
            "probabilities, leaves its numerical range); "
            + (
                "use a smaller privacy.epsilon or a larger privacy.delta"
                if sigma is None
                else "use a larger privacy.noise_multiplier"
            )
            + " or less extreme sampling probabilities"
        ) from None
    return resolved


def price_one_round(config: RunConfig, event: ev.Event) -> None:
    """Price one round as the run's guard will, before the run (σ given).

    A budget that does not admit even one round is the run's to report (it
    stops at once, "budget reached"); a noise the accounting cannot price
    raises here, before any work, instead of in round 1.
    """
    from dpfl.accounting.accountant import Accountant

    ledger = build_ledger(config)
    if ledger.budget is None:
        return
    try:
        ledger.check(event)
    except BudgetExceededError:
        # over the budget at once: the run's to report, unless no finite
        # epsilon holds at all (a loss too heavy to price), the config's
        one = Accountant(ledger.analysis).compose(event).epsilon(ledger.budget.delta)
        if math.isinf(one.upper):
            sigma = config.privacy.noise_multiplier
            raise ConfigError(
                f"privacy.noise_multiplier {sigma:g} leaves no finite epsilon for "
                "even one round (the privacy loss at such a small noise is too "
                "heavy to price); use a larger privacy.noise_multiplier"
            ) from None


def _raised_in_accounting(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside :mod:`dpfl.accounting` (its internals)."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return False
    return "/dpfl/accounting/" in last.tb_frame.f_code.co_filename.replace("\\", "/")
