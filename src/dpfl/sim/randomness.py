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

from dataclasses import dataclass

import numpy as np
import torch

from dpfl._validate import check_count

__all__ = ["CLIENT_DOMAIN", "Streams", "client_streams", "server_streams"]

#: Second entry of every client key (server children use 0 and 1).
CLIENT_DOMAIN = 2


@dataclass(frozen=True)
class Streams:
    """The two generators of one party in one round.

    Attributes
    ----------
    rng : numpy.random.Generator
        For index draws (participants, batches, orders).
    generator : torch.Generator
        For tensor draws (noise), on the party's device.
    """

    rng: np.random.Generator
    generator: torch.Generator


def _streams(seq: np.random.SeedSequence, device: str | torch.device) -> Streams:
    np_seq, torch_seq = seq.spawn(2)
    generator = torch.Generator(device=device)
    generator.manual_seed(int(torch_seq.generate_state(1, np.uint64)[0]))
    return Streams(np.random.default_rng(np_seq), generator)


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
