"""Randomness keyed by position, (round) and (round, client): secret key or seed.

A run's numbers are a function of *where* they are drawn, never of how much
was drawn before. Two modes:

**Secure (the default of a run).** Everything secret in a round derives from
the run's secret 256-bit key (:mod:`dpfl.sim.secure_noise`): the server's
draws in round ``t`` from ``HMAC(key, "server" ‖ t)``, client ``k``'s from
``HMAC(key, "client" ‖ t ‖ k)``. From such a party key come a numpy
generator for index draws (participants, batches) and a
:class:`~dpfl.sim.secure_noise.SecureGenerator` for noise (a
cryptographically secure stream with a floating-point-safe Gaussian
sampler). Without the key nobody can compute them, so a released model
cannot be de-noised from its configuration.

**Reproducible (on request, for experiments; not for release).** The
server's draws in round ``t`` come from ``SeedSequence(seed,
spawn_key=(t,))``, client ``k``'s from ``SeedSequence(seed, spawn_key=(t,
CLIENT_DOMAIN, k))``, each split into one numpy and one torch generator
(PCG64 and torch's default: not cryptographically secure). The seed is in
the run's config, so anyone who has the config can draw the same noise
again.

In both modes every client has its own streams, so a cohort may be split
across workers, run in any order or vectorised as one computation, and every
client still draws the same numbers: the loop and batched executors, a Ray
cluster and a Flower federation give the same result for the same seed or
key. A worker receives only the derived keys of the clients it runs
(:class:`CohortStreams` ships them, never the run's key). A checkpoint needs
no generator state, and a resumed run draws what the uninterrupted run drew.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np
import torch

from dpfl._validate import check_count
from dpfl.errors import InvalidParameterError
from dpfl.sim.keys import (
    check_key,
    derive_key,
    derive_keys,
    index_rng,
    keyed_orders,
    keyed_orders_many,
)
from dpfl.sim.local import _counts, epoch_orders
from dpfl.sim.secure_noise import (
    KEYED_ORDER_VERSIONS,
    STREAM_VERSION,
    NoiseGenerator,
    SecureGenerator,
    check_stream_version,
)

__all__ = [
    "CLIENT_DOMAIN",
    "CohortStreams",
    "Streams",
    "client_key",
    "client_streams",
    "cohort_epoch_orders",
    "server_key",
    "server_streams",
]

#: Second entry of every client key (server children use 0 and 1).
CLIENT_DOMAIN = 2


class Streams:
    """The two generators of one party in one round.

    Attributes
    ----------
    rng : numpy.random.Generator
        For index draws (participants, batches, orders); from a key, made on
        first use.
    generator : torch.Generator or SecureGenerator
        For noise draws (:func:`dpfl.sim.secure_noise.fill_normal_`): a
        :class:`~dpfl.sim.secure_noise.SecureGenerator` when the streams come
        from a key, else a torch generator on the party's device. Made on
        first use (most client steps draw no noise, and a torch generator
        costs tens of microseconds to make), from a seed or key fixed when
        the streams are made, so when it is made does not change what it
        draws.
    stream_version : str
        The secure stream's version (:data:`~dpfl.sim.secure_noise.STREAM_VERSION`
        unless the run started under another).
    """

    __slots__ = (
        "_device",
        "_generator",
        "_key",
        "_rng",
        "_torch_seed",
        "_torch_seq",
        "stream_version",
    )

    def __init__(
        self,
        rng: np.random.Generator | None,
        generator: NoiseGenerator | None = None,
        *,
        torch_seed: int | None = None,
        key: bytes | None = None,
        device: str | torch.device = "cpu",
        stream_version: str = STREAM_VERSION,
    ) -> None:
        if generator is None and torch_seed is None and key is None:
            raise InvalidParameterError(
                "Streams needs a generator, a torch_seed or a key"
            )
        if rng is None and key is None:
            raise InvalidParameterError("Streams needs an rng or a key")
        self._rng = rng
        self._generator = generator
        self._torch_seed = torch_seed
        # (entropy, spawn key, pool size) of a SeedSequence whose first word
        # is the torch seed, made on first use (reproducible client streams)
        self._torch_seq: tuple[object, tuple[int, ...], int] | None = None
        self._key = key
        self._device = device
        self.stream_version = check_stream_version("stream_version", stream_version)

    @classmethod
    def from_key(
        cls,
        key: bytes,
        device: str | torch.device = "cpu",
        *,
        stream_version: str = STREAM_VERSION,
    ) -> Streams:
        """A party's secure streams from its derived key (:func:`client_key`)."""
        key = check_key("key", key)
        return cls(None, key=key, device=device, stream_version=stream_version)

    @property
    def rng(self) -> np.random.Generator:
        """The index generator (from a key: made on first use, ``index_rng``)."""
        if self._rng is None:
            assert self._key is not None
            self._rng = index_rng(self._key)
        return self._rng

    def epoch_orders(self, num_records: int, epochs: int) -> np.ndarray:
        """The party's visiting orders of its ``num_records`` records, per epoch.

        Under a stream version of
        :data:`~dpfl.sim.secure_noise.KEYED_ORDER_VERSIONS` (secure streams),
        :func:`~dpfl.sim.keys.keyed_orders` of the party's key; else
        one permutation per epoch from :attr:`rng`
        (:func:`dpfl.sim.local.epoch_orders`).

        Returns
        -------
        numpy.ndarray
            ``[epochs, num_records]`` int64.
        """
        n = check_count("num_records", num_records, minimum=0)
        e = check_count("epochs", epochs, minimum=1)
        if self._key is not None and self.stream_version in KEYED_ORDER_VERSIONS:
            return keyed_orders(self._key, n, e)
        return epoch_orders(self.rng, n, e)

    @property
    def generator(self) -> NoiseGenerator:
        """The noise generator (made on first use)."""
        if self._generator is None:
            if self._key is not None:
                self._generator = SecureGenerator(
                    self._key, self._device, version=self.stream_version
                )
            else:
                if self._torch_seq is not None:
                    entropy, spawn, pool = self._torch_seq
                    seq = np.random.SeedSequence(
                        entropy,  # type: ignore[arg-type]
                        spawn_key=spawn,
                        pool_size=pool,
                    )
                    self._torch_seed = int(seq.generate_state(1, np.uint64)[0])
                g = torch.Generator(device=self._device)
                g.manual_seed(int(self._torch_seed))  # type: ignore[arg-type]
                self._generator = g
        return self._generator


