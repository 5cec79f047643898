"""Samplers: realise a round's accounting event from an explicit generator.

Each sampler draws who takes part in a round (and which of their records) from
a :class:`numpy.random.Generator` passed in by the caller, and names the
accounting event it realises with :meth:`event` (the
sampler *realises* the value the accountant *prices*):

- :class:`PoissonParticipationSampler`:
  ``ClientPoisson(p, RecordPoisson(q, d, Gaussian(σ)))`` (record level), over
  every client or over the round's online clients
  (:class:`~dpfl.sim.availability.ClientAvailability`, which realises no
  event of its own);
- :class:`FixedCohortSampler`: ``FixedCohort(m, K, Gaussian(σ))`` (client level);
- :class:`CohortRecordSampler`: ``CohortRecordPoisson(m, K, q, d, Gaussian(σ))``
  (fixed-size cohorts with Poisson records; record level);
- :class:`PoissonClientSampler`: ``ClientPoisson(p, Gaussian(σ))`` (client level);
- the check-in and two-stage samplers of the schemes whose participation
  the server sees (MS-PAFL, PriFedSync, LOCKS) are in
  :mod:`dpfl.sim.sampling_checkin`.

Cost grows with the work of a round, never with the number of clients that
did not take part: a Poisson(p) cohort is drawn as
``M ~ Binomial(N, p)`` followed by ``M`` distinct clients chosen uniformly
without replacement. This is *equal in law* to ``N`` independent
Bernoulli(p) coins: for any set ``S`` of size ``m``,
``P(cohort = S) = C(N, m) p^m (1-p)^(N-m) / C(N, m) = p^m (1-p)^(N-m)``.
Numpy's ``Generator.choice(N, M, replace=False)`` uses Floyd's algorithm
(memory and time ``O(M)``) when ``M <= N/50``, so a round at ``N = 10^9``
clients and ``p = 10^-6`` touches about a thousand integers. The same trick
samples each participant's records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dpfl._validate import (
    check_count,
    check_probability,
)
from dpfl.accounting import events as ev
from dpfl.accounting.cohorts import CohortRecordPoisson
from dpfl.errors import InvalidParameterError

__all__ = [
    "FixedCohortSampler",
    "PoissonClientSampler",
    "PoissonParticipationSampler",
    "RoundSample",
    "Sampler",
]


@dataclasses.dataclass(frozen=True)
class RoundSample:
    """Who took part in one round, and which of their records, in CSR form.

    Attributes
    ----------
    clients : numpy.ndarray
        Participating clients, int64, ascending and distinct. A client that
        took part but sampled no record is included (with an empty range).
    record_offsets : numpy.ndarray
        int64, ``len(clients) + 1`` offsets: client ``clients[j]``'s sampled
        records are ``records[record_offsets[j]:record_offsets[j + 1]]``.
    records : numpy.ndarray or None
        Global dataset row indices of the sampled records (int64), when the
        sampler was given the dataset's ``client_indices``; else ``None``
        (use :meth:`resolve`).
    positions : numpy.ndarray
        The same records as positions inside each client's own record list
        (``0 <= position < client_size``), int64, ascending within a client.
    """

    clients: np.ndarray
    record_offsets: np.ndarray
    records: np.ndarray | None
    positions: np.ndarray

    @property
    def num_clients(self) -> int:
        """Number of participating clients."""
        return int(self.clients.shape[0])

    @property
    def num_records(self) -> int:
        """Number of sampled records over all participants."""
        return int(self.positions.shape[0])

    def counts(self) -> np.ndarray:
        """Return the number of sampled records of each participant (int64)."""
        return np.diff(self.record_offsets)

    def segment_ids(self) -> np.ndarray:
        """Return each sampled record's participant, as a position in ``clients``."""
        return np.repeat(np.arange(self.num_clients, dtype=np.int64), self.counts())

    def client_records(self, j: int) -> np.ndarray:
        """Return the sampled global rows (or positions) of the ``j``-th participant."""
        lo, hi = int(self.record_offsets[j]), int(self.record_offsets[j + 1])
        src = self.records if self.records is not None else self.positions
        return src[lo:hi]

    def resolve(self, client_indices: Sequence[np.ndarray]) -> RoundSample:
        """Return a copy whose ``records`` are global rows of ``client_indices``.

        Parameters
        ----------
        client_indices : sequence of numpy.ndarray
            ``client_indices[k]`` are client ``k``'s rows in the dataset (as in
            :attr:`dpfl.data.FederatedDataset.client_indices`).

        Returns
        -------
        RoundSample
            The same sample with ``records`` filled in.
        """
        return dataclasses.replace(
            self, records=_global_rows(client_indices, self.clients, self)
        )


