"""Procedural federated data for any number of clients.

:func:`synthetic` is FedProx's Synthetic(α, β) benchmark, generated in
vectorised chunks of clients straight into one preallocated float32 array.
:func:`synthetic_images` is an image-shaped classification task whose pixels
are computed on demand from (seed, row, pixel), so 700k records of 28×28 hold
only their labels and ten templates in memory.

Both are keyed by client position: the randomness of client ``k`` comes from
``SeedSequence(seed, spawn_key=(chunk,))`` of the chunk that holds it, so the
first K clients of a run with more clients are the same as a run with K
clients (given the same ``records_per_client``).

References
----------
.. [1] Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith. Federated optimization in
   heterogeneous networks (FedProx). MLSys 2020, §5.1 and the reference
   generator ``data/synthetic_*/generate_niid.py`` of github.com/litian96/FedProx.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpfl._validate import check_count, check_nonnegative, check_positive
from dpfl.data.dataset import ClientIndices, FederatedDataset
from dpfl.errors import InvalidParameterError

__all__ = ["ProceduralImages", "synthetic", "synthetic_images"]

_CHUNK = 2048  # clients generated together; fixed so that outputs do not depend on it


def _runs(n_rows: int, sizes: np.ndarray) -> ClientIndices:
    """Clients holding consecutive rows of ``0 .. n_rows - 1``, ``sizes[k]`` each."""
    return ClientIndices.from_sizes(np.arange(n_rows, dtype=np.int64), sizes)


def _rng(seed_seq: np.random.SeedSequence) -> np.random.Generator:
    return np.random.default_rng(seed_seq)


def _chunk_seeds(seed: int, chunk: int) -> list[np.random.SeedSequence]:
    # One stream per quantity so that each is client-major and prefix-stable.
    return np.random.SeedSequence(seed, spawn_key=(chunk,)).spawn(8)


def synthetic(
    *,
    num_clients: int,
    alpha: float,
    beta: float,
    dim: int = 60,
    num_classes: int = 10,
    records_per_client: int | None = None,
    iid: bool = False,
    seed: int = 0,
    test_records_per_client: int = 0,
) -> FederatedDataset:
    """FedProx's Synthetic(α, β): per-client softmax models and input means.

    For client k: ``u_k ~ N(0, α²)``, ``W_k ~ N(u_k, 1)`` (num_classes × dim),
    ``b_k ~ N(u_k, 1)``; ``B_k ~ N(0, β²)``, ``v_k ~ N(B_k, 1)`` (dim);
    records ``x ~ N(v_k, Σ)`` with ``Σ = diag(j^-1.2)``, j = 1..dim, and
    ``y = argmax softmax(W_k x + b_k) = argmax (W_k x + b_k)``. α controls how
    much the local models differ, β how much the local inputs differ. With
    ``iid=True`` all clients share one ``W, b ~ N(0, 1)`` and ``v_k = 0``
    (FedProx's Synthetic-IID); α and β are then unused.

    α and β are *standard deviations*, as in the FedProx reference generator
    (``np.random.normal(0, alpha, …)``); the paper writes ``N(0, α)``. The two
    readings agree for the usual Synthetic(0,0), (0.5,0.5) and (1,1).

    Parameters
    ----------
    num_clients : int
        Number of clients K.
    alpha : float
        Model heterogeneity, >= 0.
    beta : float
        Input heterogeneity, >= 0.
    dim : int, optional
        Input dimension (default 60).
    num_classes : int, optional
        Number of classes (default 10).
    records_per_client : int, optional
        Training records per client; None draws FedProx's unbalanced sizes
        ``int(LogNormal(4, 2)) + 50`` (heavy-tailed: mean ≈ 453).
    iid : bool, optional
        FedProx's Synthetic-IID (default False).
    seed : int, optional
        Seed (default 0).
    test_records_per_client : int, optional
        Records per client drawn from the same client distribution for
        personalised evaluation (stored as the test set with
        ``client_test_indices``); default 0 (no test set).

    Returns
    -------
    FederatedDataset
        Features float32 ``(N, dim)`` stored client after client, so
        :meth:`FederatedDataset.client` returns views.

    Raises
    ------
    InvalidParameterError
        On bad parameters.

    Notes
    -----
    Memory is the output plus one chunk of 2,048 clients: 23,264 clients × 30
    records × 60 dims is 167.5 MB of features (+5.6 MB labels, +5.6 MB
    indices).

    References
    ----------
    .. [1] Li et al., FedProx, MLSys 2020, §5.1.
    """
    num_clients = check_count("num_clients", num_clients, minimum=1)
    alpha = check_nonnegative("alpha", alpha)
    beta = check_nonnegative("beta", beta)
    dim = check_count("dim", dim, minimum=1)
    num_classes = check_count("num_classes", num_classes, minimum=2)
    seed = check_count("seed", seed, minimum=0)
    m = check_count("test_records_per_client", test_records_per_client, minimum=0)
    chunks = range(0, num_clients, _CHUNK)
    if records_per_client is None:
        sizes = np.concatenate(
            [
                np.random.default_rng(_chunk_seeds(seed, c // _CHUNK)[0])
                .lognormal(4.0, 2.0, min(_CHUNK, num_clients - c))
                .astype(np.int64)
                + 50
                for c in chunks
            ]
        )
    else:
        d = check_count("records_per_client", records_per_client, minimum=1)
        sizes = np.full(num_clients, d, dtype=np.int64)
    n = int(sizes.sum())
    x_all = np.empty((n, dim), dtype=np.float32)
    y_all = np.empty(n, dtype=np.int64)
    x_test = np.empty((num_clients * m, dim), dtype=np.float32)
    y_test = np.empty(num_clients * m, dtype=np.int64)
    std = (np.arange(1, dim + 1, dtype=np.float64) ** -0.6).astype(np.float32)
    if iid:
        g = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2**32,)))
        w_global = g.standard_normal((num_classes, dim), dtype=np.float32)
        b_global = g.standard_normal(num_classes, dtype=np.float32)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for c in chunks:
        c_end = min(c + _CHUNK, num_clients)
        nc = c_end - c
        _, s_u, s_bb, s_v, s_w, s_b, s_x, s_test = _chunk_seeds(seed, c // _CHUNK)
        if iid:
            v = np.zeros((nc, dim), dtype=np.float32)
            w = np.broadcast_to(w_global, (nc, num_classes, dim))
            b = np.broadcast_to(b_global, (nc, num_classes))
        else:
            u = _rng(s_u).normal(0.0, alpha, nc).astype(np.float32)
            big_b = _rng(s_bb).normal(0.0, beta, nc).astype(np.float32)
            v = big_b[:, None] + _rng(s_v).standard_normal((nc, dim), dtype=np.float32)
            w = u[:, None, None] + _rng(s_w).standard_normal(
                (nc, num_classes, dim), dtype=np.float32
            )
            b = u[:, None] + _rng(s_b).standard_normal(
                (nc, num_classes), dtype=np.float32
            )
        lo, hi = int(starts[c]), int(starts[c_end])
        _fill(x_all[lo:hi], y_all[lo:hi], sizes[c:c_end], v, w, b, std, s_x)
        if m:
            _fill(
                x_test[c * m : c_end * m],
                y_test[c * m : c_end * m],
                np.full(nc, m, dtype=np.int64),
                v,
                w,
                b,
                std,
                s_test,
            )
    tag = "iid" if iid else f"{alpha:g},{beta:g}"
    return FederatedDataset(
        features=x_all,
        labels=y_all,
        client_indices=_runs(n, sizes),
        num_classes=num_classes,
        name=f"synthetic({tag})",
        input_shape=(dim,),
        test_features=x_test if m else None,
        test_labels=y_test if m else None,
        client_test_indices=_runs(num_clients * m, np.full(num_clients, m))
        if m
        else None,
    )


def _fill(
    x_out: np.ndarray,
    y_out: np.ndarray,
    sizes: np.ndarray,
    v: np.ndarray,
    w: np.ndarray,
    b: np.ndarray,
    std: np.ndarray,
    seed_seq: np.random.SeedSequence,
) -> None:
    """Draw x ~ N(v_k, diag(std²)) into ``x_out`` and label by argmax(W_k x + b_k)."""
    g = np.random.default_rng(seed_seq)
    g.standard_normal(out=x_out, dtype=np.float32)
    x_out *= std
    owner = np.repeat(np.arange(len(sizes)), sizes)
    if sizes.size and np.all(sizes == sizes[0]):
        d = int(sizes[0])
        x3 = x_out.reshape(len(sizes), d, -1)
        x3 += v[:, None, :]
        logits = x3 @ np.swapaxes(w, 1, 2) + b[:, None, :]
        y_out[:] = logits.argmax(axis=2).reshape(-1)
        return
    x_out += v[owner]
    step = 8192
    for a in range(0, len(owner), step):
        o = owner[a : a + step]
        logits = np.einsum("rd,rcd->rc", x_out[a : a + step], w[o]) + b[o]
        y_out[a : a + step] = logits.argmax(axis=1)


# ---------------------------------------------------------------------------
# Procedural images


_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """Vectorised SplitMix64 finaliser (uint64 in, uint64 out; wraps mod 2^64)."""
    z = z + _M1
    z = (z ^ (z >> np.uint64(30))) * _M2
    z = (z ^ (z >> np.uint64(27))) * _M3
    return z ^ (z >> np.uint64(31))


def _hash_normal(key: int, rows: np.ndarray, size: int) -> np.ndarray:
    """Return standard normals for (row, pixel), a pure function of (key, row, pixel).

    Box–Muller on two 24-bit uniforms from one SplitMix64 hash per pixel.
    """
    ctr = rows.astype(np.uint64)[:, None] * np.uint64(size) + np.arange(
        size, dtype=np.uint64
    )
    h = _splitmix64(ctr ^ np.uint64(key))
    scale = np.float32(2.0**-24)
    u1 = ((h >> np.uint64(40)).astype(np.float32) + np.float32(0.5)) * scale
    u2 = ((h >> np.uint64(16)) & np.uint64(0xFFFFFF)).astype(np.float32) * scale
    return np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(2 * np.pi) * u2)


class ProceduralImages:
    """Lazy image features: ``clip(template[label] + noise · z, 0, 1)``.

    ``z`` is a standard normal per (row, pixel) computed by hashing
    ``(key, row, pixel)``, so any set of rows is produced in any order, in
    any batch, with the same values, and nothing but the labels and the
    templates is stored.

    Parameters
    ----------
    templates : numpy.ndarray
        ``(num_classes, *shape)`` float32 in [0, 1].
    labels : numpy.ndarray
        int64 label of every row (shared with the dataset, not copied).
    noise : float
        Standard deviation of the pixel noise.
    key : int
        Hash key (derived from the seed).
    """

    def __init__(
        self, templates: np.ndarray, labels: np.ndarray, noise: float, key: int
    ) -> None:
        self.templates = templates
        self.labels = labels
        self.noise = float(noise)
        self.key = int(key) & 0xFFFFFFFFFFFFFFFF

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the virtual feature array ``(N, *shape)``."""
        return (len(self.labels), *self.templates.shape[1:])

    @property
    def dtype(self) -> np.dtype[Any]:
        """float32."""
        return np.dtype(np.float32)

    @property
    def nbytes(self) -> int:
        """Bytes held: the templates (the labels belong to the dataset)."""
        return int(self.templates.nbytes)

    def __len__(self) -> int:
        """Return the number of rows."""
        return len(self.labels)

    def __getitem__(self, index: Any) -> np.ndarray:
        """Return the records at ``index`` (int, slice or int array)."""
        n = len(self.labels)
        if isinstance(index, slice):
            rows = np.arange(*index.indices(n), dtype=np.int64)
        else:
            rows = np.asarray(index)
            if rows.dtype == bool:
                rows = np.flatnonzero(rows)
            if not np.issubdtype(rows.dtype, np.integer):
                raise IndexError(f"rows must be integers; got dtype {rows.dtype}")
            rows = np.where(rows < 0, rows + n, rows).astype(np.int64)
            if rows.size and (rows.min() < 0 or rows.max() >= n):
                raise IndexError(f"row index out of range [0, {n})")
        flat = rows.reshape(-1)
        pixels = int(np.prod(self.templates.shape[1:]))
        z = _hash_normal(self.key, flat, pixels)
        z *= np.float32(self.noise)
        z += self.templates[self.labels[flat]].reshape(len(flat), pixels)
        np.clip(z, 0.0, 1.0, out=z)
        return z.reshape(*rows.shape, *self.templates.shape[1:])

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """Materialise every record (beware: N × prod(shape) × 4 bytes)."""
        out = self[:]
        return out if dtype is None else out.astype(dtype)


def _templates(
    rng: np.random.Generator, num_classes: int, shape: tuple[int, ...]
) -> np.ndarray:
    """Smooth class templates: three random Gaussian blobs per class and channel."""
    channels, height, width = shape
    yy, xx = np.meshgrid(
        np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij"
    )
    out = np.zeros((num_classes, channels, height, width))
    for c in range(num_classes):
        for ch in range(channels):
            for _ in range(3):
                cy, cx = rng.uniform(0.2, 0.8, 2)
                s = rng.uniform(0.08, 0.2)
                out[c, ch] += np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * s * s))
            out[c, ch] /= out[c, ch].max()
    return out.astype(np.float32)


