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

**Which norm is released** (``norm_source``). The paper's clients release
"a private estimate of their last gradient norm" (§6). ``"current"``
(default) releases the norm of the update ḡ_k the client computes at w_t in
this round. ``"stale"`` releases the norm of the clipped update the client
computed the last time it was in S1 (at an earlier w_{t'}): the norm a client
knows before this round's training. A client in S1 for the first time has no
earlier update; it releases the norm of the one it computes now, so that
every S1 client makes exactly one norm release per round in both variants
(a fixed stand-in such as ν or C would cost nothing, but would bias stage 2
for or against newcomers by a number chosen by us). The simulator keeps
each client's last clipped norm (-1 before its first) on its behalf
(:meth:`Locks.held_state`, sent back as the message's state, never part of
its vector); it is checkpointed with the run.

The stale norm costs what the current one costs: it is ``‖ḡ_k‖ ∈ [0, C]``
of an update computed from the client's data and an earlier released model,
so its sensitivity under zero-out is C, and ``ñ_k = max(ν, ‖ḡ_k‖ + σ_n C ξ_k)``
with fresh ξ_k is a Gaussian release of std σ_n C. Given the client's batch
draws (independent of its data), each release is a Gaussian mechanism of the
data and earlier outputs, and mixing over the draws keeps the bound (joint
convexity of the divergences), exactly as for the current norm, whose update
shares this round's batches. The round's event and each S1 client's charge
are therefore the same in both variants.

**Noise.** σ_g is the run's one noise multiplier (``privacy.noise_multiplier``,
the base's ``noise_multiplier``) and ``σ_n = norm_noise_ratio · σ_g``: the two
scales move together, so calibrating σ scales both.

**Who draws what** (:mod:`dpfl.sim.randomness`). The server draws S1 and S2
with its own generator (:class:`~dpfl.sim.sampling_checkin.TwoStageSampler`). Each S1
client draws its E mini-batches from its own numpy stream and, from its own
torch stream, first ξ_k (its norm noise) then z_k (its update noise): its
message (:meth:`Locks.client_step`) carries its noisy update ``g̃_k`` (sent
only if the server picks it for stage 2) and its noisy norm ``ñ_k``. The
second stage and the aggregation are the server step's. The batched client
step (:meth:`Locks.client_steps`) trains all of S1 in one computation and
draws each client's numbers from that client's streams, so the loop and
batched executors agree.

**Accounting.** Each round records ``TwoStage(q1, m2, 1, Gaussian(σ_n),
Gaussian(σ_g))`` with participants = S1 and ``extra={"second_stage": S2,
"max_p2": max_k p2_k}`` (:meth:`Locks.ledger_extra`; max p2 rounded up to
four significant digits, so that every executor and device records the same
number: :func:`recorded_max_p2`). The recorded event is
the one checked before the round (only ``max p2 <= 1`` is known then): the
mixture price at the realised max p2 would condition on the released norms,
which only the per-client Gaussian filter below justifies, and the ledger's
per-client charges do not depend on it; the realised value is kept as a fact
of the round. The guarantee is client-level under zero-out (the client stays
enrolled, its data is replaced by data with a zero update) against the server,
which sees who sent what: the ledger composes each client's own noisy norms
and updates and stops the run before any client would pass the budget.
Observers of the released models get no better guarantee from dpfl: the
noise is added by the clients, so the aggregate's noise level reveals who and
how many took part. :meth:`Locks.paper_report`
(:func:`dpfl.accounting.reports.locks_report`) gives both views.

References
----------
"LOCKS: User differentially private and federated optimal client
sampling": Algorithm 1, Lemmas 4.1, 4.2, 5.2, Theorem 5.1, §6-7;
docs/analyses.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from dpfl._validate import (
    check_nonnegative,
    check_norm_noise,
)
from dpfl.accounting import reports
from dpfl.accounting.events import Event
from dpfl.errors import InvalidParameterError
from dpfl.sim.algorithms.base import (
    AlgorithmParams,
    DataStats,
    FederatedAlgorithm,
    Messages,
)
from dpfl.sim.algorithms.locks_params import (
    ESTIMATORS,
    MAX_P2_DIGITS,
    LocksParams,
    recorded_max_p2,
)
from dpfl.sim.algorithms.registry import register
from dpfl.sim.algorithms.tasks import Cohort, Message, Task
from dpfl.sim.batches import draw_local_batches, gather_batches
from dpfl.sim.grad import check_finite, stack_params
from dpfl.sim.local import cohort_sgd_step
from dpfl.sim.privatize import ClientGaussian
from dpfl.sim.randomness import Streams
from dpfl.sim.sampling_checkin import TwoStageSampler
from dpfl.sim.secure_noise import NoiseGenerator

__all__ = ["MAX_P2_DIGITS", "Locks", "LocksParams", "recorded_max_p2"]


@register
class Locks(FederatedAlgorithm):
    """LOCKS (name ``"locks"``): two-stage norm-proportional sampling.

    See :class:`~dpfl.sim.algorithms.base.FederatedAlgorithm` for the
    arguments; the parameters are :class:`LocksParams`, σ_g is
    ``noise_multiplier`` and σ_n = ``norm_noise_ratio`` · σ_g. The model
    must have no BatchNorm; every client needs >= 1 record.

    References
    ----------
    "LOCKS: User differentially private and federated optimal client
    sampling", Algorithm 1, Lemmas 4.1-4.2, 5.2, Theorem 5.1;
    docs/analyses.md.
    """

    name = "locks"
    Params = LocksParams
    params: LocksParams
    per_client_accounting = True

    @property
    def messages_are_releases(self) -> bool:
        """True: each client noises its update before it leaves (client-side)."""
        return True

    # -- accounting (pure) ------------------------------------------------------
    @staticmethod
    def sampler(params: LocksParams, stats: DataStats) -> TwoStageSampler:
        """S1 w.p. q1, then S2 ⊆ S1 w.p. ``min(1, m2 ω_k)``.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If ``second_stage_size`` exceeds the number of clients (the
            second stage cannot expect more clients than there are).
        """
        if params.second_stage_size > stats.num_clients:
            raise InvalidParameterError(
                f"second_stage_size must be <= the number of clients "
                f"({stats.num_clients}); got {params.second_stage_size}"
            )
        return TwoStageSampler(
            num_clients=stats.num_clients,
            first_stage_probability=params.first_stage_probability,
            second_stage_size=params.second_stage_size,
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
        """``TwoStage(q1, m2, 1, Gaussian(σ_n), Gaussian(σ_g))``, σ_g = σ.

        Before the round only ``max p2 <= 1`` is known.
        """
        p = cast(LocksParams, params)
        return cls.sampler(p, stats).event(
            check_norm_noise(p.norm_noise_ratio, noise_multiplier), noise_multiplier
        )

    @classmethod
    def expected_uploads(
        cls,
        params: AlgorithmParams,
        stats: DataStats,
        noise_multiplier: float,
        *,
        rng: np.random.Generator,
        norms: float | np.ndarray | None = None,
        draws: int = 20_000,
    ) -> float:
        """E|S2|: clients expected to upload a noisy update per round.

        :meth:`~dpfl.sim.sampling_checkin.TwoStageSampler.expected_second_stage_size`
        with the run's norm noise ``σ_n C = norm_noise_ratio · σ · C`` and
        floor ν. It depends on the clients' clipped update norms, which only
        training reveals; the default ``norms=None`` takes every update
        clipped to ``C`` (local steps large enough that every update's norm
        exceeds C), the case in which it is a function of the
        configuration alone.

        Parameters
        ----------
        params : LocksParams
            The run's parameters.
        stats : DataStats
            The data's statistics (K).
        noise_multiplier : float
            σ_g >= 0 (0: no norm noise).
        rng : numpy.random.Generator
            The generator of the Monte Carlo draws.
        norms : float, numpy.ndarray or None
            The clipped norms ``‖ḡ_k‖`` (one, or one per client); default C.
        draws : int
            Monte Carlo draws.

        Returns
        -------
        float
            The estimate of E|S2|.
        """
        p = cast(LocksParams, params)
        sigma = check_nonnegative("noise_multiplier", noise_multiplier)
        return cls.sampler(p, stats).expected_second_stage_size(
            p.clip if norms is None else norms,
            norm_noise=p.norm_noise_ratio * sigma * p.clip,
            floor=p.floor,
            rng=rng,
            draws=draws,
        )

    @classmethod
    def paper_report(
        cls,
        params: AlgorithmParams,
        stats: DataStats,
        noise_multiplier: float,
        ledger: Any,
        delta: float,
    ) -> dict[str, Any] | None:
        """The worst client's guarantee for the server and for model observers.

        :func:`dpfl.accounting.reports.locks_report` with σ_g = σ and
        σ_n = ``norm_noise_ratio`` · σ (``None`` for a non-private run).
        """
        if noise_multiplier <= 0:
            return None
        p = cast(LocksParams, params)
        return reports.locks_report(
            ledger,
            noise_multiplier=noise_multiplier,
            norm_noise_ratio=p.norm_noise_ratio,
            event=cls.round_event(p, stats, noise_multiplier),
            delta=delta,
        )

    def realised_event(self, cohort: Cohort) -> Event | None:
        """The sampler's event with the bound known before the round (max p2 = 1).

        The realised max p2 is a fact of the round (:meth:`ledger_extra`), not
        a term of its price: see the module docstring.
        """
        if not self.private:
            return None
        return self._sampler.event(self.sigma_n, self.sigma_g)

    def ledger_extra(self, cohort: Cohort) -> dict[str, Any] | None:
        """``{"second_stage": [ids of S2], "max_p2": max_k p2_k}`` (JSON-ready).

        ``max_p2`` is 0 when S1 was empty, and is recorded rounded up to
        :data:`MAX_P2_DIGITS` significant digits (:func:`recorded_max_p2`).
        """
        return {
            "second_stage": [int(k) for k in cohort.info.get("second_stage", ())],
            "max_p2": recorded_max_p2(float(cohort.info.get("max_p2", 0.0))),
        }

    # -- set-up -----------------------------------------------------------------
    def setup(self) -> None:
        """Sampler, noise scales and the two client privatizers."""
        sizes = self.stats.sizes
        if sizes.min() < 1:
            raise InvalidParameterError(
                "every client needs >= 1 training record; clients "
                f"{np.flatnonzero(sizes < 1)[:10].tolist()} have none"
            )
        p = self.params
        self._sampler = self.sampler(p, self.stats)
        #: σ_g: std of each uploaded update's noise, in units of C.
        self.sigma_g = self.noise_multiplier
        #: σ_n = norm_noise_ratio · σ_g: std of each released norm's noise.
        self.sigma_n = p.norm_noise_ratio * self.sigma_g
        self.norm_noise: ClientGaussian | None = None
        self.update_noise: ClientGaussian | None = None
        if self.private:
            self.norm_noise = ClientGaussian(noise_multiplier=self.sigma_n, clip=p.clip)
            self.update_noise = ClientGaussian(
                noise_multiplier=self.sigma_g, clip=p.clip
            )
        #: Each client's last clipped norm ‖ḡ_k‖ (-1: never in S1), held on
        #: the clients' behalf for ``norm_source="stale"``.
        self.last_norm = torch.full(
            (self.stats.num_clients,), -1.0, dtype=torch.float64
        )

    @property
    def stale(self) -> bool:
        """Whether clients release the norm of their previous update."""
        return self.params.norm_source == "stale"

    def held_state(self, client: int) -> dict[str, torch.Tensor]:
        """``{"last_norm": ‖ḡ_k‖ of its last update}`` (-1: none), when stale."""
        if not self.stale:
            return {}
        return {"last_norm": self.last_norm[int(client)].clone()}

    def extra_state(self) -> dict[str, Any]:
        """Each client's last clipped norm (the stale variant's held state)."""
        return {"last_norm": self.last_norm.clone()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`extra_state`."""
        last = state.get("last_norm")
        if last is None:  # a checkpoint from before the stale variant existed
            if self.stale:
                raise InvalidParameterError(
                    "state has no last_norm; norm_source='stale' needs the "
                    "clients' last norms"
                )
            return
        if tuple(last.shape) != tuple(self.last_norm.shape):
            raise InvalidParameterError(
                f"last_norm must have shape {tuple(self.last_norm.shape)}; got "
                f"{tuple(last.shape)}"
            )
        self.last_norm.copy_(last)

    # -- the server's first stage -------------------------------------------------
    def select(self, round_index: int, server: Streams) -> Cohort:
        """S1 ← each client w.p. q1; each trains on batches of its own choice."""
        s1 = self._sampler.first_stage(server.rng)
        tasks = [Task(int(k), state=self.held_state(int(k))) for k in s1]
        return Cohort(s1, tasks, {"round": round_index})

    # -- the clients --------------------------------------------------------------
    def clipped_updates(
        self,
        weights: torch.Tensor,
        clients: np.ndarray,
        rngs: Sequence[np.random.Generator],
    ) -> torch.Tensor:
        """Clipped updates ḡ_k at ``weights`` of ``clients``, trained together.

        Client ``clients[j]`` draws its E batches of b records (with
        replacement) from ``rngs[j]`` alone.

        Parameters
        ----------
        weights : torch.Tensor
            ``[d]`` global weights w_t.
        clients : numpy.ndarray
            The clients (ids).
        rngs : sequence of numpy.random.Generator
            Each client's own generator.

        Returns
        -------
        torch.Tensor
            ``[len(clients), d]``, each row of norm <= C.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If a gradient or an update is not finite.
        """
        p = self.params
        m = len(clients)
        if m == 0:
            return weights.new_zeros(0, weights.numel())
        sizes = self.stats.sizes
        pos = np.concatenate(
            [
                draw_local_batches(
                    rng,
                    sizes[[int(k)]],
                    batch_size=p.batch_size,
                    steps=p.local_steps,
                    replacement=True,
                )[0]
                for k, rng in zip(clients, rngs)
            ],
            axis=1,
        )
        stacked = stack_params(self.unflatten(weights), m)
        for s in range(p.local_steps):
            xb, yb = gather_batches(self.dataset, clients, pos[s], self.device)
            stacked = cohort_sgd_step(
                self.model,
                stacked,
                xb,
                yb,
                learning_rate=p.local_learning_rate,
                loss_fn=self.loss_fn,
                max_clients=self.max_clients,
            )
        g = weights.detach().unsqueeze(0) - self.flatten(stacked, lead=1)
        check_finite({"update": g}, "LOCKS client updates")
        norms = g.norm(dim=1, keepdim=True)
        clipped: torch.Tensor = g * (p.clip / norms.clamp_min(1e-30)).clamp(max=1.0)
        return clipped

    def release(
        self,
        clipped: torch.Tensor,
        generator: NoiseGenerator,
        norm: float | None = None,
    ) -> tuple[torch.Tensor, float]:
        """One client's releases: ``(g̃ = ḡ + σ_g C z, ñ = max(ν, n + σ_n C ξ))``.

        ``n`` is ``‖ḡ‖`` or the given ``norm``. ξ is drawn first, then z,
        both from the client's ``generator`` (nothing is drawn in a
        non-private run).

        Parameters
        ----------
        clipped : torch.Tensor
            ``[d]`` the client's clipped update ḡ.
        generator : torch.Generator or SecureGenerator
            The client's own torch generator.
        norm : float, optional
            The norm to release, in [0, C] (the stale variant's last clipped
            norm); default ``‖ḡ‖``.

        Returns
        -------
        tuple
            The noisy update ``[d]`` and the released norm (a float >= ν).
        """
        if norm is None:
            norm = self.clipped_norm(clipped)
        elif not 0.0 <= norm <= self.params.clip:
            # the release is priced for a norm in [0, C]
            raise InvalidParameterError(
                f"norm must be in [0, clip={self.params.clip}]; got {norm!r}"
            )
        value = torch.tensor(float(norm), dtype=torch.float64, device=clipped.device)
        norm_t = value.reshape(1, 1)
        if self.norm_noise is None or self.update_noise is None:
            return clipped.clone(), max(self.params.floor, float(norm_t))
        noisy_norm = self.norm_noise.noise_messages({"n": norm_t}, generator)["n"]
        noisy = self.update_noise.noise_messages({"g": clipped[None]}, generator)["g"]
        return noisy[0], max(self.params.floor, float(noisy_norm))

    def _message(
        self, clipped: torch.Tensor, task: Task, generator: NoiseGenerator
    ) -> Message:
        """Release ḡ and the current or held norm; keep ‖ḡ‖ when stale."""
        if not self.stale:
            noisy, norm = self.release(clipped, generator)
            return Message(noisy, {"noisy_norm": norm})
        current = self.clipped_norm(clipped)
        held = task.state.get("last_norm")
        last = -1.0 if held is None else float(held)
        # first time in S1: the current norm
        noisy, norm = self.release(clipped, generator, current if last < 0 else last)
        return Message(
            noisy,
            {"noisy_norm": norm},
            state={"last_norm": torch.tensor(current, dtype=torch.float64)},
        )

    def clipped_norm(self, clipped: torch.Tensor) -> float:
        """``‖ḡ‖`` in float64, at most C.

        Clipping in float32 can leave ``‖ḡ‖`` a few parts in a million above
        C; the norm's release is priced for ``[0, C]``, so it is capped there
        (a change of that size, the rounding's, to the released value only).
        """
        value = float(torch.linalg.vector_norm(clipped.to(torch.float64)))
        return min(value, float(self.params.clip))

    def client_step(
        self, weights: torch.Tensor, task: Task, streams: Streams
    ) -> Message:
        """ḡ_k ← clip_C(w_t − w_t after E local steps); release g̃_k and ñ_k.

        The message's vector is the noisy update g̃_k (uploaded only if the
        server picks the client for stage 2), its scalar ``"noisy_norm"`` ñ_k
        (of ḡ_k, or, when stale, of the client's previous clipped update; its
        state then carries ``‖ḡ_k‖`` for the next time).
        """
        clipped = self.clipped_updates(
            weights, np.array([task.client], dtype=np.int64), [streams.rng]
        )
        return self._message(clipped[0], task, streams.generator)

    def client_steps(
        self, weights: torch.Tensor, tasks: Sequence[Task], streams: Sequence[Streams]
    ) -> Messages:
        """All of S1 trained in one stacked computation, each with its own streams."""
        if not tasks:
            return Messages.stack([], weights)
        clients = np.array([t.client for t in tasks], dtype=np.int64)
        clipped = self.clipped_updates(weights, clients, [s.rng for s in streams])
        messages = [
            self._message(clipped[j], t, s.generator)
            for j, (t, s) in enumerate(zip(tasks, streams))
        ]
        return Messages.stack(messages, weights)

    # -- the server's second stage and step ---------------------------------------
    def aggregate(
        self,
        noisy_updates: torch.Tensor,
        noisy_norms: np.ndarray,
        rng: np.random.Generator,
        *,
        estimator: str | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Stage 2 and the estimate: S2 ⊆ S1 by noisy norms, then ĝ.

        Parameters
        ----------
        noisy_updates : torch.Tensor
            ``[n1, d]`` the S1 clients' noisy updates g̃ (only S2's are read).
        noisy_norms : numpy.ndarray
            ``[n1]`` their released norms ñ.
        rng : numpy.random.Generator
            The server's generator (draws S2).
        estimator : {"unbiased", "weighted"}, optional
            Overrides the parameters' estimator.

        Returns
        -------
        tuple
            ``(ĝ as a flat [d] tensor, info)``; info holds ``chosen``
            (positions in S1 of S2), ``p2`` and ``omega`` (numpy, aligned with
            S1), ``max_p2`` (0 for an empty S1) and ``variance`` (V̂_t of the
            module docstring).
        """
        estimator = self.params.estimator if estimator is None else estimator
        if estimator not in ESTIMATORS:
            raise InvalidParameterError(
                f"estimator must be one of {ESTIMATORS}; got {estimator!r}"
            )
        d = noisy_updates.shape[1]
        n_tilde = np.asarray(noisy_norms, dtype=np.float64).reshape(-1)
        if n_tilde.size == 0:
            return noisy_updates.new_zeros(d), {
                "chosen": np.empty(0, np.int64),
                "p2": np.empty(0),
                "omega": np.empty(0),
                "max_p2": 0.0,
                "variance": 0.0,
            }
        chosen, p2 = self._sampler.second_stage(rng, n_tilde)
        omega = n_tilde / n_tilde.sum()
        if estimator == "unbiased":
            pi = self.params.first_stage_probability * p2[chosen]
            a = 1.0 / (self.stats.num_clients * pi)
        else:
            pi = p2[chosen]
            a = np.full(len(chosen), 1.0 / self.params.second_stage_size)
        sent = noisy_updates[
            torch.as_tensor(chosen, dtype=torch.long, device=noisy_updates.device)
        ]
        coef = torch.as_tensor(a, dtype=sent.dtype, device=sent.device)
        estimate = coef @ sent if len(chosen) else noisy_updates.new_zeros(d)
        noise_var = d * (self.sigma_g * self.params.clip) ** 2
        variance = float(np.sum(a**2 * ((1.0 - pi) * n_tilde[chosen] ** 2 + noise_var)))
        return estimate, {
            "chosen": chosen,
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
        p = self.params
        eta = p.server_learning_rate
        if p.server_schedule == "constant":
            return eta
        if p.server_schedule == "inverse-sqrt":
            return eta / math.sqrt(round_index + 1)
        c2 = p.clip**2
        return eta * c2 / (c2 + check_nonnegative("variance", variance))

    def server_step(
        self, cohort: Cohort, messages: Messages, server: Streams
    ) -> dict[str, float]:
        """S2 ← norm-proportional draw; ĝ ← Σ_{S2} a_k g̃_k;  w ← w − η_t ĝ.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If the step is not finite; the weights are unchanged.
        """
        s1 = np.asarray(cohort.participants, dtype=np.int64)
        norms = (
            messages.scalars["noisy_norm"].cpu().numpy()
            if "noisy_norm" in messages.scalars
            else np.empty(0)
        )
        estimate, info = self.aggregate(messages.vectors, norms, server.rng)
        eta = self.step_size(int(cohort.info.get("round", 0)), info["variance"])
        step = estimate * eta
        self.apply_update(step, scale=-1.0)
        cohort.info["second_stage"] = s1[info["chosen"]]
        cohort.info["max_p2"] = info["max_p2"]
        if self.stale and len(s1):
            self.last_norm[torch.as_tensor(s1)] = messages.states["last_norm"].to(
                self.last_norm
            )
        return {
            "first_stage": float(len(s1)),
            "second_stage": float(len(info["chosen"])),
            "expected_second_stage": float(info["p2"].sum()),
            "max_p2": info["max_p2"],
            "step_size": eta,
            "variance": info["variance"],
            "update_norm": float(torch.linalg.vector_norm(step)),
        }
