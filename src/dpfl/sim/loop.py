"""The round loop: guard the budget, run a round, charge the ledger.

:class:`Trainer` drives any :class:`~dpfl.sim.algorithms.base.FederatedAlgorithm`.
Each :meth:`Trainer.step`

1. asks the algorithm for the accounting event of the next round and calls
   :meth:`~dpfl.accounting.ledger.PrivacyLedger.check` *before any
   computation*: a round that would exceed the budget raises
   :class:`~dpfl.errors.BudgetExceededError` and nothing changes;
2. lets the server select the cohort with the round's server generators,
   runs the client steps through the executor, each client with its own
   generators (:mod:`dpfl.sim.randomness`), and lets the server step
   aggregate, privatize and update;
3. records the event in the ledger (with the participants when the
   algorithm's guarantee is per client), and saves the ledger if it has a
   path.

Randomness is keyed by position (seed, round, client), not carried as
stream state: a checkpoint needs no generator state, a resumed run draws
exactly what the uninterrupted run drew, and the result does not depend on
the executor or on how a cohort is split.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dpfl._validate import check_count
from dpfl.accounting.events import Event
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.sim.algorithms.base import Cohort, FederatedAlgorithm, Messages
from dpfl.sim.executors import Executor, executor
from dpfl.sim.randomness import CohortStreams, Streams, server_streams

__all__ = ["RoundPlan", "RoundReport", "Trainer"]

_STATE_FORMAT = 2


@dataclasses.dataclass
class RoundReport:
    """What one round did.

    Attributes
    ----------
    round : int
        Index of the round that ran (0-based; the ledger entry's ``round``).
    event : Event or None
        The accounting event charged (``None``: a non-private round, not
        charged).
    participants : numpy.ndarray
        The clients that took part.
    metrics : dict of str to float
        The algorithm's round metrics.
    """

    round: int
    event: Event | None
    participants: np.ndarray
    metrics: dict[str, float]


@dataclasses.dataclass
class RoundPlan:
    """A round checked against the budget and selected, awaiting its messages.

    Attributes
    ----------
    round : int
        The round's index.
    event : Event or None
        The event checked against the budget (``None``: non-private).
    server : Streams
        The server's generators of the round.
    cohort : Cohort
        The participants and their tasks.
    streams : CohortStreams
        Each task's client generators, in task order.
    """

    round: int
    event: Event | None
    server: Streams
    cohort: Cohort
    streams: CohortStreams


class Trainer:
    """Runs a federated algorithm round by round against a :class:`PrivacyLedger`.

    Parameters
    ----------
    algorithm : FederatedAlgorithm
        The algorithm (holds the model and its state).
    ledger : PrivacyLedger
        Where each private round is charged; its budget guards every round.
    seed : int
        Seed of the run's randomness (>= 0).
    execution : str or Executor
        How client steps run: ``"batched"`` (default, the cohort as one
        vectorised computation), ``"loop"`` (one client at a time, the
        reference) or ``"ray"`` (Ray actors with their defaults); or an
        executor object (e.g. a configured
        :class:`~dpfl.integrations.ray.RayExecutor`).

    Attributes
    ----------
    round : int
        Rounds completed.

    Examples
    --------
    >>> # trainer = Trainer(algorithm, ledger=PrivacyLedger(Budget(8.0, 1e-5)), seed=0)
    >>> # for _ in range(100): report = trainer.step()
    """

    def __init__(
        self,
        algorithm: FederatedAlgorithm,
        *,
        ledger: PrivacyLedger,
        seed: int,
        execution: str | Executor = "batched",
    ) -> None:
        if not isinstance(algorithm, FederatedAlgorithm):
            raise InvalidParameterError(
                "algorithm must be a FederatedAlgorithm; got "
                f"{type(algorithm).__name__}"
            )
        self.algorithm = algorithm
        self.ledger = ledger
        self.seed = check_count("seed", seed, minimum=0)
        self.executor = executor(execution) if isinstance(execution, str) else execution
        self.round = 0

    def step(self) -> RoundReport:
        """Run one round: :meth:`begin_round`, the executor, :meth:`finish_round`.

        Returns
        -------
        RoundReport
            The round's index, event, participants and metrics.

        Raises
        ------
        dpfl.errors.BudgetExceededError
            If the round would exceed the ledger's budget; raised before any
            computation, and nothing (model, ledger, round) changes.
        dpfl.errors.NonFiniteUpdateError
            If the round produced NaN or Inf; the model is unchanged and the
            ledger not charged (nothing was released).
        """
        plan = self.begin_round()
        messages = self.executor.run(
            self.algorithm, self.algorithm.weights, plan.cohort.tasks, plan.streams
        )
        return self.finish_round(plan, messages)

    def begin_round(self) -> RoundPlan:
        """Check the next round's event against the budget, then select its cohort.

        The first half of :meth:`step`, for drivers that deliver the tasks
        themselves (a Flower strategy sends them to its nodes); hand the
        clients' messages to :meth:`finish_round`.

        Raises
        ------
        dpfl.errors.BudgetExceededError
            If the round would exceed the budget (nothing changes).
        """
        alg = self.algorithm
        index = self.round
        event = alg.event(index)
        if event is not None:
            self.ledger.check(event)
        server = server_streams(self.seed, index, alg.device)
        cohort = alg.select(index, server)
        streams = CohortStreams(
            self.seed, index, [task.client for task in cohort.tasks], alg.device
        )
        return RoundPlan(index, event, server, cohort, streams)

    def finish_round(self, plan: RoundPlan, messages: Messages) -> RoundReport:
        """Run the server step on the cohort's messages and charge the round.

        Raises
        ------
        dpfl.errors.DpflError
            If ``plan`` is not the round this trainer is in.
        dpfl.errors.NonFiniteUpdateError
            If the update is not finite (nothing changes, nothing charged).
        """
        self._check_plan(plan)
        alg = self.algorithm
        cohort, event = plan.cohort, plan.event
        metrics = alg.server_step(cohort, messages, plan.server)
        if event is not None:
            # Some schemes learn facts only during the round (LOCKS: the largest
            # second-stage probability, who was in the second stage); their
            # realised event prices the same as the one checked above.
            event = alg.realised_event(cohort) or event
            self._charge(plan, event, alg.ledger_extra(cohort))
        self.round = plan.round + 1
        return RoundReport(
            round=plan.round,
            event=event,
            participants=cohort.participants,
            metrics=metrics,
        )

    def abandon_round(self, plan: RoundPlan, *, sent: bool = True) -> RoundReport:
        """Give up a round before its server step (a client failed or vanished).

        The server step never runs, so the server releases nothing and the
        model and server state stay as they are; the round index advances
        (the next round draws fresh randomness, keyed by its own index).
        Whether the round is charged depends on who privatizes:

        * the server (central noise, :attr:`FederatedAlgorithm.messages_are_releases`
          False): the messages received are not releases (only the server's
          noisy update is), so nothing is charged;
        * the clients (client-side noise: each message is itself a release
          the server saw): the event checked in :meth:`begin_round` is recorded,
          with ``extra={"abandoned": True}``, so a release is never uncharged.

        Parameters
        ----------
        plan : RoundPlan
            The round from :meth:`begin_round`.
        sent : bool
            Whether any task reached a client. ``False`` (the round was given
            up before anything left the server): no client released anything
            either, and nothing is charged.

        Returns
        -------
        RoundReport
            The round's index, the event charged (``None``: not charged), the
            planned participants and ``{"abandoned": 1.0}``.

        Raises
        ------
        dpfl.errors.DpflError
            If ``plan`` is not the round this trainer is in.
        """
        self._check_plan(plan)
        alg = self.algorithm
        cohort = plan.cohort
        charged = plan.event if (sent and alg.messages_are_releases) else None
        if charged is not None:
            self._charge(plan, charged, {"abandoned": True})
        self.round = plan.round + 1
        return RoundReport(
            round=plan.round,
            event=charged,
            participants=cohort.participants,
            metrics={"abandoned": 1.0},
        )

    def _check_plan(self, plan: RoundPlan) -> None:
        if plan.round != self.round:
            raise DpflError(
                f"plan is for round {plan.round}; the trainer is in round {self.round}"
            )

    def _charge(
        self, plan: RoundPlan, event: Event, extra: dict[str, Any] | None
    ) -> None:
        """Record ``event`` for the plan's round and write the ledger to disk."""
        alg = self.algorithm
        self.ledger.record(
            event,
            participants=plan.cohort.participants
            if alg.per_client_accounting
            else None,
            round=plan.round,
            extra=extra,
        )
        if self.ledger.path is not None:
            self.ledger.flush()

    def run(self, num_rounds: int) -> list[RoundReport]:
        """Run ``num_rounds`` rounds (errors propagate; completed rounds stay).

        Parameters
        ----------
        num_rounds : int
            Rounds to run (>= 0).

        Returns
        -------
        list of RoundReport
            One report per round.
        """
        num_rounds = check_count("num_rounds", num_rounds, minimum=0)
        return [self.step() for _ in range(num_rounds)]

    def state_dict(self) -> dict[str, Any]:
        """Return the algorithm's state, the round counter and the seed.

        No generator state is stored: round ``t``'s generators are derived
        from ``(seed, t[, client])`` alone. The number of rounds the ledger
        has charged is stored to detect a checkpoint loaded against the wrong
        ledger. The ledger itself is persisted by :meth:`PrivacyLedger.save`.

        Returns
        -------
        dict
            A torch-serialisable checkpoint.
        """
        return {
            "format": _STATE_FORMAT,
            "round": self.round,
            "seed": self.seed,
            "ledger_rounds": self.ledger.rounds,
            "algorithm": self.algorithm.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (for ``dpfl resume``).

        Parameters
        ----------
        state : dict
            A checkpoint from :meth:`state_dict`.

        Raises
        ------
        dpfl.errors.DpflError
            If the checkpoint is not a trainer checkpoint, was taken with
            another seed, or the ledger holds fewer rounds than were charged
            when the checkpoint was taken (the spend is never silently reset).
            A ledger holding *more* rounds (saved after a later round than the
            checkpoint, e.g. a crash between the two writes) is accepted: the
            rounds re-run are charged again, which over-states, never
            under-states, the spend.
        """
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise DpflError(
                f"state is not a dpfl Trainer checkpoint (format {_STATE_FORMAT})"
            )
        if state["seed"] != self.seed:
            raise InvalidParameterError(
                f"checkpoint was taken with seed {state['seed']!r}; this trainer "
                f"has seed {self.seed!r}"
            )
        if self.ledger.rounds < state["ledger_rounds"]:
            raise DpflError(
                f"the ledger holds {self.ledger.rounds} charged rounds but the "
                f"checkpoint was taken after {state['ledger_rounds']}; load the "
                "ledger saved with the checkpoint (a resumed run never resets "
                "its spend)"
            )
        self.algorithm.load_state_dict(state["algorithm"])
        self.round = int(state["round"])
