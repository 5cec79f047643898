"""MS-PAFL: model splitting with random check-in (Li, Wang, Tian, Wang & Su).

One round, as in the paper's Algorithm 1 (steps 1-8)::

    K_r  <- client k checks in w.p. p_k                  (step 1, eq. 14; server)
    for k in K_r:                                         (client_step, one each)
        w   <- [w_pub ; v_k]                              (steps 2, 8)
        E times: w <- w - η (1/b Σ_{i∈B} ∇l(w; x_i) + λw) (step 3, eq. 2)
                 B: b records of D_k, WOR or WR, fresh each step
        ū_k <- clip_C(public(w) - w_pub)                  (step 4, the update)
        ũ_k <- ū_k + N(0, σ² I_{d_pub})                   (step 5, on the client)
        send ũ_k;  v_k <- private(w) stays on the device  (step 6)
    w_pub <- w_pub + (1/K) Σ_{k∈K_r} ũ_k / p_k            (step 7, HT on updates)

**Only the public part leaves a client.** A client's :class:`Message` is its
noisy public vector (``[d_pub]``, noise already added, from the client's own
generator); the server sees nothing else. The server's model holds ``w_pub``
and the *initial* private coordinates, which aggregation never touches. Each
client's private part ``v_k`` starts as the global model's private
coordinates the first time it checks in and then lives on the device
(:attr:`MsPafl.private_parts`, rows valid where :attr:`MsPafl.joined`). A
client step stages its new ``v_k``; the server step commits the staged parts
only after the round's update was found finite, so a rejected round changes
nothing.

**Who draws what.** The server checks clients in with its own generator
(:class:`~dpfl.sim.sampling_checkin.CheckInSampler`); each client draws its local
batches from its own ``rng`` and its noise from its own ``generator``
(:mod:`dpfl.sim.randomness`), so the loop and batched executors give the same
messages up to float rounding.

**Choices (docs/analyses.md).**

- ``clip_mode="update"`` (default) clips ``public(w) - w_pub`` (the update, whose
  sensitivity the analysis assumes);
  ``"parameters"`` clips the public parameters themselves (eq. 15). Either way
  one client's message moves by at most Δ = 2C when its data change.
- ``aggregation="update"`` (default): Horvitz-Thompson on updates,
  unbiased for the mean clipped update; ``"model"``: the literal eq. 17,
  ``w_pub <- (1/K) Σ m_k / p_k`` on models (shrinks the model when fewer than
  ``Σ p_k`` clients check in); ``"ratio"``: ``w_pub + mean of the updates``
  (``1/|K_r|``, slightly biased, needs no ``p_k`` at the server).
- σ: the run's ``noise_multiplier`` (std in units of ``clip``), or calibrated
  by :meth:`MsPafl.resolve_noise` from a per-round local (``local_epsilon``,
  ``local_delta``) with Δ = 2C by the analytic Gaussian
  (``calibration="analytic"``, any ε) or the paper's Lemma 1 (``"lemma1"``,
  only ε < 1, docs/analyses.md).
- Check-in probabilities ``p_k`` are per client (a scalar means all equal).

**Accounting.** Each round's event is ``CheckIn(max_k p_k, Gaussian(σ))``
(the check-in event prices it under replace-one, Δ = 2C), recorded with the
participants. The sound analysis prices a round a client joined as the
un-amplified Gaussian (the server sees who checked in and each message; the
private part carries earlier subsamples forward, so neither p nor γ
amplification is valid: docs/analyses.md), and the ledger charges each client
only the rounds it joined and reports the worst-off client.
:meth:`MsPafl.paper_report` puts the paper's central (Theorem 2), local
(Theorem 3) and global (Theorem 4) figures beside it, labelled
(:func:`dpfl.accounting.reports.ms_pafl_report`).

References
----------
Li, Wang, Tian, Wang & Su, "MS-PAFL", arXiv 2509.25906, Algorithm 1,
§III-B, Theorems 1-4; docs/analyses.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from dpfl.accounting import checkin, gaussian, reports
from dpfl.accounting.events import Event
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.models.split import ParameterSplit, split_parameters
from dpfl.sim.algorithms.base import (
    AlgorithmParams,
    DataStats,
    FederatedAlgorithm,
    Messages,
)
from dpfl.sim.algorithms.ms_pafl_params import MsPaflParams
from dpfl.sim.algorithms.registry import register
from dpfl.sim.algorithms.tasks import Cohort, Message, Task
from dpfl.sim.batches import draw_local_batches, gather_batches
from dpfl.sim.evaluation import evaluate_model
from dpfl.sim.grad import check_finite
from dpfl.sim.local import cohort_sgd_step
from dpfl.sim.privatize import ClientGaussian
from dpfl.sim.randomness import Streams
from dpfl.sim.sampling_checkin import CheckInSampler
from dpfl.sim.secure_noise import NoiseGenerator

__all__ = ["MsPafl", "MsPaflParams"]


def _clip_rows(v: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale each row of ``v`` to norm at most ``clip``."""
    norms = v.norm(dim=-1, keepdim=True)
    clipped: torch.Tensor = v * (clip / norms.clamp_min(1e-30)).clamp(max=1.0)
    return clipped


