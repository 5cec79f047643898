"""DP-DSGD with random client participation (Hasircioglu & Gündüz, Algorithm 1).

One round, as in the paper's pseudo-code (docs/analyses.md)::

    P_t  <- each of the N available clients joins w.p. p
    for i in P_t:  S_i <- each of i's d records w.p. q
                   g_i <- sum_{s in S_i} clip_C(grad l(w_t, s))
    g    <- sum_i g_i + N(0, σ²C² I)            (trusted server)
    ĝ    <- g / (p N q d)                       (unbiased)
    v    <- μ v + ĝ ;  w <- w - η v             (momentum SGD)

All sampled records of all participants go through **one** batched call of
:func:`dpfl.sim.grad.clipped_grad_sum`. Clipping is per record, so the
sum over participants of their per-client sums is the plain sum over all
sampled records (linearity); no per-client segmentation is needed because
the server only ever uses the total.

With ``server="untrusted"`` every available client sends a message (§5.5):
see :class:`dpfl.sim.privatize.NoiseOnlyMessages` for the two choices of the
per-message noise (``secure_aggregation``).

**Unbiased scaling.** With ``n_k`` records at client ``k`` and ``n = Σ_k n_k``
(= ``N d`` when every client holds ``d``), each record is sampled w.p. ``pq``,
so ``E[Σ sampled clip(g)] = pq Σ_all clip(g)`` and
``ĝ = (Σ sampled clip(g) + noise) / (p q n)`` is unbiased for the mean clipped
gradient over all records. The paper's ``1/(p N_t q d)`` is the equal-size case.

**Non-private baseline.** ``noise_multiplier=None`` (or 0): same sampling and
scaling, no noise, :meth:`event` returns ``None`` and the trainer charges
nothing. ``clip`` may stay (clipped, noise-free) or be ``None`` (plain summed
gradients, the paper's non-private curve).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from dpfl._validate import (
    check_count,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.accounting import events as ev
from dpfl.data.dataset import FederatedDataset
from dpfl.errors import InvalidParameterError
from dpfl.sim._flat import flat_view, flat_zeros
from dpfl.sim.evaluation import evaluate_model
from dpfl.sim.grad import check_finite, clipped_grad_sum
from dpfl.sim.loop import check_state_owner, model_state
from dpfl.sim.privatize import CentralGaussian, NoiseOnlyMessages, Privatizer
from dpfl.sim.sampling import PoissonParticipationSampler, RoundSample

__all__ = ["DsgdRandomParticipation"]

Params = dict[str, torch.Tensor]
SERVERS = ("trusted", "untrusted")


class DsgdRandomParticipation:
    """DP-DSGD with random participation (name ``"dsgd-rp"``).

    Parameters
    ----------
    model : torch.nn.Module
        The model (moved to ``device``; trained in place). No BatchNorm.
    dataset : FederatedDataset
        Clients' records; its test set (if any) is used by :meth:`evaluate`.
    device : str
        Torch device of the model and the noise (``"cpu"``, ``"cuda"``).
    participation_probability : float
        p in (0, 1]: each available client joins a round w.p. p.
    record_probability : float
        q in (0, 1]: a participant samples each of its records w.p. q.
    noise_multiplier : float or None
        σ: noise std on the sum in units of ``clip``. ``None`` or 0: the
        non-private baseline (no noise, nothing charged).
    clip : float or None
        Per-record clipping norm C (> 0); ``None`` only when non-private.
    learning_rate : float
        Server step size η (> 0); the paper uses 0.002 (App. B.2).
    momentum : float
        Momentum μ in [0, 1) (the paper: 0.9).
    eval_batch_size : int
        Batch size of :meth:`evaluate`.
    server : {"trusted", "untrusted"}
        Who adds the noise (see the module docstring).
    secure_aggregation : bool
        Untrusted server only: per-message noise ``σC/sqrt(N)`` (valid only
        if the server sees just the sum of messages) if True; ``σC`` per
        message (the paper's §5.5, valid against a server that reads each
        message) if False, the default.
    max_batch : int or None
        Examples per chunk of the gradient kernel (memory bound).
    loss_fn : callable
        ``loss_fn(output, target)``, mean over the batch (default cross-entropy).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a parameter outside its domain (the message names it).

    References
    ----------
    Hasircioglu & Gündüz, "Communication efficient federated learning with
    differential privacy and random participation", arXiv 2205.01556,
    Algorithm 1, eq. (4), §5.5, App. B.
    """

    name = "dsgd-rp"
    per_client_accounting = False

    def __init__(
        self,
        *,
        model: nn.Module,
        dataset: FederatedDataset,
        device: str = "cpu",
        participation_probability: float,
        record_probability: float,
        noise_multiplier: float | None = None,
        clip: float | None = 1.0,
        learning_rate: float = 0.002,
        momentum: float = 0.9,
        eval_batch_size: int = 1024,
        server: str = "trusted",
        secure_aggregation: bool = False,
        max_batch: int | None = None,
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
        self.participation_probability = check_probability(
            "participation_probability", participation_probability
        )
        self.record_probability = check_probability(
            "record_probability", record_probability
        )
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
        self.learning_rate = check_positive("learning_rate", learning_rate)
        self.momentum = check_nonnegative("momentum", momentum)
        if self.momentum >= 1:
            raise InvalidParameterError(f"momentum must be in [0, 1); got {momentum!r}")
        self.eval_batch_size = check_count(
            "eval_batch_size", eval_batch_size, minimum=1
        )
        if server not in SERVERS:
            raise InvalidParameterError(
                f"server must be one of {SERVERS}; got {server!r}"
            )
        self.server = server
        self.secure_aggregation = bool(secure_aggregation)
        self.max_batch = (
            None
            if max_batch is None
            else check_count("max_batch", max_batch, minimum=1)
        )
        self.loss_fn = loss_fn
        self.device = str(device)
        self.dataset = dataset
        self.model = model.to(self.device)

        sizes = dataset.client_sizes()
        self.num_available = dataset.num_clients
        self.num_records_total = int(sizes.sum())
        if self.num_records_total == 0:
            raise InvalidParameterError("dataset has no training records")
        self.sampler = PoissonParticipationSampler(
            num_clients=self.num_available,
            participation_probability=self.participation_probability,
            record_probability=self.record_probability,
            client_sizes=sizes,
            client_indices=dataset.client_indices,
        )
        #: 1 / (p q n): n = Σ_k n_k = N d for equal sizes (paper eq. 4).
        self.scale = 1.0 / (
            self.participation_probability
            * self.record_probability
            * self.num_records_total
        )
        self.privatizer: Privatizer | None = None
        if self.private and clip is not None:
            sigma = float(noise_multiplier or 0.0)
            if server == "trusted":
                self.privatizer = CentralGaussian(noise_multiplier=sigma, clip=clip)
            else:
                self.privatizer = NoiseOnlyMessages(
                    noise_multiplier=sigma,
                    clip=clip,
                    secure_aggregation=self.secure_aggregation,
                )
        # Views into one flat buffer: the momentum step is one operation.
        self.velocity: Params = flat_zeros(self._params(), ())

    # -- accounting -----------------------------------------------------------
    def event(self) -> ev.Event | None:
        """The accounting event of a round, or ``None`` for the non-private baseline.

        Returns
        -------
        Event or None
            ``ClientPoisson(p, RecordPoisson(q, d, Gaussian(σ)))`` with ``d``
            the largest client size; ``None`` when ``noise_multiplier`` is
            ``None`` or 0.
        """
        if not self.private or self.noise_multiplier is None:
            return None
        return self.sampler.event(self.noise_multiplier)

    # -- one round --------------------------------------------------------------
    def _params(self) -> Params:
        return {n: p.detach() for n, p in self.model.named_parameters()}

    def _gradient_sum(
        self, sample: RoundSample, params: Params | None = None
    ) -> tuple[Params, dict[str, float]]:
        """Sum of (clipped) per-record gradients over every sampled record."""
        if params is None:
            params = self._params()
        metrics: dict[str, float] = {}
        if sample.num_records == 0:
            return {n: torch.zeros_like(p) for n, p in params.items()}, metrics
        if sample.records is None:  # the sampler was built with client_indices
            sample = sample.resolve(self.dataset.client_indices)
        x_np, y_np = self.dataset.take(cast(np.ndarray, sample.records))
        x = torch.as_tensor(np.ascontiguousarray(x_np))
        y = torch.as_tensor(np.ascontiguousarray(y_np))
        if self.clip is not None:
            sums, norms = clipped_grad_sum(
                self.model,
                params,
                x,
                y,
                clip=self.clip,
                loss_fn=self.loss_fn,
                max_batch=self.max_batch,
                return_norms=True,
            )
            metrics["clipped_fraction"] = float((norms > self.clip).float().mean())
            metrics["grad_norm_median"] = float(norms.median())
            return sums, metrics
        # Non-private, unclipped: one ordinary backward per chunk of the summed
        # loss. With the model's own trainable weights the model is called
        # directly (functional_call's weight swapping cost ~10% of a round at
        # the paper's scenario-1 scale).
        own = dict(self.model.named_parameters())
        direct = all(
            own[n].requires_grad and own[n].data_ptr() == p.data_ptr()
            for n, p in params.items()
        )
        leaves = (
            [own[n] for n in params]
            if direct
            else [p.detach().requires_grad_(True) for p in params.values()]
        )
        total = flat_zeros(params, ())  # one buffer: scaling and momentum fuse
        chunk = self.max_batch or x.shape[0]
        for start in range(0, x.shape[0], chunk):
            xc = x[start : start + chunk].to(self.device)
            yc = y[start : start + chunk].to(self.device)
            with torch.enable_grad():
                if direct:
                    out = self.model(xc)
                else:
                    weights = dict(zip(params, leaves))
                    out = torch.func.functional_call(self.model, weights, (xc,))
                loss = self.loss_fn(out, yc) * xc.shape[0]
                grads = torch.autograd.grad(loss, leaves)
            for t, g in zip(total.values(), grads):
                t.add_(g)
        check_finite(total, "gradient sum")
        return total, metrics

    def gradient_estimate(
        self, rng: np.random.Generator, generator: torch.Generator
    ) -> tuple[Params, RoundSample, dict[str, float]]:
        """Sample a round and return the server's estimate ĝ (model unchanged).

        Parameters
        ----------
        rng : numpy.random.Generator
            Draws participants and records.
        generator : torch.Generator
            Draws the noise.

        Returns
        -------
        tuple
            ``(ĝ by parameter name, the RoundSample, metrics)``.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If a per-record gradient or the estimate holds NaN or Inf (checked
            before aggregation and before the step).
        """
        sample = self.sampler.sample(rng)
        if self.privatizer is None:
            total, metrics = self._gradient_sum(sample)
            flat = flat_view(list(total.values()))
            if flat is not None:
                flat.mul_(self.scale)
                estimate = total
            else:
                estimate = {n: t.mul_(self.scale) for n, t in total.items()}
        else:
            # The noise does not depend on the gradients: it is drawn (on a
            # worker thread, on CPU) while they are computed, then added to the
            # sum in place with the 1/(pqn) scaling (one operation each when
            # the sum is one flat buffer, as clipped_grad_sum returns it).
            params = self._params()
            pending = self.privatizer.start_noise(
                params,
                num_participants=sample.num_clients,
                num_available=self.num_available,
                generator=generator,
                scale=self.scale,
            )
            try:
                total, metrics = self._gradient_sum(sample, params)
            finally:
                pending.wait()  # the generator is free again, even on error
            estimate = pending.add_to_(total)
        flat = flat_view(list(estimate.values()))
        if flat is not None:
            sq = float(torch.linalg.vector_norm(flat).square())
        else:
            sq = float(
                torch.stack(
                    [torch.linalg.vector_norm(t).square() for t in estimate.values()]
                ).sum()
            )
        # One fused pass: the squared norm is finite iff every entry is finite
        # (barring overflow of the square, which check_finite then tells apart).
        if not math.isfinite(sq):
            check_finite(estimate, "model update")
        metrics["update_norm"] = math.sqrt(sq)
        return estimate, sample, metrics

    def run_round(
        self, round_index: int, rng: np.random.Generator, generator: torch.Generator
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Run Algorithm 1 for one round and take the momentum-SGD step.

        Parameters
        ----------
        round_index : int
            Index of the round (for the record; randomness comes from the
            generators).
        rng : numpy.random.Generator
            Draws participants and records.
        generator : torch.Generator
            Draws the noise.

        Returns
        -------
        tuple
            ``(participants, metrics)``; metrics hold ``participants``,
            ``records``, ``update_norm`` and, with clipping,
            ``clipped_fraction`` and ``grad_norm_median``.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If gradients or the update are not finite; the model and the
            momentum are left unchanged.
        """
        estimate, sample, metrics = self.gradient_estimate(rng, generator)
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            v_flat = flat_view(list(self.velocity.values()))
            e_flat = flat_view([estimate[n] for n in self.velocity])
            if v_flat is not None and e_flat is not None:
                # v <- ĝ + μ v in one operation on the flat buffers.
                torch.add(e_flat, v_flat, alpha=self.momentum, out=v_flat)
            else:
                for n in params:
                    v = self.velocity[n]
                    torch.add(estimate[n], v, alpha=self.momentum, out=v)
            for n, p in params.items():
                p.add_(self.velocity[n], alpha=-self.learning_rate)
        metrics.update(
            participants=float(sample.num_clients), records=float(sample.num_records)
        )
        return sample.clients, metrics

    # -- evaluation and state ---------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Mean loss and accuracy on the dataset's test set.

        Returns
        -------
        dict of str to float
            ``{"test_loss", "test_accuracy"}``; empty if the dataset has no
            test set.
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
        """Model and momentum buffers (CPU copies) for an exact resume.

        Returns
        -------
        dict
            ``{"name", "model", "velocity"}``.
        """
        return {
            "name": self.name,
            "model": model_state(self.model),
            "velocity": {k: v.detach().cpu().clone() for k, v in self.velocity.items()},
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
            If the state belongs to another algorithm or model.
        """
        check_state_owner(state, self.name)
        if set(state["velocity"]) != set(self.velocity):
            raise InvalidParameterError(
                "state's parameters do not match the model's: "
                f"{sorted(state['velocity'])[:5]} vs {sorted(self.velocity)[:5]}"
            )
        velocity = flat_zeros(self._params(), ())
        for k, v in velocity.items():
            saved = state["velocity"][k]
            if tuple(saved.shape) != tuple(v.shape):
                raise InvalidParameterError(
                    f"state's velocity {k!r} has shape {tuple(saved.shape)}; the "
                    f"model's parameter has {tuple(v.shape)}"
                )
        self.model.load_state_dict(state["model"])
        for k, v in velocity.items():
            v.copy_(state["velocity"][k])
        self.velocity = velocity
