"""PriFedSync (Zheng, Chen, Long & Su, "Federated f-differential privacy", Alg. 1-2).

One synchronisation round, as in the paper's pseudo-code (docs/analyses.md)::

    Ω   <- each of the m clients syncs w.p. p          (re-drawn while empty)
    for i in Ω (all at once, batched):
        θ <- h̃^(i)                                      (the client's helper model)
        repeat K times:                                  (NoisySGD / noisy Adam)
            I  <- uniform size-B subset of S^(i), without replacement
            g̃  <- (1/B) [ Σ_{x in I} clip_C(∇ℓ(θ; x)) + N(0, (2Cσ)² I) ]
            θ  <- optimiser(θ, g̃)                        (SGD, or Adam with
                                                           per-client state)
        w̃^(i) <- θ
    w̃_global <- (1 − η) w̃_global + η · mean_{i in Ω} w̃^(i)
    h̃^(i)    <- F_i(w̃_global)  for i in Ω:
                 identity       F_i(w) = w                (FedAvg)
                 interpolation  F_i(w) = (1 − α_i) w̃^(i) + α_i w   (eq. 2.1)

The helper model ``h̃^(i)`` is the client's *personalised* model: it is what
the client evaluates with and where its next local training starts. Clients
that never synced keep ``w0``. The optimiser state (Adam's moments and step
count) persists per client across rounds, as in the authors' code.

Noise convention (docs/analyses.md)
--------------------------------------------
``noise_multiplier`` is the **paper's** σ: the noise on the sum of the ``B``
clipped per-record gradients has standard deviation ``2Cσ`` (replace-one
sensitivity ``2C``), so one un-subsampled step is ``G_{1/σ}``. Opacus'
``noise_multiplier`` for the same noise is ``2σ``.

Privacy accounting
------------------
Unit: a record; neighbouring: replace one record of one client; adversary:
any other client (weak federated f-DP, one-vs-one) or all other clients
jointly (strong). Each round, every synced client runs ``K`` steps, each the
replace-one subsampled Gaussian ``C_{B/n}(G_{1/σ})``; the round's event is
``SelfComposed(WithoutReplacement(B, n, Gaussian(2σ, sensitivity=2)), K)``
with ``n`` the *smallest* client size (a client with more records is at
least as private, so one event bounds every client), and the synced clients
are recorded as the round's participants. A client's spend is the
composition of the rounds it synced in (``PrivacyLedger.client_epsilon``);
the federation's weak (and, soundly, strong) guarantee is that of the client
that synced most often (:meth:`PriFedSync.privacy_summary`).

**Client sampling gives no amplification here.** Who synced is visible (it
is recorded, and a helper model changes only when its client synced), and
the paper's Lemma 3.8 ``p²`` term is not justified (docs/analyses.md):
dpfl charges a client the full ``K``-step release in every round it syncs,
and nothing in rounds it does not. Re-drawing an empty Ω (as the authors'
code does) changes only *which* clients sync, never what a synced client
releases, so it costs nothing either.

**Batched training.** The synced clients are trained together: their
parameters are stacked ``[|Ω|, P]`` and each local step is one call of
:func:`dpfl.sim.grad.batched_client_grads` followed by a batched SGD or
Adam update on the stacked tensors (:func:`dpfl.sim.local.cohort_adam_step`).
``grad_method="auto"`` uses its cross-client ghost kernel (one forward and one
backward pass for all synced clients; no per-example gradients of
``nn.Linear`` weights) when every parameter sits in a layer with a ghost rule
(``nn.Linear``, ``nn.Conv2d``, or one registered with
:func:`dpfl.sim.grad.register_layer`), and its ``vmap`` kernel
(per-example gradients ``[|Ω|, B, P]``) otherwise. Measured on 2 shared CPU
cores, |Ω| = 50, B = 16: an MLP 784-200-10 takes 17 ms per step with the
ghost kernel, 630 ms with ``vmap``; the paper's MNIST CNN 2.2 ms per client
with the ghost kernel versus 5.4 ms per client in a loop of
:func:`dpfl.sim.grad.clipped_grad_sum` calls (``"per-client"``).

References
----------
Q. Zheng, S. Chen, Q. Long and W. J. Su, "Federated f-differential privacy",
AISTATS 2021 (federated-f-dp.txt), Algorithms 1-2, eq. (2.1), Theorem 2, §4;
enosair/federated-fdp (``sync.py``, ``sampler.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpfl._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.accounting import events as ev
from dpfl.accounting import fdp
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data.dataset import FederatedDataset
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.sim.grad import (
    batched_client_grads,
    check_finite,
    clipped_grad_sum,
    ghost_supported,
)
from dpfl.sim.local import cohort_adam_step
from dpfl.sim.loop import check_state_owner
from dpfl.sim.privatize import gaussian_noise_like
from dpfl.sim.sampling import PoissonClientSampler

__all__ = ["PriFedSync"]

Params = dict[str, torch.Tensor]
OPTIMIZERS = ("adam", "sgd")
HELPERS = ("interpolation", "identity")
GRAD_METHODS = ("auto", "ghost", "batched", "per-client")


class PriFedSync:
    """PriFedSync with NoisySGD or noisy Adam local training (name ``"prifedsync"``).

    Parameters
    ----------
    model : torch.nn.Module
        The model; its initial parameters are ``w0`` for every client. Its
        parameters track the global model ``w̃_global``. No BatchNorm.
    dataset : FederatedDataset
        Clients' records; per-client test sets (``client_test_indices``) are
        used by :meth:`evaluate`.
    device : str
        Torch device.
    sync_probability : float
        p in (0, 1]: each client syncs in a round w.p. p (Ω re-drawn if empty).
    noise_multiplier : float or None
        The paper's σ: noise std on the clipped sum is ``2 · clip · σ``.
        ``None`` or 0: non-private (no noise, nothing charged).
    batch_size : int
        B records per local step, drawn uniformly without replacement
        (``B <= n_i`` for every client).
    local_steps : int
        K local steps per synced client per round.
    clip : float or None
        Per-record clipping norm C (> 0); ``None`` only when non-private.
    learning_rate : float
        Local step size (the paper: Adam, 0.001 on MNIST).
    optimizer : {"adam", "sgd"}
        Local optimiser fed with the noisy mean gradient.
    betas : tuple of float
        Adam's (β1, β2), each in [0, 1).
    adam_epsilon : float
        Adam's ε in the denominator (> 0).
    weight_decay : float
        L2 penalty added to the noisy gradient (torch's Adam/SGD
        ``weight_decay``; post-processing, no privacy cost).
    helper : {"interpolation", "identity"}
        Helper model ``F_i``: interpolation (eq. 2.1) or the global model.
    interpolation_weight : float or sequence of float
        α_i in [0, 1] (one value, or one per client); the paper uses 0.1.
        Used by ``helper="interpolation"`` only.
    aggregation_rate : float
        η in (0, 1]: ``w̃_global <- (1-η) w̃_global + η · mean``.
    grad_method : {"auto", "ghost", "batched", "per-client"}
        ``"ghost"``: one cross-client ghost-clipping pass per step
        (``batched_client_grads(method="ghost")``; models whose parameters
        all sit in ``nn.Linear`` / ``nn.Conv2d``); ``"batched"``: one ``vmap``
        of per-example gradients over the synced clients per step;
        ``"per-client"``: a loop of single-client ghost-clipping calls;
        ``"auto"`` picks ``"ghost"`` when the model supports it, else
        ``"batched"``.
    max_clients : int or None
        Clients per chunk of the batched kernel (memory bound).
    eval_batch_size : int
        Records per forward pass in :meth:`evaluate`.
    loss_fn : callable
        ``loss_fn(output, target)``, mean over the batch (cross-entropy).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a parameter outside its domain (the message names it), or a
        client holding fewer than ``batch_size`` records.

    References
    ----------
    Zheng, Chen, Long & Su, "Federated f-differential privacy", AISTATS 2021,
    Algorithms 1-2, eq. (2.1), Theorem 2; docs/analyses.md.
    """

    name = "prifedsync"
    per_client_accounting = True

    def __init__(
        self,
        *,
        model: nn.Module,
        dataset: FederatedDataset,
        device: str = "cpu",
        sync_probability: float = 1.0,
        noise_multiplier: float | None = None,
        batch_size: int = 16,
        local_steps: int = 38,
        clip: float | None = 1.0,
        learning_rate: float = 0.001,
        optimizer: str = "adam",
        betas: Sequence[float] = (0.9, 0.999),
        adam_epsilon: float = 1e-8,
        weight_decay: float = 0.0,
        helper: str = "interpolation",
        interpolation_weight: float | Sequence[float] = 0.1,
        aggregation_rate: float = 1.0,
        grad_method: str = "auto",
        max_clients: int | None = None,
        eval_batch_size: int = 1024,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise InvalidParameterError(
                f"model must be a torch.nn.Module; got {type(model).__name__}"
            )
        if not isinstance(dataset, FederatedDataset):
            raise InvalidParameterError(
                f"dataset must be a FederatedDataset; got {type(dataset).__name__}"
            )
        self.sync_probability = check_probability("sync_probability", sync_probability)
        if noise_multiplier is not None:
            noise_multiplier = check_nonnegative("noise_multiplier", noise_multiplier)
        self.noise_multiplier = noise_multiplier
        self.private = bool(noise_multiplier)
        if clip is None:
            if self.private:
                raise InvalidParameterError(
                    "clip must be given (> 0) when noise_multiplier > 0; got None"
                )
        else:
            clip = check_positive("clip", clip)
        self.clip = clip
        self.batch_size = check_count("batch_size", batch_size, minimum=1)
        self.local_steps = check_count("local_steps", local_steps, minimum=1)
        self.learning_rate = check_positive("learning_rate", learning_rate)
        if optimizer not in OPTIMIZERS:
            raise InvalidParameterError(
                f"optimizer must be one of {OPTIMIZERS}; got {optimizer!r}"
            )
        self.optimizer = optimizer
        betas = tuple(float(b) for b in betas)
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise InvalidParameterError(
                f"betas must be two numbers in [0, 1); got {betas!r}"
            )
        self.betas = betas
        self.adam_epsilon = check_positive("adam_epsilon", adam_epsilon)
        self.weight_decay = check_nonnegative("weight_decay", weight_decay)
        if helper not in HELPERS:
            raise InvalidParameterError(
                f"helper must be one of {HELPERS}; got {helper!r}"
            )
        self.helper = helper
        self.aggregation_rate = check_probability("aggregation_rate", aggregation_rate)
        if grad_method not in GRAD_METHODS:
            raise InvalidParameterError(
                f"grad_method must be one of {GRAD_METHODS}; got {grad_method!r}"
            )
        self.max_clients = (
            None
            if max_clients is None
            else check_count("max_clients", max_clients, minimum=1)
        )
        self.eval_batch_size = check_count(
            "eval_batch_size", eval_batch_size, minimum=1
        )
        self.loss_fn = loss_fn
        self.device = str(device)
        self.dataset = dataset
        self.model = model.to(self.device)

        self.num_clients = dataset.num_clients
        self.sizes = dataset.client_sizes()
        smallest = int(self.sizes.min())
        if smallest < self.batch_size:
            raise InvalidParameterError(
                f"batch_size must be <= every client's number of records (smallest "
                f"client holds {smallest}); got {batch_size!r}"
            )
        self.min_client_size = smallest
        alphas = np.asarray(interpolation_weight, dtype=np.float64)
        if alphas.ndim == 0:
            alphas = np.full(self.num_clients, float(alphas))
        if alphas.shape != (self.num_clients,):
            raise InvalidParameterError(
                "interpolation_weight must be one number or one per client "
                f"({self.num_clients}); got {len(alphas)} values"
            )
        for a in alphas:
            check_probability("interpolation_weight", float(a), allow_zero=True)
        self.interpolation_weight = alphas
        self.sampler = PoissonClientSampler(
            num_clients=self.num_clients,
            participation_probability=self.sync_probability,
            client_sizes=self.sizes,
            batch_size=1,
        )

        params = {n: p.detach() for n, p in self.model.named_parameters()}
        self._names = list(params)
        self._shapes = [tuple(p.shape) for p in params.values()]
        self._numels = [p.numel() for p in params.values()]
        self.num_parameters = int(sum(self._numels))
        self._initial = self._flatten(params)
        self.global_flat = self._initial.clone()
        #: Personalised (helper) models of the clients that synced; others: w0.
        self._local: dict[int, torch.Tensor] = {}
        #: Adam's first / second moments and step counts, per client that synced.
        self._moment1: dict[int, torch.Tensor] = {}
        self._moment2: dict[int, torch.Tensor] = {}
        self._steps: dict[int, int] = {}
        #: batched_client_grads' method: "auto" when chosen by grad_method="auto"
        #: (falls back to vmap, e.g. for a layer called twice per forward pass).
        self._kernel = {"ghost": "ghost", "batched": "vmap"}.get(grad_method, "auto")
        if grad_method == "auto":
            grad_method = "ghost" if ghost_supported(self.model) else "batched"
        elif grad_method == "ghost" and not ghost_supported(self.model):
            raise InvalidParameterError(
                "grad_method='ghost' needs every parameter in a layer with a "
                "ghost rule, e.g. nn.Linear or nn.Conv2d (see "
                "dpfl.sim.grad.ghost_supported); use 'batched'"
            )
        if grad_method == "per-client" and clip is None:
            grad_method = "batched"
        self.grad_method = grad_method

    # -- flat parameter vectors ---------------------------------------------------
    def _flatten(self, params: Params) -> torch.Tensor:
        return torch.cat([params[n].detach().reshape(-1) for n in self._names]).to(
            self.device
        )

    def _flatten_stacked(self, stacked: Params, m: int) -> torch.Tensor:
        return torch.cat([stacked[n].reshape(m, -1) for n in self._names], dim=1)

    def _unflatten(self, flat: torch.Tensor) -> Params:
        """Views of a ``[P]`` or ``[m, P]`` vector as named parameter tensors."""
        lead = tuple(flat.shape[:-1])
        out: Params = {}
        for n, piece, shape in zip(
            self._names, flat.split(self._numels, dim=-1), self._shapes
        ):
            out[n] = piece.reshape(*lead, *shape)
        return out

    def local_model(self, client: int) -> Params:
        """Client ``client``'s personalised (helper) model, by parameter name.

        Parameters
        ----------
        client : int
            Client number in ``[0, num_clients)``.

        Returns
        -------
        dict of str to torch.Tensor
            A copy of the parameters (``w0`` if the client never synced).

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If ``client`` is out of range.
        """
        k = self._check_client(client)
        return {n: t.clone() for n, t in self._unflatten(self._local_flat(k)).items()}

    def global_model(self) -> Params:
        """The global model ``w̃_global``, by parameter name (a copy).

        Returns
        -------
        dict of str to torch.Tensor
            The parameters.
        """
        return {n: t.clone() for n, t in self._unflatten(self.global_flat).items()}

    def _check_client(self, client: int) -> int:
        k = check_count("client", client, minimum=0)
        if k >= self.num_clients:
            raise InvalidParameterError(
                f"client must be < num_clients ({self.num_clients}); got {client!r}"
            )
        return k

    def _local_flat(self, k: int) -> torch.Tensor:
        return self._local.get(k, self._initial)

    # -- accounting ---------------------------------------------------------------
    def event(self) -> ev.Event | None:
        """The accounting event of a synced client's round (``None``: non-private).

        Returns
        -------
        Event or None
            ``CheckIn(p', SelfComposed(WithoutReplacement(B, n_min,
            Gaussian(2σ)), K))``: a client syncs w.p. ``p'`` (the server sees
            who), then runs K steps, each on a uniform size-B subset of the
            smallest client's ``n_min`` records, with noise std ``2Cσ`` on a
            clipped sum of replace-one sensitivity ``2C``, i.e.
            ``C_{B/n}(G_{1/σ})`` per step. ``p' = p / (1 - (1-p)^m)`` is the
            chance that a client syncs given that Ω is re-drawn while empty.
        """
        if not self.private or self.noise_multiplier is None:
            return None
        step = ev.WithoutReplacement(
            self.batch_size,
            self.min_client_size,
            ev.Gaussian(2.0 * self.noise_multiplier),
        )
        p = self.sync_probability
        synced = min(1.0, p / -math.expm1(self.num_clients * math.log1p(-p)))
        return ev.CheckIn(synced, ev.SelfComposed(step, self.local_steps))

    # -- one round ----------------------------------------------------------------
    def sync_clients(self, rng: np.random.Generator) -> np.ndarray:
        """Draw Ω: each client w.p. ``sync_probability``, re-drawn while empty.

        Parameters
        ----------
        rng : numpy.random.Generator
            The round's generator.

        Returns
        -------
        numpy.ndarray
            The synced clients, ascending, non-empty (int64).
        """
        while True:
            clients = self.sampler.sample(rng).clients
            if clients.size:
                return clients

    def _client_data(
        self, clients: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """Every synced client's records, padded to ``[m, n_max, ...]``."""
        sizes = self.sizes[clients]
        n_max = int(sizes.max())
        xs, ys = [], []
        for k in clients:
            x, y = self.dataset.client(int(k))
            x_t = torch.as_tensor(np.ascontiguousarray(x))
            y_t = torch.as_tensor(np.ascontiguousarray(y))
            pad = n_max - x_t.shape[0]
            if pad:
                x_t = torch.cat([x_t, x_t.new_zeros(pad, *x_t.shape[1:])])
                y_t = torch.cat([y_t, y_t.new_zeros(pad)])
            xs.append(x_t)
            ys.append(y_t)
        return (
            torch.stack(xs).to(self.device),
            torch.stack(ys).to(self.device),
            sizes,
        )

    def batch_positions(
        self, rng: np.random.Generator, sizes: np.ndarray
    ) -> np.ndarray:
        """One local step's batches: a uniform size-B subset of each client's records.

        The first ``B`` entries of a uniformly random permutation (the order
        of i.i.d. uniform keys), i.e. uniform sampling without replacement.

        Parameters
        ----------
        rng : numpy.random.Generator
            The round's generator.
        sizes : numpy.ndarray
            Records of each synced client (each >= B).

        Returns
        -------
        numpy.ndarray
            ``[len(sizes), B]`` positions inside each client's record list.
        """
        n_max = int(sizes.max())
        keys = rng.random((len(sizes), n_max))
        keys[np.arange(n_max)[None, :] >= sizes[:, None]] = np.inf
        return np.argsort(keys, axis=1)[:, : self.batch_size]

    def _gradient_sums(
        self, theta: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor
    ) -> torch.Tensor:
        """Each client's sum of clipped per-record gradients, ``[m, P]``."""
        m = theta.shape[0]
        if self.grad_method == "per-client" and self.clip is not None:
            rows = []
            for j in range(m):
                sums = clipped_grad_sum(
                    self.model,
                    self._unflatten(theta[j]),
                    xb[j],
                    yb[j],
                    clip=self.clip,
                    loss_fn=self.loss_fn,
                )
                rows.append(self._flatten(sums))
            return torch.stack(rows)
        sums = batched_client_grads(
            self.model,
            self._unflatten(theta),
            xb,
            yb,
            loss_fn=self.loss_fn,
            clip=self.clip,
            max_clients=self.max_clients,
            method=self._kernel,  # type: ignore[arg-type]
        )
        return self._flatten_stacked(sums, m)

    def noisy_gradient(
        self,
        theta: torch.Tensor,
        xb: torch.Tensor,
        yb: torch.Tensor,
        generator: torch.Generator,
    ) -> torch.Tensor:
        """Alg. 2's noisy mean gradient per client, ``(Σ clip + N(0, (2Cσ)² I)) / B``.

        Parameters
        ----------
        theta : torch.Tensor
            ``[m, P]`` flat parameters of the ``m`` clients.
        xb : torch.Tensor
            ``[m, B, ...]`` inputs of each client's batch.
        yb : torch.Tensor
            ``[m, B]`` targets.
        generator : torch.Generator
            Source of the noise (independent per client and coordinate).

        Returns
        -------
        torch.Tensor
            ``[m, P]``: the noisy mean gradient that feeds the optimiser.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If a per-record gradient holds NaN or Inf.
        """
        sums = self._gradient_sums(theta, xb, yb)
        if self.private and self.clip is not None and self.noise_multiplier:
            std = 2.0 * self.clip * float(self.noise_multiplier)
            sums.add_(gaussian_noise_like({"g": sums}, std, generator)["g"])
        return sums.div_(float(xb.shape[1]))

    def local_training(
        self,
        clients: np.ndarray,
        rng: np.random.Generator,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor | np.ndarray]]:
        """Run K noisy local steps for every client of ``clients`` (batched).

        Parameters
        ----------
        clients : numpy.ndarray
            The synced clients.
        rng : numpy.random.Generator
            Draws the batches.
        generator : torch.Generator
            Draws the noise.

        Returns
        -------
        tuple
            ``([m, P] trained models w̃^(i), new optimiser state)``; nothing
            of ``self`` is modified.
        """
        theta = torch.stack([self._local_flat(int(k)) for k in clients]).clone()
        m = theta.shape[0]
        zeros = torch.zeros(self.num_parameters, device=self.device)
        m1 = torch.stack([self._moment1.get(int(k), zeros) for k in clients]).clone()
        m2 = torch.stack([self._moment2.get(int(k), zeros) for k in clients]).clone()
        steps = torch.as_tensor(
            [self._steps.get(int(k), 0) for k in clients],
            dtype=torch.long,
            device=self.device,
        )
        x_all, y_all, sizes = self._client_data(clients)
        rows = torch.arange(m, device=self.device)[:, None]
        for _ in range(self.local_steps):
            pos = torch.as_tensor(self.batch_positions(rng, sizes), device=self.device)
            xb, yb = x_all[rows, pos], y_all[rows, pos]
            grad = self.noisy_gradient(theta, xb, yb, generator)
            if self.weight_decay:
                grad = grad + self.weight_decay * theta
            if self.optimizer == "adam":
                theta = cohort_adam_step(
                    theta,
                    grad,
                    m1,
                    m2,
                    steps,
                    learning_rate=self.learning_rate,
                    betas=self.betas,
                    eps=self.adam_epsilon,
                )
            else:
                theta = theta - self.learning_rate * grad
        check_finite(theta, "local models")
        return theta, {"moment1": m1, "moment2": m2, "steps": steps}

    def helper_models(self, clients: np.ndarray, trained: torch.Tensor) -> torch.Tensor:
        """``F_i(w̃_global)`` for each synced client (eq. 2.1 or identity).

        Parameters
        ----------
        clients : numpy.ndarray
            The synced clients.
        trained : torch.Tensor
            ``[m, P]``: their trained local models ``w̃^(i)``.

        Returns
        -------
        torch.Tensor
            ``[m, P]``: ``(1 − α_i) w̃^(i) + α_i w̃_global`` (interpolation) or
            ``w̃_global`` (identity), with the current global model.
        """
        g = self.global_flat[None, :]
        if self.helper == "identity":
            return g.expand_as(trained).clone()
        alpha = torch.as_tensor(
            self.interpolation_weight[clients], dtype=trained.dtype, device=self.device
        )[:, None]
        return (1.0 - alpha) * trained + alpha * g

    def run_round(
        self, round_index: int, rng: np.random.Generator, generator: torch.Generator
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Run one synchronisation round of Algorithm 1.

        Parameters
        ----------
        round_index : int
            Index of the round (randomness comes from the generators).
        rng : numpy.random.Generator
            Draws Ω and the batches.
        generator : torch.Generator
            Draws the noise.

        Returns
        -------
        tuple
            ``(synced clients, metrics)``; metrics hold ``participants`` and
            ``global_update_norm``.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If a gradient or a trained model is not finite; no state changes.
        """
        clients = self.sync_clients(rng)
        trained, state = self.local_training(clients, rng, generator)
        average = trained.mean(0)
        eta = self.aggregation_rate
        new_global = (1.0 - eta) * self.global_flat + eta * average
        check_finite(new_global, "global model")
        update_norm = float((new_global - self.global_flat).norm())
        self.global_flat = new_global
        helpers = self.helper_models(clients, trained)
        steps = state["steps"]
        for j, k in enumerate(clients.tolist()):
            self._local[k] = helpers[j].clone()
            self._moment1[k] = state["moment1"][j].clone()
            self._moment2[k] = state["moment2"][j].clone()
            self._steps[k] = int(steps[j])
        self._sync_model()
        return clients, {
            "participants": float(clients.size),
            "global_update_norm": update_norm,
        }

    def _sync_model(self) -> None:
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(self._unflatten(self.global_flat)[n])

    # -- evaluation -----------------------------------------------------------------
    def _client_test(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        ds = self.dataset
        if ds.client_test_indices is not None:
            x, y = ds.client_test(k)
        elif ds.test_features is None or ds.test_labels is None:
            raise DpflError("the data set has no test set")  # evaluate() checks
        else:
            x, y = ds.test_features, ds.test_labels
        return (
            torch.as_tensor(np.ascontiguousarray(np.asarray(x))),
            torch.as_tensor(np.ascontiguousarray(np.asarray(y))),
        )

    def _score(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[float, float]:
        params = self._unflatten(flat)
        buffers = dict(self.model.named_buffers())
        loss_sum, correct = 0.0, 0
        for s in range(0, x.shape[0], self.eval_batch_size):
            xc = x[s : s + self.eval_batch_size].to(self.device)
            yc = y[s : s + self.eval_batch_size].to(self.device)
            out = torch.func.functional_call(self.model, (params, buffers), (xc,))
            loss_sum += float(self.loss_fn(out, yc)) * xc.shape[0]
            correct += int((out.argmax(1) == yc).sum())
        n = max(int(x.shape[0]), 1)
        return loss_sum / n, correct / n

    def evaluate(self) -> dict[str, float]:
        """Average over clients of personalised and global accuracy on their tests.

        Each client's personalised (helper) model and the global model are
        scored on the client's own test records (``dataset.client_test(k)``;
        the shared test set if the dataset has no per-client split); the
        client averages are unweighted, as the paper's "average test
        accuracy across clients".

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
                for k in range(self.num_clients):
                    x, y = self._client_test(k)
                    if x.shape[0] == 0:
                        continue
                    personal.append(self._score(self._local_flat(k), x, y))
                    glob.append(self._score(self.global_flat, x, y))
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

    # -- the run's guarantee ------------------------------------------------------
    def privacy_summary(
        self, ledger: PrivacyLedger, *, delta: float | None = None
    ) -> dict[str, Any]:
        """Weak and strong federated f-DP of the run recorded in ``ledger``.

        The least private client is the one that synced most often (every
        round charges the same event, and ε grows with the number of
        compositions), so ``max_i ledger.client_epsilon(i)`` is that
        client's ε. It is reported beside the exact
        :func:`~dpfl.accounting.fdp.weak_federated` and
        :func:`~dpfl.accounting.fdp.strong_federated` guarantees for
        ``K · R_max`` steps and the paper's CLT μ (an approximation, not a
        bound), both at ``R_max`` and at the total number of rounds ``R``
        (the paper's tables charge every client all ``R`` rounds).

        Parameters
        ----------
        ledger : PrivacyLedger
            The run's ledger (rounds recorded with their synced clients).
        delta : float, optional
            δ (default: the ledger's budget δ).

        Returns
        -------
        dict
            ``epsilon`` / ``epsilon_lower`` (ledger, sound), ``delta``,
            ``rounds``, ``max_client_rounds``, ``least_private_client``,
            ``mu_effective``, ``mu_clt`` (at ``R_max``), ``mu_clt_all_rounds``
            (at ``R``), ``epsilon_clt``, ``strong_mu_paper``, and the
            :class:`~dpfl.accounting.bounds.Guarantee` objects ``weak`` and
            ``strong``.

        Raises
        ------
        dpfl.errors.DpflError
            If the run is not private or the ledger holds no round.
        """
        if not self.private or self.noise_multiplier is None:
            raise DpflError(
                "privacy_summary needs a private run (noise_multiplier > 0)"
            )
        if delta is None:
            if ledger.budget is None:
                raise DpflError("delta must be given when the ledger has no budget")
            delta = ledger.budget.delta
        d = check_delta("delta", delta)
        counts = np.zeros(self.num_clients, dtype=np.int64)
        for entry in ledger.entries:
            if entry.participants is None:
                counts += 1
            else:
                counts[list(entry.participants)] += 1
        if ledger.rounds == 0:
            raise DpflError("the ledger holds no round")
        least = int(np.argmax(counts))
        r_max = int(counts[least])
        eps = ledger.client_epsilon(least, d)
        common: dict[str, Any] = {
            "noise_multiplier": float(self.noise_multiplier),
            "batch_size": self.batch_size,
            "records_per_client": self.min_client_size,
            "local_steps": self.local_steps,
        }
        weak = fdp.weak_federated(
            rounds=r_max,
            delta=d,
            num_clients=self.num_clients if self.num_clients >= 2 else None,
            **common,
        )
        strong = (
            fdp.strong_federated(
                rounds=r_max, delta=d, num_clients=self.num_clients, **common
            )
            if self.num_clients >= 2
            else None
        )
        mu_all = fdp.clt_mu(rounds=ledger.rounds, **common)
        return {
            "epsilon": eps.upper,
            "epsilon_lower": eps.lower,
            "delta": d,
            "rounds": ledger.rounds,
            "max_client_rounds": r_max,
            "least_private_client": least,
            "mu_effective": fdp.mu_effective(epsilon=eps.upper, delta=d),
            "mu_clt": weak.values["mu_clt"],
            "mu_clt_all_rounds": mu_all,
            "epsilon_clt": weak.values["epsilon_clt"],
            "strong_mu_paper": None if strong is None else strong.values["mu_paper"],
            "weak": weak,
            "strong": strong,
        }

    # -- state ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Global, personalised models and optimiser states (CPU copies).

        Returns
        -------
        dict
            ``{"name", "global", "initial", "local", "moment1", "moment2",
            "steps"}``.
        """

        def cpu(d: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
            return {k: v.detach().cpu().clone() for k, v in d.items()}

        return {
            "name": self.name,
            "global": self.global_flat.detach().cpu().clone(),
            "initial": self._initial.detach().cpu().clone(),
            "local": cpu(self._local),
            "moment1": cpu(self._moment1),
            "moment2": cpu(self._moment2),
            "steps": dict(self._steps),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Parameters
        ----------
        state : dict
            From :meth:`state_dict`.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If the state belongs to another algorithm or model size.
        """
        check_state_owner(state, self.name)
        if int(state["global"].numel()) != self.num_parameters:
            raise InvalidParameterError(
                f"state holds {state['global'].numel()} parameters; the model has "
                f"{self.num_parameters}"
            )

        def dev(d: dict[Any, torch.Tensor]) -> dict[int, torch.Tensor]:
            return {int(k): v.to(self.device).clone() for k, v in d.items()}

        self.global_flat = state["global"].to(self.device).clone()
        self._initial = state["initial"].to(self.device).clone()
        self._local = dev(state["local"])
        self._moment1 = dev(state["moment1"])
        self._moment2 = dev(state["moment2"])
        self._steps = {int(k): int(v) for k, v in state["steps"].items()}
        self._sync_model()
