"""Arrays to a :class:`~dpfl.data.dataset.FederatedDataset`: a named partition, applied.

:func:`federate` partitions shared arrays among clients by one of
:data:`~dpfl.data.partition.PARTITIONS` (or explicit index arrays) and adds
the optional personalised test split of :func:`client_test_split`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpfl._validate import check_count
from dpfl.data.dataset import FederatedDataset
from dpfl.data.partition import (
    PARTITIONS,
    _check_features,
    _check_labels,
    _check_rng,
    _to_numpy,
    dirichlet,
    dirichlet_per_client,
    equal_size,
    iid,
    label_subsets,
    natural,
    shards,
)
from dpfl.errors import InvalidParameterError

__all__ = ["client_test_split", "federate"]


def client_test_split(
    train_labels: np.ndarray,
    client_indices: list[np.ndarray],
    test_labels: np.ndarray,
    records_per_client: int,
    rng: np.random.Generator,
    *,
    proportions: list[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Per-client test rows that follow each client's training label mix.

    Client k with empirical training label distribution π_k (or the given
    ``proportions[k]``) draws label counts
    ``~ Multinomial(records_per_client, π_k)`` and, for each label, that many
    test rows of the label without replacement (with replacement if the label
    has fewer test rows). Clients draw independently, so they may share test
    rows; this is the personalised evaluation of the federated-f-dp paper
    (§4.1: "each client will sample 200 examples with the same label she/he
    has seen in training"; §4.2: θ^te ~ Multinomial(q, 200)).

    Parameters
    ----------
    train_labels : numpy.ndarray
        Labels of the training rows.
    client_indices : list of numpy.ndarray
        Each client's training rows.
    test_labels : numpy.ndarray
        Labels of the test rows.
    records_per_client : int
        Test rows per client.
    rng : numpy.random.Generator
        Source of randomness.
    proportions : list of numpy.ndarray, optional
        Each client's label distribution to draw from instead of its
        empirical one (e.g. the ``q_k`` :func:`dirichlet_per_client` drew).

    Returns
    -------
    list of numpy.ndarray
        Test row numbers of each client, sorted ascending.

    Raises
    ------
    InvalidParameterError
        If a client's label does not occur in the test set, or on bad input.
    """
    ytr = _check_labels(train_labels)
    yte = _check_labels(test_labels)
    m = check_count("records_per_client", records_per_client, minimum=1)
    rng = _check_rng(rng)
    num_classes = int(max(ytr.max(initial=0), yte.max(initial=0))) + 1
    pools = [np.flatnonzero(yte == c) for c in range(num_classes)]
    out = []
    if proportions is not None and len(proportions) != len(client_indices):
        raise InvalidParameterError(
            f"proportions must have one entry per client ({len(client_indices)}); "
            f"got {len(proportions)}"
        )
    for k, rows in enumerate(client_indices):
        if proportions is not None:
            mix = np.zeros(num_classes)
            q = np.asarray(proportions[k], dtype=np.float64)
            mix[: q.size] = q[:num_classes]
        else:
            mix = np.bincount(ytr[rows], minlength=num_classes).astype(np.float64)
        if mix.sum() <= 0:
            raise InvalidParameterError(f"client_indices[{k}] is empty")
        draw = rng.multinomial(m, mix / mix.sum())
        picked = []
        for c in np.flatnonzero(draw):
            pool = pools[c]
            if pool.size == 0:
                raise InvalidParameterError(
                    f"label {c} of client {k} has no rows in test_labels"
                )
            picked.append(rng.choice(pool, int(draw[c]), replace=draw[c] > pool.size))
        out.append(np.sort(np.concatenate(picked)))
    return out


