"""DP-FedNova: normalised averaging (Wang et al. 2020) under client-level DP-FedAvg.

FedNova (Wang, Liu, Liang, Joshi & Poor 2020, eq. 7 with local SGD) corrects
the objective inconsistency of FedAvg when clients take different numbers of
local steps τ_k: each client's update is normalised by its step count and the
average is rescaled by an effective step count τ_eff,

    w_{t+1} = w_t + η_s · τ_eff · (1/m) Σ_k Δw_k / τ_k .

With E epochs of mini-batches of B, client k takes ``τ_k = E · ⌈n_k / B⌉``
steps. Here the round is DP-FedAvg's (:mod:`dpfl.sim.algorithms.dp_fedavg`)
with the normalised update in place of the update:

* the client clips ``Δw_k / τ_k`` (not Δw_k) to S and sends it;
* the server adds ``N(0, σ_Δ² S² I)`` to the sum and divides by m_t, as
  DP-FedAvg does;
* the average is rescaled by ``τ_eff``, the mean of τ_k over **all** K
  clients. FedNova's own ``τ_eff = Σ_{k in cohort} p_k τ_k`` depends on who
  took part, which a subsampled mechanism must keep secret; the federation's
  mean is a public constant (it depends only on the data's statistics), so
  the rescaling is post-processing.

The round is therefore exactly DP-FedAvg's Gaussian mechanism on a sum of
sensitivity S with the same client sampler: the event, the ledger and the
guarantee are DP-FedAvg's (:meth:`DpFedAvg.round_event` is inherited). Every
clipping rule, sampling, schedule and server optimiser of DP-FedAvg applies
(S is a bound on the *normalised* update, so it is smaller than DP-FedAvg's
for the same data).

References
----------
Wang, Liu, Liang, Joshi & Poor, "Tackling the objective inconsistency problem
in heterogeneous federated optimization", NeurIPS 2020, Section 4, eq. (7).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dpfl.sim.algorithms.base import Messages
from dpfl.sim.algorithms.dp_fedavg import DpFedAvg
from dpfl.sim.algorithms.dp_fedavg_params import DpFedAvgParams
from dpfl.sim.algorithms.registry import register
from dpfl.sim.algorithms.tasks import Message, Task
from dpfl.sim.randomness import Streams

__all__ = ["DpFedNova"]


@register
class DpFedNova(DpFedAvg):
    """DP-FedNova (name ``"dp-fednova"``); parameters as :class:`DpFedAvgParams`.

    Attributes
    ----------
    local_steps : numpy.ndarray
        τ_k = E · ⌈n_k / B⌉ of every client (at least 1).
    effective_steps : float
        τ_eff, the mean of :attr:`local_steps` over all clients.
    """

    name = "dp-fednova"
    Params = DpFedAvgParams
    params: DpFedAvgParams

    def setup(self) -> None:
        """DP-FedAvg's set-up, then τ_k and τ_eff from the clients' sizes."""
        super().setup()
        p = self.params
        steps = p.local_epochs * -(-self.stats.sizes // p.batch_size)
        self.local_steps = np.maximum(steps, 1)
        self.effective_steps = float(self.local_steps.mean())

    def client_step(
        self, weights: torch.Tensor, task: Task, streams: Streams
    ) -> Message:
        """E epochs of SGD from w_t; send clip_S(Δw_k / τ_k) and its norm."""
        update, _ = self.local_sgd_update(weights, task, streams, **self._local())
        return self._clipped(update / float(self.local_steps[task.client]), task)

    def client_steps(
        self, weights: torch.Tensor, tasks: Sequence[Task], streams: Sequence[Streams]
    ) -> Messages:
        """The cohort's local training as one batched computation (same messages)."""
        if not tasks:
            return Messages.stack([], weights)
        updates, _ = self.local_sgd_updates(weights, tasks, streams, **self._local())
        tau = [float(self.local_steps[t.client]) for t in tasks]
        normalised = [u / s for u, s in zip(updates, tau, strict=True)]
        return Messages.stack(
            [self._clipped(u, t) for u, t in zip(normalised, tasks, strict=True)],
            weights,
        )

    def server_update(
        self, delta: torch.Tensor, *, learning_rate: float = 1.0
    ) -> torch.Tensor:
        """The server optimiser's step from ``τ_eff · delta`` (public rescaling)."""
        return super().server_update(
            delta * self.effective_steps, learning_rate=learning_rate
        )
