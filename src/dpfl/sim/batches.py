"""Per-client local mini-batches, drawn and gathered for a whole cohort at once.

Local training of several clients runs as one batched computation over
tensors shaped ``[clients, batch, ...]``; these helpers draw the positions of
each client's E mini-batches (with or without replacement) and gather them
from the shared federated arrays.
"""

from __future__ import annotations

import numpy as np
import torch

from dpfl._validate import check_count
from dpfl.data.dataset import FederatedDataset
from dpfl.errors import InvalidParameterError

__all__ = ["draw_local_batches", "gather_batches"]


def draw_local_batches(
    rng: np.random.Generator,
    sizes: np.ndarray,
    *,
    batch_size: int,
    steps: int,
    replacement: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Positions of ``steps`` mini-batches of ``batch_size`` records per client.

    Parameters
    ----------
    rng : numpy.random.Generator
        Source of randomness.
    sizes : numpy.ndarray
        Records held by each client of the cohort, shape ``(m,)``.
    batch_size : int
        b >= 1.
    steps : int
        E >= 1: each step draws a fresh batch.
    replacement : bool
        True: b positions uniform with replacement (WR). False: a uniform size-b
        subset without replacement (WOR); a client with fewer than b records
        uses all of them (the rest of the row is padding with mask 0).

    Returns
    -------
    tuple of numpy.ndarray
        ``positions`` (int64, ``[steps, m, batch_size]``, positions inside each
        client's record list; padding is 0) and ``mask`` (float32, same shape,
        1 for a real record).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On bad sizes or counts, or a client with no records.
    """
    b = check_count("batch_size", batch_size, minimum=1)
    e = check_count("steps", steps, minimum=1)
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.ndim != 1 or (sizes.size and sizes.min() < 1):
        raise InvalidParameterError(
            f"every client of the cohort needs >= 1 record; got sizes {sizes[:10]}"
        )
    m = sizes.shape[0]
    if replacement:
        pos = np.floor(rng.random((e, m, b)) * sizes[None, :, None]).astype(np.int64)
        return np.minimum(pos, sizes[None, :, None] - 1), np.ones((e, m, b), np.float32)
    pos = np.zeros((e, m, b), dtype=np.int64)
    mask = np.zeros((e, m, b), dtype=np.float32)
    for s in range(e):
        for j, n in enumerate(sizes.tolist()):
            k = min(b, n)
            pos[s, j, :k] = rng.choice(n, size=k, replace=False)
            mask[s, j, :k] = 1.0
    return pos, mask


def gather_batches(
    dataset: FederatedDataset,
    clients: np.ndarray,
    positions: np.ndarray,
    device: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and labels ``[m, b, ...]`` of per-client positions ``[m, b]``."""
    rows = np.stack(
        [
            np.asarray(dataset.client_indices[int(k)], dtype=np.int64)[positions[j]]
            for j, k in enumerate(clients)
        ]
    )
    x_np, y_np = dataset.take(rows.reshape(-1))
    x = torch.as_tensor(np.ascontiguousarray(x_np)).to(device)
    y = torch.as_tensor(np.ascontiguousarray(y_np)).to(device)
    return x.reshape(*rows.shape, *x.shape[1:]), y.reshape(*rows.shape, *y.shape[1:])
