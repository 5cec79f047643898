"""Randomness keyed by position: (seed, round) and (seed, round, client).

A run's numbers are a function of *where* they are drawn, never of how much
was drawn before:

* the server's draws in round ``t`` (which clients take part, central noise)
  come from ``SeedSequence(seed, spawn_key=(t,))``, split into one numpy and
  one torch generator;
* client ``k``'s draws in round ``t`` (its local batches, its own noise) come
  from ``SeedSequence(seed, spawn_key=(t, CLIENT_DOMAIN, k))``.

The two key spaces cannot meet: the server's children have keys ``(t, 0)``
and ``(t, 1)``, a client's key has three entries. Because every client has
its own stream, a cohort may be split across workers, run in any order or
vectorised as one computation, and every client still draws the same
numbers: the loop and batched executors, a Ray cluster and a Flower
federation give the same result for the same seed. A checkpoint needs no
generator state, and a resumed run draws what the uninterrupted run drew.

These are simulator generators (PCG64 and torch's default): not
cryptographically secure. A deployment draws its noise from a secure source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np
import torch

from dpfl._validate import check_count
from dpfl.errors import InvalidParameterError

__all__ = [
    "CLIENT_DOMAIN",
    "CohortStreams",
    "Streams",
    "client_streams",
    "server_streams",
]

#: Second entry of every client key (server children use 0 and 1).
CLIENT_DOMAIN = 2


class Streams:
    """The two generators of one party in one round.

    Attributes
    ----------
    rng : numpy.random.Generator
        For index draws (participants, batches, orders).
    generator : torch.Generator
        For tensor draws (noise), on the party's device; made on first use
        (most client steps draw no noise, and a torch generator costs tens of
        microseconds to make), from a seed fixed when the streams are made, so
        when it is made does not change what it draws.
    """

    __slots__ = ("_device", "_generator", "_torch_seed", "rng")

    def __init__(
        self,
        rng: np.random.Generator,
        generator: torch.Generator | None = None,
        *,
        torch_seed: int | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        if generator is None and torch_seed is None:
            raise InvalidParameterError("Streams needs a generator or a torch_seed")
        self.rng = rng
        self._generator = generator
        self._torch_seed = torch_seed
        self._device = device

    @property
    def generator(self) -> torch.Generator:
        """The torch generator (made on first use)."""
        if self._generator is None:
            g = torch.Generator(device=self._device)
            g.manual_seed(int(self._torch_seed))  # type: ignore[arg-type]
            self._generator = g
        return self._generator


def _streams(seq: np.random.SeedSequence, device: str | torch.device) -> Streams:
    np_seq, torch_seq = seq.spawn(2)
    seed = int(torch_seq.generate_state(1, np.uint64)[0])
    return Streams(np.random.default_rng(np_seq), torch_seed=seed, device=device)


def server_streams(
    seed: int, round_index: int, device: str | torch.device = "cpu"
) -> Streams:
    """The server's generators in round ``round_index`` of a run.

    Parameters
    ----------
    seed : int
        The run's seed (>= 0).
    round_index : int
        The round (>= 0).
    device : str or torch.device
        Device of the torch generator.

    Returns
    -------
    Streams
        Generators derived from ``SeedSequence(seed, spawn_key=(round_index,))``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``seed`` or ``round_index`` is not a non-negative integer.
    """
    seed = check_count("seed", seed, minimum=0)
    round_index = check_count("round_index", round_index, minimum=0)
    return _streams(np.random.SeedSequence(seed, spawn_key=(round_index,)), device)


def client_streams(
    seed: int, round_index: int, client: int, device: str | torch.device = "cpu"
) -> Streams:
    """Client ``client``'s generators in round ``round_index`` of a run.

    Parameters
    ----------
    seed : int
        The run's seed (>= 0).
    round_index : int
        The round (>= 0).
    client : int
        The client's index in the federation (>= 0).
    device : str or torch.device
        Device of the torch generator.

    Returns
    -------
    Streams
        Generators derived from
        ``SeedSequence(seed, spawn_key=(round_index, CLIENT_DOMAIN, client))``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If an argument is not a non-negative integer.
    """
    seed = check_count("seed", seed, minimum=0)
    round_index = check_count("round_index", round_index, minimum=0)
    client = check_count("client", client, minimum=0)
    key = (round_index, CLIENT_DOMAIN, client)
    return _streams(np.random.SeedSequence(seed, spawn_key=key), device)


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
        Device of the torch generators.
    """

    def __init__(
        self,
        seed: int,
        round_index: int,
        clients: Sequence[int],
        device: str | torch.device = "cpu",
    ) -> None:
        self.seed = seed
        self.round_index = round_index
        self.clients = [int(k) for k in clients]
        self.device = device
        self._made: dict[int, Streams] = {}

    def part(self, start: int, stop: int) -> CohortStreams:
        """The streams of tasks ``start:stop`` (for one share of a split cohort)."""
        return CohortStreams(
            self.seed, self.round_index, self.clients[start:stop], self.device
        )

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Ship the keys, not the generators: the receiver makes its own.
        return (
            CohortStreams,
            (self.seed, self.round_index, self.clients, str(self.device)),
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
            self._made[i] = client_streams(
                self.seed, self.round_index, self.clients[i], self.device
            )
        return self._made[i]