def _global_rows(
    client_indices: Sequence[np.ndarray], clients: np.ndarray, sample: RoundSample
) -> np.ndarray:
    parts = [
        np.asarray(client_indices[int(k)], dtype=np.int64)[
            sample.positions[sample.record_offsets[j] : sample.record_offsets[j + 1]]
        ]
        for j, k in enumerate(clients)
    ]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


class Sampler:
    """Shared machinery of the samplers (not used directly)."""

    num_clients: int
    _sizes: np.ndarray
    _client_indices: Sequence[np.ndarray] | None

    def _finish(self, clients: np.ndarray, positions: list[np.ndarray]) -> RoundSample:
        counts = np.fromiter((len(p) for p in positions), np.int64, len(positions))
        offsets = np.zeros(len(positions) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        pos = np.concatenate(positions) if positions else np.empty(0, np.int64)
        sample = RoundSample(
            clients=clients, record_offsets=offsets, records=None, positions=pos
        )
        if self._client_indices is not None:
            sample = sample.resolve(self._client_indices)
        return sample

    def sample(self, rng: np.random.Generator) -> RoundSample:  # pragma: no cover
        """Draw one round (implemented by subclasses)."""
        raise NotImplementedError


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise InvalidParameterError(
            f"rng must be a numpy.random.Generator; got {type(rng).__name__}"
        )
    return rng


def _check_sizes(client_sizes: object, num_clients: int) -> np.ndarray:
    """Validate ``client_sizes`` without touching N elements when it is a broadcast."""
    sizes = np.asarray(client_sizes)
    if sizes.shape != (num_clients,):
        raise InvalidParameterError(
            f"client_sizes must have shape ({num_clients},); got {sizes.shape}"
        )
    if not np.issubdtype(sizes.dtype, np.integer):
        raise InvalidParameterError(
            f"client_sizes must hold integers; got dtype {sizes.dtype}"
        )
    # A zero-stride view (np.broadcast_to(d, (N,))) holds one value: check it once.
    probe = sizes[:1] if sizes.strides == (0,) else sizes
    if probe.size and int(probe.min()) < 0:
        raise InvalidParameterError(
            f"client_sizes must be >= 0; got minimum {int(probe.min())}"
        )
    return sizes


def _check_client_indices(
    client_indices: Sequence[np.ndarray] | None, sizes: np.ndarray
) -> Sequence[np.ndarray] | None:
    if client_indices is None:
        return None
    if len(client_indices) != sizes.shape[0]:
        raise InvalidParameterError(
            f"client_indices must have one entry per client ({sizes.shape[0]}); "
            f"got {len(client_indices)}"
        )
    return client_indices


def _choose(rng: np.random.Generator, population: int, size: int) -> np.ndarray:
    """``size`` distinct integers of ``[0, population)``, ascending.

    O(size) memory when ``size <= population / 50`` (Floyd's algorithm in numpy).
    """
    if size == 0:
        return np.empty(0, np.int64)
    if size == population:
        return np.arange(population, dtype=np.int64)
    out = rng.choice(population, size=size, replace=False, shuffle=False)
    out = np.asarray(out, dtype=np.int64)
    out.sort()
    return out


def _poisson_subset(rng: np.random.Generator, population: int, p: float) -> np.ndarray:
    """A Poisson(p) subset of ``[0, population)``: Binomial count, then uniform."""
    m = int(rng.binomial(population, p)) if p < 1.0 else population
    return _choose(rng, population, m)


class PoissonParticipationSampler(Sampler):
    """Random participation (Hasircioglu & Gündüz, Algorithm 1).

    Each of ``num_clients`` clients joins independently w.p.
    ``participation_probability`` (p); each joining client keeps each of its
    records independently w.p. ``record_probability`` (q).

    Both levels are drawn as a Binomial count followed by a uniform choice
    without replacement, which is equal in law to independent Bernoulli coins
    (see the module docstring) and costs ``O(#participants + #sampled
    records)``, never ``O(num_clients)``: ``client_sizes`` is only indexed at
    the participants, so a zero-stride array such as
    ``np.broadcast_to(30, (10**9,))`` describes a billion clients in 8 bytes.

    Parameters
    ----------
    num_clients : int
        Number of available clients N (>= 1).
    participation_probability : float
        p in (0, 1].
    record_probability : float
        q in (0, 1].
    client_sizes : numpy.ndarray
        Records held by each client, integer, shape ``(num_clients,)``.
    client_indices : sequence of numpy.ndarray, optional
        Each client's global dataset rows; when given, samples carry
        ``records`` (global rows), else only ``positions``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a bad count, probability or sizes array.

    References
    ----------
    Hasircioglu & Gündüz, "Communication efficient federated learning with
    differential privacy and random participation", arXiv 2205.01556, Alg. 1.
    """

    def __init__(
        self,
        *,
        num_clients: int,
        participation_probability: float,
        record_probability: float,
        client_sizes: np.ndarray,
        client_indices: Sequence[np.ndarray] | None = None,
    ) -> None:
        self.num_clients = check_count("num_clients", num_clients, minimum=1)
        self.participation_probability = check_probability(
            "participation_probability", participation_probability
        )
        self.record_probability = check_probability(
            "record_probability", record_probability
        )
        self._sizes = _check_sizes(client_sizes, self.num_clients)
        self._client_indices = _check_client_indices(client_indices, self._sizes)
        probe = self._sizes[:1] if self._sizes.strides == (0,) else self._sizes
        self.records_per_client = int(probe.max())

    def sample(self, rng: np.random.Generator) -> RoundSample:
        """Draw one round's participants and their sampled records.

        Parameters
        ----------
        rng : numpy.random.Generator
            The round's generator (its state advances).

        Returns
        -------
        RoundSample
            Participants (ascending) and, for each, its sampled records.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If ``rng`` is not a numpy Generator.
        """
        rng = _check_rng(rng)
        clients = _poisson_subset(rng, self.num_clients, self.participation_probability)
        return self._with_records(rng, clients)

    def sample_available(
        self, rng: np.random.Generator, available: np.ndarray
    ) -> RoundSample:
        """Draw one round when only the clients ``available`` are online.

        Each available client joins w.p. p (the others cannot), then each
        participant keeps each of its records w.p. q, exactly as
        :meth:`sample` does over the whole population; ``sample_available(rng,
        arange(num_clients))`` is :meth:`sample`.

        Parameters
        ----------
        rng : numpy.random.Generator
            The round's generator (its state advances).
        available : numpy.ndarray
            The online clients, distinct, ascending, in ``[0, num_clients)``
            (e.g. from
            :meth:`dpfl.sim.availability.ClientAvailability.draw`).

        Returns
        -------
        RoundSample
            Participants (ascending, a subset of ``available``) and their
            sampled records.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If ``rng`` is not a numpy Generator or ``available`` is not a
            set of this population's clients.
        """
        rng = _check_rng(rng)
        available = np.asarray(available, dtype=np.int64)
        if available.ndim != 1 or (
            len(available)
            and (
                available[0] < 0
                or available[-1] >= self.num_clients
                or np.any(np.diff(available) <= 0)
            )
        ):
            raise InvalidParameterError(
                "available must be distinct ascending clients in "
                f"[0, {self.num_clients}); got {available!r}"
            )
        chosen = _poisson_subset(rng, len(available), self.participation_probability)
        return self._with_records(rng, available[chosen])

    def _with_records(
        self, rng: np.random.Generator, clients: np.ndarray
    ) -> RoundSample:
        """Each participant in ``clients`` keeps each of its records w.p. q."""
        sizes = np.asarray(self._sizes[clients], dtype=np.int64)
        q = self.record_probability
        counts = rng.binomial(sizes, q) if q < 1.0 else sizes
        positions = [
            _choose(rng, int(n), int(c))
            for n, c in zip(sizes.tolist(), counts.tolist())
        ]
        return self._finish(clients, positions)

    def event(self, noise_multiplier: float) -> ev.Event:
        """The accounting event of one round with this noise multiplier.

        ``records_per_client`` is the largest client size: with unequal sizes
        this is the conservative choice. A record added to the largest client
        has that many companions, and the ``sound`` analysis's per-round
        curve grows with the number of companions at every epsilon (its
        per-label worst case is a supremum over a ball that grows with the
        label, and a larger client's label is stochastically larger), so
        every smaller client is covered.

        Parameters
        ----------
        noise_multiplier : float
            Noise std on the sum divided by the clipping norm (> 0).

        Returns
        -------
        Event
            ``ClientPoisson(p, RecordPoisson(q, d, Gaussian(noise_multiplier)))``.
        """
        return ev.ClientPoisson(
            self.participation_probability,
            ev.RecordPoisson(
                self.record_probability,
                self.records_per_client,
                ev.Gaussian(noise_multiplier),
            ),
        )


class CohortRecordSampler(PoissonParticipationSampler):
    """Exactly ``cohort_size`` clients, uniformly, then each record w.p. q.

    Fixed-size cohorts with Poisson records: the cohort is drawn without
    replacement (as :class:`FixedCohortSampler`), and each member keeps each
    of its records independently w.p. ``record_probability`` (as
    :class:`PoissonParticipationSampler`). Its event is
    :class:`~dpfl.accounting.cohorts.CohortRecordPoisson`, whose analysis is
    in :mod:`dpfl.accounting.cohorts`.

    Parameters
    ----------
    num_clients : int
        Population K (>= 1).
    cohort_size : int
        Cohort m, ``1 <= m <= K``.
    record_probability : float
        q in (0, 1].
    client_sizes : numpy.ndarray
        Records held by each client, shape ``(num_clients,)``.
    client_indices : sequence of numpy.ndarray, optional
        Each client's global dataset rows.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On bad counts, probability or sizes.
    """

    def __init__(
        self,
        *,
        num_clients: int,
        cohort_size: int,
        record_probability: float,
        client_sizes: np.ndarray,
        client_indices: Sequence[np.ndarray] | None = None,
    ) -> None:
        num_clients = check_count("num_clients", num_clients, minimum=1)
        self.cohort_size = check_count("cohort_size", cohort_size, minimum=1)
        if self.cohort_size > num_clients:
            raise InvalidParameterError(
                f"cohort_size must be <= num_clients ({num_clients}); "
                f"got {cohort_size!r}"
            )
        super().__init__(
            num_clients=num_clients,
            participation_probability=self.cohort_size / num_clients,
            record_probability=record_probability,
            client_sizes=client_sizes,
            client_indices=client_indices,
        )

    def sample(self, rng: np.random.Generator) -> RoundSample:
        """Draw one cohort (ascending) and each member's records w.p. q."""
        rng = _check_rng(rng)
        return self._with_records(rng, _choose(rng, self.num_clients, self.cohort_size))

    def sample_available(
        self, rng: np.random.Generator, available: np.ndarray
    ) -> RoundSample:
        """Not offered: the cohort is drawn from every client."""
        raise InvalidParameterError(
            "a fixed-size cohort is drawn from every client; availability must be 'all'"
        )

    def event(self, noise_multiplier: float) -> ev.Event:
        """``CohortRecordPoisson(m, K, q, d, Gaussian(noise_multiplier))``.

        ``d`` is the largest client's size (see
        :meth:`PoissonParticipationSampler.event`).
        """
        return CohortRecordPoisson(
            self.cohort_size,
            self.num_clients,
            self.record_probability,
            self.records_per_client,
            ev.Gaussian(noise_multiplier),
        )


class FixedCohortSampler(Sampler):
    """Exactly ``cohort_size`` of ``num_clients`` clients, uniformly.

    Drawn without replacement; each member brings all of its records
    (client-level DP-FedAvg).

    Parameters
    ----------
    num_clients : int
        Population K (>= 1).
    cohort_size : int
        Cohort m, ``1 <= m <= K``.
    client_sizes : numpy.ndarray
        Records held by each client, shape ``(num_clients,)``.
    client_indices : sequence of numpy.ndarray, optional
        Each client's global dataset rows (see
        :class:`PoissonParticipationSampler`).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On bad counts or sizes.

    References
    ----------
    Geyer, Klein & Nabi, "Differentially private federated learning: a client
    level perspective", 2017, Alg. 1.
    """

    def __init__(
        self,
        *,
        num_clients: int,
        cohort_size: int,
        client_sizes: np.ndarray,
        client_indices: Sequence[np.ndarray] | None = None,
    ) -> None:
        self.num_clients = check_count("num_clients", num_clients, minimum=1)
        self.cohort_size = check_count("cohort_size", cohort_size, minimum=1)
        if self.cohort_size > self.num_clients:
            raise InvalidParameterError(
                f"cohort_size must be <= num_clients ({self.num_clients}); "
                f"got {cohort_size!r}"
            )
        self._sizes = _check_sizes(client_sizes, self.num_clients)
        self._client_indices = _check_client_indices(client_indices, self._sizes)

    def sample(self, rng: np.random.Generator) -> RoundSample:
        """Draw one cohort; every record of each member is included.

        Parameters
        ----------
        rng : numpy.random.Generator
            The round's generator.

        Returns
        -------
        RoundSample
            The cohort (ascending) and all of its records.
        """
        rng = _check_rng(rng)
        clients = _choose(rng, self.num_clients, self.cohort_size)
        positions = [
            np.arange(int(n), dtype=np.int64) for n in self._sizes[clients].tolist()
        ]
        return self._finish(clients, positions)

    def event(self, noise_multiplier: float) -> ev.Event:
        """Return ``FixedCohort(m, K, Gaussian(noise_multiplier))`` (client level)."""
        return ev.FixedCohort(
            self.cohort_size, self.num_clients, ev.Gaussian(noise_multiplier)
        )


class PoissonClientSampler(Sampler):
    """Clients join independently w.p. p, with all or a mini-batch of their records.

    For client-level schemes; the mini-batch (``batch_size``) is uniform
    without replacement.

    Parameters
    ----------
    num_clients : int
        Population N (>= 1).
    participation_probability : float
        p in (0, 1].
    client_sizes : numpy.ndarray
        Records held by each client, shape ``(num_clients,)``.
    batch_size : int, optional
        If given, each participant contributes ``min(batch_size, n_k)`` records
        drawn uniformly without replacement; default all records.
    client_indices : sequence of numpy.ndarray, optional
        Each client's global dataset rows.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On bad parameters.
    """

    def __init__(
        self,
        *,
        num_clients: int,
        participation_probability: float,
        client_sizes: np.ndarray,
        batch_size: int | None = None,
        client_indices: Sequence[np.ndarray] | None = None,
    ) -> None:
        self.num_clients = check_count("num_clients", num_clients, minimum=1)
        self.participation_probability = check_probability(
            "participation_probability", participation_probability
        )
        self.batch_size = (
            None
            if batch_size is None
            else check_count("batch_size", batch_size, minimum=1)
        )
        self._sizes = _check_sizes(client_sizes, self.num_clients)
        self._client_indices = _check_client_indices(client_indices, self._sizes)

    def sample(self, rng: np.random.Generator) -> RoundSample:
        """Draw one round: Poisson(p) clients, all records or a mini-batch each.

        Parameters
        ----------
        rng : numpy.random.Generator
            The round's generator.

        Returns
        -------
        RoundSample
            Participants (ascending) and their records.
        """
        rng = _check_rng(rng)
        clients = _poisson_subset(rng, self.num_clients, self.participation_probability)
        sizes = self._sizes[clients].tolist()
        if self.batch_size is None:
            positions = [np.arange(int(n), dtype=np.int64) for n in sizes]
        else:
            positions = [
                _choose(rng, int(n), min(self.batch_size, int(n))) for n in sizes
            ]
        return self._finish(clients, positions)

    def event(self, noise_multiplier: float) -> ev.Event:
        """Return ``ClientPoisson(p, Gaussian(noise_multiplier))`` (client level)."""
        return ev.ClientPoisson(
            self.participation_probability, ev.Gaussian(noise_multiplier)
        )