@register
class MsPafl(FederatedAlgorithm):
    """MS-PAFL (name ``"ms-pafl"``): split model, random check-in, client noise.

    See :class:`~dpfl.sim.algorithms.base.FederatedAlgorithm` for the
    arguments; the parameters are :class:`MsPaflParams`. σ (the run's
    ``noise_multiplier``) is each message's noise std in units of ``clip``;
    0 is the non-private baseline (no noise, nothing charged). The model
    should hold no BatchNorm (the paper: logistic regression).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a parameter outside its domain, per-client probabilities of the
        wrong length, a client with no record, or parameters whose
        ``local_epsilon`` was not resolved (:meth:`resolve_noise`).

    References
    ----------
    Li, Wang, Tian, Wang & Su, "MS-PAFL", arXiv 2509.25906, Algorithm 1.
    """

    name = "ms-pafl"
    Params = MsPaflParams
    params: MsPaflParams
    per_client_accounting = True

    @property
    def messages_are_releases(self) -> bool:
        """True: each client noises its update before it leaves (client-side)."""
        return True

    # -- accounting (pure, no model) ------------------------------------------------
    @staticmethod
    def sampler(params: MsPaflParams, stats: DataStats) -> CheckInSampler:
        """Client k checks in w.p. p_k (step 1)."""
        return CheckInSampler(
            num_clients=stats.num_clients,
            probabilities=params.checkin_probability,
            client_sizes=stats.sizes,
        )

    @classmethod
    def round_event(
        cls,
        params: AlgorithmParams,
        stats: DataStats,
        noise_multiplier: float,
        round_index: int = 0,
    ) -> Event:
        """``CheckIn(max_k p_k, Gaussian(σ))``: the least favourable client's check-in.

        The check-in event prices one clipped public update's Gaussian release
        under replace-one (Δ = 2C).
        """
        return cls.sampler(cast(MsPaflParams, params), stats).event(noise_multiplier)

    @classmethod
    def resolve_noise(
        cls, params: AlgorithmParams, stats: DataStats
    ) -> tuple[float, AlgorithmParams] | None:
        """σ from ``local_epsilon`` (with Δ = 2C), if it is set.

        ``calibration="analytic"``: the analytic Gaussian mechanism
        (:func:`dpfl.accounting.gaussian.calibrate_analytic`); ``"lemma1"``:
        Lemma 1 (:func:`dpfl.accounting.checkin.lemma1_sigma`, ε < 1), as a
        multiple of C.

        Returns
        -------
        tuple or None
            ``(σ, params with local_epsilon=None)``; ``None`` when
            ``local_epsilon`` is not set (σ is the run's ``noise_multiplier``).
        """
        p = cast(MsPaflParams, params)
        if p.local_epsilon is None:
            return None
        if p.calibration == "lemma1":
            sigma = checkin.lemma1_sigma(
                epsilon=p.local_epsilon, delta=p.local_delta, sensitivity=2.0 * p.clip
            )
            multiplier = sigma / p.clip
        else:
            multiplier = gaussian.calibrate_analytic(
                epsilon=p.local_epsilon, delta=p.local_delta, sensitivity=2.0
            )
        return float(multiplier), dataclasses.replace(p, local_epsilon=None)

    @classmethod
    def local_guarantee(
        cls, params: MsPaflParams, noise_multiplier: float
    ) -> tuple[float, float]:
        """Per-round local (ε, δ) of one message at ``local_delta``.

        ``local_epsilon`` when set; else read back from σ with Δ = 2C: by
        Lemma 1 when ``calibration="lemma1"`` and that gives ε < 1 (it then
        returns the ε σ was calibrated for), else by the analytic Gaussian.

        Raises
        ------
        dpfl.errors.DpflError
            If σ = 0 (a non-private run has no local guarantee).
        """
        if not noise_multiplier > 0:
            raise DpflError("a non-private MS-PAFL run has no local guarantee")
        if params.local_epsilon is not None:
            return params.local_epsilon, params.local_delta
        if params.calibration == "lemma1":
            eps = math.sqrt(2.0 * math.log(1.25 / params.local_delta)) * 2.0
            eps /= noise_multiplier
            if eps < 1:
                return eps, params.local_delta
        eps = gaussian.epsilon_for_delta(
            params.local_delta, noise_multiplier=noise_multiplier, sensitivity=2.0
        )
        return float(eps), params.local_delta

    @staticmethod
    def subsampling_ratio(params: MsPaflParams, stats: DataStats) -> float:
        """γ of the smallest client: P(a record is touched in the E steps).

        ``1 - (1 - b/n)^E`` (WOR) or ``1 - (1 - 1/n)^{bE}`` (WR) for the
        smallest n_k (docs/analyses.md), the largest γ over clients.
        """
        n = int(stats.sizes.min())
        b = params.batch_size if params.replacement else min(params.batch_size, n)
        return checkin.subsampling_ratio(
            batch_size=b,
            dataset_size=n,
            replacement=params.replacement,
            local_steps=params.local_steps,
        )

    @classmethod
    def paper_report(
        cls,
        params: AlgorithmParams,
        stats: DataStats,
        noise_multiplier: float,
        ledger: Any,
        delta: float,
    ) -> dict[str, Any]:
        """The sound figure and the paper's Theorems 2-4, labelled.

        See :func:`dpfl.accounting.reports.ms_pafl_report`.

        Raises
        ------
        dpfl.errors.DpflError
            If the run is non-private (σ = 0).
        """
        p = cast(MsPaflParams, params)
        eps_l, delta_l = cls.local_guarantee(p, noise_multiplier)
        return reports.ms_pafl_report(
            ledger,
            noise_multiplier=noise_multiplier,
            clip=p.clip,
            probabilities=cls.sampler(p, stats).probabilities,
            local_epsilon=eps_l,
            local_delta=delta_l,
            gamma=cls.subsampling_ratio(p, stats),
            xi=p.xi,
            delta=delta,
        )

    # -- state ----------------------------------------------------------------------
    def setup(self) -> None:
        """Split, sampler, privatizer and the clients' private parts."""
        p = self.params
        if p.local_epsilon is not None:
            raise InvalidParameterError(
                "local_epsilon must be resolved into the noise multiplier first "
                "(MsPafl.resolve_noise gives σ and the parameters without it)"
            )
        sizes = self.stats.sizes
        if sizes.min() < 1:
            raise InvalidParameterError(
                "every client needs >= 1 training record; clients "
                f"{np.flatnonzero(sizes < 1)[:10].tolist()} have none"
            )
        self._sampler = self.sampler(p, self.stats)
        self.probabilities = self._sampler.probabilities
        self.split: ParameterSplit = split_parameters(
            self.unflatten(self.weights), private_fraction=p.private_fraction
        )
        if self.split.num_public == 0:
            raise InvalidParameterError(
                f"private_fraction={p.private_fraction!r} leaves no public coordinate"
            )
        self._pub = self.split.public_index.to(self.device)
        self.privatizer = (
            ClientGaussian(noise_multiplier=self.noise_multiplier, clip=p.clip)
            if self.private
            else None
        )
        #: Each client's private part v_k, ``[K, d_priv]`` (never sent); a row
        #: is valid once the client has joined (:attr:`joined`).
        self.private_parts = self.weights.new_zeros(
            self.stats.num_clients, self.split.num_private
        )
        #: Whether each client has checked in at least once.
        self.joined = torch.zeros(
            self.stats.num_clients, dtype=torch.bool, device=self.device
        )

    @property
    def public_model(self) -> torch.Tensor:
        """The server's global public part w_pub (a copy)."""
        return self.split.public(self.weights).clone()

    def private_of(self, clients: Sequence[int] | np.ndarray) -> torch.Tensor:
        """Private parts ``[m, d_priv]`` of ``clients`` (global before joining)."""
        idx = torch.as_tensor(np.asarray(clients, dtype=np.int64), device=self.device)
        start = self.split.private(self.weights)
        return torch.where(
            self.joined[idx].unsqueeze(1), self.private_parts[idx], start.unsqueeze(0)
        )

    # -- Algorithm 1, one round -----------------------------------------------------
    def select(self, round_index: int, server: Streams) -> Cohort:
        """K_r <- client k checks in w.p. p_k (step 1, the server's generator).

        Each task carries the client's private part v_k (the global private
        coordinates before it first joins): the simulator keeps v_k on the
        clients' behalf; it is never part of a message's vector.
        """
        clients = self._sampler.sample(server.rng).clients
        return Cohort(
            clients, [Task(int(k), state=self.held_state(k)) for k in clients]
        )

    def held_state(self, client: int) -> dict[str, torch.Tensor]:
        """Client ``client``'s private part v_k (global before it first joins)."""
        return {"private": self.private_of([int(client)])[0]}

    def _local_train(
        self,
        weights: torch.Tensor,
        tasks: Sequence[Task],
        rngs: list[np.random.Generator],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """E local SGD steps of ``clients`` (steps 2, 3, 8), one row per client.

        Client ``clients[j]`` draws its batches from ``rngs[j]`` alone.
        Returns the new public ``[m, d_pub]`` and private ``[m, d_priv]`` parts.
        """
        p = self.params
        clients = [int(t.client) for t in tasks]
        w_pub = self.split.public(weights)
        private = torch.stack([t.state["private"] for t in tasks]).to(weights)
        start = self.split.merge(w_pub.unsqueeze(0).expand(len(clients), -1), private)
        stacked = {k: v.clone() for k, v in self.unflatten(start).items()}
        sizes = self.stats.sizes
        draws = [
            draw_local_batches(
                rng,
                sizes[[k]],
                batch_size=p.batch_size,
                steps=p.local_steps,
                replacement=p.replacement,
            )
            for k, rng in zip(clients, rngs)
        ]
        pos = np.concatenate([d[0] for d in draws], axis=1)
        mask = np.concatenate([d[1] for d in draws], axis=1)
        ids = np.asarray(clients, dtype=np.int64)
        for s in range(p.local_steps):
            xb, yb = gather_batches(self.dataset, ids, pos[s], self.device)
            new = cohort_sgd_step(
                self.model,
                stacked,
                xb,
                yb,
                learning_rate=p.learning_rate,
                loss_fn=self.loss_fn,
                sample_mask=torch.as_tensor(mask[s], device=self.device),
                max_clients=self.max_clients,
            )
            if p.weight_decay:
                new = {
                    k: v - p.learning_rate * p.weight_decay * stacked[k]
                    for k, v in new.items()
                }
            stacked = new
        flat = self.flatten(stacked, lead=1)
        return self.split.public(flat), self.split.private(flat)

    def _messages(
        self,
        weights: torch.Tensor,
        public: torch.Tensor,
        generators: list[NoiseGenerator],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Steps 4-5: clip each row, then each client adds its own noise.

        Returns the messages ``[m, d_pub]`` and whether each row was clipped.
        """
        w_pub = self.split.public(weights)
        raw = public - w_pub if self.params.clip_mode == "update" else public
        clipped = _clip_rows(raw, self.params.clip)
        was_clipped = raw.norm(dim=1) > self.params.clip
        if self.privatizer is None:
            return clipped, was_clipped
        rows = [
            self.privatizer.noise_messages({"u": clipped[j]}, g)["u"]
            for j, g in enumerate(generators)
        ]
        return torch.stack(rows), was_clipped

    def client_step(
        self, weights: torch.Tensor, task: Task, streams: Streams
    ) -> Message:
        """One client: local training, clip, its own noise; keep its new v_k."""
        public, private = self._local_train(weights, [task], [streams.rng])
        messages, clipped = self._messages(weights, public, [streams.generator])
        return Message(
            messages[0], {"clipped": float(clipped[0])}, state={"private": private[0]}
        )

    def client_steps(
        self, weights: torch.Tensor, tasks: Sequence[Task], streams: Sequence[Streams]
    ) -> Messages:
        """The cohort's local training as one batched computation.

        Each client's batches and noise still come from its own streams.
        """
        if not tasks:
            return Messages(weights.new_zeros(0, self.split.num_public), {})
        public, private = self._local_train(weights, tasks, [s.rng for s in streams])
        messages, clipped = self._messages(
            weights, public, [s.generator for s in streams]
        )
        return Messages(
            messages,
            {"clipped": clipped.to(torch.float64)},
            states={"private": private},
        )

    def aggregate(
        self, clients: np.ndarray, received: torch.Tensor, w_pub: torch.Tensor
    ) -> torch.Tensor:
        """Step 7: the next w_pub from the received ``[m, d_pub]`` messages."""
        if self.params.clip_mode == "update":
            updates, models = received, received + w_pub
        else:
            updates, models = received - w_pub, received
        if len(clients) == 0:
            return w_pub.clone() if self.params.aggregation != "model" else 0.0 * w_pub
        weights = torch.as_tensor(
            1.0 / (self.stats.num_clients * self.probabilities[clients]),
            dtype=received.dtype,
            device=received.device,
        )
        if self.params.aggregation == "update":
            return w_pub + weights @ updates
        if self.params.aggregation == "model":
            return weights @ models
        return w_pub + updates.mean(0)

    def server_step(
        self, cohort: Cohort, messages: Messages, server: Streams
    ) -> dict[str, float]:
        """Aggregate (step 7), then commit the public part and the private parts.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If the new public part or a private part is not finite; nothing
            changes.
        """
        clients = np.asarray(cohort.participants, dtype=np.int64)
        m = len(clients)
        d_pub = self.split.num_public
        w_pub = self.public_model
        received = messages.vectors if m else w_pub.new_zeros(0, d_pub)
        if messages.summed or tuple(received.shape) != (m, d_pub):
            raise DpflError(
                f"MS-PAFL needs one [{d_pub}] message per participant ({m}); got "
                f"{tuple(received.shape)} (summed={messages.summed})"
            )
        new_pub = self.aggregate(clients, received, w_pub)
        private = messages.states["private"] if m else self.private_parts[:0]
        check_finite({"public model": new_pub, "private parts": private}, "MS-PAFL")
        # Step 8: recombination. The server's model keeps its private coordinates.
        with torch.no_grad():
            self.weights.index_copy_(0, self._pub, new_pub.to(self.weights.dtype))
            if m:
                idx = torch.as_tensor(clients, device=self.device)
                self.private_parts[idx] = private
                self.joined[idx] = True
        metrics = {
            "participants": float(m),
            "update_norm": float((new_pub - w_pub).norm()),
        }
        if m:
            metrics["clipped_fraction"] = messages.scalar_total("clipped") / m
        return metrics

    # -- evaluation and state ---------------------------------------------------------
    def _eval_ids(self) -> np.ndarray:
        k = min(self.params.eval_clients, self.stats.num_clients)
        n = self.stats.num_clients
        return np.unique(np.linspace(0, n - 1, k).round().astype(int))

    def evaluate(self) -> dict[str, float]:
        """Mean test loss and accuracy of the clients' personalised models.

        Client k's model is ``[w_pub ; v_k]``. On its own test split when the
        dataset has per-client test splits, else on the shared test set;
        averaged over ``eval_clients`` evenly spaced clients.

        Returns
        -------
        dict of str to float
            ``{"test_loss", "test_accuracy"}``; empty without a test set.
        """
        ds = self.dataset
        if ds.test_features is None or ds.test_labels is None:
            return {}
        per_client = getattr(ds, "client_test_indices", None) is not None
        ids = self._eval_ids()
        w_pub = self.split.public(self.weights)
        models = self.split.merge(w_pub.unsqueeze(0), self.private_of(ids))
        saved = self.weights.clone()
        losses, accs = [], []
        try:
            for j, k in enumerate(ids.tolist()):
                x, y = (
                    ds.client_test(k)
                    if per_client
                    else (ds.test_features, ds.test_labels)
                )
                if len(y) == 0:
                    continue
                with torch.no_grad():
                    self.weights.copy_(models[j])
                out = evaluate_model(
                    self.model,
                    x,
                    y,
                    loss_fn=self.loss_fn,
                    batch_size=self.eval_batch_size,
                    device=self.device,
                )
                losses.append(out["test_loss"])
                accs.append(out["test_accuracy"])
        finally:
            with torch.no_grad():
                self.weights.copy_(saved)
        if not accs:
            return {}
        return {
            "test_loss": float(np.mean(losses)),
            "test_accuracy": float(np.mean(accs)),
        }

    def extra_state(self) -> dict[str, Any]:
        """Every client's private part and whether it has joined (CPU copies)."""
        return {
            "private_parts": self.private_parts.detach().cpu().clone(),
            "joined": self.joined.detach().cpu().clone(),
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`extra_state`."""
        parts, joined = state["private_parts"], state["joined"]
        if tuple(parts.shape) != tuple(self.private_parts.shape) or tuple(
            joined.shape
        ) != tuple(self.joined.shape):
            raise InvalidParameterError(
                f"private_parts must have shape {tuple(self.private_parts.shape)} "
                f"and joined {tuple(self.joined.shape)}; got {tuple(parts.shape)} "
                f"and {tuple(joined.shape)}"
            )
        self.private_parts.copy_(parts)
        self.joined.copy_(joined)
