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
3. checks that the model is finite, records the event in the ledger (with
   the participants when the algorithm's guarantee is per client, and a
   SHA-256 digest of the model after the round), and saves the ledger if it
   has a path.

A ledger with a finite budget never records a round without noise: such a
round is refused before it runs (a non-private run is declared as one: its
ledger has no budget).

Resuming. :meth:`Trainer.load_state_dict` ties a checkpoint to its ledger
(the entry count and chain hash it was taken at) and rewinds a ledger that
holds later rounds (:meth:`~dpfl.accounting.ledger.PrivacyLedger.rewind`):
those rounds are *replayed*, not charged again. The guard is not asked again
for them (they were admitted when they first ran); each replayed round's
entry, digest included, must equal the one on record, or the run stops with
:class:`~dpfl.accounting.chain.LedgerMismatchError` naming the round. A
round replays bit for bit on the same executor, device and torch build, with
the same number of threads.

:meth:`Trainer.fit` runs rounds to a target, evaluates the model every few
rounds with the ε spent so far, stops cleanly on the budget, Ctrl-C or a
callback's request, and hands every round's record to its callbacks
(:mod:`dpfl.sim.callbacks`: metrics files, checkpoints, progress, tracking);
``dpfl train`` and :func:`dpfl.make_private` both train through it.

Randomness is keyed by position (round, client) under the run's secret key
(or, in reproducible mode, its seed), not carried as stream state
(:mod:`dpfl.sim.randomness`): a checkpoint needs no generator state, a
resumed run given the same key draws
exactly what the uninterrupted run drew, and the result does not depend on
the executor or on how a cohort is split.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dpfl._files import fault
from dpfl._validate import check_count, check_delta
from dpfl.accounting import schemes
from dpfl.accounting.events import Event
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.errors import (
    BudgetExceededError,
    DpflError,
    InvalidParameterError,
    NonFiniteUpdateError,
)
from dpfl.sim import keys as _keys
from dpfl.sim import secure_noise as _streams
from dpfl.sim.algorithms.base import FederatedAlgorithm, Messages
from dpfl.sim.callbacks.base import Callback, FitResult, FitState, check_callbacks
from dpfl.sim.callbacks.clipping import ClippingWarning
from dpfl.sim.executors import Executor, executor
from dpfl.sim.randomness import CohortStreams, server_streams
from dpfl.sim.rounds import (
    RoundPlan,
    RoundReport,
    _check_record,
    deferred_interrupt,
    weights_digest,
)

__all__ = [
    "Trainer",
]

_log = logging.getLogger("dpfl.sim")

_STATE_FORMAT = 3


def _finite_budget(ledger: PrivacyLedger) -> bool:
    return ledger.budget is not None and not math.isinf(ledger.budget.epsilon)