def _streams(seq: np.random.SeedSequence, device: str | torch.device) -> Streams:
    """The numpy and torch generators of ``seq.spawn(2)`` (children 0 and 1).

    The children are made directly (a spawned child is the sequence with the
    child's index appended to the spawn key), and the torch seed only when
    the noise generator is first used: the same draws as spawning, for less.
    """
    entropy, spawn, pool = seq.entropy, tuple(seq.spawn_key), seq.pool_size
    np_seq = np.random.SeedSequence(entropy, spawn_key=(*spawn, 0), pool_size=pool)
    made = Streams(np.random.default_rng(np_seq), torch_seed=0, device=device)
    made._torch_seq = (entropy, (*spawn, 1), pool)
    return made


def server_key(key: bytes, round_index: int) -> bytes:
    """The server's derived key in round ``round_index``: ``HMAC(key, "server" ‖ t)``.

    Parameters
    ----------
    key : bytes
        The run's secret key.
    round_index : int
        The round.
    """
    return derive_key(key, "server", round_index)


def client_key(key: bytes, round_index: int, client: int) -> bytes:
    """Client ``client``'s derived key in round ``round_index``.

    ``HMAC(key, "client" ‖ t ‖ k)``: what a worker that runs the client is
    sent. It yields that client's streams in that round and nothing else.
    """
    return derive_key(key, "client", round_index, client)


