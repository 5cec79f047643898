"""One call from a model, federated data and a target (ε, δ) to private training.

:func:`make_private` is dpfl's counterpart of Opacus'
``PrivacyEngine.make_private_with_epsilon``: given any ``torch.nn.Module``, a
:class:`~dpfl.data.FederatedDataset`, an algorithm name with its parameters
and a target (ε, δ) over a number of rounds, it

1. builds the algorithm's parameters (:func:`dpfl.sim.algorithms.make_params`;
   an unknown name lists the accepted ones);
2. takes the accounting event the algorithm's rounds realise, resolves the
   scheme's default analysis (its tightest proven one), and calibrates the
   noise multiplier σ so that the rounds fit the budget, with the same
   function as ``dpfl train`` (:func:`dpfl.sim.plan.plan_privacy`), through
   the one assembler of runs (:func:`dpfl.experiments.build.assemble`);
3. returns a :class:`PrivateTrainer` holding σ, the event, the analysis and
   the guarantee's terms, whose :meth:`~PrivateTrainer.fit` trains under a
   :class:`~dpfl.accounting.ledger.PrivacyLedger` that refuses any round that
   would pass the budget.

Examples
--------
See the README section "Train your own model" (run by the tests)::

    trainer = dpfl.make_private(model, data, "dp-fedavg", epsilon=2.0,
                                delta=1e-5, rounds=50, cohort_size=25, clip=0.5)
    result = trainer.fit()
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dpfl._validate import check_count

if TYPE_CHECKING:
    from torch import nn

    from dpfl.accounting.bounds import Bound
    from dpfl.accounting.events import Event
    from dpfl.data.dataset import FederatedDataset
    from dpfl.sim.algorithms.base import FederatedAlgorithm
    from dpfl.sim.callbacks import Callback, FitResult
    from dpfl.sim.executors import Executor
    from dpfl.sim.loop import Trainer

__all__ = ["PrivateTrainer", "make_private"]

log = logging.getLogger("dpfl.sim")


class PrivateTrainer:
    """A federated algorithm made private: σ, its accounting, and a fit method.

    Built by :func:`make_private`; the attributes are what it decided.

    Attributes
    ----------
    model : torch.nn.Module
        The model, trained in place.
    algorithm : FederatedAlgorithm
        The algorithm running the rounds.
    trainer : Trainer
        The round loop (:class:`dpfl.sim.loop.Trainer`).
    ledger : PrivacyLedger
        Where every round is charged; its budget guards every round.
    noise_multiplier : float
        σ (calibrated, or as given; 0: non-private).
    event : Event or None
        One round's accounting event at σ (``None``: non-private).
    analysis : str or None
        The analysis that prices the rounds.
    epsilon, delta : float or None
        The target budget (ε ``None``: no budget, σ as given).
    rounds : int
        The rounds the budget was planned for.
    eval_every : int
        Evaluation period of :meth:`fit`.
    """

    def __init__(
        self,
        *,
        algorithm: FederatedAlgorithm,
        trainer: Trainer,
        event: Event | None,
        analysis: str | None,
        epsilon: float | None,
        delta: float | None,
        rounds: int,
        eval_every: int,
        callbacks: Sequence[Callback] = (),
        progress: bool = True,
    ) -> None:
        self.algorithm = algorithm
        self.trainer = trainer
        self.ledger = trainer.ledger
        self.model = algorithm.model
        self.noise_multiplier = float(algorithm.noise_multiplier)
        self.event = event
        self.analysis = analysis
        self.epsilon = epsilon
        self.delta = delta
        self.rounds = rounds
        self.eval_every = eval_every
        self._callbacks = list(callbacks)
        self._progress = progress

    @property
    def guarantee(self) -> dict[str, Any]:
        """What the planned run guarantees, with every term.

        Returns
        -------
        dict
            ``private``; for a private run also the target ``epsilon`` and
            ``delta`` (``None`` without a budget), ``rounds``,
            ``noise_multiplier``, ``noise`` (``"secure"`` or the reproducible
            mode's warning) and the scheme's terms: ``scheme``,
            ``unit``, ``neighbouring``, ``adversary``, ``analysis``,
            ``status`` and ``basis``.
        """
        if self.event is None:
            return {
                "private": False,
                "note": "no noise is added: the run has no privacy guarantee",
            }
        from dpfl.accounting import schemes
        from dpfl.sim.keys import noise_label

        return {
            "private": True,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "rounds": self.rounds,
            "noise_multiplier": self.noise_multiplier,
            "noise": noise_label(self.trainer.noise_key is not None),
            **schemes.describe(self.event, self.analysis),
        }

    def spent(self) -> Bound | None:
        """ε spent so far at the target δ (worst-off unit); ``None`` if non-private.

        Returns
        -------
        Bound or None
            The ledger's bracket (``.upper`` is the guarantee); ``None`` when
            nothing is charged (non-private, or no round run yet).
        """
        if self.event is None or not self.ledger.rounds or self.delta is None:
            return None
        return self.ledger.epsilon(self.delta)

    def fit(
        self,
        rounds: int | None = None,
        *,
        callbacks: Sequence[Callback] | None = None,
        progress: bool | None = None,
        eval_every: int | None = None,
    ) -> FitResult:
        """Train: run the rounds, evaluating every ``eval_every`` rounds.

        Stops early, cleanly, if the ledger refuses a round (``"budget"``) or
        on Ctrl-C (``"interrupted"``, after the round in progress).

        Parameters
        ----------
        rounds : int or None
            Run to this round, counted from 0 (default: the planned
            ``rounds``); a second call continues where the first stopped.
        callbacks : sequence of Callback or None
            Callbacks for this call, after those given to
            :func:`make_private` (:mod:`dpfl.sim.callbacks`).
        progress : bool or None
            Show progress (a bar on a terminal, else a plain line every few
            rounds); default: as given to :func:`make_private`.
        eval_every : int or None
            Evaluation period (default: the trainer's).

        Returns
        -------
        FitResult
            ``history`` (one record per round; ``test_accuracy``,
            ``test_loss`` and ``epsilon`` on evaluation rounds), ``epsilon``
            (ε spent at the end, from the ledger), ``metrics`` (the last
            evaluation), ``rounds_completed`` and ``stopped``.
        """
        from dpfl.sim.callbacks import check_callbacks
        from dpfl.sim.callbacks import progress as progress_callback

        target = (
            self.rounds if rounds is None else check_count("rounds", rounds, minimum=1)
        )
        every = (
            self.eval_every
            if eval_every is None
            else check_count("eval_every", eval_every, minimum=1)
        )
        items = [*self._callbacks, *check_callbacks(callbacks)]
        if self._progress if progress is None else progress:
            items.append(progress_callback(desc=self.algorithm.name))
        return self.trainer.fit(
            target,
            eval_every=every,
            delta=self.delta,
            callbacks=items,
            name=self.algorithm.name,
        )

    #: The same as :meth:`fit`.
    train = fit

    def close(self) -> None:
        """Release the executor's resources (Ray workers); a no-op otherwise."""
        close = getattr(self.trainer.executor, "close", None)
        if callable(close):
            close()

    def __repr__(self) -> str:
        """Return the algorithm, σ, the target and the analysis."""
        target = (
            "non-private"
            if self.event is None
            else f"epsilon={self.epsilon}, delta={self.delta}, "
            f"analysis={self.analysis!r}"
        )
        return (
            f"PrivateTrainer({self.algorithm.name}, noise_multiplier="
            f"{self.noise_multiplier:.4g}, rounds={self.rounds}, {target})"
        )


def make_private(
    model: nn.Module,
    data: FederatedDataset,
    algorithm: str = "dp-fedavg",
    *,
    epsilon: float | None,
    delta: float | None,
    rounds: int,
    noise_multiplier: float | None = None,
    analysis: str | None = None,
    allow_unproven: bool = False,
    allow_large_delta: bool = False,
    seed: int = 0,
    secure_noise: bool = True,
    noise_key: bytes | None = None,
    eval_every: int | None = None,
    execution: str | Executor = "batched",
    device: str = "cpu",
    loss_fn: Callable[[Any, Any], Any] | None = None,
    callbacks: Sequence[Callback] | None = None,
    progress: bool = True,
    **params: Any,
) -> PrivateTrainer:
    """Make ``model`` trainable on ``data`` by a private federated algorithm.

    Parameters
    ----------
    model : torch.nn.Module
        Any module mapping a batch of the data's features to class scores
        (no BatchNorm: per-example gradients need examples processed
        independently; use GroupNorm). Trained in place.
    data : FederatedDataset
        The federated data (:func:`dpfl.data.federate` turns arrays and a
        partition into one; :func:`dpfl.data.get_dataset` loads the built-in
        ones).
    algorithm : str
        A registered algorithm: ``"dp-fedavg"`` (client-level; default),
        ``"dsgd-rp"`` (record-level DP-DSGD with random participation),
        ``"prifedsync"``, ``"ms-pafl"``, ``"locks"``, or ``"fedavg"`` (the
        non-private baseline: only with ``epsilon=None``).
    epsilon : float or None
        Target ε for the worst-off privacy unit over all ``rounds`` (> 0).
        ``None``: no budget; then ``noise_multiplier`` must be given, and ε
        spent is only reported.
    delta : float or None
        Target δ in (0, 1), below 1/n for the n privacy units (records or
        clients) unless ``allow_large_delta``; ``None`` only for a
        non-private run.
    rounds : int
        Rounds the budget must cover (>= 1); :meth:`PrivateTrainer.fit`
        runs them.
    noise_multiplier : float or None
        σ; ``None`` (default): calibrated to (ε, δ) over ``rounds``; 0: no
        noise (non-private; not with ``epsilon``).
    analysis : str or None
        The analysis that prices the rounds (``None``: the scheme's default,
        its tightest proven one).
    allow_unproven : bool
        Accept an analysis or setting whose ε is not a proven bound.
    allow_large_delta : bool
        Accept δ >= 1/n.
    seed : int
        Seed of the run (>= 0); of every round's randomness only with
        ``secure_noise=False``.
    secure_noise : bool
        ``True`` (default): participants and noise come from a secret key
        (``noise_key``) through a cryptographically secure,
        floating-point-safe sampler (:mod:`dpfl.sim.secure_noise`).
        ``False``: reproducible noise from ``seed``; anyone who knows the
        seed can regenerate the noise and subtract it (not for release).
    noise_key : bytes or None
        The secret 32-byte key of secure noise (``None``: a fresh one, kept
        as ``trainer.trainer.noise_key``); never publish it.
    eval_every : int or None
        Evaluation period of :meth:`PrivateTrainer.fit` (default: about ten
        evaluations per run).
    execution : str or Executor
        ``"batched"`` (the cohort as one vectorised computation), ``"loop"``
        (one client at a time), ``"ray"`` (Ray actors; call
        :meth:`PrivateTrainer.close` when done), or an executor object.
    device : str
        Torch device (``"cpu"``, ``"cuda"``).
    loss_fn : callable or None
        ``loss_fn(output, target)``, mean over the batch (default cross
        entropy).
    callbacks : sequence of Callback or None
        Callbacks of every :meth:`PrivateTrainer.fit`
        (:mod:`dpfl.sim.callbacks`: TensorBoard, metrics file, your own).
    progress : bool
        Show progress during :meth:`PrivateTrainer.fit`.
    **params
        The algorithm's parameters (e.g. DP-FedAvg's ``cohort_size``,
        ``clip``, ``local_epochs``, ``batch_size``, ``learning_rate``); an
        unknown one is refused with the list of accepted ones.

    Returns
    -------
    PrivateTrainer
        With the calibrated σ (``noise_multiplier``), ``event``,
        ``analysis`` and ``guarantee``; call :meth:`~PrivateTrainer.fit`.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a bad argument (the message names it, its constraint and value),
        a model that does not accept the data, an unproven analysis without
        ``allow_unproven``, or δ >= 1/n without ``allow_large_delta``.
    dpfl.errors.DpflError
        If no noise multiplier meets the target (the message says what
        would).
    """
    from dpfl.experiments.build import assemble
    from dpfl.sim.callbacks import check_callbacks

    rounds = check_count("rounds", rounds, minimum=1)
    extra = check_callbacks(callbacks)
    every = (
        max(1, round(rounds / 10))
        if eval_every is None
        else check_count("eval_every", eval_every, minimum=1)
    )
    built = assemble(
        model,
        data,
        algorithm,
        params,
        epsilon=epsilon,
        delta=delta,
        rounds=rounds,
        noise_multiplier=noise_multiplier,
        analysis=analysis,
        allow_unproven=allow_unproven,
        allow_large_delta=allow_large_delta,
        seed=seed,
        secure_noise=secure_noise,
        noise_key=noise_key,
        execution=execution,
        device=device,
        loss_fn=loss_fn,
        logger=log,
    )
    return PrivateTrainer(
        algorithm=built.algorithm,
        trainer=built.trainer,
        event=built.plan.event,
        analysis=built.plan.analysis,
        epsilon=built.epsilon,
        delta=built.delta,
        rounds=rounds,
        eval_every=every,
        callbacks=extra,
        progress=progress,
    )
