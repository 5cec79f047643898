"""LOCKS: two-round, norm-proportional client sampling with client-side noise.

One round t, as reconstructed in docs/analyses.md::

    S1   <- each of the K clients w.p. q1                           (stage 1)
    for k in S1:                                                     (batched)
        g_k  <- w_t - (w_t after E local SGD steps, b records WR each)
        ḡ_k  <- clip_C(g_k)
        ñ_k  <- max(ν, ‖ḡ_k‖ + σ_n C ξ_k)            (released: noisy norm)
    ω_k  <- ñ_k / Σ_{j∈S1} ñ_j ;  p2_k <- min(1, m2 ω_k)
    S2   <- each k in S1 w.p. p2_k                                   (stage 2)
    for k in S2:  g̃_k <- ḡ_k + σ_g C z_k             (released: noisy update)
    ĝ    <- (1/K) Σ_{S2} g̃_k / (q1 p2_k)   (A, unbiased, Lemma 4.2)
         or (1/m2) Σ_{S2} g̃_k              (B, weighted, Lemma 5.2)
    w_{t+1} <- w_t - η_t ĝ

The update ``g_k`` is the model delta of E local steps (FedAvg's
pseudo-gradient; with E = 1 it is the local step size times the mini-batch
gradient), so a server step ``η_t = 1`` with full participation and no noise
is FedAvg. All S1 clients train together in one batched computation
(:func:`dpfl.sim.local.cohort_sgd_step`).

**Estimators.** (A) is unbiased for the uniform mean ``(1/K) Σ_k ḡ_k``
because ``E[1{k∈S2} / (q1 p2_k) | S1, ñ] = 1{k∈S1} / q1`` and
``E[1{k∈S1}] = q1`` (it stays unbiased when the cap ``p2 <= 1`` binds).
(B) is unbiased for the noisy-norm-weighted aggregate ``Σ_{k∈S1} ω_k ḡ_k``
given S1 and ñ, when ``m2 max ω <= 1`` (Lemma 5.2's assumption), not for
the uniform mean.

**Adaptive server step (RECON of Theorem 5.1).** The paper's rate formula is
lost; its proof bounds the descent by a variance term that grows with
``Σ_k 1/π_k`` and ``d σ_g² C²``, and asks the step to shrink with it. dpfl
uses, from *released* quantities only (so the step is post-processing)::

    V̂_t = Σ_{k∈S2} a_k² [ (1 - π_k) ñ_k² + d σ_g² C² ]
    η_t = η · C² / (C² + V̂_t)                      (server_schedule="variance")

where ``ĝ = Σ_{k∈S2} a_k g̃_k`` (``a_k = 1/(K q1 p2_k)`` for A, ``1/m2`` for
B), ``π_k = q1 p2_k`` for A and ``p2_k`` for B (B is conditioned on S1).
``V̂_t`` is the Horvitz-Thompson estimate of the estimator's variance for
Poisson sampling (``Σ_{k∈S} (1-π_k) y_k²/π_k²``, with the released ñ_k standing
in for ‖ḡ_k‖) plus the exact variance of the noise; ``C²`` bounds the squared
norm of the mean clipped update. The step is the descent lemma's optimum
``‖∇‖² / (L(‖∇‖² + Var))`` with ‖∇‖² replaced by that bound. Also available:
``"constant"`` (η_t = η) and ``"inverse-sqrt"`` (η_t = η/√(t+1), the decaying
rate such proofs usually assume).

**Accounting.** Each round records ``TwoStage(q1, m2, max_k p2_k,
Gaussian(σ_n), Gaussian(σ_g))`` with participants = S1 and
``extra={"second_stage": S2}`` (see :meth:`Locks.ledger_extra` and
:meth:`Locks.realised_event`: before the round only ``max p2 <= 1`` is
known). The guarantee is client-level under zero-out (the client stays
enrolled, its data is replaced by data with a zero update) against the server,
which sees who sent what: the ledger composes each client's own noisy norms
and updates and stops the run before any client would pass the budget.
Observers of the released models get no better guarantee from dpfl: the
noise is added by the clients, so the aggregate's noise level reveals who and
how many took part. :meth:`Locks.privacy_report` gives both views.

References
----------
LOCKS (locks.txt): Algorithm 1, Lemmas 4.1, 4.2, 5.2, Theorem 5.1, §6-7;
docs/analyses.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
from dpfl.accounting import rdp, schemes
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data.dataset import FederatedDataset
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.sim.batches import draw_local_batches, gather_batches
from dpfl.sim.evaluation import evaluate_model
from dpfl.sim.grad import check_finite, stack_params
from dpfl.sim.local import cohort_sgd_step
from dpfl.sim.loop import check_state_owner, model_state
from dpfl.sim.privatize import ClientGaussian
from dpfl.sim.sampling import PoissonClientSampler

__all__ = ["Locks"]

Params = dict[str, torch.Tensor]
ESTIMATORS = ("unbiased", "weighted")
SCHEDULES = ("variance", "constant", "inverse-sqrt")


class Locks:
    """LOCKS (name ``"locks"``): two-stage norm-proportional sampling.

    Parameters
    ----------
    model : torch.nn.Module
        The model; no BatchNorm.
    dataset : FederatedDataset
        Clients' records (each client needs >= 1); its test set is used by
        :meth:`evaluate`.
    device : str
        Torch device.
    first_stage_probability : float
        q1 in (0, 1]: each client joins S1 w.p. q1.
    second_stage_size : int
        m2 >= 1: expected size of S2 when no cap binds (Lemma 4.1).
    noise_multiplier : float
        σ_g > 0: noise std of each uploaded update, in units of ``clip``
        (``privacy.noise_multiplier`` in a run config; calibration scales it).
    norm_noise_ratio : float
        σ_n / σ_g > 0: the norm release's noise std is ``norm_noise_ratio ·
        noise_multiplier · clip`` (default 4; the two scales move together
        when the noise is calibrated).
    clip : float
        C > 0, clip norm of each client's update.
    norm_floor : float or None
        ν > 0, the floor of the released norm; default ``0.01 · clip``.
    local_steps : int
        E >= 1 local SGD steps.
    batch_size : int
        b >= 1 records per step, drawn with replacement (proof of Thm 5.1).
    local_learning_rate : float
        Local step size (> 0).
    server_learning_rate : float
        Base server step η (> 0).
    server_schedule : {"variance", "constant", "inverse-sqrt"}
        The adaptive server step (module docstring).
    estimator : {"unbiased", "weighted"}
        (A) ``1/(K q1 p2_k)`` scaling or (B) ``1/m2`` weighting.
    max_clients : int or None
        Clients per chunk of the batched local step.
    eval_batch_size : int
        Batch size of :meth:`evaluate`.
    loss_fn : callable
        ``loss_fn(output, target)``, mean over the batch.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a parameter outside its domain (the message names it).

    References
    ----------
    LOCKS (locks.txt), Algorithm 1, Lemmas 4.1-4.2, 5.2, Theorem 5.1;
    docs/analyses.md.
    """

    name = "locks"
    per_client_accounting = True

    def __init__(
        self,
        *,
        model: nn.Module,
        dataset: FederatedDataset,
        device: str = "cpu",
        first_stage_probability: float,
        second_stage_size: int,
        noise_multiplier: float,
        norm_noise_ratio: float = 4.0,
        clip: float = 1.0,
        norm_floor: float | None = None,
        local_steps: int = 1,
        batch_size: int = 16,
        local_learning_rate: float = 0.1,
        server_learning_rate: float = 1.0,
        server_schedule: str = "variance",
        estimator: str = "unbiased",
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
        self.q1 = check_probability("first_stage_probability", first_stage_probability)
        self.m2 = check_count("second_stage_size", second_stage_size, minimum=1)
        self.sigma_g = check_positive("noise_multiplier", noise_multiplier)
        self.sigma_n = self.sigma_g * check_positive(
            "norm_noise_ratio", norm_noise_ratio
        )
        self.clip = check_positive("clip", clip)
        self.norm_floor = (
            0.01 * self.clip
            if norm_floor is None
            else check_positive("norm_floor", norm_floor)
        )
        self.local_steps = check_count("local_steps", local_steps, minimum=1)
        self.batch_size = check_count("batch_size", batch_size, minimum=1)
        self.local_learning_rate = check_positive(
            "local_learning_rate", local_learning_rate
        )
        self.server_learning_rate = check_positive(
            "server_learning_rate", server_learning_rate
        )
        if server_schedule not in SCHEDULES:
            raise InvalidParameterError(
                f"server_schedule must be one of {SCHEDULES}; got {server_schedule!r}"
            )
        self.server_schedule = server_schedule
        if estimator not in ESTIMATORS:
            raise InvalidParameterError(
                f"estimator must be one of {ESTIMATORS}; got {estimator!r}"
            )
        self.estimator = estimator
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
        self.sizes = np.asarray(dataset.client_sizes(), dtype=np.int64)
        if self.sizes.min() < 1:
            raise InvalidParameterError(
                "every client needs >= 1 training record; clients "
                f"{np.flatnonzero(self.sizes < 1)[:10].tolist()} have none"
            )
        self.sampler = PoissonClientSampler(
            num_clients=self.num_clients,
            participation_probability=self.q1,
            client_sizes=self.sizes,
        )
        self.names = [n for n, _ in self.model.named_parameters()]
        self.shapes = [p.shape for _, p in self.model.named_parameters()]
        self.dim = sum(p.numel() for p in self.model.parameters())
        self.norm_noise = ClientGaussian(noise_multiplier=self.sigma_n, clip=self.clip)
        self.update_noise = ClientGaussian(
            noise_multiplier=self.sigma_g, clip=self.clip
        )
        self._last: dict[str, Any] = {}

    # -- accounting -------------------------------------------------------------
    def _event(self, max_p2: float) -> ev.TwoStage:
        return ev.TwoStage(
            self.q1,
            self.m2,
            max_p2,
            ev.Gaussian(self.sigma_n),
            ev.Gaussian(self.sigma_g),
        )

    def event(self) -> ev.Event:
        """The accounting event of the next round, known before it runs.

        Returns
        -------
        Event
            ``TwoStage(q1, m2, 1.0, Gaussian(σ_n), Gaussian(σ_g))``: before the
            round only ``max p2 <= 1`` is known. Use :meth:`realised_event`
            after the round to record the realised maximum.
        """
        return self._event(1.0)

    def realised_event(self) -> ev.Event:
        """The last round's event with its realised ``max_k p2_k``.

        Returns
        -------
        Event
            ``TwoStage(q1, m2, max p2, Gaussian(σ_n), Gaussian(σ_g))`` (1.0
            before any round, or when S1 was empty).
        """
        return self._event(float(self._last.get("max_p2", 1.0)) or 1.0)

    def ledger_extra(self) -> dict[str, Any]:
        """Per-round facts for the ledger entry of the last round.

        Returns
        -------
        dict
            ``{"second_stage": [ids of S2]}`` (JSON-ready).
        """
        return {"second_stage": [int(k) for k in self._last.get("second_stage", [])]}

    # -- one round, piece by piece ------------------------------------------------
    def _params(self) -> Params:
        return {n: p.detach() for n, p in self.model.named_parameters()}

    def first_stage(self, rng: np.random.Generator) -> np.ndarray:
        """S1: each client w.p. q1 (ascending ids).

        Parameters
        ----------
        rng : numpy.random.Generator
            The round's generator.

        Returns
        -------
        numpy.ndarray
            int64 client ids.
        """
        return self.sampler.sample(rng).clients

    def client_updates(
        self, clients: np.ndarray, rng: np.random.Generator
    ) -> torch.Tensor:
        """Clipped updates ḡ_k of S1 clients computed at w_t, batched.

        Parameters
        ----------
        clients : numpy.ndarray
            S1 (ids).
        rng : numpy.random.Generator
            Draws the b records (with replacement) of each of the E steps.

        Returns
        -------
        torch.Tensor
            ``[len(clients), d]`` flat clipped updates, each of norm <= C.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If a gradient is not finite.
        """
        w = self._params()
        flat_w = torch.cat([w[n].reshape(-1) for n in self.names])
        if len(clients) == 0:
            return flat_w.new_zeros(0, self.dim)
        stacked = stack_params(w, len(clients))
        pos, _ = draw_local_batches(
            rng,
            self.sizes[clients],
            batch_size=self.batch_size,
            steps=self.local_steps,
            replacement=True,
        )
        for s in range(self.local_steps):
            xb, yb = gather_batches(self.dataset, clients, pos[s], self.device)
            stacked = cohort_sgd_step(
                self.model,
                stacked,
                xb,
                yb,
                learning_rate=self.local_learning_rate,
                loss_fn=self.loss_fn,
                max_clients=self.max_clients,
            )
        local = torch.cat(
            [stacked[n].reshape(len(clients), -1) for n in self.names], dim=1
        )
        g = flat_w.unsqueeze(0) - local
        norms = g.norm(dim=1, keepdim=True)
        return g * (self.clip / norms.clamp_min(1e-30)).clamp(max=1.0)

    def noisy_norms(
        self, clipped: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """Released norms ñ_k = max(ν, ‖ḡ_k‖ + σ_n C ξ_k), ξ_k ~ N(0, 1).

        Parameters
        ----------
        clipped : torch.Tensor
            ``[n1, d]`` clipped updates.
        generator : torch.Generator
            Source of ξ.

        Returns
        -------
        torch.Tensor
            ``[n1]`` float64 released norms.
        """
        if clipped.shape[0] == 0:
            return clipped.new_zeros(0, dtype=torch.float64)
        norms = clipped.norm(dim=1, keepdim=True)
        noisy = self.norm_noise.noise_messages({"n": norms}, generator)["n"]
        return noisy.squeeze(1).to(torch.float64).clamp_min(self.norm_floor)

    def second_stage(
        self,
        clients: np.ndarray,
        clipped: torch.Tensor,
        norms: torch.Tensor,
        rng: np.random.Generator,
        generator: torch.Generator,
        *,
        estimator: str | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Stage 2 and aggregation: S2 ⊆ S1, client noise, the estimate ĝ.

        Parameters
        ----------
        clients : numpy.ndarray
            S1 (ids), aligned with ``clipped`` and ``norms``.
        clipped : torch.Tensor
            ``[n1, d]`` clipped updates ḡ.
        norms : torch.Tensor
            ``[n1]`` released norms ñ.
        rng : numpy.random.Generator
            Draws S2.
        generator : torch.Generator
            Draws the update noise.
        estimator : {"unbiased", "weighted"}, optional
            Overrides the instance's estimator.

        Returns
        -------
        tuple
            ``(ĝ as a flat [d] tensor, info)``; info holds ``second_stage``
            (S2 ids), ``p2`` (numpy, aligned with S1), ``max_p2``, ``omega``
            and ``variance`` (V̂_t of the module docstring).
        """
        estimator = self.estimator if estimator is None else estimator
        if estimator not in ESTIMATORS:
            raise InvalidParameterError(
                f"estimator must be one of {ESTIMATORS}; got {estimator!r}"
            )
        n1 = len(clients)
        if n1 == 0:
            zero = clipped.new_zeros(self.dim)
            return zero, {
                "second_stage": np.empty(0, np.int64),
                "p2": np.empty(0),
                "omega": np.empty(0),
                "max_p2": 0.0,
                "variance": 0.0,
            }
        n_tilde = norms.detach().cpu().numpy().astype(float)
        omega = n_tilde / n_tilde.sum()
        p2 = np.minimum(1.0, self.m2 * omega)
        chosen = rng.random(n1) < p2
        idx = np.flatnonzero(chosen)
        sent = self.update_noise.noise_messages(
            {"g": clipped[torch.as_tensor(idx, dtype=torch.long)]}, generator
        )["g"]
        if estimator == "unbiased":
            pi = self.q1 * p2[idx]
            a = 1.0 / (self.num_clients * pi)
        else:
            pi = p2[idx]
            a = np.full(len(idx), 1.0 / self.m2)
        coef = torch.as_tensor(a, dtype=sent.dtype, device=sent.device)
        estimate = coef @ sent if len(idx) else clipped.new_zeros(self.dim)
        noise_var = self.dim * (self.sigma_g * self.clip) ** 2
        variance = float(np.sum(a**2 * ((1.0 - pi) * n_tilde[idx] ** 2 + noise_var)))
        return estimate, {
            "second_stage": clients[idx],
            "p2": p2,
            "omega": omega,
            "max_p2": float(p2.max()),
            "variance": variance,
        }

    def step_size(self, round_index: int, variance: float) -> float:
        """η_t of the server step (see the module docstring).

        Parameters
        ----------
        round_index : int
            t >= 0.
        variance : float
            V̂_t >= 0 of the round's estimate.

        Returns
        -------
        float
            The step size.
        """
        eta = self.server_learning_rate
        if self.server_schedule == "constant":
            return eta
        if self.server_schedule == "inverse-sqrt":
            return eta / math.sqrt(round_index + 1)
        c2 = self.clip**2
        return eta * c2 / (c2 + check_nonnegative("variance", variance))

    def run_round(
        self, round_index: int, rng: np.random.Generator, generator: torch.Generator
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Run one LOCKS round and take the server step.

        Parameters
        ----------
        round_index : int
            t (used by the ``"inverse-sqrt"`` schedule).
        rng : numpy.random.Generator
            Draws S1, the records and S2.
        generator : torch.Generator
            Draws the norm and update noise.

        Returns
        -------
        tuple
            ``(S1, metrics)``; metrics hold ``first_stage``, ``second_stage``,
            ``max_p2``, ``step_size``, ``variance`` and ``update_norm``.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If an update or the estimate is not finite; the model is unchanged.
        """
        s1 = self.first_stage(rng)
        clipped = self.client_updates(s1, rng)
        norms = self.noisy_norms(clipped, generator)
        estimate, info = self.second_stage(s1, clipped, norms, rng, generator)
        check_finite({"estimate": estimate}, "LOCKS")
        eta = self.step_size(round_index, info["variance"])
        with torch.no_grad():
            start = 0
            for p in self.model.parameters():
                k = p.numel()
                p.sub_(eta * estimate[start : start + k].reshape(p.shape))
                start += k
        self._last = {"second_stage": info["second_stage"], "max_p2": info["max_p2"]}
        metrics = {
            "first_stage": float(len(s1)),
            "second_stage": float(len(info["second_stage"])),
            "max_p2": info["max_p2"],
            "step_size": eta,
            "variance": info["variance"],
            "update_norm": float(eta * estimate.norm()),
        }
        return s1, metrics

    # -- evaluation and state ---------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Mean loss and accuracy of the global model on the test set.

        Returns
        -------
        dict of str to float
            ``{"test_loss", "test_accuracy"}``; empty without a test set.
        """
        return evaluate_model(
            self.model,
            self.dataset.test_features,
            self.dataset.test_labels,
            loss_fn=self.loss_fn,
            batch_size=self.eval_batch_size,
            device=self.device,
        )

    def state_dict(self) -> dict[str, Any]:
        """Model parameters (CPU copies); LOCKS keeps no other state.

        Returns
        -------
        dict
            ``{"name", "model"}``.
        """
        return {
            "name": self.name,
            "model": model_state(self.model),
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
            If the state belongs to another algorithm.
        """
        check_state_owner(state, self.name)
        self.model.load_state_dict(state["model"])

    # -- the run's guarantee ----------------------------------------------------
    def privacy_report(
        self, ledger: PrivacyLedger, *, delta: float | None = None
    ) -> dict[str, Any]:
        """The worst client's guarantee, for the server and for model observers.

        Parameters
        ----------
        ledger : PrivacyLedger
            The run's ledger: participants = S1 and ``extra["second_stage"]``.
        delta : float, optional
            Target δ (default: the ledger budget's δ).

        Returns
        -------
        dict
            ``"server_view"``: the most exposed client's realised N1 (noisy
            norms sent) and N2 (noisy updates sent), and
            :func:`~dpfl.accounting.rdp.locks_server_view` of them (exact
            Gaussian composition; zero-out, and ``epsilon_replace_one``); its
            ``epsilon_ledger`` is the ledger's figure for the same client.
            ``"observer_view"``: the ledger's ε for parties that see only the
            released models, which dpfl bounds by the server's view (no
            amplification is claimed: client-added noise reveals who took
            part).

        Raises
        ------
        dpfl.errors.DpflError
            If no δ is given and the ledger has no budget.
        """
        if delta is None:
            if ledger.budget is None:
                raise DpflError("delta must be given when the ledger has no budget")
            delta = ledger.budget.delta
        delta = check_delta("delta", delta)
        worst, bound = ledger.worst_unit(delta, analysis="server")
        n1 = n2 = 0
        for entry in ledger.entries:
            if worst is not None and worst in (entry.participants or ()):
                n1 += 1
                n2 += worst in entry.extra.get("second_stage", ())
        kw: dict[str, Any] = {
            "norm_noise_multiplier": self.sigma_n,
            "update_noise_multiplier": self.sigma_g,
            "norm_rounds": n1,
            "update_rounds": n2,
            "delta": delta,
        }
        server = rdp.locks_server_view(**kw)
        server["epsilon_replace_one"] = rdp.locks_server_view(
            **kw, neighbouring="replace-one"
        )["epsilon"]
        server["epsilon_ledger"] = bound.upper
        server["client"] = worst
        observer = {
            "epsilon": ledger.epsilon(delta, analysis="observer").upper,
            **schemes.describe(self.event(), "observer"),
        }
        return {
            "rounds": ledger.rounds,
            "delta": delta,
            "server_view": server,
            "observer_view": observer,
        }

    def __repr__(self) -> str:
        """Return a short description."""
        return (
            f"Locks(K={self.num_clients}, q1={self.q1:g}, m2={self.m2}, "
            f"sigma_n={self.sigma_n:g}, sigma_g={self.sigma_g:g}, C={self.clip:g}, "
            f"estimator={self.estimator!r})"
        )
