"""Samplers: realise a round's accounting event from an explicit generator.

Each sampler draws who takes part in a round (and which of their records) from
a :class:`numpy.random.Generator` passed in by the caller, and names the
accounting event it realises with :meth:`event` (the
sampler *realises* the value the accountant *prices*):

- :class:`PoissonParticipationSampler`:
  ``ClientPoisson(p, RecordPoisson(q, d, Gaussian(σ)))`` (record level), over
  every client or over the round's online clients
  (:class:`ClientAvailability`, which realises no event of its own);
- :class:`FixedCohortSampler`: ``FixedCohort(m, K, Gaussian(σ))`` (client level);
- :class:`CohortRecordSampler`: ``CohortRecordPoisson(m, K, q, d, Gaussian(σ))``
  (fixed-size cohorts with Poisson records; record level);
- :class:`PoissonClientSampler`: ``ClientPoisson(p, Gaussian(σ))`` (client level);
- :class:`CheckInSampler`: ``CheckIn(max_k p_k, Gaussian(σ))`` (visible check-in).
- :class:`SyncSampler`: ``CheckIn(p', SelfComposed(WithoutReplacement(B, n,
  Gaussian(σ)), K))`` (record level; PriFedSync's sync and local steps).

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
from dpfl.accounting.cohorts import CohortRecordPoisson
from dpfl.errors import InvalidParameterError

__all__ = [
    "ClientAvailability",
    "FixedCohortSampler",
    "PoissonClientSampler",
    "PoissonParticipationSampler",
    "RoundSample",
    "Sampler",
    "CheckInSampler",
    "SyncSampler",
    "TwoStageSampler",
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
            (e.g. from :meth:`ClientAvailability.draw`).

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


AVAILABILITY_MODELS = ("all", "bernoulli", "fixed")


class ClientAvailability:
    """Which clients are online in a round (random participation's N_t <= N).

    Hasircioglu & Gündüz (arXiv 2205.01556, §3) let ``N_t <= N`` clients be
    available in round ``t``, with ``N_t`` known to the server. Availability
    is drawn here from the caller's generator and never looks at the data,
    which is what keeps the per-round accounting event unchanged: a client
    that is offline releases nothing in that round, and an online one faces
    exactly the analysed round, so the worst-off client is one that is always
    online (its event is charged every round).

    Parameters
    ----------
    num_clients : int
        Population N (>= 1).
    model : {"all", "bernoulli", "fixed"}
        ``"all"``: every client, every round (``N_t = N``); ``"bernoulli"``:
        each client is online independently w.p. ``rate`` (``N_t ~
        Binomial(N, rate)``); ``"fixed"``: ``available_clients`` clients
        chosen uniformly without replacement (``N_t`` fixed).
    rate : float
        Bernoulli model: the probability a client is online, in (0, 1].
    available_clients : int or None
        Fixed model: ``N_t``, ``1 <= N_t <= N``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On an unknown model or a parameter outside its range.
    """

    def __init__(
        self,
        *,
        num_clients: int,
        model: str = "all",
        rate: float = 1.0,
        available_clients: int | None = None,
    ) -> None:
        self.num_clients = check_count("num_clients", num_clients, minimum=1)
        if model not in AVAILABILITY_MODELS:
            raise InvalidParameterError(
                f"availability model must be one of {AVAILABILITY_MODELS}; "
                f"got {model!r}"
            )
        self.model = model
        self.rate = check_probability("availability rate", rate)
        #: N_t of the fixed model (None for the other models).
        self.available_clients: int | None = None
        if model == "fixed":
            if available_clients is None:
                raise InvalidParameterError(
                    "available_clients must be given for the 'fixed' availability "
                    "model; got None"
                )
            self.available_clients = check_count(
                "available_clients", available_clients, minimum=1
            )
            if self.available_clients > self.num_clients:
                raise InvalidParameterError(
                    f"available_clients must be <= num_clients ({self.num_clients}); "
                    f"got {available_clients!r}"
                )
        elif available_clients is not None:
            raise InvalidParameterError(
                "available_clients is only used by the 'fixed' availability model "
                f"(model is {model!r}); got {available_clients!r}"
            )

    @property
    def always_all(self) -> bool:
        """Whether every client is online in every round."""
        return self.model == "all" or (self.model == "bernoulli" and self.rate == 1.0)

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """The round's online clients, int64, distinct and ascending.

        Parameters
        ----------
        rng : numpy.random.Generator
            Source of the draw (not advanced when every client is online).

        Returns
        -------
        numpy.ndarray
            The ``N_t`` available clients (possibly none, Bernoulli model).
        """
        rng = _check_rng(rng)
        if self.always_all:
            return np.arange(self.num_clients, dtype=np.int64)
        if self.model == "fixed":
            return _choose(rng, self.num_clients, int(self.available_clients or 0))
        return _poisson_subset(rng, self.num_clients, self.rate)


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
    :class:`PoissonClientSampler`. Each first-stage client releases a noisy
    norm ``ñ_k > 0``; stage 2 then keeps client ``k`` of S1 independently
    w.p. ``p2_k = min(1, m2 ñ_k / Σ_{j∈S1} ñ_j)`` (``m2`` =
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
