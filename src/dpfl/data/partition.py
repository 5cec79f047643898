"""Partitions of a dataset's rows among clients.

Every function takes an explicit :class:`numpy.random.Generator` and returns a
list of int64 index arrays, one per client. Partitions are disjoint and, except
where stated, cover every row. :func:`dpfl.data.federate.federate` applies
one by name and wraps the arrays in a
:class:`~dpfl.data.dataset.FederatedDataset`.

References
----------
.. [1] McMahan, Moore, Ramage, Hampson, Agüera y Arcas. Communication-efficient
   learning of deep networks from decentralized data. AISTATS 2017 (label
   shards).
.. [2] Hsu, Qi, Brown. Measuring the effects of non-identical data distribution
   for federated visual classification. 2019 (Dirichlet label skew).
.. [3] Yurochkin et al. Bayesian nonparametric federated learning of neural
   networks. ICML 2019 (per-class Dirichlet split over clients).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpfl._validate import check_count, check_positive
from dpfl.errors import DpflError, InvalidParameterError

__all__ = [
    "PARTITIONS",
    "dirichlet",
    "dirichlet_per_client",
    "equal_size",
    "iid",
    "label_subsets",
    "natural",
    "shards",
]

PARTITIONS = (
    "iid",
    "shards",
    "dirichlet",
    "dirichlet-per-client",
    "equal-size",
    "natural",
    "label-subsets",
)


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise InvalidParameterError(
            f"rng must be a numpy.random.Generator; got {type(rng).__name__}"
        )
    return rng


def _to_numpy(value: Any) -> Any:
    """A torch tensor (any device) as a numpy array; anything else unchanged."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()
    return value


def _check_features(features: Any) -> Any:
    """Return features as float32; lazy sources are kept as they are.

    Arrays, tensors and nested lists are converted (without a copy when
    already a float32 numpy array).
    """
    features = _to_numpy(features)
    if not isinstance(features, np.ndarray) and all(
        hasattr(features, a) for a in ("shape", "dtype", "nbytes", "__getitem__")
    ):
        return features  # a LazyFeatures source
    try:
        arr = np.asarray(features)
    except (TypeError, ValueError) as err:
        raise InvalidParameterError(
            f"features must be a numeric array (N, ...); got "
            f"{type(features).__name__}: {err}"
        ) from None
    if arr.ndim < 1 or not (
        np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_
    ):
        raise InvalidParameterError(
            f"features must be a numeric array (N, ...); got dtype {arr.dtype}, "
            f"shape {arr.shape}"
        )
    return arr.astype(np.float32, copy=False)


