"""MS-PAFL: model splitting with random check-in (Li, Wang, Tian, Wang & Su).

One round, as in the paper's Algorithm 1 (steps 1-8)::

    K_r  <- client k checks in w.p. p_k                  (step 1, eq. 14)
    for k in K_r:                                         (batched)
        w   <- [w_pub ; v_k]                              (steps 2, 8)
        E times: w <- w - η (1/b Σ_{i∈B} ∇l(w; x_i) + λw) (step 3, eq. 2)
                 B: b records of D_k, WOR or WR, fresh each step
        ū_k <- clip_C(public(w) - w_pub)                  (step 4, the update)
        ũ_k <- ū_k + N(0, σ² I_{d_pub})                   (step 5, on the client)
        send ũ_k;  v_k <- private(w) stays on the device  (step 6)
    w_pub <- w_pub + (1/K) Σ_{k∈K_r} ũ_k / p_k            (step 7, HT on updates)

**Only the public part leaves a client.** Every message goes through
:meth:`MsPafl.send` (``[participants, d_pub]``, noise already added); tests
replace it to capture what the server receives. The server's model holds
``w_pub`` and the *initial* private coordinates, which aggregation never
touches; each client's private part lives in :attr:`MsPafl.private_parts`.

**Choices (docs/analyses.md).**

- ``clip_mode="update"`` (default) clips ``public(w) - w_pub`` (item 10);
  ``"parameters"`` clips the public parameters themselves (eq. 15). Either way
  one client's message moves by at most Δ = 2C when its data change.
- ``aggregation="update"`` (default): Horvitz-Thompson on updates (item 9),
  unbiased for the mean clipped update; ``"model"``: the literal eq. 17,
  ``w_pub <- (1/K) Σ m_k / p_k`` on models (shrinks the model when fewer than
  ``Σ p_k`` clients check in); ``"ratio"``: ``w_pub + mean of the updates``
  (``1/|K_r|``, slightly biased, needs no ``p_k`` at the server).
- σ: ``noise_multiplier`` (std in units of ``clip``) directly, or calibrated
  from a per-round local (``local_epsilon``, ``local_delta``) with Δ = 2C by
  the analytic Gaussian (``calibration="analytic"``, any ε) or the paper's
  Lemma 1 (``"lemma1"``, only ε < 1, docs/analyses.md).
- Check-in probabilities ``p_k`` are per client (a scalar means all equal).
  A uniform ``p`` is drawn in ``O(participants)``; per-client ``p_k`` take one
  uniform draw per client per round (``O(K)`` numpy, no torch work).

**Accounting.** Each round emits ``CheckIn(max_k p_k, Gaussian(σ/C))`` (the
check-in event prices it under replace-one, Δ = 2C) with the participants.
The sound analysis prices a round a client joined as the un-amplified Gaussian
(the server sees who checked in and each message; the private part carries
earlier subsamples forward, so neither p nor γ amplification is valid:
docs/analyses.md), and the ledger charges each client only the rounds it
joined and reports the worst-off client.
:meth:`MsPafl.privacy_report` puts the paper's central (Theorem 2), local
(Theorem 3) and global (Theorem 4) figures beside it, labelled.

References
----------
Li, Wang, Tian, Wang & Su, "MS-PAFL", arXiv 2509.25906, Algorithm 1,
§III-B, Theorems 1-4; docs/analyses.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from dpfl._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.accounting import checkin, gaussian
from dpfl.accounting import events as ev
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data.dataset import FederatedDataset
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.models.split import ParameterSplit, split_parameters
from dpfl.sim.batches import draw_local_batches, gather_batches
from dpfl.sim.grad import check_finite
from dpfl.sim.local import cohort_sgd_step
from dpfl.sim.loop import check_state_owner, model_state
from dpfl.sim.privatize import ClientGaussian
from dpfl.sim.sampling import PoissonClientSampler

__all__ = ["MsPafl"]

Params = dict[str, torch.Tensor]
CLIP_MODES = ("update", "parameters")
AGGREGATIONS = ("update", "model", "ratio")
CALIBRATIONS = ("analytic", "lemma1")


def _clip_rows(v: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale each row of ``v`` to norm at most ``clip``."""
    norms = v.norm(dim=-1, keepdim=True)
    return v * (clip / norms.clamp_min(1e-30)).clamp(max=1.0)