def federate(
    features: Any,
    labels: np.ndarray,
    *,
    partition: str | Sequence[Any] = "iid",
    num_clients: int | None = None,
    client_ids: Any = None,
    seed: int | np.random.Generator = 0,
    num_classes: int | None = None,
    test_features: Any = None,
    test_labels: np.ndarray | None = None,
    client_test_records: int | None = None,
    shards_per_client: int = 2,
    beta: float = 0.5,
    records_per_client: int | None = None,
    min_size: int = 1,
    allow_repeats: bool = False,
    labels_per_client: int = 1,
    name: str = "",
    input_shape: tuple[int, ...] | None = None,
) -> FederatedDataset:
    """Partition shared arrays among clients and wrap them in a FederatedDataset.

    Parameters
    ----------
    features : array-like or LazyFeatures
        Inputs ``(N, ...)``: a numpy array, a torch tensor (any device) or
        nested lists, converted to float32 (float32 numpy arrays and lazy
        sources are kept, not copied).
    labels : array-like
        Integer labels ``(N,)`` (numpy or torch; integral floats such as
        ``1.0`` are accepted).
    partition : str or sequence of index arrays, optional
        ``"iid"``, ``"shards"``, ``"dirichlet"``, ``"dirichlet-per-client"``,
        ``"equal-size"``, ``"label-subsets"`` (each client holds
        ``labels_per_client`` labels, :func:`label_subsets`), ``"natural"``
        (one client per distinct value of
        ``client_ids``; see :func:`natural`), or explicit per-client row
        arrays: any partitioner's output, e.g. a list of index arrays or
        ``[p.indices for p in ...]``. Default ``"iid"``.
    num_clients : int, optional
        Number of clients (required unless ``partition`` is a list or
        ``"natural"``; for ``"natural"`` it draws that many of the ids).
    client_ids : array-like, optional
        Owner of each row, for ``partition="natural"``.
    seed : int or numpy.random.Generator, optional
        Seed or generator for the partition and the test split (default 0).
    num_classes : int, optional
        Defaults to ``max(label) + 1`` over train and test.
    test_features, test_labels : optional
        A shared test set.
    client_test_records : int, optional
        If given, draw that many personalised test rows per client with
        :func:`client_test_split`.
    shards_per_client : int, optional
        For ``"shards"`` (default 2).
    beta : float, optional
        Dirichlet concentration for ``"dirichlet"`` / ``"dirichlet-per-client"``
        (default 0.5).
    records_per_client : int, optional
        For ``"equal-size"``, ``"dirichlet-per-client"`` and ``"shards"``
        (optional there: default, all rows are dealt).
    min_size : int, optional
        For ``"dirichlet"`` (default 1).
    allow_repeats : bool, optional
        For ``"equal-size"`` and ``"shards"`` (default False).
    labels_per_client : int, optional
        For ``"label-subsets"`` (default 1).
    name : str, optional
        Name of the result; defaults to the partition's name.
    input_shape : tuple of int, optional
        Defaults to ``features.shape[1:]``.

    Returns
    -------
    FederatedDataset
        The federated view of the arrays.

    Raises
    ------
    InvalidParameterError
        On an unknown partition or bad parameters.
    """
    features = _check_features(features)
    if test_features is not None:
        test_features = _check_features(test_features)
    y = _check_labels(labels)
    rng = np.random.default_rng(seed)
    # The label mixes a partition drew, when the test split should follow them
    # rather than the clients' empirical mixes ("dirichlet-per-client").
    mixes: list[np.ndarray] | None = None
    if isinstance(partition, str) and partition.lower() == "natural":
        if client_ids is None:
            raise InvalidParameterError(
                "partition 'natural' needs client_ids (the owner of each row); got None"
            )
        if len(client_ids) != y.size:
            raise InvalidParameterError(
                f"client_ids must have one entry per row ({y.size}); got "
                f"{len(client_ids)}"
            )
        parts = natural(client_ids, num_clients, rng)
        label = "natural"
    elif isinstance(partition, str):
        if num_clients is None:
            raise InvalidParameterError(
                f"num_clients is required for partition {partition!r}; got None"
            )
        key = partition.replace("_", "-").lower()
        if key == "iid":
            parts = iid(y.size, num_clients, rng)
        elif key == "shards":
            parts = shards(
                y,
                num_clients,
                shards_per_client,
                rng,
                records_per_client=records_per_client,
                allow_repeats=allow_repeats,
            )
        elif key == "label-subsets":
            parts = label_subsets(y, num_clients, labels_per_client, rng)
        elif key == "dirichlet":
            parts = dirichlet(y, num_clients, beta, rng, min_size=min_size)
        elif key in ("dirichlet-per-client", "equal-size"):
            if records_per_client is None:
                raise InvalidParameterError(
                    f"records_per_client is required for partition {partition!r}; "
                    "got None"
                )
            if key == "equal-size":
                parts = equal_size(
                    y.size,
                    num_clients,
                    records_per_client,
                    rng,
                    allow_repeats=allow_repeats,
                )
            else:
                mixes = []
                parts = dirichlet_per_client(
                    y, num_clients, records_per_client, beta, rng, proportions=mixes
                )
        else:
            raise InvalidParameterError(
                f"partition must be one of {PARTITIONS} or a list of index arrays; "
                f"got {partition!r}"
            )
        label = key
    else:
        parts = [np.asarray(_to_numpy(p)) for p in partition]
        for k, part in enumerate(parts):
            if part.ndim != 1 or (
                part.size and not np.issubdtype(part.dtype, np.integer)
            ):
                raise InvalidParameterError(
                    f"partition[{k}] must be a 1-d array of row numbers; got "
                    f"dtype {part.dtype}, shape {part.shape}"
                )
        parts = [part.astype(np.int64, copy=False) for part in parts]
        label = "custom"
    y_test = None if test_labels is None else _check_labels(test_labels)
    if num_classes is None:
        top = int(y.max(initial=0))
        if y_test is not None and y_test.size:
            top = max(top, int(y_test.max()))
        num_classes = top + 1
    client_test = None
    if client_test_records is not None:
        if y_test is None:
            raise InvalidParameterError(
                "client_test_records needs test_features and test_labels"
            )
        client_test = client_test_split(
            y, parts, y_test, client_test_records, rng, proportions=mixes
        )
    return FederatedDataset(
        features=features,
        labels=y,
        client_indices=parts,
        num_classes=int(num_classes),
        name=name or label,
        input_shape=tuple(input_shape) if input_shape else (),
        test_features=test_features,
        test_labels=y_test,
        client_test_indices=client_test,
    )