class Trainer:
    """Runs a federated algorithm round by round against a :class:`PrivacyLedger`.

    Parameters
    ----------
    algorithm : FederatedAlgorithm
        The algorithm (holds the model and its state).
    ledger : PrivacyLedger
        Where each private round is charged; its budget guards every round.
    seed : int
        Seed of the run's randomness (>= 0); with ``secure_noise``, only what
        is not secret derives from it (the model's initial weights, the data).
    execution : str or Executor
        How client steps run: ``"batched"`` (default, the cohort as one
        vectorised computation), ``"loop"`` (one client at a time, the
        reference) or ``"ray"`` (Ray actors with their defaults); or an
        executor object (e.g. a configured
        :class:`~dpfl.integrations.ray.RayExecutor`).
    secure_noise : bool
        Draw every round's participants, batches and noise from streams keyed
        by the secret ``noise_key`` (default; :mod:`dpfl.sim.secure_noise`).
        ``False``: reproducible mode, everything from ``seed`` (anyone with
        the seed can draw the noise again and subtract it: not for release).
    noise_key : bytes or None
        The run's secret 32-byte key (secure mode); ``None``: a fresh one
        (:func:`~dpfl.sim.keys.new_key`). Keep it to resume the run;
        never publish it (it de-noises every round). Never stored in
        :meth:`state_dict`.
    stream_version : str
        The secure noise stream (:data:`~dpfl.sim.secure_noise.STREAM_VERSIONS`;
        default the current :data:`~dpfl.sim.secure_noise.STREAM_VERSION`).
        A resumed run passes the version it started with, so that it draws
        what the uninterrupted run drew.
    diagnostics : bool
        Compute the algorithm's round diagnostics (extra metrics, e.g.
        DP-FedAvg's between-client variance) in every round. ``False``
        (default): only in the rounds :meth:`fit` evaluates.

    Attributes
    ----------
    round : int
        Rounds completed.
    diagnostics : bool
        As given; may be changed between rounds.
    stream_version : str
        The secure noise stream drawn from (as given).

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
        secure_noise: bool = True,
        noise_key: bytes | None = None,
        stream_version: str = _streams.STREAM_VERSION,
        diagnostics: bool = False,
    ) -> None:
        if not isinstance(algorithm, FederatedAlgorithm):
            raise InvalidParameterError(
                "algorithm must be a FederatedAlgorithm; got "
                f"{type(algorithm).__name__}"
            )
        valid = algorithm.valid_analyses(algorithm.params)
        if valid is not None and ledger.analysis not in valid:
            # the ledger would price a mechanism other than the one run
            raise InvalidParameterError(
                f"ledger.analysis must be one of {list(valid)} for this "
                f"{type(algorithm).__name__} setting; got {ledger.analysis!r}"
            )
        if algorithm.event() is None and _finite_budget(ledger):
            raise InvalidParameterError(
                f"ledger.budget must be None for an algorithm that adds no noise "
                f"(a non-private run has no budget to guard); got {ledger.budget}"
            )
        self.algorithm = algorithm
        self.ledger = ledger
        self.seed = check_count("seed", seed, minimum=0)
        if not secure_noise and noise_key is not None:
            raise InvalidParameterError(
                "noise_key is for secure_noise=True (reproducible noise derives "
                "from the seed)"
            )
        self.stream_version = _streams.check_stream_version(
            "stream_version", stream_version
        )
        self.noise_key: bytes | None = None
        if secure_noise:
            self.noise_key = (
                _keys.new_key()
                if noise_key is None
                else _keys.check_key("noise_key", noise_key)
            )
        self.executor = executor(execution) if isinstance(execution, str) else execution
        self.round = 0
        self.diagnostics = bool(diagnostics)
        self._evaluated_next = False  # set by fit for the rounds it evaluates

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
        if event is None and _finite_budget(self.ledger):
            raise DpflError(
                f"round {index + 1} would add no noise under a finite budget "
                f"({self.ledger.budget}): refused (a non-private run has no budget)"
            )
        if event is not None and not self.ledger.replaying:
            # a replayed round was admitted (and charged) when it first ran
            self.ledger.check(event)
        key, version = self.noise_key, self.stream_version
        server = server_streams(
            self.seed, index, alg.device, key=key, stream_version=version
        )
        cohort = alg.select(index, server)
        clients = [task.client for task in cohort.tasks]
        streams = CohortStreams(
            self.seed, index, clients, alg.device, key=key, stream_version=version
        )
        return RoundPlan(index, event, server, cohort, streams)

    def finish_round(self, plan: RoundPlan, messages: Messages) -> RoundReport:
        """Run the server step on the cohort's messages and charge the round.

        The messages are moved to the algorithm's device first
        (:meth:`Messages.to <dpfl.sim.algorithms.base.Messages.to>`).

        Raises
        ------
        dpfl.errors.DpflError
            If ``plan`` is not the round this trainer is in.
        dpfl.errors.NonFiniteUpdateError
            If the update is not finite (nothing changes, nothing charged),
            or the model is not finite after it (nothing charged; the
            trainer must not be used further).
        dpfl.accounting.chain.LedgerMismatchError
            In a replayed round, if it differs from the ledger's entry.
        """
        self._check_plan(plan)
        alg = self.algorithm
        cohort, event = plan.cohort, plan.event
        # The server step computes on the algorithm's device, whatever device
        # the shares were computed on (a replica elsewhere, a remote worker).
        messages = messages.to(alg.weights.device)
        alg.diagnostics = self.diagnostics or self._evaluated_next
        metrics = alg.server_step(cohort, messages, plan.server)
        if not bool(alg.weights.isfinite().all()):
            raise NonFiniteUpdateError(
                "the model holds NaN or Inf after the server step (the update "
                "was finite; the weights overflowed); nothing was charged"
            )
        fault("round")
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
            digest=weights_digest(alg.weights),
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

    def fit(
        self,
        rounds: int,
        *,
        eval_every: int = 10,
        delta: float | None = None,
        callbacks: Sequence[Callback] | None = None,
        name: str = "",
        run_dir: str | Path | None = None,
        logger: logging.Logger | None = None,
        step: Callable[[], RoundReport] | None = None,
    ) -> FitResult:
        """Run to round ``rounds``, evaluating and reporting to ``callbacks``.

        Each round's record (``round`` = rounds completed, the round's
        metrics, and on every ``eval_every``-th and the last round the test
        loss and accuracy with ε spent so far) goes to every callback's
        :meth:`~dpfl.sim.callbacks.Callback.on_round_end`; files, progress and
        tracking are callbacks (:mod:`dpfl.sim.callbacks`). The loop stops
        cleanly

        * at round ``rounds``: ``"completed"``;
        * when the ledger's guard refuses the next round
          (:class:`~dpfl.errors.BudgetExceededError`): ``"budget"``;
        * on Ctrl-C (in the main thread), after finishing the round in
          progress: ``"interrupted"`` (a second Ctrl-C aborts at once);
        * when a callback calls :meth:`FitState.stop`: its reason.

        After an early stop the model is evaluated once more if its last
        round was not (``FitState.final_evaluation``).

        Parameters
        ----------
        rounds : int
            The round to run to, counted from round 0 (>= 1): a trainer
            already at round ``k`` (a resumed run) runs ``rounds - k`` more.
        eval_every : int
            Evaluate every this many rounds (and at round ``rounds``).
        delta : float or None
            δ at which ε spent is reported; ``None``: the ledger budget's δ
            (required for a private run whose ledger has no budget).
        callbacks : sequence of Callback or None
            Called in order at the start, after each round and at the end.
        name : str
            A label for progress output.
        run_dir : str or Path or None
            The run folder, for callbacks that write into it.
        logger : logging.Logger or None
            Where the budget stop and interrupt messages go (default
            ``dpfl.sim``).
        step : callable or None
            Runs one round and returns its report (default :meth:`step`). A
            driver that delivers the tasks itself (the Flower strategy) passes
            its own, built on :meth:`begin_round` and :meth:`finish_round` or
            :meth:`abandon_round`; it raises
            :class:`~dpfl.errors.BudgetExceededError` when the guard refuses
            the round, as :meth:`step` does.

        Returns
        -------
        FitResult
            Rounds completed, why the loop stopped, ε spent, the last
            evaluation and every round's record.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            On a bad argument (the message names it and its value).
        """
        rounds = check_count("rounds", rounds, minimum=1)
        eval_every = check_count("eval_every", eval_every, minimum=1)
        items = check_callbacks(callbacks)
        if not any(isinstance(c, ClippingWarning) for c in items):
            items.append(ClippingWarning())  # the default; pass one to change it
        run_round = self.step if step is None else step
        log = logger if logger is not None else _log
        ledger = self.ledger
        event = self.algorithm.event()
        private = event is not None
        if private and delta is None:
            if ledger.budget is None:
                raise InvalidParameterError(
                    "delta must be given to fit a private run whose ledger has no "
                    "budget; got None"
                )
            delta = ledger.budget.delta
        if delta is not None:
            delta = check_delta("delta", delta)
        at = float(delta) if delta is not None else 0.0  # δ of the ε reported
        status = default = None
        if event is not None:
            status = schemes.describe(event, ledger.analysis)["status"]
            default = schemes.scheme_of(event).default
        state = FitState(
            trainer=self,
            rounds=rounds,
            eval_every=eval_every,
            delta=delta if private else None,
            private=private,
            status=status,
            budget=ledger.budget,
            name=str(name),
            run_dir=None if run_dir is None else Path(run_dir),
            start_round=self.round,
        )

        def evaluate(done: int) -> dict[str, Any]:
            state.evaluation = {
                k: float(v) for k, v in self.algorithm.evaluate().items()
            }
            state.evaluated_round = done
            out: dict[str, Any] = dict(state.evaluation)
            if not private:
                out["epsilon"] = None
                out["private"] = False
                return out
            state.epsilon = float(ledger.epsilon(at).upper) if ledger.rounds else 0.0
            out["epsilon"] = state.epsilon
            if status != "proven":
                # an unproven figure never travels without the proven one
                state.epsilon_proven = (
                    float(ledger.epsilon(at, analysis=default).upper)
                    if ledger.rounds
                    else 0.0
                )
                out["epsilon_status"] = status
                out["epsilon_proven"] = state.epsilon_proven
            return out

        begun: list[Callback] = []
        try:
            for cb in items:
                cb.on_fit_begin(state)
                begun.append(cb)
            with deferred_interrupt(log) as flag:
                while self.round < rounds:
                    after = self.round + 1  # diagnostics where fit evaluates
                    self._evaluated_next = after % eval_every == 0 or after == rounds
                    try:
                        report = run_round()
                    except BudgetExceededError as exc:
                        state.stopped = "budget"
                        log.warning(
                            "budget reached at round %d: %s", self.round + 1, exc
                        )
                        break
                    except NonFiniteUpdateError as exc:
                        raise NonFiniteUpdateError(
                            f"round {self.round + 1}: {exc}; the run stops (the "
                            "last checkpoint is kept)"
                        ) from None
                    done = report.round + 1
                    record: dict[str, Any] = {"round": done}
                    record.update({k: float(v) for k, v in report.metrics.items()})
                    if done % eval_every == 0 or done == rounds:
                        record.update(evaluate(done))
                    _check_record(record)
                    state.history.append(record)
                    for cb in items:
                        cb.on_round_end(state, record)
                    if flag["stop"]:
                        state.stopped = "interrupted"
                        log.warning("interrupted after round %d", done)
                        break
                    if state.stop_requested is not None:
                        state.stopped = state.stop_requested
                        log.info("stopped by a callback after round %d", done)
                        break
            if state.stopped is None:
                state.stopped = "completed"
            if (
                state.stopped != "completed"
                and self.round
                and state.evaluated_round != self.round
            ):
                # a final evaluation of the model the fit ends with
                final = {"round": self.round, **evaluate(self.round)}
                if state.history and state.history[-1]["round"] == self.round:
                    state.history[-1].update(final)
                state.final_evaluation = final
            elif not state.evaluation and self.round:
                evaluate(self.round)  # nothing left to run (a finished run resumed)
        except BaseException as exc:
            state.error = exc
            raise
        finally:
            self._evaluated_next = False
            for cb in begun:
                cb.on_fit_end(state)
        return FitResult(
            rounds_completed=self.round,
            stopped=state.stopped,
            epsilon=state.epsilon if private else None,
            delta=state.delta,
            metrics=dict(state.evaluation),
            history=state.history,
        )

    def state_dict(self) -> dict[str, Any]:
        """Return the algorithm's state, the round counter and the seed.

        No generator state is stored: round ``t``'s generators are derived
        from ``(key or seed, t[, client])`` alone; the secret noise key is
        never stored here (a checkpoint is what gets shared). The number of
        rounds the ledger has charged and its chain hash there tie the
        checkpoint to its ledger. The ledger itself is persisted by
        :meth:`PrivacyLedger.save`.

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
            "ledger_chain": self.ledger.chain_at(self.ledger.rounds),
            "algorithm": self.algorithm.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (for ``dpfl resume``).

        A ledger holding *more* rounds than the checkpoint (saved after a
        later round, e.g. a crash between two checkpoints) is rewound to the
        checkpoint (:meth:`PrivacyLedger.rewind`): the later rounds are
        replayed and each confirms its entry instead of being charged again.

        Parameters
        ----------
        state : dict
            A checkpoint from :meth:`state_dict`.

        Raises
        ------
        dpfl.errors.DpflError
            If the checkpoint is not a trainer checkpoint, was taken with
            another seed, the ledger holds fewer rounds than were charged
            when the checkpoint was taken (the spend is never silently reset),
            its entries up to the checkpoint are not the ones the checkpoint
            was taken with (chain hash), or the checkpoint's model is not the
            one the ledger recorded for its last charged round (digest).
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
        count = int(state["ledger_rounds"])
        if self.ledger.released < count:
            raise DpflError(
                f"the ledger holds {self.ledger.released} charged rounds but the "
                f"checkpoint was taken after {count}; load the ledger saved with "
                "the checkpoint (a resumed run never resets its spend)"
            )
        self.ledger.rewind(count)
        if self.ledger.chain_at(count) != state["ledger_chain"]:
            raise DpflError(
                f"the ledger's first {count} entries are not those the checkpoint "
                "was taken with (chain hash differs): a ledger of another run, or "
                "an altered one"
            )
        self.algorithm.load_state_dict(state["algorithm"])
        if count:
            # the model must be the one the ledger recorded after its last
            # charged round (what the chain covers): not another run's
            recorded = self.ledger.entries[count - 1].digest
            if recorded is not None and recorded != weights_digest(
                self.algorithm.weights
            ):
                raise DpflError(
                    f"the checkpoint's model is not the model the ledger recorded "
                    f"after its round {self.ledger.entries[count - 1].round + 1} "
                    "(model digest differs): a checkpoint of another run, or an "
                    "altered one; refusing it"
                )
        self.round = int(state["round"])