class MsPafl:
    """MS-PAFL (name ``"ms-pafl"``): split model, random check-in, client noise.

    Parameters
    ----------
    model : torch.nn.Module
        The model (the paper: logistic regression); no BatchNorm.
    dataset : FederatedDataset
        Clients' records; every client needs at least one. Its test set is
        used by :meth:`evaluate` (per-client test splits when present).
    device : str
        Torch device.
    checkin_probability : float or sequence of float
        p_k in (0, 1]: one value for all clients, or one per client.
    clip : float
        Clip norm C (> 0) of the public update (or public parameters).
    noise_multiplier : float or None
        Client noise std in units of ``clip`` (σ = noise_multiplier · C). Give
        this or ``local_epsilon``; neither (or 0): the non-private baseline
        (no noise, nothing charged).
    local_epsilon : float or None
        Per-round local ε of one message; σ is then calibrated with Δ = 2C.
    local_delta : float
        Per-round local δ (used with ``local_epsilon`` and by the paper's
        figures in :meth:`privacy_report`).
    calibration : {"analytic", "lemma1"}
        How σ is found from (``local_epsilon``, ``local_delta``): the analytic
        Gaussian mechanism (Balle-Wang, any ε) or Lemma 1 (ε < 1 only).
    local_steps : int
        E >= 1 local SGD steps per round.
    batch_size : int
        b >= 1 records per step.
    replacement : bool
        Draw each batch with replacement (WR) instead of without (WOR).
    learning_rate : float
        Local step size η (> 0).
    weight_decay : float
        λ >= 0 of the regularised loss (MS-PAFL eq. 24): the step adds λw.
    private_fraction : float
        Fraction of the flat parameter vector kept private (the first
        coordinates; the paper: 0.5).
    clip_mode : {"update", "parameters"}
        What is clipped (see the module docstring).
    aggregation : {"update", "model", "ratio"}
        How the server aggregates (see the module docstring).
    xi : float
        Hoeffding parameter ξ in (0, 1) of the paper's Theorem 2 (reports only).
    eval_clients : int
        Number of clients (evenly spaced) whose personalised models
        :meth:`evaluate` averages over.
    eval_batch_size : int
        Test examples per chunk in :meth:`evaluate`.
    max_clients : int or None
        Clients per chunk of the batched local step (memory bound).
    loss_fn : callable
        ``loss_fn(output, target)``, mean over the batch.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a parameter outside its domain (the message names it).

    References
    ----------
    Li, Wang, Tian, Wang & Su, "MS-PAFL", arXiv 2509.25906, Algorithm 1.
    """

    name = "ms-pafl"
    per_client_accounting = True

    def __init__(
        self,
        *,
        model: nn.Module,
        dataset: FederatedDataset,
        device: str = "cpu",
        checkin_probability: float | Sequence[float] = 0.5,
        clip: float = 1.0,
        noise_multiplier: float | None = None,
        local_epsilon: float | None = None,
        local_delta: float = 1e-5,
        calibration: str = "analytic",
        local_steps: int = 5,
        batch_size: int = 16,
        replacement: bool = False,
        learning_rate: float = 0.1,
        weight_decay: float = 0.0,
        private_fraction: float = 0.5,
        clip_mode: str = "update",
        aggregation: str = "update",
        xi: float = 0.5,
        eval_clients: int = 100,
        eval_batch_size: int = 4096,
        max_clients: int | None = None,
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
        self.num_clients = dataset.num_clients
        self.sizes = np.asarray(dataset.client_sizes(), dtype=np.int64)
        if self.sizes.min() < 1:
            raise InvalidParameterError(
                "every client needs >= 1 training record; clients "
                f"{np.flatnonzero(self.sizes < 1)[:10].tolist()} have none"
            )
        probs = np.asarray(checkin_probability, dtype=float)
        if probs.ndim == 0:
            p = check_probability("checkin_probability", float(probs))
            self.probabilities = np.full(self.num_clients, p)
            self.uniform = True
        else:
            if probs.shape != (self.num_clients,):
                raise InvalidParameterError(
                    f"checkin_probability must be a float or {self.num_clients} "
                    f"values (one per client); got shape {probs.shape}"
                )
            for k, pk in enumerate(probs.tolist()):
                check_probability(f"checkin_probability[{k}]", pk)
            self.probabilities = probs
            self.uniform = bool(np.all(probs == probs[0]))
        self.clip = check_positive("clip", clip)
        self.local_delta = check_delta("local_delta", local_delta)
        if calibration not in CALIBRATIONS:
            raise InvalidParameterError(
                f"calibration must be one of {CALIBRATIONS}; got {calibration!r}"
            )
        self.calibration = calibration
        if noise_multiplier is not None and local_epsilon is not None:
            raise InvalidParameterError(
                "give noise_multiplier or local_epsilon, not both; got "
                f"noise_multiplier={noise_multiplier!r}, "
                f"local_epsilon={local_epsilon!r}"
            )
        self.local_epsilon: float | None = None
        if local_epsilon is not None:
            self.local_epsilon = check_positive("local_epsilon", local_epsilon)
            if calibration == "lemma1":
                sigma = checkin.lemma1_sigma(
                    epsilon=self.local_epsilon,
                    delta=self.local_delta,
                    sensitivity=2.0 * self.clip,
                )
                noise_multiplier = sigma / self.clip
            else:
                noise_multiplier = gaussian.calibrate_analytic(
                    epsilon=self.local_epsilon, delta=self.local_delta, sensitivity=2.0
                )
        elif noise_multiplier is not None:
            noise_multiplier = check_nonnegative("noise_multiplier", noise_multiplier)
        self.noise_multiplier = noise_multiplier
        self.private = bool(noise_multiplier)
        self.local_steps = check_count("local_steps", local_steps, minimum=1)
        self.batch_size = check_count("batch_size", batch_size, minimum=1)
        self.replacement = bool(replacement)
        self.learning_rate = check_positive("learning_rate", learning_rate)
        self.weight_decay = check_nonnegative("weight_decay", weight_decay)
        if clip_mode not in CLIP_MODES:
            raise InvalidParameterError(
                f"clip_mode must be one of {CLIP_MODES}; got {clip_mode!r}"
            )
        self.clip_mode = clip_mode
        if aggregation not in AGGREGATIONS:
            raise InvalidParameterError(
                f"aggregation must be one of {AGGREGATIONS}; got {aggregation!r}"
            )
        self.aggregation = aggregation
        self.xi = check_probability("xi", xi, allow_one=False)
        self.eval_clients = check_count("eval_clients", eval_clients, minimum=1)
        self.eval_batch_size = check_count(
            "eval_batch_size", eval_batch_size, minimum=1
        )
        self.max_clients = (
            None
            if max_clients is None
            else check_count("max_clients", max_clients, minimum=1)
        )
        self.loss_fn = loss_fn
        self.device = str(device)
        self.dataset = dataset
        self.model = model.to(self.device)

        self.split: ParameterSplit = split_parameters(
            self.model,
            private_fraction=check_probability(
                "private_fraction", private_fraction, allow_zero=True
            ),
        )
        if self.split.num_public == 0:
            raise InvalidParameterError(
                f"private_fraction={private_fraction!r} leaves no public coordinate"
            )
        flat = self._flat_global()
        #: Each client's private part v_k, ``[K, d_priv]`` (never sent).
        self.private_parts = (
            self.split.private(flat).unsqueeze(0).repeat(self.num_clients, 1)
        )
        self.sampler = (
            PoissonClientSampler(
                num_clients=self.num_clients,
                participation_probability=float(self.probabilities[0]),
                client_sizes=self.sizes,
            )
            if self.uniform
            else None
        )
        self.privatizer = (
            ClientGaussian(noise_multiplier=float(noise_multiplier or 0.0), clip=clip)
            if self.private
            else None
        )

    # -- accounting -------------------------------------------------------------
    @property
    def noise_std(self) -> float:
        """σ = noise_multiplier · C, the std of each message's noise (0 if none)."""
        return float(self.noise_multiplier or 0.0) * self.clip

    def event(self) -> ev.Event | None:
        """The accounting event of a round (``None`` when non-private).

        Returns
        -------
        Event or None
            ``CheckIn(max_k p_k, Gaussian(σ/C))``: the largest check-in
            probability (the least favourable client) and the Gaussian release
            of one clipped public update, priced under replace-one (the
            check-in event doubles the sensitivity: Δ = 2C).
        """
        if not self.private:
            return None
        return ev.CheckIn(
            float(self.probabilities.max()),
            ev.Gaussian(float(self.noise_multiplier or 0.0)),
        )

    def local_guarantee(self) -> tuple[float, float]:
        """Per-round local (ε, δ) of one message, at ``local_delta``.

        Returns
        -------
        tuple of float
            ``(local_epsilon, local_delta)``: the calibration target when σ was
            calibrated, else the analytic Gaussian's ε of σ with Δ = 2C.

        Raises
        ------
        dpfl.errors.DpflError
            If the run is non-private.
        """
        if not self.private:
            raise DpflError("a non-private MS-PAFL run has no local guarantee")
        if self.local_epsilon is not None:
            return self.local_epsilon, self.local_delta
        eps = gaussian.epsilon_for_delta(
            self.local_delta,
            noise_multiplier=float(self.noise_multiplier or 0.0),
            sensitivity=2.0,
        )
        return eps, self.local_delta

    def subsampling_ratio(self) -> float:
        """γ of the smallest client: P(a record is touched in the E steps).

        Returns
        -------
        float
            ``1 - (1 - b/n)^E`` (WOR) or ``1 - (1 - 1/n)^{bE}`` (WR) for the
            smallest n_k (docs/analyses.md), the largest γ over clients.
        """
        n = int(self.sizes.min())
        b = self.batch_size if self.replacement else min(self.batch_size, n)
        return checkin.subsampling_ratio(
            batch_size=b,
            dataset_size=n,
            replacement=self.replacement,
            local_steps=self.local_steps,
        )

    # -- one round ----------------------------------------------------------------
    def _flat_global(self) -> torch.Tensor:
        return self.split.flatten(
            {n: p.detach() for n, p in self.model.named_parameters()}
        )

    @property
    def public_model(self) -> torch.Tensor:
        """The server's global public part w_pub (a copy)."""
        return self.split.public(self._flat_global()).clone()

    def check_in(self, rng: np.random.Generator) -> np.ndarray:
        """Draw K_r: client k checks in w.p. p_k, independently (ascending ids).

        Parameters
        ----------
        rng : numpy.random.Generator
            The round's generator.

        Returns
        -------
        numpy.ndarray
            int64 ids of the clients that checked in.
        """
        if self.sampler is not None:
            return self.sampler.sample(rng).clients
        return np.flatnonzero(rng.random(self.num_clients) < self.probabilities)

    def local_update(
        self, clients: np.ndarray, rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """E local SGD steps of every participant, batched (steps 2, 3, 8).

        Parameters
        ----------
        clients : numpy.ndarray
            Participants (ids).
        rng : numpy.random.Generator
            Draws the mini-batches.

        Returns
        -------
        tuple of torch.Tensor
            The participants' new public parts ``[m, d_pub]`` and private parts
            ``[m, d_priv]``.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If a gradient is not finite.
        """
        w_pub = self.public_model
        start = self.split.merge(
            w_pub.unsqueeze(0).expand(len(clients), -1),
            self.private_parts[torch.as_tensor(clients)],
        )
        stacked = {k: v.clone() for k, v in self.split.unflatten(start).items()}
        pos, mask = draw_local_batches(
            rng,
            self.sizes[clients],
            batch_size=self.batch_size,
            steps=self.local_steps,
            replacement=self.replacement,
        )
        for s in range(self.local_steps):
            xb, yb = gather_batches(self.dataset, clients, pos[s], self.device)
            new = cohort_sgd_step(
                self.model,
                stacked,
                xb,
                yb,
                learning_rate=self.learning_rate,
                loss_fn=self.loss_fn,
                sample_mask=torch.as_tensor(mask[s], device=self.device),
                max_clients=self.max_clients,
            )
            if self.weight_decay:
                new = {
                    k: v - self.learning_rate * self.weight_decay * stacked[k]
                    for k, v in new.items()
                }
            stacked = new
        flat = self.split.flatten(stacked, batch_dims=1)
        return self.split.public(flat), self.split.private(flat)

    def clip_public(self, public: torch.Tensor, w_pub: torch.Tensor) -> torch.Tensor:
        """Step 4: clip the update ``public - w_pub`` (or the parameters) to C.

        Parameters
        ----------
        public : torch.Tensor
            New public parts ``[m, d_pub]``.
        w_pub : torch.Tensor
            The broadcast global public part ``[d_pub]``.

        Returns
        -------
        torch.Tensor
            ū, ``[m, d_pub]``, each row of norm <= C.
        """
        v = public - w_pub if self.clip_mode == "update" else public
        return _clip_rows(v, self.clip)

    def privatize(
        self, clipped: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """Step 5, on each client: ũ_k = ū_k + N(0, σ² I) (independent per client).

        Parameters
        ----------
        clipped : torch.Tensor
            ū, ``[m, d_pub]``.
        generator : torch.Generator
            Source of the noise.

        Returns
        -------
        torch.Tensor
            The messages ``[m, d_pub]`` (``clipped`` itself when non-private).
        """
        if self.privatizer is None or clipped.shape[0] == 0:
            return clipped
        return self.privatizer.noise_messages({"public": clipped}, generator)["public"]

    def send(self, clients: np.ndarray, messages: torch.Tensor) -> torch.Tensor:
        """Step 6, the network: what the server receives (identity).

        The only path from a client to the server. Replace it on an instance
        (``alg.send = my_hook``) to observe or transform the messages.

        Parameters
        ----------
        clients : numpy.ndarray
            Senders (ids).
        messages : torch.Tensor
            ``[len(clients), d_pub]`` noisy public messages.

        Returns
        -------
        torch.Tensor
            The received messages.
        """
        return messages

    def aggregate(
        self, clients: np.ndarray, received: torch.Tensor, w_pub: torch.Tensor
    ) -> torch.Tensor:
        """Step 7: the new global public part from the received messages.

        Parameters
        ----------
        clients : numpy.ndarray
            Senders (ids).
        received : torch.Tensor
            ``[m, d_pub]``.
        w_pub : torch.Tensor
            The current global public part.

        Returns
        -------
        torch.Tensor
            The next w_pub (see ``aggregation`` in the module docstring).
        """
        if self.clip_mode == "update":
            updates, models = received, received + w_pub
        else:
            updates, models = received - w_pub, received
        if len(clients) == 0:
            return w_pub.clone() if self.aggregation != "model" else 0.0 * w_pub
        weights = torch.as_tensor(
            1.0 / (self.num_clients * self.probabilities[clients]),
            dtype=received.dtype,
            device=received.device,
        )
        if self.aggregation == "update":
            return w_pub + weights @ updates
        if self.aggregation == "model":
            return weights @ models
        return w_pub + updates.mean(0)

    def run_round(
        self, round_index: int, rng: np.random.Generator, generator: torch.Generator
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Run one MS-PAFL round (steps 1-8).

        Parameters
        ----------
        round_index : int
            Index of the round (for the record).
        rng : numpy.random.Generator
            Draws check-ins and mini-batches.
        generator : torch.Generator
            Draws the clients' noise.

        Returns
        -------
        tuple
            ``(participants, metrics)``; metrics hold ``participants``,
            ``clipped_fraction`` and ``update_norm`` (of the public step).

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If a local model or the aggregate is not finite; nothing changes.
        """
        clients = self.check_in(rng)
        w_pub = self.public_model
        metrics: dict[str, float] = {"participants": float(len(clients))}
        if len(clients):
            public, private = self.local_update(clients, rng)
            raw = public - w_pub if self.clip_mode == "update" else public
            metrics["clipped_fraction"] = float(
                (raw.norm(dim=1) > self.clip).float().mean()
            )
            messages = self.privatize(self.clip_public(public, w_pub), generator)
        else:
            private = self.private_parts[:0]
            messages = w_pub.new_zeros(0, self.split.num_public)
        received = self.send(clients, messages)
        if received.shape != (len(clients), self.split.num_public):
            raise DpflError(
                f"send must return [{len(clients)}, {self.split.num_public}] "
                f"messages; got {tuple(received.shape)}"
            )
        new_pub = self.aggregate(clients, received, w_pub)
        check_finite({"public model": new_pub, "private parts": private}, "MS-PAFL")
        # Step 8: recombination. The server's model keeps its private coordinates.
        flat = self._flat_global()
        new_flat = self.split.merge(new_pub, self.split.private(flat))
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(self.split.unflatten(new_flat)[n])
        if len(clients):
            self.private_parts[torch.as_tensor(clients)] = private
        metrics["update_norm"] = float((new_pub - w_pub).norm())
        return clients, metrics

    # -- evaluation and state ---------------------------------------------------
    def _eval_ids(self) -> np.ndarray:
        k = min(self.eval_clients, self.num_clients)
        return np.unique(np.linspace(0, self.num_clients - 1, k).round().astype(int))

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
        ids = self._eval_ids()
        w_pub = self.public_model
        per_client = getattr(ds, "client_test_indices", None) is not None
        losses, accs = [], []
        for k in ids.tolist():
            params = self.split.unflatten(
                self.split.merge(w_pub, self.private_parts[k])
            )
            x_np, y_np = ds.client_test(k) if per_client else (None, None)
            if y_np is not None and len(y_np) == 0:
                continue
            loss, acc = self._score(params, x_np, y_np)
            losses.append(loss)
            accs.append(acc)
        if not accs:
            return {}
        return {
            "test_loss": float(np.mean(losses)),
            "test_accuracy": float(np.mean(accs)),
        }

    def _score(
        self, params: Params, x_np: np.ndarray | None, y_np: np.ndarray | None
    ) -> tuple[float, float]:
        ds = self.dataset
        n = len(y_np) if y_np is not None else len(ds.test_labels)  # type: ignore[arg-type]
        loss_sum, correct = 0.0, 0
        with torch.no_grad():
            for s in range(0, n, self.eval_batch_size):
                e = min(s + self.eval_batch_size, n)
                if x_np is None:
                    xs = np.asarray(ds.test_features[s:e])  # type: ignore[index]
                    ys = np.asarray(ds.test_labels[s:e])  # type: ignore[index]
                else:
                    xs, ys = np.asarray(x_np[s:e]), np.asarray(y_np[s:e])  # type: ignore[index]
                x = torch.as_tensor(xs).to(self.device)
                y = torch.as_tensor(ys).to(self.device)
                out = functional_call(self.model, params, (x,))
                loss_sum += float(self.loss_fn(out, y)) * (e - s)
                correct += int((out.argmax(1) == y).sum())
        return loss_sum / max(n, 1), correct / max(n, 1)

    def state_dict(self) -> dict[str, Any]:
        """Server model and every client's private part (CPU copies).

        Returns
        -------
        dict
            ``{"name", "model", "private_parts"}``.
        """
        return {
            "name": self.name,
            "model": model_state(self.model),
            "private_parts": self.private_parts.detach().cpu().clone(),
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
            If the state belongs to another algorithm or shape.
        """
        check_state_owner(state, self.name)
        parts = state["private_parts"]
        if tuple(parts.shape) != tuple(self.private_parts.shape):
            raise InvalidParameterError(
                f"private_parts must have shape {tuple(self.private_parts.shape)}; "
                f"got {tuple(parts.shape)}"
            )
        self.model.load_state_dict(state["model"])
        self.private_parts = parts.to(self.device).clone()

    # -- the run's guarantee ----------------------------------------------------
    def privacy_report(
        self, ledger: PrivacyLedger, *, delta: float | None = None
    ) -> dict[str, Any]:
        """The run's guarantee: the sound default and the paper's figures, labelled.

        Parameters
        ----------
        ledger : PrivacyLedger
            The run's ledger (rounds recorded with participants).
        delta : float, optional
            Target δ of the totals (default: the ledger budget's δ).

        Returns
        -------
        dict
            ``"sound"``: max over clients of the ledger's per-client ε
            (un-amplified Gaussian composed over the rounds each client
            joined; ``rounds_joined_max``, an exact-GDP cross-check
            ``epsilon_gdp``, and the terms). ``"paper_ledger"``: the ledger's ε
            under the paper's analysis (CheckIn amplified as Poisson(p) over
            all rounds). ``"paper_central_round"``: Theorem 2's (ε_c, δ_c) of
            one round of the global public model. ``"paper_local_total"``:
            Theorem 3 (moments accountant; its validity conditions included).
            ``"paper_global_total"``: Theorem 4 (strong composition of ε_c).
            Each paper figure carries a ``caveat``; a figure whose formula does
            not apply holds ``{"error": reason}``.

        Raises
        ------
        dpfl.errors.DpflError
            If the run is non-private, or no δ is given and the ledger has no
            budget.
        """
        if not self.private:
            raise DpflError("a non-private MS-PAFL run has no privacy report")
        if delta is None:
            if ledger.budget is None:
                raise DpflError("delta must be given when the ledger has no budget")
            delta = ledger.budget.delta
        delta = check_delta("delta", delta)
        rounds = ledger.rounds
        counts: dict[int, int] = {}
        for entry in ledger.entries:
            for k in entry.participants or ():
                counts[k] = counts.get(k, 0) + 1
        z = float(self.noise_multiplier or 0.0)
        out: dict[str, Any] = {"rounds": rounds, "delta": delta}
        if counts:
            worst = max(counts, key=lambda k: (counts[k], -k))
            bound = ledger.client_epsilon(worst, delta)
            n_max = counts[worst]
        else:
            worst, n_max = -1, 0
            bound = None
        gdp = checkin.sound_client(
            noise_multiplier=z, clip=self.clip, rounds_joined=n_max, delta=delta
        )
        out["sound"] = {
            "epsilon": 0.0 if bound is None else bound.upper,
            "bound": None if bound is None else bound,
            "epsilon_gdp": gdp["epsilon"],
            "client": worst,
            "rounds_joined_max": n_max,
            "unit": "record (and client: Δ = 2C bounds any change of D_k)",
            "neighbouring": "replace-one",
            "adversary": "the parameter server (sees each message and who checked in)",
            "analysis": "sound: un-amplified Gaussian, composed over the rounds "
            "the client joined (docs/analyses.md)",
        }
        if rounds == 0:
            return out
        out["paper_ledger"] = {
            "epsilon": ledger.epsilon(delta, analysis="paper").upper,
            "analysis": "paper: every round's release amplified by check-in as "
            "Poisson(max p_k), composed over all rounds (PLD)",
            "caveat": "not valid against the server, which sees who checked in "
            "(docs/analyses.md)",
        }
        eps_l, delta_l = self.local_guarantee()
        p = float(self.probabilities.max())
        gamma = self.subsampling_ratio()
        try:
            # Theorem 2 in its heterogeneous form (eq. 19): Σ_j p_j check-ins
            # expected; the figure is the most exposed client's (largest p_k).
            eps_cs, delta_cs = checkin.central_round_clients(
                epsilon=eps_l,
                delta=delta_l,
                probabilities=self.probabilities,
                gammas=gamma,
                xi=self.xi,
            )
            eps_c, delta_c = float(eps_cs.max()), float(delta_cs.max())
            out["paper_central_round"] = {
                "epsilon": eps_c,
                "delta": delta_c,
                "local_epsilon": eps_l,
                "local_delta": delta_l,
                "gamma": gamma,
                "xi": self.xi,
                "analysis": "paper: Theorem 2 / Corollary 1, eq. 19 with the "
                "clients' own p_k (exact Poisson-binomial tail), for the client "
                "with the largest p_k",
                "caveat": "protects against parties that see the global public "
                "model only, assumes σ from Lemma 1 and γ amplification, which "
                "the persistent private part invalidates (docs/analyses.md)",
            }
            out["paper_global_total"] = {
                **dict(
                    zip(
                        ("epsilon", "delta"),
                        checkin.global_total(
                            eps_max=eps_c,
                            delta_max=delta_c,
                            rounds=rounds,
                            delta_slack=delta,
                        ),
                    )
                ),
                "analysis": "paper: Theorem 4 (strong composition, DRV)",
                "caveat": "composes the per-round Theorem-2 figure; same caveat",
            }
        except InvalidParameterError as exc:
            out["paper_central_round"] = {"error": str(exc)}
            out["paper_global_total"] = {"error": str(exc)}
        if gamma < 1:
            local = checkin.local_total_moments(
                probability=p,
                rounds=rounds,
                gamma=gamma,
                noise_multiplier=z,
                clip=self.clip,
                delta=delta,
            )
            local["caveat"] = (
                "uses the expected p·R rounds and γ amplification (docs/analyses.md )"
            )
            out["paper_local_total"] = local
        else:
            out["paper_local_total"] = {"error": "γ = 1: no data subsampling"}
        return out

    def __repr__(self) -> str:
        """Return a short description."""
        return (
            f"MsPafl(K={self.num_clients}, p={float(self.probabilities.max()):g}, "
            f"noise_multiplier={self.noise_multiplier!r}, clip={self.clip}, "
            f"d_pub={self.split.num_public}, d_priv={self.split.num_private})"
        )