def synthetic_images(
    *,
    num_clients: int,
    records_per_client: int,
    shape: tuple[int, int, int] = (1, 28, 28),
    num_classes: int = 10,
    seed: int = 0,
    noise: float = 0.5,
    label_concentration: float | None = None,
    test_records_per_client: int = 0,
) -> FederatedDataset:
    """Image-shaped procedural task for federated scale; pixels built on demand.

    Each class has a smooth random template (three Gaussian blobs per channel,
    peak 1); record i is ``clip(template[y_i] + noise · z_i, 0, 1)`` with
    ``z_i`` a standard normal field that is a pure function of
    ``(seed, i, pixel)``. Storage is the int64 labels plus the templates:
    23,264 × 30 records of 28×28 hold 5.6 MB of labels instead of 2.19 GB of
    float32 pixels (or 547 MB of uint8); a round that touches 70 records
    builds just those 70.

    Parameters
    ----------
    num_clients : int
        Number of clients.
    records_per_client : int
        Records per client.
    shape : tuple of int, optional
        ``(channels, height, width)``, default ``(1, 28, 28)``.
    num_classes : int, optional
        Number of classes (default 10).
    seed : int, optional
        Seed (default 0).
    noise : float, optional
        Pixel noise standard deviation (default 0.5).
    label_concentration : float, optional
        If given, client k's labels follow ``q_k ~ Dir(label_concentration·1)``
        (label skew); default None: uniform labels.
    test_records_per_client : int, optional
        Per-client test records from the client's label distribution
        (default 0: no test set).

    Returns
    -------
    FederatedDataset
        Features are a :class:`ProceduralImages` source; rows are stored
        client after client, so client k owns rows ``[k·d, (k+1)·d)``.

    Raises
    ------
    InvalidParameterError
        On bad parameters.
    """
    num_clients = check_count("num_clients", num_clients, minimum=1)
    d = check_count("records_per_client", records_per_client, minimum=1)
    num_classes = check_count("num_classes", num_classes, minimum=2)
    seed = check_count("seed", seed, minimum=0)
    noise = check_nonnegative("noise", noise)
    m = check_count("test_records_per_client", test_records_per_client, minimum=0)
    if len(shape) != 3:
        raise InvalidParameterError(
            f"shape must be (channels, height, width); got {shape!r}"
        )
    shape = tuple(check_count("shape", s, minimum=1) for s in shape)  # type: ignore[assignment]
    s_tmpl, s_lab, s_key = np.random.SeedSequence(seed).spawn(3)
    templates = _templates(np.random.default_rng(s_tmpl), num_classes, shape)
    g = np.random.default_rng(s_lab)
    if label_concentration is None:
        probs = None
    else:
        conc = check_positive("label_concentration", label_concentration)
        probs = g.dirichlet(np.full(num_classes, conc), size=num_clients)
    y = _draw_labels(g, probs, num_clients, d, num_classes)
    key_train, key_test = (int(k) for k in s_key.generate_state(2, np.uint64))
    features = ProceduralImages(templates, y, noise, key_train)
    test_x = test_y = test_idx = None
    if m:
        test_y = _draw_labels(g, probs, num_clients, m, num_classes)
        test_x = ProceduralImages(templates, test_y, noise, key_test)
        test_idx = _runs(num_clients * m, np.full(num_clients, m))
    return FederatedDataset(
        features=features,
        labels=y,
        client_indices=_runs(num_clients * d, np.full(num_clients, d)),
        num_classes=num_classes,
        name="synthetic-images",
        input_shape=tuple(shape),
        test_features=test_x,
        test_labels=test_y,
        client_test_indices=test_idx,
    )


def _draw_labels(
    g: np.random.Generator,
    probs: np.ndarray | None,
    num_clients: int,
    d: int,
    num_classes: int,
) -> np.ndarray:
    if probs is None:
        return g.integers(0, num_classes, num_clients * d, dtype=np.int64)
    cum = np.cumsum(probs, axis=1)
    cum[:, -1] = 1.0
    u = g.random((num_clients, d))
    out = np.empty((num_clients, d), dtype=np.int64)
    for k0 in range(0, num_clients, 4096):  # bound the (k, d, C) comparison
        sl = slice(k0, k0 + 4096)
        out[sl] = (u[sl, :, None] > cum[sl, None, :]).sum(axis=2)
    return out.reshape(-1)
