"""DP-DSGD with random client participation (Hasircioglu & Gündüz, Algorithm 1).

One round, as in the paper's pseudo-code (docs/analyses.md)::

    P_t  <- each of the N_t available clients joins w.p. p
    for i in P_t:  S_i <- each of i's d records w.p. q
                   g_i <- sum_{s in S_i} clip_C(grad l(w_t, s))
    g    <- sum_i g_i + N(0, σ²C² I)            (trusted server)
    ĝ    <- g / (p N_t q d)                     (unbiased)
    v    <- μ v + ĝ ;  w <- w - η v             (momentum SGD)

All sampled records of all participants go through **one** batched call of
:func:`dpfl.sim.grad.clipped_grad_sum`. Clipping is per record, so the
sum over participants of their per-client sums is the plain sum over all
sampled records (linearity); no per-client segmentation is needed because
the server only ever uses the total.

With ``server="untrusted"`` every available client sends a message (§5.5):
see :class:`dpfl.sim.privatize.NoiseOnlyMessages` for the two choices of the
per-message noise (``secure_aggregation``).

With ``server="untrusted-participants"`` (the cheaper variant at the end of
§5.5) only the participants send, each its clipped sum plus its own
``N(0, σ²C² I)`` (:class:`dpfl.sim.privatize.ClientGaussian`): each message
alone is the Gaussian mechanism on that client's sampled records, but the
server sees who sent, so participation is visible and the guarantee falls to
the paper's WCS (Theorem 5.2): only the ``wcs`` analysis (and the looser
``ols``) are accepted for it (:meth:`DsgdRandomParticipation.valid_analyses`).
The noise on the sum is ``sqrt(m)·σC`` for ``m`` participants.

**Availability (N_t ≤ N).** Clients go offline (§3): ``availability`` draws
the round's online clients from the server's round generator, never from the
data (:class:`dpfl.sim.availability.ClientAvailability`: ``"bernoulli"``, each
online w.p. ``availability_rate``; ``"fixed"``, ``available_clients`` of them
uniformly), and only online clients may join. The server knows who is online
and scales by ``1/(p q n_t)``, ``n_t`` the records of the online clients
(``N_t d`` for equal sizes, the paper's ``1/(p N_t q d)``). The accounting
event is unchanged and sound: availability is independent of the data and of
the mechanism's coins, so the adversary may be handed the online set for
free; given it, an offline client's records change nothing (privacy loss 0),
and an online client's record faces exactly the analysed round (the event
depends on p, q, d and σ, never on N_t). The worst-off client is one that is
always online, and it is charged the event every round, which is what the
ledger records. (No amplification by availability is claimed: it would need
availability hidden from the adversary and random, an assumption dpfl does
not make.) A round with no client online releases a zero update (no data, no
noise) and is still charged, conservatively.

**Unbiased scaling.** With ``n_k`` records at client ``k`` and ``n = Σ_k n_k``
(= ``N d`` when every client holds ``d``), each record is sampled w.p. ``pq``,
so ``E[Σ sampled clip(g)] = pq Σ_all clip(g)`` and
``ĝ = (Σ sampled clip(g) + noise) / (p q n)`` is unbiased for the mean clipped
gradient over all records. The paper's ``1/(p N_t q d)`` is the equal-size case.

**Non-private baseline.** σ = 0: same sampling and scaling, no noise, no
event, nothing charged. ``clip`` may stay (clipped, noise-free) or be
``None`` (plain summed gradients, the paper's non-private curve).

**Who draws what.** The server's sampler draws the participants and their
records (the :class:`~dpfl.sim.sampling.PoissonParticipationSampler` whose
event the ledger prices); a client's step is the clipped gradient sum of its
records; the noise is the privatizer's, drawn by the server (one draw of the
sum of every message's noise, :mod:`dpfl.sim.privatize`). The batched client
step computes the cohort's sum in one kernel call, since the server uses
only the sum.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from dpfl._validate import check_count, check_positive, check_probability
from dpfl.accounting.events import Event
from dpfl.errors import InvalidParameterError
from dpfl.sim._flat import flat_view
from dpfl.sim.algorithms.base import (
    AlgorithmParams,
    DataStats,
    FederatedAlgorithm,
    Messages,
)
from dpfl.sim.algorithms.registry import register
from dpfl.sim.algorithms.tasks import Cohort, Message, Task
from dpfl.sim.availability import AVAILABILITY_MODELS, ClientAvailability
from dpfl.sim.grad import check_finite, clipped_grad_sum
from dpfl.sim.privatize import (
    CentralGaussian,
    ClientGaussian,
    NoiseOnlyMessages,
    Privatizer,
)
from dpfl.sim.randomness import Streams
from dpfl.sim.sampling import CohortRecordSampler, PoissonParticipationSampler

__all__ = ["DsgdRandomParticipation", "DsgdRpParams"]

SERVERS = ("trusted", "untrusted", "untrusted-participants")

#: Analyses that hold when the server sees who took part (participants-only
#: messages): Theorem 5.2 (WCS) and Theorem 5.1 (OLS, which ignores client
#: sampling altogether).
VISIBLE_PARTICIPATION_ANALYSES = ("wcs", "ols")


@dataclasses.dataclass(frozen=True)
class DsgdRpParams(AlgorithmParams):
    """Parameters of DP-DSGD with random participation.

    Attributes
    ----------
    participation_probability : float
        p in (0, 1]: each available client joins a round w.p. p.
    record_probability : float
        q in (0, 1]: a participant samples each of its records w.p. q.
    clip : float or None
        Per-record clipping norm C (> 0); ``None`` only for a non-private run.
    learning_rate : float
        Server step size η (> 0); the paper uses 0.002 (App. B.2).
    momentum : float
        Momentum μ in [0, 1) (the paper: 0.9).
    server : {"trusted", "untrusted", "untrusted-participants"}
        Who adds the noise and who sends (see the module docstring).
    secure_aggregation : bool
        Untrusted server only: per-message noise ``σC/sqrt(N)`` (valid only
        if the server sees just the sum of messages) if True; ``σC`` per
        message (the paper's §5.5, valid against a server that reads each
        message) if False, the default.
    availability : {"all", "bernoulli", "fixed"}
        Which clients are online each round (see the module docstring).
    availability_rate : float
        ``"bernoulli"``: probability a client is online in a round, (0, 1].
    available_clients : int or None
        ``"fixed"``: N_t, the clients online in every round (1 <= N_t <= N).
    max_batch : int or None
        Examples per chunk of the gradient kernel (memory bound).
    cohort_size : int or None
        If set, exactly this many clients per round, uniformly without
        replacement, instead of each w.p. p (fixed-size cohorts with Poisson
        records, :mod:`dpfl.accounting.cohorts`; ``participation_probability``
        is then m/K and must be left at its default; availability ``"all"``).
    """

    participation_probability: float = 0.1
    record_probability: float = 0.5
    clip: float | None = 1.0
    learning_rate: float = 0.002
    momentum: float = 0.9
    server: str = "trusted"
    secure_aggregation: bool = False
    availability: str = "all"
    availability_rate: float = 1.0
    available_clients: int | None = None
    max_batch: int | None = None
    cohort_size: int | None = None

    def __post_init__(self) -> None:
        if self.cohort_size is not None:
            if self.participation_probability != DsgdRpParams.participation_probability:
                raise InvalidParameterError(
                    "participation_probability is set by cohort_size (m/K); leave "
                    f"it at its default; got {self.participation_probability!r}"
                )
            if self.availability != "all":
                raise InvalidParameterError(
                    "cohort_size needs availability 'all' (the cohort is drawn "
                    f"from every client); got {self.availability!r}"
                )
            self._set("cohort_size", check_count("cohort_size", self.cohort_size))
        self._set(
            "participation_probability",
            check_probability(
                "participation_probability", self.participation_probability
            ),
        )
        self._set(
            "record_probability",
            check_probability("record_probability", self.record_probability),
        )
        if self.clip is not None:
            self._set("clip", check_positive("clip", self.clip))
        self._set("learning_rate", check_positive("learning_rate", self.learning_rate))
        if not 0.0 <= float(self.momentum) < 1.0:
            raise InvalidParameterError(
                f"momentum must be in [0, 1); got {self.momentum!r}"
            )
        if self.server not in SERVERS:
            raise InvalidParameterError(
                f"server must be one of {SERVERS}; got {self.server!r}"
            )
        if self.secure_aggregation and self.server != "untrusted":
            raise InvalidParameterError(
                "secure_aggregation applies only to server 'untrusted' (every "
                f"available client sends); got server {self.server!r}"
            )
        if self.availability not in AVAILABILITY_MODELS:
            raise InvalidParameterError(
                f"availability must be one of {AVAILABILITY_MODELS}; got "
                f"{self.availability!r}"
            )
        self._set(
            "availability_rate",
            check_probability("availability_rate", self.availability_rate),
        )
        if self.availability != "bernoulli" and self.availability_rate != 1.0:
            raise InvalidParameterError(
                "availability_rate is used only by availability 'bernoulli' "
                f"(availability is {self.availability!r}); got "
                f"{self.availability_rate!r}"
            )
        if (self.availability == "fixed") != (self.available_clients is not None):
            raise InvalidParameterError(
                "available_clients must be given exactly when availability is "
                f"'fixed' (availability is {self.availability!r}); got "
                f"{self.available_clients!r}"
            )
        if self.max_batch is not None and int(self.max_batch) < 1:
            raise InvalidParameterError(
                f"max_batch must be >= 1; got {self.max_batch!r}"
            )


@register
class DsgdRandomParticipation(FederatedAlgorithm):
    """DP-DSGD with random participation (name ``"dsgd-rp"``).

    See :class:`~dpfl.sim.algorithms.base.FederatedAlgorithm` for the
    arguments; the parameters are :class:`DsgdRpParams`.

    References
    ----------
    Hasircioglu & Gündüz, "Communication efficient federated learning with
    differential privacy and random participation", arXiv 2205.01556,
    Algorithm 1, eq. (4), §5.5, App. B.
    """

    name = "dsgd-rp"
    Params = DsgdRpParams
    params: DsgdRpParams

    @property
    def messages_are_releases(self) -> bool:
        """True for an untrusted server: each message carries its own noise."""
        return self.params.server != "trusted"

    @classmethod
    def valid_analyses(cls, params: AlgorithmParams) -> tuple[str, ...] | None:
        """``("wcs", "ols")`` for participants-only messages, else any.

        With ``server="untrusted-participants"`` the server sees who sent, so
        an analysis that hides participation (``sound``, ``paper``, ``cs``)
        does not describe the mechanism (Hasircioglu & Gündüz, §5.5: "our
        privacy guarantees reduce to the one provided by WCS").
        """
        if cast(DsgdRpParams, params).server == "untrusted-participants":
            return VISIBLE_PARTICIPATION_ANALYSES
        return None

    @staticmethod
    def sampler(params: DsgdRpParams, stats: DataStats) -> PoissonParticipationSampler:
        """Clients w.p. p (or a cohort of ``cohort_size``), then records w.p. q."""
        if params.cohort_size is not None:
            return CohortRecordSampler(
                num_clients=stats.num_clients,
                cohort_size=params.cohort_size,
                record_probability=params.record_probability,
                client_sizes=stats.sizes,
            )
        return PoissonParticipationSampler(
            num_clients=stats.num_clients,
            participation_probability=params.participation_probability,
            record_probability=params.record_probability,
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
        """The sampler's event: ``ClientPoisson(p, RecordPoisson(q, d, G(σ)))``.

        With ``cohort_size``: ``CohortRecordPoisson(m, K, q, d, G(σ))``; d is
        the largest client.
        """
        return cls.sampler(cast(DsgdRpParams, params), stats).event(noise_multiplier)

    def setup(self) -> None:
        """Sampler, privatizer, the 1/(pqn) scale and the momentum buffer."""
        p = self.params
        if self.private and p.clip is None:
            raise InvalidParameterError(
                "clip must be given (> 0) when noise_multiplier > 0; got None"
            )
        self._sampler = self.sampler(p, self.stats)
        self._event: Event | None = None  # every round's, made once
        self.availability = ClientAvailability(
            num_clients=self.stats.num_clients,
            model=p.availability,
            rate=p.availability_rate,
            available_clients=p.available_clients,
        )
        self.privatizer: Privatizer | None = None
        if self.private:
            clip = cast(float, p.clip)
            sigma = self.noise_multiplier
            if p.server == "trusted":
                self.privatizer = CentralGaussian(noise_multiplier=sigma, clip=clip)
            elif p.server == "untrusted":
                self.privatizer = NoiseOnlyMessages(
                    noise_multiplier=sigma,
                    clip=clip,
                    secure_aggregation=p.secure_aggregation,
                )
            else:
                self.privatizer = ClientGaussian(noise_multiplier=sigma, clip=clip)
        #: 1 / (p q n): n = Σ_k n_k = N d for equal sizes (paper eq. 4); the
        #: scale of a round with every client online.
        self.scale = self._scale(self.stats.num_records)
        self.velocity = torch.zeros_like(self.weights)

    def _scale(self, records: int) -> float:
        """``1 / (p q n)`` for ``n`` records held by the online clients.

        Raises
        ------
        InvalidParameterError
            If ``p q n`` is so small that its inverse is not a finite double
            (``participation_probability: 5e-324``): the round's sum would be
            scaled by infinity.
        """
        p = self.params
        rate = self._sampler.participation_probability  # m/K with a fixed cohort
        expected = rate * p.record_probability * records
        if not expected > 0 or not math.isfinite(1.0 / expected):
            raise InvalidParameterError(
                f"the participation rate p ({rate!r}; participation_probability, or "
                "cohort_size / num_clients) x "
                f"record_probability ({p.record_probability!r}) x {records} records "
                "is too small to scale a round by its inverse (a double overflows); "
                "use larger probabilities"
            )
        return 1.0 / expected

    def event(self, round_index: int = 0) -> Event | None:
        """The round's event: the same every round, so made once (no O(N) work)."""
        if not self.private:
            return None
        if self._event is None:
            self._event = self._sampler.event(self.noise_multiplier)
        return self._event

    # -- Algorithm 1, one round -----------------------------------------------------
    def select(self, round_index: int, server: Streams) -> Cohort:
        """P_t ← clients w.p. p; S_i ← their records w.p. q.

        The privatizer's noise does not depend on the gradients: its draw
        starts here (on a worker thread, on CPU) and overlaps the client steps.
        """
        online: np.ndarray | None = None  # None: every client is online
        if self.availability.always_all:
            sample = self._sampler.sample(server.rng)
            num_available, scale = self.stats.num_clients, self.scale
        else:
            online = self.availability.draw(server.rng)
            sample = self._sampler.sample_available(server.rng, online)
            num_available = len(online)
            held = int(np.asarray(self.stats.sizes)[online].sum())
            # No client online (or none holding data): nothing to estimate.
            scale = self._scale(held) if held else 0.0
        sample = sample.resolve(self.dataset.client_indices)
        records = cast(np.ndarray, sample.records)
        offsets = sample.record_offsets
        tasks = [
            Task(int(k), records[offsets[j] : offsets[j + 1]])
            for j, k in enumerate(sample.clients)
        ]
        info: dict[str, object] = {
            "records": records,
            "available": num_available,
            "online": online,
            "scale": scale,
        }
        if self.privatizer is not None and scale > 0:
            info["noise"] = self.privatizer.start_noise(
                {"w": self.weights},
                num_participants=sample.num_clients,
                num_available=num_available,
                generator=server.generator,
                scale=scale,
            )
        return Cohort(sample.clients, tasks, info)

    def _gradient_sum(self, weights: torch.Tensor, rows: np.ndarray) -> Message:
        """Σ over ``rows`` of clip_C(∇ℓ(w, s)) (plain gradients when C is None)."""
        if len(rows) == 0:
            return Message(torch.zeros_like(weights), {"records": 0.0, "clipped": 0.0})
        x, y = self.client_data(rows)
        params = self.unflatten(weights)
        clip = self.params.clip
        if clip is not None:
            sums, norms = clipped_grad_sum(
                self.model,
                params,
                x,
                y,
                clip=clip,
                loss_fn=self.loss_fn,
                max_batch=self.params.max_batch,
                return_norms=True,
            )
            flat = flat_view(list(sums.values()))  # the kernel's one flat buffer
            total = self.flatten(sums) if flat is None else flat
            clipped = float((norms > clip).sum())
        else:
            total = self._plain_gradient_sum(x, y)
            clipped = 0.0
        return Message(total, {"records": float(len(rows)), "clipped": clipped})

    def _plain_gradient_sum(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Unclipped Σ ∇ℓ: one ordinary backward per chunk (the non-private curve).

        The model's own weights are the global weights (views of one buffer),
        so the model is called directly.
        """
        leaves = [p for p in self.model.parameters() if p.requires_grad]
        total = torch.zeros_like(self.weights)
        chunk = self.params.max_batch or x.shape[0]
        for start in range(0, x.shape[0], chunk):
            xc, yc = x[start : start + chunk], y[start : start + chunk]
            with torch.enable_grad():
                loss = self.loss_fn(self.model(xc), yc) * xc.shape[0]
                grads = torch.autograd.grad(loss, leaves)
            total.add_(torch.cat([g.reshape(-1) for g in grads]))
        check_finite({"gradient sum": total}, "gradient sum")
        return total

    def client_step(
        self, weights: torch.Tensor, task: Task, streams: Streams
    ) -> Message:
        """g_i ← Σ_{s ∈ S_i} clip_C(∇ℓ(w_t, s))."""
        return self._gradient_sum(weights, cast(np.ndarray, task.rows))

    def client_steps(
        self, weights: torch.Tensor, tasks: Sequence[Task], streams: Sequence[Streams]
    ) -> Messages:
        """Σ_i g_i over the cohort in one kernel call (the server uses only the sum).

        Clipping is per record, so the sum of per-client sums is the plain sum
        over every sampled record (linearity).
        """
        rows = [cast(np.ndarray, t.rows) for t in tasks]
        all_rows = np.concatenate(rows) if rows else np.empty(0, np.int64)
        m = self._gradient_sum(weights, all_rows)
        return Messages(
            m.vector[None],
            {
                k: torch.tensor([v], dtype=torch.float64, device=m.vector.device)
                for k, v in m.scalars.items()
            },
            summed=True,
        )

    def estimate(
        self, cohort: Cohort, messages: Messages
    ) -> tuple[torch.Tensor, float]:
        """ĝ ← (Σ_i g_i + N(0, σ²C²)) / (pqn), flat, and its norm; checked finite.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If ĝ holds NaN or Inf.
        """
        total = messages.total()  # the messages are the server's to consume
        pending = cohort.info.get("noise")
        if pending is not None:
            estimate: torch.Tensor = pending.add_to_({"w": total})["w"]
        else:
            estimate = total.mul_(cast(float, cohort.info.get("scale", self.scale)))
        # One fused pass: the norm is finite iff every entry is (barring an
        # overflow of the square, which check_finite then tells apart).
        norm = float(torch.linalg.vector_norm(estimate))
        if not math.isfinite(norm):
            check_finite({"update": estimate}, "model update")
        return estimate, norm

    def server_step(
        self, cohort: Cohort, messages: Messages, server: Streams
    ) -> dict[str, float]:
        """ĝ as in :meth:`estimate`;  v ← μv + ĝ;  w ← w − ηv."""
        estimate, norm = self.estimate(cohort, messages)
        with torch.no_grad():
            # v ← ĝ + μ v and w ← w − η v, one pass each over the flat buffers.
            torch.add(
                estimate, self.velocity, alpha=self.params.momentum, out=self.velocity
            )
            self.weights.add_(self.velocity, alpha=-self.params.learning_rate)
        records = messages.scalar_total("records") if len(messages.scalars) else 0.0
        metrics = {
            "participants": float(len(cohort.participants)),
            "available": float(
                cast(int, cohort.info.get("available", self.stats.num_clients))
            ),
            "records": records,
            "update_norm": norm,
        }
        if self.params.clip is not None and records:
            metrics["clipped_fraction"] = messages.scalar_total("clipped") / records
        return metrics

    # -- state ------------------------------------------------------------------------
    def extra_state(self) -> dict[str, torch.Tensor]:
        """The momentum buffer."""
        return {"velocity": self.velocity.detach().cpu().clone()}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the momentum buffer."""
        v = state["velocity"]
        if tuple(v.shape) != tuple(self.velocity.shape):
            raise InvalidParameterError(
                f"state's velocity has shape {tuple(v.shape)}; the model has "
                f"{tuple(self.velocity.shape)} weights"
            )
        self.velocity.copy_(v)