def _check_labels(labels: object) -> np.ndarray:
    arr = np.asarray(_to_numpy(labels))
    if arr.ndim == 1 and arr.size and np.issubdtype(arr.dtype, np.floating):
        # Labels stored as floats (1.0, 2.0, ...), as CSV and some tensors hold them.
        if np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InvalidParameterError(
            f"labels must be a 1-d integer array; got dtype {arr.dtype}, "
            f"shape {arr.shape}"
        )
    if arr.size and arr.min() < 0:
        raise InvalidParameterError(f"labels must be >= 0; got min {arr.min()}")
    return arr.astype(np.int64, copy=False)


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Split ``n`` rows uniformly at random into ``num_clients`` near-equal parts.

    Sizes differ by at most one; each client's rows are sorted ascending.

    Parameters
    ----------
    n : int
        Number of rows.
    num_clients : int
        Number of clients, ``1 <= num_clients <= n``.
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    list of numpy.ndarray
        Row numbers of each client.

    Raises
    ------
    InvalidParameterError
        On a bad count or generator.
    """
    n = check_count("n", n, minimum=1)
    num_clients = check_count("num_clients", num_clients, minimum=1)
    if num_clients > n:
        raise InvalidParameterError(
            f"num_clients must be <= n ({n}); got {num_clients!r}"
        )
    perm = _check_rng(rng).permutation(n)
    return [np.sort(part) for part in np.array_split(perm, num_clients)]


def _label_sorted(
    y: np.ndarray, rows: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """``rows`` shuffled, then stably sorted by label (ties in random order)."""
    perm = rng.permutation(rows)
    return perm[np.argsort(y[perm], kind="stable")]


def shards(
    labels: np.ndarray,
    num_clients: int,
    shards_per_client: int,
    rng: np.random.Generator,
    *,
    records_per_client: int | None = None,
    allow_repeats: bool = False,
) -> list[np.ndarray]:
    """McMahan et al.'s label shards: sort by label, cut into shards, deal them.

    Rows are shuffled, stably sorted by label (so ties are in random order),
    cut into ``num_clients * shards_per_client`` contiguous shards of near-equal
    size, and each client receives ``shards_per_client`` shards chosen at
    random without replacement. With MNIST, 100 clients and 2 shards of 300,
    most clients see two digits [1]_; the f-DP paper uses 4 shards of 150.

    With ``records_per_client`` every shard has exactly
    ``records_per_client / shards_per_client`` rows. One *pass* sorts the
    rows (after leaving out a random ``n mod shard_size`` of them) and cuts
    them into ``n // shard_size`` shards, dealt in random order. When the
    clients need more shards than one pass has, ``allow_repeats=True`` makes
    further passes, each with a fresh shuffle (so a row meets other
    companions in its next shard), and deals their shards to the next
    clients. This is Geyer, Klein & Nabi's set-up for K = 1,000 and 10,000
    clients of 600 MNIST images ("data points are repeated", §4 of [2]_):
    every client still holds two label-sorted shards (two labels when each
    label's count is a multiple of the shard size), and a row is used at most
    ``ceil(K * shards_per_client / (n // shard_size))`` times (exactly that
    many when the division is exact and ``shard_size`` divides ``n``). A row
    then belongs to several clients, so record-level guarantees must count
    its multiplicity; when a pass's shard count is not a multiple of
    ``shards_per_client``, the client that straddles two passes may even hold
    a row twice.

    Parameters
    ----------
    labels : numpy.ndarray
        Integer labels of the rows.
    num_clients : int
        Number of clients.
    shards_per_client : int
        Shards given to each client.
    rng : numpy.random.Generator
        Source of randomness.
    records_per_client : int, optional
        Rows per client, a multiple of ``shards_per_client``, at most the
        number of rows. Default: all rows are dealt (shards of near-equal
        size).
    allow_repeats : bool, optional
        Reuse rows when ``num_clients * records_per_client`` exceeds the
        number of rows (needs ``records_per_client``). Default False.

    Returns
    -------
    list of numpy.ndarray
        Row numbers of each client, sorted ascending.

    Raises
    ------
    InvalidParameterError
        If there are fewer rows than shards (and no repeats are allowed), on
        ``allow_repeats`` without ``records_per_client``, or on bad counts.

    References
    ----------
    .. [1] McMahan et al., AISTATS 2017, §3.
    .. [2] Geyer, Klein, Nabi. Differentially private federated learning: a
       client level perspective. 2017, §4.
    """
    y = _check_labels(labels)
    num_clients = check_count("num_clients", num_clients, minimum=1)
    shards_per_client = check_count("shards_per_client", shards_per_client, minimum=1)
    rng = _check_rng(rng)
    num_shards = num_clients * shards_per_client
    if records_per_client is None:
        if allow_repeats:
            raise InvalidParameterError(
                "allow_repeats for partition 'shards' needs records_per_client "
                "(the shard size is records_per_client / shards_per_client); got None"
            )
        if num_shards > y.size:
            raise InvalidParameterError(
                f"num_clients * shards_per_client must be <= number of rows "
                f"({y.size}); got {num_shards}"
            )
        order = _label_sorted(y, np.arange(y.size), rng)
        pieces = np.array_split(order, num_shards)
        deal = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
        return [np.sort(np.concatenate([pieces[s] for s in row])) for row in deal]
    d = check_count("records_per_client", records_per_client, minimum=1)
    if d % shards_per_client or d > y.size:
        raise InvalidParameterError(
            f"records_per_client must be a multiple of shards_per_client "
            f"({shards_per_client}) and <= number of rows ({y.size}); got {d}"
        )
    size = d // shards_per_client
    per_pass = y.size // size
    if num_shards > per_pass and not allow_repeats:
        raise InvalidParameterError(
            f"num_clients * records_per_client must be <= number of rows "
            f"({y.size}) unless allow_repeats=True; got {num_clients * d}"
        )
    passes = []
    for _ in range(-(-num_shards // per_pass)):
        kept = rng.permutation(y.size)[: per_pass * size]
        cut = _label_sorted(y, kept, rng).reshape(per_pass, size)
        passes.append(cut[rng.permutation(per_pass)])
    block = np.concatenate(passes)[:num_shards].reshape(num_clients, d)
    block.sort(axis=1)
    return list(block)


def label_subsets(
    labels: np.ndarray,
    num_clients: int,
    labels_per_client: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Clients of near-equal size, each holding exactly ``labels_per_client`` labels.

    MS-PAFL's set-up (Li et al., arXiv 2509.25906, §V-B): "the training samples
    are uniformly distributed across clients, with each client holding only a
    subset of the labels". The ``num_clients * labels_per_client`` client-label
    *slots* are shared among the labels in proportion to their row counts
    (largest remainder; every label at least one slot, at most one per client),
    each label's rows are shuffled and split evenly over its slots, and the
    slots are dealt so that every client gets ``labels_per_client`` distinct
    labels, the clients in random order. A slot holds about ``n / (num_clients
    * labels_per_client)`` rows whatever its label, so clients are of near-equal
    size; every row is dealt once.

    Unlike :func:`shards`, a client never gets two pieces of one label nor a
    piece that straddles two labels. On Adult (two labels, 24% ">50K") with one
    label per client, about 24 of 100 clients hold only ">50K" rows.

    Parameters
    ----------
    labels : numpy.ndarray
        Integer labels of the rows.
    num_clients : int
        Number of clients.
    labels_per_client : int
        Distinct labels of each client, at most the number of labels; with
        ``num_clients * labels_per_client`` at least the number of labels (so
        every label is dealt).
    rng : numpy.random.Generator
        Source of randomness.

    Returns
    -------
    list of numpy.ndarray
        Row numbers of each client, sorted ascending.

    Raises
    ------
    InvalidParameterError
        On bad counts, more labels per client than labels, too few slots for
        every label, or fewer rows of a label than its slots.
    """
    y = _check_labels(labels)
    k = check_count("num_clients", num_clients, minimum=1)
    per = check_count("labels_per_client", labels_per_client, minimum=1)
    rng = _check_rng(rng)
    classes, counts = np.unique(y, return_counts=True)
    if per > classes.size:
        raise InvalidParameterError(
            f"labels_per_client must be <= the number of labels ({classes.size}); "
            f"got {per}"
        )
    total = k * per
    if total < classes.size:
        raise InvalidParameterError(
            f"num_clients * labels_per_client must be >= the number of labels "
            f"({classes.size}), so that every label is dealt; got {total}"
        )
    share = counts / counts.sum() * total
    slots = np.ones(classes.size, dtype=np.int64)
    for _ in range(total - classes.size):  # largest remainder, at most k a label
        gap = np.where(slots < k, share - slots, -np.inf)
        slots[int(np.argmax(gap))] += 1
    short = np.flatnonzero(counts < slots)
    if short.size:
        c = short[0]
        raise InvalidParameterError(
            f"label {classes[c]} has {counts[c]} rows for {slots[c]} client slots; "
            "use fewer clients or labels_per_client"
        )
    # slot s of the label-sorted slots goes to client s mod k: a label's slots
    # are contiguous and at most k, so no client gets one label twice
    owner = rng.permutation(k)[np.arange(total) % k]
    pieces: list[list[np.ndarray]] = [[] for _ in range(k)]
    start = 0
    for c, cls in enumerate(classes):
        rows = rng.permutation(np.flatnonzero(y == cls))
        for j, piece in enumerate(np.array_split(rows, slots[c])):
            pieces[owner[start + j]].append(piece)
        start += slots[c]
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in pieces]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    beta: float,
    rng: np.random.Generator,
    *,
    min_size: int = 1,
    max_tries: int = 1000,
) -> list[np.ndarray]:
    """Dirichlet(β) label skew: each class is split over clients by Dir(β·1).

    For every class c, proportions ``p_c ~ Dir(β, …, β)`` over the clients are
    drawn and the class's (shuffled) rows are cut at the cumulative
    proportions [3]_. Small β gives each client few classes; as β → ∞ every
    client's label distribution approaches the global one. The whole draw is
    repeated until every client has at least ``min_size`` rows. Client sizes
    are unequal (that is part of the skew); use :func:`dirichlet_per_client`
    for equal sizes.

    Parameters
    ----------
    labels : numpy.ndarray
        Integer labels of the rows.
    num_clients : int
        Number of clients.
    beta : float
        Concentration, > 0.
    rng : numpy.random.Generator
        Source of randomness.
    min_size : int, optional
        Least number of rows per client (default 1).
    max_tries : int, optional
        Redraws allowed before giving up (default 1000).

    Returns
    -------
    list of numpy.ndarray
        Row numbers of each client, sorted ascending; disjoint, covering.

    Raises
    ------
    InvalidParameterError
        On bad parameters.
    DpflError
        If no draw met ``min_size`` within ``max_tries``.

    References
    ----------
    .. [3] Yurochkin et al., ICML 2019; Hsu, Qi, Brown 2019.
    """
    y = _check_labels(labels)
    num_clients = check_count("num_clients", num_clients, minimum=1)
    beta = check_positive("beta", beta)
    min_size = check_count("min_size", min_size, minimum=0)
    max_tries = check_count("max_tries", max_tries, minimum=1)
    rng = _check_rng(rng)
    if num_clients * min_size > y.size:
        raise InvalidParameterError(
            f"num_clients * min_size must be <= number of rows ({y.size}); got "
            f"{num_clients * min_size}"
        )
    classes = np.unique(y)
    by_class = [np.flatnonzero(y == c) for c in classes]
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for rows in by_class:
            rows = rng.permutation(rows)
            p = rng.dirichlet(np.full(num_clients, beta))
            cuts = (np.cumsum(p)[:-1] * rows.size).astype(np.int64)
            for k, piece in enumerate(np.split(rows, cuts)):
                parts[k].append(piece)
        out = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(o) for o in out) >= min_size:
            return out
    raise DpflError(
        f"dirichlet: no partition with min_size={min_size} found in {max_tries} "
        f"draws (num_clients={num_clients}, beta={beta}); lower min_size or "
        "raise beta"
    )


