"""The round loop: guard the budget, run a round, charge the ledger.

:class:`Trainer` drives any :class:`Algorithm`. Each :meth:`Trainer.step`

1. asks the algorithm for the accounting event of the next round and calls
   :meth:`~dpfl.accounting.ledger.PrivacyLedger.check` *before any
   computation*: a round that would exceed the budget raises
   :class:`~dpfl.errors.BudgetExceededError` and nothing changes;
2. derives the round's generators from ``SeedSequence(seed)`` keyed by the
   round index and runs the round;
3. records the event in the ledger (with the participants only if the
   algorithm's guarantee is per client), and saves the ledger if it has a
   path.

Randomness is keyed by position, not carried as stream state: round ``t``
uses ``SeedSequence(seed, spawn_key=(t,))`` — the ``t``-th child of
``SeedSequence(seed).spawn`` — split into one numpy and one torch generator.
A checkpoint therefore needs no generator state, a resumed run draws exactly
what the uninterrupted run drew, and round ``t``'s numbers do not depend on
what earlier rounds consumed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from dpfl._validate import check_count
from dpfl.accounting.events import Event
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.errors import DpflError, InvalidParameterError

__all__ = [
    "Algorithm",
    "RoundReport",
    "Trainer",
    "check_state_owner",
    "model_state",
    "round_generators",
]

_STATE_FORMAT = 1


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of ``model``'s state, for an algorithm's ``state_dict``."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def check_state_owner(state: dict[str, Any], name: str) -> None:
    """Raise unless ``state`` was saved by the algorithm called ``name``.

    Raises
    ------
    InvalidParameterError
        If the state names another algorithm.
    """
    if state.get("name") != name:
        raise InvalidParameterError(
            f"state is for algorithm {state.get('name')!r}, not {name!r}"
        )


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
    participants : numpy.ndarray or None
        The clients that took part, when the algorithm reports them.
    metrics : dict of str to float
        The algorithm's round metrics.
    """

    round: int
    event: Event | None
    participants: np.ndarray | None
    metrics: dict[str, float]


@runtime_checkable
class Algorithm(Protocol):
    """A federated algorithm as the :class:`Trainer` sees it.

    Optional attributes read by the trainer: ``device`` (where the torch
    generator lives; default ``"cpu"``) and ``per_client_accounting`` (record
    participants in the ledger; default ``False``).
    """

    name: str

    def event(self) -> Event | None:
        """The accounting event of the next round (``None``: not private)."""
        ...

    def run_round(
        self, round_index: int, rng: np.random.Generator, generator: torch.Generator
    ) -> tuple[np.ndarray | None, dict[str, float]]:
        """Run one round; return the participants and the round's metrics."""
        ...

    def evaluate(self) -> dict[str, float]:
        """Evaluate the current model (``test_loss``, ``test_accuracy``, ...)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`."""
        ...


def round_generators(
    seed: int, round_index: int, device: str | torch.device = "cpu"
) -> tuple[np.random.Generator, torch.Generator]:
    """The numpy and torch generators of round ``round_index`` of a run.

    Parameters
    ----------
    seed : int
        The run's seed (>= 0).
    round_index : int
        The round (>= 0).
    device : str or torch.device
        Device of the torch generator.

    Returns
    -------
    tuple
        ``(numpy.random.Generator, torch.Generator)``, both from
        ``SeedSequence(seed, spawn_key=(round_index,))``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``seed`` or ``round_index`` is not a non-negative integer.
    """
    seed = check_count("seed", seed, minimum=0)
    round_index = check_count("round_index", round_index, minimum=0)
    np_seq, torch_seq = np.random.SeedSequence(seed, spawn_key=(round_index,)).spawn(2)
    generator = torch.Generator(device=device)
    generator.manual_seed(int(torch_seq.generate_state(1, np.uint64)[0]))
    return np.random.default_rng(np_seq), generator


class Trainer:
    """Runs an :class:`Algorithm` round by round against a :class:`PrivacyLedger`.

    Parameters
    ----------
    algorithm : Algorithm
        The algorithm (holds the model and its optimiser state).
    ledger : PrivacyLedger
        Where each private round is charged; its budget guards every round.
    seed : int
        Seed of the run's randomness (>= 0).

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
        self, algorithm: Algorithm, *, ledger: PrivacyLedger, seed: int
    ) -> None:
        self.algorithm = algorithm
        self.ledger = ledger
        self.seed = seed
        self.round = 0

    def _device(self) -> str | torch.device:
        return getattr(self.algorithm, "device", "cpu")

    def step(self) -> RoundReport:
        """Run one round.

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
        event = self.algorithm.event()
        if event is not None:
            self.ledger.check(event)
        index = self.round
        rng, generator = round_generators(self.seed, index, self._device())
        participants, metrics = self.algorithm.run_round(index, rng, generator)
        if event is not None:
            # Some schemes learn facts only during the round (LOCKS: the largest
            # second-stage probability, who was in the second stage); their
            # realised event prices the same as the one checked above.
            realised = getattr(self.algorithm, "realised_event", None)
            if realised is not None:
                event = realised()
            ledger_extra = getattr(self.algorithm, "ledger_extra", None)
            per_client = bool(getattr(self.algorithm, "per_client_accounting", False))
            self.ledger.record(
                event,
                participants=participants if per_client else None,
                round=index,
                extra=ledger_extra() if ledger_extra is not None else None,
            )
            if self.ledger.path is not None:
                self.ledger.flush()
        self.round = index + 1
        return RoundReport(
            round=index, event=event, participants=participants, metrics=metrics
        )

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
        from ``(seed, t)`` alone (see the module docstring). The number of
        rounds the ledger has charged is stored to detect a checkpoint loaded
        against the wrong ledger. The ledger itself is persisted by
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
            raise DpflError("state is not a dpfl Trainer checkpoint (format 1)")
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
