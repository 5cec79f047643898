"""PriFedSync (Zheng, Chen, Long & Su, "Federated f-differential privacy", Alg. 1-2).

One synchronisation round, as in the paper's pseudo-code (docs/analyses.md)::

    Ω   <- each of the m clients syncs w.p. p          (re-drawn while empty)
    for i in Ω:                                        (client step)
        θ <- h̃^(i)                                      (the client's helper model)
        repeat K times:                                  (NoisySGD / noisy Adam)
            I  <- uniform size-B subset of S^(i), without replacement
            g̃  <- (1/B) [ Σ_{x in I} clip_C(∇ℓ(θ; x)) + N(0, (2Cσ)² I) ]
            θ  <- optimiser(θ, g̃)                        (SGD, or Adam with
                                                           per-client state)
        send w̃^(i) <- θ
    w̃_global <- (1 − η) w̃_global + η · mean_{i in Ω} w̃^(i)   (server step)
    h̃^(i)    <- F_i(w̃_global)  for i in Ω:
                 identity       F_i(w) = w                (FedAvg)
                 interpolation  F_i(w) = (1 − α_i) w̃^(i) + α_i w   (eq. 2.1)

The helper model ``h̃^(i)`` is the client's *personalised*, synchronised
state: it is what the client evaluates with and where its next local training
starts (clients that never synced hold ``w0``). The optimiser state (Adam's
moments and step count) persists per client across rounds, as in the
authors' code. Both live in this object as ``[clients, d]`` tensors; a client
step reads its row and stages its new optimiser state, which the server step
commits only once the round's update is finite.

σ (``privacy.noise_multiplier``) is the **paper's** σ: the noise on the sum of
the ``B`` clipped per-record gradients has standard deviation ``2Cσ``
(replace-one sensitivity ``2C``), so one un-subsampled step is ``G_{1/σ}``
and its event is ``Gaussian(2σ)`` under a replace-one sampling event.
Opacus' ``noise_multiplier`` for the same noise is ``2σ``.

Privacy accounting
------------------
Unit: a record; neighbouring: replace one record of one client; adversary:
any other client (weak federated f-DP, one-vs-one) or all other clients
jointly (strong). The round's event is the
:class:`~dpfl.sim.sampling_checkin.SyncSampler`'s,
``CheckIn(p', SelfComposed(WithoutReplacement(B, n_min, Gaussian(2σ)), K))``:
a client syncs w.p. ``p' = p / (1 − (1 − p)^m)`` (Ω is re-drawn while empty),
visibly, then runs ``K`` steps, each ``C_{B/n}(G_{1/σ})`` with ``n`` the
*smallest* client size (a client with more records is at least as private).
The synced clients are recorded as the round's participants, so a client's
spend is the composition of the rounds it synced in
(``PrivacyLedger.client_epsilon``); the federation's weak (and, soundly,
strong) guarantee is that of the client that synced most often
(:func:`dpfl.accounting.reports.prifedsync_report`, via
:meth:`PriFedSync.paper_report`).

**Client sampling gives no amplification here.** Who synced is visible (it
is recorded, and a helper model changes only when its client synced), and
the paper's Lemma 3.8 ``p²`` term is not justified (docs/analyses.md).

**Who draws what.** The server draws Ω from its round generator; each synced
client draws its ``K`` batches and its own noise from its own generators
(:mod:`dpfl.sim.randomness`), so the loop and batched executors draw the same
numbers. The batched client step stacks the synced clients' parameters
``[|Ω|, d]``: each local step is one call of
:func:`dpfl.sim.grad.batched_client_grads` (the cross-client ghost kernel when
every parameter sits in a layer with a ghost rule, else ``vmap``) followed by
:func:`dpfl.sim.local.cohort_adam_step` (or an SGD step) on the stacked rows.

References
----------
Q. Zheng, S. Chen, Q. Long and W. J. Su, "Federated f-differential privacy",
AISTATS 2021, Algorithms 1-2, eq. (2.1), Theorem 2, §4;
enosair/federated-fdp (``sync.py``, ``sampler.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, cast

import numpy as np
import torch

from dpfl._validate import (
    check_count,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.accounting import reports
from dpfl.accounting.events import Event
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.models.losses import predicted_labels
from dpfl.sim.algorithms.base import (
    AlgorithmParams,
    DataStats,
    FederatedAlgorithm,
    Messages,
)
from dpfl.sim.algorithms.registry import register
from dpfl.sim.algorithms.tasks import Cohort, Message, Task
from dpfl.sim.grad import (
    batched_client_grads,
    check_finite,
    clipped_grad_sum,
    ghost_supported,
)
from dpfl.sim.local import cohort_adam_step
from dpfl.sim.noise import gaussian_noise_rows
from dpfl.sim.randomness import Streams
from dpfl.sim.sampling_checkin import SyncSampler
from dpfl.sim.secure_noise import NoiseGenerator

__all__ = ["PriFedSync", "PriFedSyncParams"]

OPTIMIZERS = ("adam", "sgd")
HELPERS = ("interpolation", "identity")
GRAD_METHODS = ("auto", "ghost", "batched", "per-client")
Kernel = Literal["auto", "vmap", "ghost"]


@dataclasses.dataclass(frozen=True)
class PriFedSyncParams(AlgorithmParams):
    """Parameters of PriFedSync (the ``algorithm.params`` of a run).

    Attributes
    ----------
    sync_probability : float
        p in (0, 1]: each client syncs in a round w.p. p (Ω re-drawn if empty).
    batch_size : int
        B records per local step, drawn uniformly without replacement
        (``B <= n_i`` for every client).
    local_steps : int
        K local steps per synced client per round.
    clip : float or None
        Per-record clipping norm C (> 0); ``None`` only for a non-private run.
    learning_rate : float
        Local step size (the paper: Adam, 0.001 on MNIST).
    optimizer : {"adam", "sgd"}
        Local optimiser fed with the noisy mean gradient.
    betas : tuple of float
        Adam's (β1, β2), each in [0, 1).
    adam_epsilon : float
        Adam's ε in the denominator (> 0).
    weight_decay : float
        L2 penalty added to the noisy gradient (torch's ``weight_decay``;
        post-processing, no privacy cost).
    lr_decay : float
        Step decay of the learning rate, in (0, 1]: a client's step ``t``
        (counted over all its local steps so far, across rounds) uses
        ``learning_rate * lr_decay ** (t // lr_decay_steps)``. 1 (the
        default) keeps it constant. The paper's CIFAR-10 schedule, "decayed
        by a factor of 0.99 every 10 epochs", is ``lr_decay: 0.99`` with
        ``lr_decay_steps`` = 10 epochs of the client's local steps
        (10 n_i / B = 312 for n_i = 500, B = 16). Post-processing: no
        privacy cost.
    lr_decay_steps : int
        Local steps of a client between two decays (>= 1).
    helper : {"interpolation", "identity"}
        Helper model ``F_i``: interpolation (eq. 2.1) or the global model.
    interpolation_weight : float or tuple of float
        α_i in [0, 1] (one value, or one per client); the paper uses 0.1.
        Used by ``helper="interpolation"`` only.
    aggregation_rate : float
        η in (0, 1]: ``w̃_global <- (1-η) w̃_global + η · mean``.
    grad_method : {"auto", "ghost", "batched", "per-client"}
        Kernel of the batched client step: ``"ghost"`` (one cross-client
        ghost-clipping pass per local step; every parameter in a layer with a
        ghost rule), ``"batched"`` (``vmap`` of per-example gradients over the
        synced clients), ``"per-client"`` (the client steps one at a time) or
        ``"auto"`` (``"ghost"`` when the model supports it, else
        ``"batched"``).
    """

    sync_probability: float = 1.0
    batch_size: int = 16
    local_steps: int = 38
    clip: float | None = 1.0
    learning_rate: float = 0.001
    optimizer: str = "adam"
    betas: tuple[float, float] = (0.9, 0.999)
    adam_epsilon: float = 1e-8
    weight_decay: float = 0.0
    lr_decay: float = 1.0
    lr_decay_steps: int = 1
    helper: str = "interpolation"
    interpolation_weight: float | tuple[float, ...] = 0.1
    aggregation_rate: float = 1.0
    grad_method: str = "auto"

    def __post_init__(self) -> None:
        self._set(
            "sync_probability",
            check_probability("sync_probability", self.sync_probability),
        )
        self._set("batch_size", check_count("batch_size", self.batch_size, minimum=1))
        self._set(
            "local_steps", check_count("local_steps", self.local_steps, minimum=1)
        )
        if self.clip is not None:
            self._set("clip", check_positive("clip", self.clip))
        self._set("learning_rate", check_positive("learning_rate", self.learning_rate))
        if self.optimizer not in OPTIMIZERS:
            raise InvalidParameterError(
                f"optimizer must be one of {OPTIMIZERS}; got {self.optimizer!r}"
            )
        try:
            betas = tuple(float(b) for b in self.betas)
        except (TypeError, ValueError):
            betas = ()
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise InvalidParameterError(
                f"betas must be two numbers in [0, 1); got {self.betas!r}"
            )
        self._set("betas", betas)
        self._set("adam_epsilon", check_positive("adam_epsilon", self.adam_epsilon))
        self._set("weight_decay", check_nonnegative("weight_decay", self.weight_decay))
        self._set("lr_decay", check_probability("lr_decay", self.lr_decay))
        self._set(
            "lr_decay_steps",
            check_count("lr_decay_steps", self.lr_decay_steps, minimum=1),
        )
        if self.helper not in HELPERS:
            raise InvalidParameterError(
                f"helper must be one of {HELPERS}; got {self.helper!r}"
            )
        alpha = self.interpolation_weight
        if isinstance(alpha, (Sequence, np.ndarray)) and not isinstance(alpha, str):
            self._set(
                "interpolation_weight",
                tuple(
                    check_probability("interpolation_weight", a, allow_zero=True)
                    for a in np.asarray(alpha, dtype=np.float64).tolist()
                ),
            )
        else:
            self._set(
                "interpolation_weight",
                check_probability("interpolation_weight", alpha, allow_zero=True),
            )
        self._set(
            "aggregation_rate",
            check_probability("aggregation_rate", self.aggregation_rate),
        )
        if self.grad_method not in GRAD_METHODS:
            raise InvalidParameterError(
                f"grad_method must be one of {GRAD_METHODS}; got {self.grad_method!r}"
            )


@register
class PriFedSync(FederatedAlgorithm):
    """PriFedSync with NoisySGD or noisy Adam local training (name ``"prifedsync"``).

    See :class:`~dpfl.sim.algorithms.base.FederatedAlgorithm` for the
    arguments; the parameters are :class:`PriFedSyncParams`. No BatchNorm.

    Attributes
    ----------
    helpers : torch.Tensor
        ``[clients, d]``: each client's helper (personalised) model ``h̃^(i)``.
    exp_avg, exp_avg_sq : torch.Tensor or None
        ``[clients, d]``: each client's Adam moments (``None`` for SGD).
    adam_steps : torch.Tensor
        ``[clients]``: each client's Adam step count.

    References
    ----------
    Zheng, Chen, Long & Su, "Federated f-differential privacy", AISTATS 2021,
    Algorithms 1-2, eq. (2.1), Theorem 2; docs/analyses.md.
    """

    name = "prifedsync"
    Params = PriFedSyncParams
    params: PriFedSyncParams
    per_client_accounting = True

    @property
    def messages_are_releases(self) -> bool:
        """True: each client runs noisy clipped local steps (client-side noise)."""
        return True

    # -- accounting (pure) -----------------------------------------------------------
    @staticmethod
    def sampler(params: PriFedSyncParams, stats: DataStats) -> SyncSampler:
        """Clients sync w.p. p (re-drawn while empty); K uniform size-B batches each."""
        return SyncSampler(
            num_clients=stats.num_clients,
            sync_probability=params.sync_probability,
            client_sizes=stats.sizes,
            batch_size=params.batch_size,
            local_steps=params.local_steps,
        )

    @classmethod
    def round_event(
        cls,
        params: AlgorithmParams,
        stats: DataStats,
        noise_multiplier: float,
        round_index: int = 0,
    ) -> Event:
        """The sampler's event at noise std ``2Cσ`` (see the module docstring)."""
        p = cast(PriFedSyncParams, params)
        return cls.sampler(p, stats).event(2.0 * noise_multiplier)

    @classmethod
    def paper_report(
        cls,
        params: AlgorithmParams,
        stats: DataStats,
        noise_multiplier: float,
        ledger: Any,
        delta: float,
    ) -> dict[str, Any] | None:
        """Weak and strong federated f-DP of the run (None when σ = 0).

        See :func:`dpfl.accounting.reports.prifedsync_report`.
        """
        if not noise_multiplier > 0:
            return None
        p = cast(PriFedSyncParams, params)
        return reports.prifedsync_report(
            ledger,
            delta=delta,
            noise_multiplier=noise_multiplier,
            batch_size=p.batch_size,
            records_per_client=int(stats.sizes.min()),
            local_steps=p.local_steps,
            num_clients=stats.num_clients,
        )

    # -- state -------------------------------------------------------------------------
    def setup(self) -> None:
        """Sampler, kernel, α per client, helper models and optimiser states."""
        p = self.params
        if self.private and p.clip is None:
            raise InvalidParameterError(
                "clip must be given (> 0) when noise_multiplier > 0; got None"
            )
        self._sampler = self.sampler(p, self.stats)
        n = self.stats.num_clients
        alphas = np.asarray(p.interpolation_weight, dtype=np.float64)
        if alphas.ndim == 0:
            alphas = np.full(n, float(alphas))
        if alphas.shape != (n,):
            raise InvalidParameterError(
                f"interpolation_weight must be one number or one per client ({n}); "
                f"got {alphas.size} values"
            )
        self.alphas = alphas
        #: batched_client_grads' method ("auto" falls back to vmap with a warning).
        self._kernel = cast(
            Kernel, {"ghost": "ghost", "batched": "vmap"}.get(p.grad_method, "auto")
        )
        method = p.grad_method
        if method == "auto":
            method = "ghost" if ghost_supported(self.model) else "batched"
        elif method == "ghost" and not ghost_supported(self.model):
            raise InvalidParameterError(
                "grad_method='ghost' needs every parameter in a layer with a "
                "ghost rule, e.g. nn.Linear or nn.Conv2d (see "
                "dpfl.sim.grad.ghost_supported); use 'batched'"
            )
        self.grad_method = method
        w0 = self.weights.detach()
        self.helpers = w0.unsqueeze(0).repeat(n, 1)
        adam = p.optimizer == "adam"
        self.exp_avg = torch.zeros_like(self.helpers) if adam else None
        self.exp_avg_sq = torch.zeros_like(self.helpers) if adam else None
        self.adam_steps = torch.zeros(n, dtype=torch.long, device=self.device)

    def extra_state(self) -> dict[str, Any]:
        """Helper models and optimiser states (CPU copies)."""
        state: dict[str, Any] = {
            "helpers": self.helpers.detach().cpu().clone(),
            "adam_steps": self.adam_steps.detach().cpu().clone(),
        }
        if self.exp_avg is not None and self.exp_avg_sq is not None:
            state["exp_avg"] = self.exp_avg.detach().cpu().clone()
            state["exp_avg_sq"] = self.exp_avg_sq.detach().cpu().clone()
        return state

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`extra_state`.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If the state's shapes do not match this federation and model.
        """
        names = ["helpers"] + (
            ["exp_avg", "exp_avg_sq"] if self.exp_avg is not None else []
        )
        for name in names:
            mine, theirs = getattr(self, name), state.get(name)
            if not isinstance(theirs, torch.Tensor) or theirs.shape != mine.shape:
                raise InvalidParameterError(
                    f"state's {name} does not match [{self.stats.num_clients}, "
                    f"{self.num_weights}]"
                )
        for name in names:
            getattr(self, name).copy_(state[name])
        self.adam_steps.copy_(state["adam_steps"])

    # -- Algorithm 1, one round --------------------------------------------------------
    def select(self, round_index: int, server: Streams) -> Cohort:
        """Ω ← each client w.p. p, re-drawn while empty; every synced client trains.

        Each task carries what the client holds: its helper model h̃^(i) (the
        server pushed it at the client's last sync) and its optimiser state.
        """
        clients = self._sampler.sample(server.rng).clients
        tasks = [Task(k, state=self.held_state(k)) for k in clients.tolist()]
        return Cohort(clients, tasks)

    def held_state(self, client: int) -> dict[str, torch.Tensor]:
        """Client ``client``'s helper model h̃^(i), Adam moments and step count."""
        k = int(client)
        state = {"helper": self.helpers[k], "steps": self.adam_steps[k]}
        if self.exp_avg is not None and self.exp_avg_sq is not None:
            state["exp_avg"] = self.exp_avg[k]
            state["exp_avg_sq"] = self.exp_avg_sq[k]
        return state

    def _noisy_mean(
        self, sums: torch.Tensor, generators: Sequence[NoiseGenerator]
    ) -> torch.Tensor:
        """Alg. 2's ``(Σ clip + N(0, (2Cσ)² I)) / B`` per row.

        Row ``j``'s noise comes from ``generators[j]`` (its client's own).
        """
        if self.private:
            std = 2.0 * cast(float, self.params.clip) * self.noise_multiplier
            # every client's noise of the step in one draw (one kernel launch
            # on CUDA with secure noise), row j from client j's generator
            sums = sums + gaussian_noise_rows(sums, std, generators)
        return sums / float(self.params.batch_size)

    def _local_update(
        self,
        theta: torch.Tensor,
        grad: torch.Tensor,
        m1: torch.Tensor | None,
        m2: torch.Tensor | None,
        steps: torch.Tensor,
    ) -> torch.Tensor:
        """One optimiser step of stacked rows (moments and steps updated in place)."""
        p = self.params
        if p.weight_decay:
            grad = grad + p.weight_decay * theta
        # the step's learning rate relative to learning_rate, per row, from
        # the client's steps so far (lr_decay); both steps are linear in it
        scale = None
        if p.lr_decay < 1.0:
            decays = torch.div(steps, p.lr_decay_steps, rounding_mode="floor")
            scale = torch.pow(p.lr_decay, decays.to(theta.dtype))
            scale = scale.reshape(-1, *([1] * (theta.dim() - 1)))
        if m1 is not None and m2 is not None:
            new = cohort_adam_step(
                theta,
                grad,
                m1,
                m2,
                steps,
                learning_rate=p.learning_rate,
                betas=p.betas,
                eps=p.adam_epsilon,
            )
            return new if scale is None else theta + scale * (new - theta)
        steps += 1
        rate = p.learning_rate if scale is None else p.learning_rate * scale
        return theta - rate * grad

    def _start(
        self, tasks: Sequence[Task]
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """The tasks' helper models and optimiser states, as stacked copies."""

        def rows(name: str) -> torch.Tensor:
            return torch.stack([t.state[name] for t in tasks]).to(self.device)

        adam = self.exp_avg is not None
        m1 = rows("exp_avg") if adam else None
        m2 = rows("exp_avg_sq") if adam else None
        return rows("helper"), m1, m2, rows("steps")

    @staticmethod
    def _kept(
        m1: torch.Tensor | None, m2: torch.Tensor | None, steps: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """The clients' new optimiser states (``[m, ...]``), sent back to keep."""
        state = {"steps": steps}
        if m1 is not None and m2 is not None:
            state["exp_avg"] = m1
            state["exp_avg_sq"] = m2
        return state

    def client_step(
        self, weights: torch.Tensor, task: Task, streams: Streams
    ) -> Message:
        """K noisy local steps from the client's helper model; sends ``w̃^(i)``.

        ``weights`` (the global model) is not read: a client trains from its
        helper ``h̃^(i)``, the synchronised state the server pushed to it at
        its last sync (``w0`` before), carried in ``task.state``.

        The batches come from the client's own ``streams.rng``, the noise from
        its ``streams.generator``; the gradient is one
        :func:`~dpfl.sim.grad.clipped_grad_sum` per step (the reference of
        :meth:`client_steps`). The new optimiser state returns in the
        message's ``state``.
        """
        k = int(task.client)
        theta, m1, m2, steps = self._start([task])
        x, y = self.client_data(self.client_rows(k))
        batches = self._sampler.local_batches(streams.rng, int(x.shape[0]))
        clip = self.params.clip
        for pos in batches:
            idx = torch.as_tensor(pos, device=self.device)
            if clip is not None:
                sums = clipped_grad_sum(
                    self.model,
                    self.unflatten(theta[0]),
                    x[idx],
                    y[idx],
                    clip=clip,
                    loss_fn=self.loss_fn,
                    method=self._kernel,
                )
                flat = self.flatten(sums)[None]
            else:
                flat = self._grad_sums(theta, x[idx][None], y[idx][None])
            grad = self._noisy_mean(flat, [streams.generator])
            theta = self._local_update(theta, grad, m1, m2, steps)
        kept = {name: rows[0] for name, rows in self._kept(m1, m2, steps).items()}
        return Message(theta[0], state=kept)

    def _grad_sums(
        self, theta: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor
    ) -> torch.Tensor:
        """Each row's sum of clipped per-record gradients, ``[m, d]``."""
        sums = batched_client_grads(
            self.model,
            self.unflatten(theta),
            xb,
            yb,
            loss_fn=self.loss_fn,
            clip=self.params.clip,
            max_clients=self.max_clients,
            method=self._kernel,
        )
        return self.flatten(sums, lead=1)

    def client_steps(
        self, weights: torch.Tensor, tasks: Sequence[Task], streams: Sequence[Streams]
    ) -> Messages:
        """The synced clients' local training as stacked ``[|Ω|, d]`` computations.

        Client ``j`` draws its batches and noise from ``streams[j]``, exactly
        as :meth:`client_step`; ``grad_method="per-client"`` runs the client
        steps one at a time.
        """
        if self.grad_method == "per-client" or not tasks:
            return super().client_steps(weights, tasks, streams)
        clients = [int(t.client) for t in tasks]
        theta, m1, m2, steps = self._start(tasks)
        data = [self.client_data(self.client_rows(k)) for k in clients]
        n_max = max(int(x.shape[0]) for x, _ in data)
        x_all = torch.stack([_pad(x, n_max) for x, _ in data])
        y_all = torch.stack([_pad(y, n_max) for _, y in data])
        batches = np.stack(
            [
                self._sampler.local_batches(s.rng, int(x.shape[0]))
                for s, (x, _) in zip(streams, data)
            ],
            axis=1,
        )  # [K, m, B]
        rows = torch.arange(len(clients), device=self.device)[:, None]
        generators = [s.generator for s in streams]
        for pos in batches:
            idx = torch.as_tensor(pos, device=self.device)
            sums = self._grad_sums(theta, x_all[rows, idx], y_all[rows, idx])
            grad = self._noisy_mean(sums, generators)
            theta = self._local_update(theta, grad, m1, m2, steps)
        return Messages(theta, states=self._kept(m1, m2, steps))

    def server_step(
        self, cohort: Cohort, messages: Messages, server: Streams
    ) -> dict[str, float]:
        """w̃_global ← (1 − η) w̃_global + η · mean w̃^(i); h̃^(i) ← F_i(w̃_global).

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If a trained model or the new global model is not finite; no state
            changes.
        """
        clients = [int(t.client) for t in cohort.tasks]
        steps = messages.states.get("steps")
        if messages.summed or steps is None or len(steps) != len(clients):
            raise DpflError(
                "server_step needs every synced client's model and optimiser state "
                f"({len(clients)} clients)"
            )
        trained = messages.vectors.to(self.weights.dtype)
        eta = self.params.aggregation_rate
        new_global = (1.0 - eta) * self.weights + eta * trained.mean(0)
        check_finite(
            {"local models": trained, "global model": new_global}, "model update"
        )
        update_norm = float(torch.linalg.vector_norm(new_global - self.weights))
        with torch.no_grad():
            self.weights.copy_(new_global)
        idx = torch.as_tensor(clients, dtype=torch.long, device=self.device)
        g = self.weights[None, :]
        if self.params.helper == "identity":
            self.helpers[idx] = g.expand_as(trained)
        else:
            alpha = torch.as_tensor(
                self.alphas[clients], dtype=trained.dtype, device=self.device
            )[:, None]
            self.helpers[idx] = (1.0 - alpha) * trained + alpha * g
        if self.exp_avg is not None and self.exp_avg_sq is not None:
            self.exp_avg[idx] = messages.states["exp_avg"].to(self.exp_avg)
            self.exp_avg_sq[idx] = messages.states["exp_avg_sq"].to(self.exp_avg_sq)
        self.adam_steps[idx] = steps.to(self.adam_steps)
        return {"participants": float(len(clients)), "global_update_norm": update_norm}

    # -- evaluation --------------------------------------------------------------------
    def _client_test(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        ds = self.dataset
        if ds.client_test_indices is not None:
            x, y = ds.client_test(k)
        else:  # evaluate() checked the test set exists
            x, y = cast(np.ndarray, ds.test_features), cast(np.ndarray, ds.test_labels)
        return (
            torch.as_tensor(np.ascontiguousarray(np.asarray(x))),
            torch.as_tensor(np.ascontiguousarray(np.asarray(y))),
        )

    def _score(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[float, float]:
        params = self.unflatten(flat)
        buffers = dict(self.model.named_buffers())
        loss_sum, correct = 0.0, 0
        for s in range(0, x.shape[0], self.eval_batch_size):
            xc = x[s : s + self.eval_batch_size].to(self.device)
            yc = y[s : s + self.eval_batch_size].to(self.device)
            out = torch.func.functional_call(self.model, (params, buffers), (xc,))
            loss_sum += float(self.loss_fn(out, yc)) * xc.shape[0]
            correct += int((predicted_labels(out) == yc).sum())
        n = max(int(x.shape[0]), 1)
        return loss_sum / n, correct / n

    def evaluate(self) -> dict[str, float]:
        """Average over clients of personalised and global accuracy on their tests.

        Each client's helper model and the global model are scored on the
        client's own test records (``dataset.client_test(k)``; the shared test
        set if the dataset has no per-client split); the client averages are
        unweighted, as the paper's "average test accuracy across clients".

        Returns
        -------
        dict of str to float
            ``test_accuracy`` and ``test_loss`` (personalised, the paper's
            metric), ``personal_test_accuracy``, ``global_test_accuracy``,
            ``global_test_loss``; empty if the dataset has no test set.
        """
        ds = self.dataset
        if ds.test_features is None or ds.test_labels is None:
            return {}
        was_training = self.model.training
        self.model.eval()
        personal, glob = [], []
        try:
            with torch.no_grad():
                for k in range(self.stats.num_clients):
                    x, y = self._client_test(k)
                    if x.shape[0] == 0:
                        continue
                    personal.append(self._score(self.helpers[k], x, y))
                    glob.append(self._score(self.weights, x, y))
        finally:
            self.model.train(was_training)
        if not personal:
            return {}
        p_loss, p_acc = np.mean(np.asarray(personal), axis=0)
        g_loss, g_acc = np.mean(np.asarray(glob), axis=0)
        return {
            "test_accuracy": float(p_acc),
            "test_loss": float(p_loss),
            "personal_test_accuracy": float(p_acc),
            "global_test_accuracy": float(g_acc),
            "global_test_loss": float(g_loss),
        }


def _pad(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` padded with zeros to ``n`` rows (padding is never drawn)."""
    extra = n - t.shape[0]
    return t if extra == 0 else torch.cat([t, t.new_zeros(extra, *t.shape[1:])])