def dirichlet_per_client(
    labels: np.ndarray,
    num_clients: int,
    records_per_client: int,
    beta: float,
    rng: np.random.Generator,
    *,
    proportions: list[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Equal-size clients with Dirichlet label mixtures (Hsu, Qi, Brown 2019).

    Client k draws ``q_k ~ Dir(β·1)`` and ``records_per_client`` labels from
    ``q_k``, then takes rows of those labels without replacement from what is
    left; a label whose rows have run out is dropped from ``q_k`` and the rest
    renormalised. This is the federated-f-dp paper's CIFAR-10 set-up (100
    clients × 500 images, β = 0.5).

    Parameters
    ----------
    labels : numpy.ndarray
        Integer labels of the rows.
    num_clients : int
        Number of clients.
    records_per_client : int
        Rows per client; ``num_clients * records_per_client <= len(labels)``.
    beta : float
        Concentration, > 0.
    rng : numpy.random.Generator
        Source of randomness.
    proportions : list, optional
        If given (an empty list), each client's drawn ``q_k`` is appended to
        it, so that a test set can be drawn from ``q_k`` itself (the paper's
        θ^te ~ Multinomial(200, q); see :func:`client_test_split`).

    Returns
    -------
    list of numpy.ndarray
        Row numbers of each client, sorted ascending; disjoint.

    Raises
    ------
    InvalidParameterError
        On bad parameters.

    References
    ----------
    .. [2] Hsu, Qi, Brown 2019; federated-f-dp paper §4.2.
    """
    y = _check_labels(labels)
    num_clients = check_count("num_clients", num_clients, minimum=1)
    d = check_count("records_per_client", records_per_client, minimum=1)
    beta = check_positive("beta", beta)
    rng = _check_rng(rng)
    if num_clients * d > y.size:
        raise InvalidParameterError(
            f"num_clients * records_per_client must be <= number of rows "
            f"({y.size}); got {num_clients * d}"
        )
    num_classes = int(y.max()) + 1
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in range(num_classes)]
    left = np.array([p.size for p in pools], dtype=np.int64)
    used = np.zeros(num_classes, dtype=np.int64)
    out = []
    for _ in range(num_clients):
        q = rng.dirichlet(np.full(num_classes, beta))
        if proportions is not None:
            proportions.append(q)
        want = np.zeros(num_classes, dtype=np.int64)
        need = d
        avail = left.copy()
        while need:
            w = np.where(avail > 0, q, 0.0)
            if w.sum() <= 0:  # q put all its mass on exhausted classes
                w = (avail > 0).astype(float)
            draw = rng.multinomial(need, w / w.sum())
            take = np.minimum(draw, avail)
            want += take
            avail -= take
            need -= int(take.sum())
        rows = [pools[c][used[c] : used[c] + want[c]] for c in np.flatnonzero(want)]
        used += want
        left -= want
        out.append(np.sort(np.concatenate(rows)))
    return out


def equal_size(
    n: int,
    num_clients: int,
    records_per_client: int,
    rng: np.random.Generator,
    *,
    allow_repeats: bool = False,
) -> list[np.ndarray]:
    """Give each client exactly ``records_per_client`` random rows (the d of [4]).

    Rows are a random permutation cut into consecutive blocks; the returned
    arrays are views into one shared index array, so 23,264 clients cost one
    array of 697,920 int64 (5.6 MB) plus the view objects. Rows not needed
    (``n - num_clients * d``) are left out.

    Parameters
    ----------
    n : int
        Number of rows.
    num_clients : int
        Number of clients.
    records_per_client : int
        Rows per client (d).
    rng : numpy.random.Generator
        Source of randomness.
    allow_repeats : bool, optional
        If ``num_clients * d > n``, reuse rows by concatenating fresh
        permutations (as the client-level DP-FedAvg paper does for 1,000 and
        10,000 clients × 600 MNIST images). A row then belongs to several
        clients (and, across a permutation boundary, possibly twice to one),
        so record-level guarantees must count its multiplicity. Default False.

    Returns
    -------
    list of numpy.ndarray
        Row numbers of each client, sorted ascending within the client.

    Raises
    ------
    InvalidParameterError
        If ``num_clients * d > n`` and ``allow_repeats`` is False, or on bad
        counts.

    References
    ----------
    .. [4] random-participation paper §6: d = 30 records, 23,264 EMNIST clients.
    """
    n = check_count("n", n, minimum=1)
    num_clients = check_count("num_clients", num_clients, minimum=1)
    d = check_count("records_per_client", records_per_client, minimum=1)
    rng = _check_rng(rng)
    total = num_clients * d
    if total > n and not allow_repeats:
        raise InvalidParameterError(
            f"num_clients * records_per_client must be <= n ({n}) unless "
            f"allow_repeats=True; got {total}"
        )
    reps = -(-total // n)
    perm = np.concatenate([rng.permutation(n) for _ in range(reps)])[:total]
    block = perm.reshape(num_clients, d)
    block.sort(axis=1)
    return list(block)


def natural(
    client_ids: Any,
    num_clients: int | None = None,
    rng: np.random.Generator | None = None,
) -> list[np.ndarray]:
    """The partition the data came with: one client per distinct id.

    ``client_ids[i]`` names the owner of row ``i`` (a writer of FEMNIST, the
    value of a CSV file's client column, ...). Clients are ordered by sorted
    id. With ``num_clients`` smaller than the number of ids, that many ids are
    drawn uniformly at random without replacement (as LEAF samples a fraction
    of its users) and the rows of the others are left out.

    Parameters
    ----------
    client_ids : array-like
        One id per row (integers or strings), shape ``(N,)``.
    num_clients : int, optional
        Number of clients to keep; default all.
    rng : numpy.random.Generator, optional
        Source of randomness; required when ``num_clients`` keeps fewer
        clients than there are ids.

    Returns
    -------
    list of numpy.ndarray
        Row numbers of each client, ascending.

    Raises
    ------
    InvalidParameterError
        If ``client_ids`` is not 1-d, or ``num_clients`` exceeds the number of
        distinct ids.
    """
    ids = np.asarray(_to_numpy(client_ids))
    if ids.ndim != 1 or ids.size == 0:
        raise InvalidParameterError(
            f"client_ids must be a non-empty 1-d array; got shape {ids.shape}"
        )
    uniq, owner = np.unique(ids, return_inverse=True)
    order = np.argsort(owner, kind="stable")
    bounds = np.cumsum(np.bincount(owner, minlength=uniq.size))[:-1]
    parts = np.split(order.astype(np.int64), bounds)
    if num_clients is None or num_clients == uniq.size:
        return parts
    num_clients = check_count("num_clients", num_clients, minimum=1)
    if num_clients > uniq.size:
        raise InvalidParameterError(
            f"num_clients must be <= the {uniq.size} distinct client ids; got "
            f"{num_clients} (use num_clients=None for all of them)"
        )
    keep = np.sort(_check_rng(rng).choice(uniq.size, num_clients, replace=False))
    return [parts[i] for i in keep]
