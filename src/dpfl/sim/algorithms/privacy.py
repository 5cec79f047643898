"""What privacy needs of an algorithm: its accounting hooks, apart from the round.

:class:`PrivacyHooks` is the part of
:class:`~dpfl.sim.algorithms.base.FederatedAlgorithm` that accounting reads:
the planner (:func:`dpfl.sim.plan.plan_privacy`), the
:class:`~dpfl.sim.loop.Trainer`'s charge and the run's report. Only
:meth:`PrivacyHooks.round_event` must be written; every other hook has a
default that fits a central-noise algorithm with a proven analysis:

* ``round_event``: the event of one round, pure (abstract: must be written);
* ``unproven_reason``: why the parameters give no proven bound (default
  ``None``: proven);
* ``valid_analyses``: the only analyses that describe the run (``None``: any);
* ``resolve_noise``: σ set by the parameters themselves (``None``);
* ``paper_report``: the paper's own figures for a run (``None``);
* ``event``: the event of a round of *this* run (``round_event`` at its σ);
* ``realised_event``: the event as the round realised it (``None``: ``event``);
* ``ledger_extra``: extra facts for the ledger entry (``None``);
* ``messages_are_releases``: whether a client's message is itself a release
  (``False``: central noise);
* ``per_client_accounting``: record each round's participants (``False``).

The class methods are pure functions of the parameters and the data's
statistics (calibration calls them without building a model); the instance
hooks read ``params``, ``stats``, ``noise_multiplier`` and ``private``, which
the algorithm sets in its constructor.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar

from dpfl.accounting.events import Event

if TYPE_CHECKING:
    from dpfl.sim.algorithms.base import AlgorithmParams, DataStats
    from dpfl.sim.algorithms.tasks import Cohort

__all__ = ["PrivacyHooks"]


class PrivacyHooks(abc.ABC):  # noqa: B024  (round_event is its abstract member)
    """The accounting hooks of an algorithm (see the module docstring)."""

    #: Record the participants of each round in the ledger (client-level,
    #: per-participant accounting).
    per_client_accounting: ClassVar[bool] = False

    params: AlgorithmParams
    stats: DataStats
    noise_multiplier: float
    private: bool

    @classmethod
    @abc.abstractmethod
    def round_event(
        cls,
        params: AlgorithmParams,
        stats: DataStats,
        noise_multiplier: float,
        round_index: int = 0,
    ) -> Event:
        """The accounting event of round ``round_index`` at noise multiplier σ > 0.

        The event of the sampler and privatizer the round uses, built without
        a model: :func:`dpfl.accounting.calibrate.calibrate_noise_multiplier`
        calibrates σ through it. It depends on the round only where a
        parameter is a per-round schedule.
        """

    @classmethod
    def unproven_reason(cls, params: AlgorithmParams) -> str | None:
        """Why these parameters give no proven bound (None: they do)."""
        return None

    @classmethod
    def valid_analyses(cls, params: AlgorithmParams) -> tuple[str, ...] | None:
        """The only analyses that describe these parameters' mechanism (None: any).

        An algorithm whose setting changes what the adversary sees (e.g.
        participation made visible to the server) narrows the analyses that
        hold; :func:`dpfl.sim.plan.plan_privacy` refuses any other, even with
        ``allow_unproven``, since it would not describe the mechanism run.
        """
        return None

    @classmethod
    def resolve_noise(
        cls, params: AlgorithmParams, stats: DataStats
    ) -> tuple[float, AlgorithmParams] | None:
        """σ set by the parameters themselves (e.g. a per-round local ε), if any.

        Returns ``(σ, params without that setting)``, or ``None`` (default):
        σ comes from ``privacy.noise_multiplier``.
        """
        return None

    @classmethod
    def paper_report(
        cls,
        params: AlgorithmParams,
        stats: DataStats,
        noise_multiplier: float,
        ledger: Any,
        delta: float,
    ) -> dict[str, Any] | None:
        """The paper's own privacy figures for a run, with caveats (None: none)."""
        return None

    def event(self, round_index: int = 0) -> Event | None:
        """The event of round ``round_index`` (``None``: non-private, not charged)."""
        if not self.private:
            return None
        return type(self).round_event(
            self.params, self.stats, self.noise_multiplier, round_index
        )

    def realised_event(self, cohort: Cohort) -> Event | None:
        """The event as the round realised it, when it learns facts during the round.

        It must price as :meth:`event` (the ledger checked that one). Default
        ``None``: the round realised :meth:`event`.
        """
        return None

    def ledger_extra(self, cohort: Cohort) -> dict[str, Any] | None:
        """Extra facts of the round for the ledger entry (default none)."""
        return None

    @property
    def messages_are_releases(self) -> bool:
        """Whether a client's message is itself a private release.

        True when the clients privatize what they send (client-side noise):
        the server, or anyone who sees a message, sees a release the event
        prices, so a round whose messages reached the server is charged even
        if it is abandoned before the server step
        (:meth:`dpfl.sim.loop.Trainer.abandon_round`). False (default): the
        server privatizes (central noise) and only its update is a release.
        """
        return False