def server_streams(
    seed: int,
    round_index: int,
    device: str | torch.device = "cpu",
    *,
    key: bytes | None = None,
    stream_version: str = STREAM_VERSION,
) -> Streams:
    """The server's generators in round ``round_index`` of a run.

    Parameters
    ----------
    seed : int
        The run's seed (>= 0); what the streams derive from when ``key`` is
        ``None``.
    round_index : int
        The round (>= 0).
    device : str or torch.device
        Device of the noise.
    key : bytes or None
        The run's secret key (secure mode); ``None``: reproducible mode.
    stream_version : str
        The secure stream's version (the run's).

    Returns
    -------
    Streams
        With a key, :meth:`Streams.from_key` of :func:`server_key`; else
        generators derived from ``SeedSequence(seed, spawn_key=(round_index,))``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``seed`` or ``round_index`` is not a non-negative integer, or
        ``key`` is not 32 bytes.
    """
    seed = check_count("seed", seed, minimum=0)
    round_index = check_count("round_index", round_index, minimum=0)
    if key is not None:
        return Streams.from_key(
            server_key(key, round_index), device, stream_version=stream_version
        )
    return _streams(np.random.SeedSequence(seed, spawn_key=(round_index,)), device)


def client_streams(
    seed: int,
    round_index: int,
    client: int,
    device: str | torch.device = "cpu",
    *,
    key: bytes | None = None,
    stream_version: str = STREAM_VERSION,
) -> Streams:
    """Client ``client``'s generators in round ``round_index`` of a run.

    Parameters
    ----------
    seed : int
        The run's seed (>= 0); what the streams derive from when ``key`` is
        ``None``.
    round_index : int
        The round (>= 0).
    client : int
        The client's index in the federation (>= 0).
    device : str or torch.device
        Device of the noise.
    key : bytes or None
        The run's secret key (secure mode); ``None``: reproducible mode.
    stream_version : str
        The secure stream's version (the run's).

    Returns
    -------
    Streams
        With a key, :meth:`Streams.from_key` of :func:`client_key`; else
        generators derived from
        ``SeedSequence(seed, spawn_key=(round_index, CLIENT_DOMAIN, client))``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If an argument is not a non-negative integer, or ``key`` is not 32
        bytes.
    """
    seed = check_count("seed", seed, minimum=0)
    round_index = check_count("round_index", round_index, minimum=0)
    client = check_count("client", client, minimum=0)
    if key is not None:
        return Streams.from_key(
            client_key(key, round_index, client), device, stream_version=stream_version
        )
    spawn = (round_index, CLIENT_DOMAIN, client)
    return _streams(np.random.SeedSequence(seed, spawn_key=spawn), device)


