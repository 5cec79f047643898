"""Samplers of the schemes whose participation the server sees: check-in and two-stage.

Each draws from a :class:`numpy.random.Generator` passed in by the caller and
names the accounting event it realises, as the samplers of
:mod:`dpfl.sim.sampling` (whose :class:`~dpfl.sim.sampling.Sampler` machinery
they share):

- :class:`CheckInSampler`: ``CheckIn(max_k p_k, Gaussian(σ))`` (visible
  check-in; MS-PAFL);
- :class:`SyncSampler`: ``CheckIn(p', SelfComposed(WithoutReplacement(B, n,
  Gaussian(σ)), K))`` (record level; PriFedSync's sync and local steps);
- :class:`TwoStageSampler`: LOCKS's uniform first stage and norm-dependent
  second stage.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpfl._validate import (
    check_count,
    check_nonnegative,
    check_positive,
    check_probability,
    shown,
)
from dpfl.accounting import events as ev
from dpfl.errors import InvalidParameterError
from dpfl.sim.sampling import (
    RoundSample,
    Sampler,
    _check_client_indices,
    _check_rng,
    _check_sizes,
    _poisson_subset,
)

__all__ = ["CheckInSampler", "SyncSampler", "TwoStageSampler"]


class SyncSampler(Sampler):
    """Client sync with local steps on uniform batches (PriFedSync, Algorithm 1).

    Each of ``num_clients`` clients syncs independently w.p.
    ``sync_probability`` (p), the draw repeated while nobody syncs; each synced
    client then runs ``local_steps`` (K) steps, each on a uniform size-B
    subset of its own records drawn without replacement from the *client's*
    generator (:meth:`local_batches`).

    Parameters
    ----------
    num_clients : int
        Population m (>= 1).
    sync_probability : float
        p in (0, 1].
    client_sizes : numpy.ndarray
        Records held by each client, shape ``(num_clients,)``; every client
        holds at least ``batch_size``.
    batch_size : int
        B records per local step (>= 1).
    local_steps : int
        K local steps per synced client and round (>= 1).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a bad count or probability, or a client holding fewer than B
        records.

    References
    ----------
    Zheng, Chen, Long & Su, "Federated f-differential privacy", AISTATS 2021,
    Algorithms 1-2.
    """

    def __init__(
        self,
        *,
        num_clients: int,
        sync_probability: float,
        client_sizes: np.ndarray,
        batch_size: int,
        local_steps: int,
    ) -> None:
        self.num_clients = check_count("num_clients", num_clients, minimum=1)
        self.sync_probability = check_probability("sync_probability", sync_probability)
        self.batch_size = check_count("batch_size", batch_size, minimum=1)
        self.local_steps = check_count("local_steps", local_steps, minimum=1)
        self._sizes = _check_sizes(client_sizes, self.num_clients)
        self._client_indices = None
        self.smallest_client = int(self._sizes.min())
        if self.smallest_client < self.batch_size:
            raise InvalidParameterError(
                "batch_size must be <= every client's number of records (smallest "
                f"client holds {self.smallest_client}); got {batch_size!r}"
            )

    @property
    def synced_probability(self) -> float:
        """``p' = p / (1 − (1 − p)^m)``: a client's sync chance given Ω ≠ ∅."""
        p = self.sync_probability
        if p >= 1.0:
            return 1.0
        nonempty = -math.expm1(self.num_clients * math.log1p(-p))
        return min(1.0, p / nonempty)

    def sample(self, rng: np.random.Generator) -> RoundSample:
        """Draw Ω: each client w.p. p, re-drawn while empty.

        Parameters
        ----------
        rng : numpy.random.Generator
            The server's generator of the round.

        Returns
        -------
        RoundSample
            The synced clients (ascending, non-empty) with no records: each
            client draws its own batches (:meth:`local_batches`).
        """
        rng = _check_rng(rng)
        while True:
            clients = _poisson_subset(rng, self.num_clients, self.sync_probability)
            if clients.size:
                return self._finish(clients, [np.empty(0, np.int64)] * clients.size)

    def local_batches(self, rng: np.random.Generator, client_size: int) -> np.ndarray:
        """A client's K batches: uniform size-B subsets of its records.

        Each row is the first B entries of the order of ``client_size`` i.i.d.
        uniform keys, i.e. a uniform subset drawn without replacement.

        Parameters
        ----------
        rng : numpy.random.Generator
            The client's own generator of the round.
        client_size : int
            Records the client holds (>= B).

        Returns
        -------
        numpy.ndarray
            ``[K, B]`` positions inside the client's record list (int64).
        """
        rng = _check_rng(rng)
        n = check_count("client_size", client_size, minimum=self.batch_size)
        keys = rng.random((self.local_steps, n))
        return np.argsort(keys, axis=1)[:, : self.batch_size].astype(np.int64)

    def event(self, noise_multiplier: float) -> ev.Event:
        """The event of one round for a client, at noise std ``noise_multiplier · C``.

        Parameters
        ----------
        noise_multiplier : float
            Noise std on a step's clipped sum divided by the clipping norm
            (> 0); the neighbouring relation is replace-one, which the events
            price with sensitivity 2C themselves.

        Returns
        -------
        Event
            ``CheckIn(p', SelfComposed(WithoutReplacement(B, n_min,
            Gaussian(noise_multiplier)), K))`` with ``p'`` =
            :attr:`synced_probability` (who synced is visible) and ``n_min``
            the smallest client (a larger client is at least as private).
        """
        step = ev.WithoutReplacement(
            self.batch_size, self.smallest_client, ev.Gaussian(noise_multiplier)
        )
        return ev.CheckIn(
            self.synced_probability, ev.SelfComposed(step, self.local_steps)
        )


class CheckInSampler(Sampler):
    """Random check-in: client ``k`` checks in w.p. ``p_k``, independently, visibly.

    MS-PAFL's step 1 (eq. 14). Each client that checks in brings its whole
    data (it draws its own local batches). A uniform ``p`` is drawn as a
    Binomial count and a uniform subset (``O(participants)``); per-client
    ``p_k`` take one uniform draw per client (``O(num_clients)``).

    Parameters
    ----------
    num_clients : int
        Population K (>= 1).
    probabilities : float or sequence of float
        p_k in (0, 1]: one value for all clients, or one per client.
    client_sizes : numpy.ndarray
        Records held by each client, shape ``(num_clients,)``.
    client_indices : sequence of numpy.ndarray, optional
        Each client's global dataset rows.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a bad count, probability or sizes array.

    References
    ----------
    Li, Wang, Tian, Wang & Su, "MS-PAFL", arXiv 2509.25906, Algorithm 1 step 1.
    """

    def __init__(
        self,
        *,
        num_clients: int,
        probabilities: float | Sequence[float] | np.ndarray,
        client_sizes: np.ndarray,
        client_indices: Sequence[np.ndarray] | None = None,
    ) -> None:
        self.num_clients = check_count("num_clients", num_clients, minimum=1)
        probs = np.asarray(probabilities, dtype=float)
        if probs.ndim == 0:
            p = check_probability("probabilities", float(probs))
            probs = np.full(self.num_clients, p)
        elif probs.shape != (self.num_clients,):
            raise InvalidParameterError(
                f"probabilities must be a float or {self.num_clients} values (one "
                f"per client); got shape {probs.shape}"
            )
        else:
            for k, pk in enumerate(probs.tolist()):
                check_probability(f"probabilities[{k}]", pk)
        self.probabilities = probs
        self.uniform = bool(np.all(probs == probs[0]))
        self._sizes = _check_sizes(client_sizes, self.num_clients)
        self._client_indices = _check_client_indices(client_indices, self._sizes)

    @property
    def max_probability(self) -> float:
        """The largest p_k (the least favourable client)."""
        return float(self.probabilities.max())

    def sample(self, rng: np.random.Generator) -> RoundSample:
        """Draw one round's check-ins; each participant brings all its records.

        Parameters
        ----------
        rng : numpy.random.Generator
            The round's generator.

        Returns
        -------
        RoundSample
            The clients that checked in (ascending) and all of their records.
        """
        rng = _check_rng(rng)
        if self.uniform:
            p = float(self.probabilities[0])
            clients = _poisson_subset(rng, self.num_clients, p)
        else:
            draws = rng.random(self.num_clients)
            clients = np.flatnonzero(draws < self.probabilities).astype(np.int64)
        positions = [
            np.arange(int(n), dtype=np.int64) for n in self._sizes[clients].tolist()
        ]
        return self._finish(clients, positions)

    def event(self, noise_multiplier: float) -> ev.Event:
        """Return ``CheckIn(max_k p_k, Gaussian(noise_multiplier))``.

        The largest check-in probability prices the least favourable client;
        the check-in event prices the Gaussian under replace-one (Δ = 2C).
        """
        return ev.CheckIn(self.max_probability, ev.Gaussian(noise_multiplier))


class TwoStageSampler(Sampler):
    """LOCKS: a Poisson(q1) first stage, then a norm-proportional second stage.

    Stage 1 takes each of ``num_clients`` clients independently w.p.
    ``first_stage_probability`` (q1), drawn as in
    :class:`~dpfl.sim.sampling.PoissonClientSampler`. Each first-stage
    client releases a noisy norm ``ñ_k > 0``; stage 2 then keeps client
    ``k`` of S1 independently w.p. ``p2_k = min(1, m2 ñ_k / Σ_{j∈S1} ñ_j)`` (``m2`` =
    ``second_stage_size``: the expected size of S2 when no cap binds,
    LOCKS Lemma 4.1).

    The round realises ``TwoStage(q1, m2, max p2, norm_event, update_event)``;
    before the round only ``max p2 <= 1`` is known, which is what
    :meth:`event` gives by default.

    Parameters
    ----------
    num_clients : int
        Population K (>= 1).
    first_stage_probability : float
        q1 in (0, 1].
    second_stage_size : int
        m2 >= 1.
    client_sizes : numpy.ndarray
        Records held by each client, shape ``(num_clients,)``.
    client_indices : sequence of numpy.ndarray, optional
        Each client's global dataset rows.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On bad parameters.

    References
    ----------
    "LOCKS: User differentially private and federated optimal client
    sampling", Algorithm 1, Lemma 4.1; docs/systems/locks.md.
    """

    def __init__(
        self,
        *,
        num_clients: int,
        first_stage_probability: float,
        second_stage_size: int,
        client_sizes: np.ndarray,
        client_indices: Sequence[np.ndarray] | None = None,
    ) -> None:
        self.num_clients = check_count("num_clients", num_clients, minimum=1)
        self.first_stage_probability = check_probability(
            "first_stage_probability", first_stage_probability
        )
        self.second_stage_size = check_count(
            "second_stage_size", second_stage_size, minimum=1
        )
        self._sizes = _check_sizes(client_sizes, self.num_clients)
        self._client_indices = _check_client_indices(client_indices, self._sizes)

    def first_stage(self, rng: np.random.Generator) -> np.ndarray:
        """S1: each client w.p. q1 (int64 ids, ascending).

        Parameters
        ----------
        rng : numpy.random.Generator
            The server's generator of the round.

        Returns
        -------
        numpy.ndarray
            The first-stage clients.
        """
        rng = _check_rng(rng)
        return _poisson_subset(rng, self.num_clients, self.first_stage_probability)

    def sample(self, rng: np.random.Generator) -> RoundSample:
        """Draw the first stage, each member with all of its records.

        Parameters
        ----------
        rng : numpy.random.Generator
            The round's generator.

        Returns
        -------
        RoundSample
            S1 (ascending) and all of its records.
        """
        clients = self.first_stage(rng)
        positions = [
            np.arange(int(n), dtype=np.int64) for n in self._sizes[clients].tolist()
        ]
        return self._finish(clients, positions)

    def second_stage_probabilities(self, norms: np.ndarray) -> np.ndarray:
        """``p2_k = min(1, m2 ñ_k / Σ_j ñ_j)`` for released norms ``ñ`` of S1.

        Parameters
        ----------
        norms : numpy.ndarray
            ``[n1]`` released norms, each finite and > 0.

        Returns
        -------
        numpy.ndarray
            ``[n1]`` float64 probabilities (empty for an empty S1).

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If a norm is not finite and > 0.
        """
        n = np.asarray(norms, dtype=np.float64).reshape(-1)
        if n.size == 0:
            return n
        if not (np.all(np.isfinite(n)) and n.min() > 0):
            raise InvalidParameterError(
                "released norms must be finite and > 0 (apply the floor first)"
            )
        return np.minimum(1.0, self.second_stage_size * (n / n.sum()))

    def second_stage(
        self, rng: np.random.Generator, norms: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """S2: each member ``k`` of S1 w.p. ``p2_k`` (independent coins).

        Parameters
        ----------
        rng : numpy.random.Generator
            The server's generator of the round (after :meth:`first_stage`).
        norms : numpy.ndarray
            ``[n1]`` released norms of S1, in S1's order.

        Returns
        -------
        tuple of numpy.ndarray
            ``(chosen, p2)``: positions in S1 of the second-stage members
            (int64, ascending) and every S1 member's ``p2``.
        """
        rng = _check_rng(rng)
        p2 = self.second_stage_probabilities(norms)
        if p2.size == 0:
            return np.empty(0, np.int64), p2
        chosen = np.flatnonzero(rng.random(p2.size) < p2).astype(np.int64)
        return chosen, p2

    def expected_second_stage_size(
        self,
        norms: float | np.ndarray,
        *,
        norm_noise: float,
        floor: float,
        rng: np.random.Generator,
        draws: int = 20_000,
    ) -> float:
        """E|S2|: the expected number of clients that upload an update per round.

        ``E|S2| = E[Σ_{k∈S1} p2_k]`` over the first stage and the norm noise,
        estimated by Monte Carlo: each draw takes S1 (each client w.p. q1),
        releases ``ñ_k = max(ν, n_k + norm_noise · ξ_k)`` for ``k ∈ S1`` and
        adds up :meth:`second_stage_probabilities`. It is ``m2`` only when no
        cap ``p2 <= 1`` binds; with noisy norms the cap binds often and
        ``E|S2| < m2`` (LOCKS Lemma 4.1 bounds it by ``m2``). With every
        ``p2_k = 1`` (``m2 = K`` and equal released norms, e.g. all at the
        floor) it is ``K q1``.

        Parameters
        ----------
        norms : float or numpy.ndarray
            The clipped update norms ``n_k = ‖ḡ_k‖`` of the ``K`` clients
            (``[K]``), or one norm for all (e.g. ``C`` when every update is
            clipped).
        norm_noise : float
            ``σ_n C >= 0``, the std of each released norm's noise.
        floor : float
            ν > 0, the floor of a released norm.
        rng : numpy.random.Generator
            The generator of the draws.
        draws : int
            Monte Carlo draws (>= 1); the standard error is about
            ``sd(|S2|) / sqrt(draws)``.

        Returns
        -------
        float
            The estimate of ``E|S2|``.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            On a negative or non-finite norm or noise, a floor <= 0, norms of
            the wrong length or ``draws < 1``.
        """
        rng = _check_rng(rng)
        draws = check_count("draws", draws, minimum=1)
        norm_noise = check_nonnegative("norm_noise", norm_noise)
        floor = check_positive("floor", floor)
        n = np.asarray(norms, dtype=np.float64)
        if n.ndim == 0:
            n = np.full(self.num_clients, float(n))
        if n.shape != (self.num_clients,) or not (
            np.all(np.isfinite(n)) and n.min() >= 0
        ):
            raise InvalidParameterError(
                f"norms must be one finite norm >= 0 or {self.num_clients} of "
                f"them (one per client); got {shown(norms)}"
            )
        total, chunk = 0.0, max(1, 2_000_000 // self.num_clients)
        for start in range(0, draws, chunk):
            rows = min(chunk, draws - start)
            member = rng.random((rows, self.num_clients)) < self.first_stage_probability
            noisy = np.maximum(
                floor, n + norm_noise * rng.standard_normal((rows, self.num_clients))
            )
            noisy = np.where(member, noisy, 0.0)
            sums = noisy.sum(axis=1, keepdims=True)
            share = np.divide(noisy, sums, out=np.zeros_like(noisy), where=sums > 0)
            total += float(np.minimum(1.0, self.second_stage_size * share).sum())
        return total / draws

    def event(
        self,
        norm_noise_multiplier: float,
        update_noise_multiplier: float,
        max_second_stage_probability: float = 1.0,
    ) -> ev.Event:
        """``TwoStage(q1, m2, max p2, Gaussian(σ_n), Gaussian(σ_g))``.

        Parameters
        ----------
        norm_noise_multiplier : float
            σ_n > 0, noise std of each released norm in units of the clip.
        update_noise_multiplier : float
            σ_g > 0, noise std of each released update in units of the clip.
        max_second_stage_probability : float
            The bound on every ``p2_k`` (default 1: all that is known before
            the round).

        Returns
        -------
        Event
            The round's accounting event.
        """
        return ev.TwoStage(
            self.first_stage_probability,
            self.second_stage_size,
            max_second_stage_probability,
            ev.Gaussian(norm_noise_multiplier),
            ev.Gaussian(update_noise_multiplier),
        )