class CohortStreams(Sequence[Streams]):
    """The streams of a round's clients, in task order, each made on first use.

    A batched step that draws nothing per client (DP-DSGD's: the server draws
    its records and noise) then pays nothing for them; a step that does gets
    exactly :func:`client_streams` of each client.

    Parameters
    ----------
    seed, round_index : int
        The run's seed and the round.
    clients : sequence of int
        The clients, in task order.
    device : str or torch.device
        Device of the noise.
    key : bytes or None
        The run's secret key (secure mode): only each client's derived key
        (:func:`client_key`) is kept, so what is shipped to a worker (a
        :meth:`part`, a pickle) never holds the run's key.
    client_keys : sequence of bytes or None
        The clients' derived keys, in task order (instead of ``key``; how a
        worker receives them).
    stream_version : str
        The secure stream's version (the run's; shipped with the keys).
    """

    def __init__(
        self,
        seed: int,
        round_index: int,
        clients: Sequence[int],
        device: str | torch.device = "cpu",
        *,
        key: bytes | None = None,
        client_keys: Sequence[bytes] | None = None,
        stream_version: str = STREAM_VERSION,
    ) -> None:
        self.seed = seed
        self.stream_version = check_stream_version("stream_version", stream_version)
        self.round_index = round_index
        self.clients = [int(k) for k in clients]
        self.device = device
        if key is not None:
            if client_keys is not None:
                raise InvalidParameterError("give key or client_keys, not both")
            # client_key(key, round_index, k) of each client, the key checked once
            client_keys = derive_keys(key, "client", (round_index,), self.clients)
        elif client_keys is not None:
            client_keys = [check_key("client_keys[j]", k) for k in client_keys]
            if len(client_keys) != len(self.clients):
                raise InvalidParameterError(
                    f"client_keys must have one key per client ({len(self.clients)}); "
                    f"got {len(client_keys)}"
                )
        self.client_keys: list[bytes] | None = client_keys
        self._made: dict[int, Streams] = {}

    @property
    def secure(self) -> bool:
        """Whether the streams are the clients' secure streams (derived keys)."""
        return self.client_keys is not None

    def part(self, start: int, stop: int) -> CohortStreams:
        """The streams of tasks ``start:stop`` (for one share of a split cohort)."""
        keys = None if self.client_keys is None else self.client_keys[start:stop]
        return CohortStreams(
            self.seed,
            self.round_index,
            self.clients[start:stop],
            self.device,
            client_keys=keys,
            stream_version=self.stream_version,
        )

    def on_device(self, device: str | torch.device) -> CohortStreams:
        """The same streams (same keys), with noise on ``device``."""
        return CohortStreams(
            self.seed,
            self.round_index,
            self.clients,
            device,
            client_keys=self.client_keys,
            stream_version=self.stream_version,
        )

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Ship the keys (derived ones in secure mode), not the generators:
        # the receiver makes its own.
        return (
            _cohort_streams,
            (
                self.seed,
                self.round_index,
                self.clients,
                str(self.device),
                self.client_keys,
                self.stream_version,
            ),
        )

    def __len__(self) -> int:
        return len(self.clients)

    @overload
    def __getitem__(self, index: int) -> Streams: ...

    @overload
    def __getitem__(self, index: slice) -> list[Streams]: ...

    def __getitem__(self, index: int | slice) -> Streams | list[Streams]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = range(len(self))[index]
        if i not in self._made:
            if self.client_keys is not None:
                made = Streams.from_key(
                    self.client_keys[i],
                    self.device,
                    stream_version=self.stream_version,
                )
            else:
                made = client_streams(
                    self.seed, self.round_index, self.clients[i], self.device
                )
            self._made[i] = made
        return self._made[i]


def cohort_epoch_orders(
    streams: Sequence[Streams], counts: Sequence[int], epochs: int
) -> list[np.ndarray]:
    """Each client's :meth:`Streams.epoch_orders`, for a whole cohort at once.

    Secure :class:`CohortStreams` under a stream version of
    :data:`~dpfl.sim.secure_noise.KEYED_ORDER_VERSIONS` give every client's
    :func:`~dpfl.sim.keys.keyed_orders` in one pass
    (:func:`~dpfl.sim.keys.keyed_orders_many`: the same orders, one sort);
    other streams are asked one by one.

    Returns
    -------
    list of numpy.ndarray
        ``streams[j].epoch_orders(counts[j], epochs)`` for each ``j``.
    """
    e = check_count("epochs", epochs, minimum=1)
    if (
        isinstance(streams, CohortStreams)
        and streams.client_keys is not None
        and streams.stream_version in KEYED_ORDER_VERSIONS
    ):
        sizes = _counts(counts)
        if len(sizes) != len(streams):
            raise InvalidParameterError(
                f"counts must have one entry per client ({len(streams)}); "
                f"got {len(sizes)}"
            )
        return keyed_orders_many(streams.client_keys, sizes, e)
    return [s.epoch_orders(int(n), e) for s, n in zip(streams, counts, strict=True)]


def _cohort_streams(
    seed: int,
    round_index: int,
    clients: list[int],
    device: str,
    client_keys: list[bytes] | None,
    stream_version: str = STREAM_VERSION,
) -> CohortStreams:
    return CohortStreams(
        seed,
        round_index,
        clients,
        device,
        client_keys=client_keys,
        stream_version=stream_version,
    )
