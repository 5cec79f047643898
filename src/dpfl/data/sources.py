"""A user's own data in memory: per-client lists and torch datasets.

Arrays and tensors with a partition go through :func:`dpfl.data.federate`;
this module adds the other ways in from memory:

* :func:`federate_clients` — one ``(x, y)`` pair per client, the partition
  being the lists themselves;
* :func:`federate_torch` — a ``torch.utils.data.Dataset`` plus a partition.

A user's files (CSV, npz, IDX) are read by :mod:`dpfl.data.user_files`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpfl.data.dataset import FederatedDataset
from dpfl.data.federate import federate
from dpfl.data.partition import _check_features, _check_labels, _to_numpy
from dpfl.errors import InvalidParameterError

__all__ = ["federate_clients", "federate_torch"]


# -- in memory ----------------------------------------------------------------------
def _pair(value: Any, what: str) -> tuple[Any, Any]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise InvalidParameterError(
            f"{what} must be an (x, y) pair; got {type(value).__name__}"
        )
    x = _check_features(value[0])
    y = _check_labels(value[1])
    if len(x) != len(y):
        raise InvalidParameterError(
            f"{what} must hold as many labels as records; got {len(x)} records "
            f"and {len(y)} labels"
        )
    return x, y


def _stack(pairs: list[tuple[Any, Any]], what: str) -> tuple[np.ndarray, np.ndarray]:
    shapes = {tuple(x.shape[1:]) for x, _ in pairs}
    if len(shapes) > 1:
        raise InvalidParameterError(
            f"{what} must all have records of one shape; got {sorted(shapes)}"
        )
    x = np.concatenate([np.asarray(x) for x, _ in pairs]).astype(np.float32)
    y = np.concatenate([y for _, y in pairs]).astype(np.int64)
    return x, y


def federate_clients(
    clients: Sequence[Any],
    *,
    test: Any = None,
    client_tests: Sequence[Any] | None = None,
    num_classes: int | None = None,
    name: str = "clients",
) -> FederatedDataset:
    """A federated dataset from one ``(x, y)`` pair per client.

    Parameters
    ----------
    clients : sequence of (x, y)
        Client ``k``'s records: features ``(n_k, ...)`` and integer labels
        ``(n_k,)``, as numpy arrays, torch tensors or lists. All records must
        have one shape.
    test : (x, y), optional
        A shared test set.
    client_tests : sequence of (x, y), optional
        One test set per client (personalised evaluation); they are stored
        one after the other, after ``test`` if given, in the shared test
        arrays, and ``client_test_indices`` points into them.
    num_classes : int, optional
        Defaults to the largest label + 1.
    name : str, optional
        Name of the result (default ``"clients"``).

    Returns
    -------
    FederatedDataset
        Client ``k`` holds exactly the records of ``clients[k]``, in order.

    Raises
    ------
    InvalidParameterError
        If a pair is malformed, shapes differ, or ``client_tests`` does not
        have one entry per client.

    Examples
    --------
    >>> import numpy as np
    >>> from dpfl.data import federate_clients
    >>> rng = np.random.default_rng(0)
    >>> ds = federate_clients([(rng.normal(size=(n, 3)), rng.integers(0, 2, n))
    ...                        for n in (5, 8, 2)])
    >>> ds.client_sizes().tolist()
    [5, 8, 2]
    """
    if isinstance(clients, (str, bytes)) or not isinstance(clients, Sequence):
        raise InvalidParameterError(
            f"clients must be a sequence of (x, y) pairs; got {type(clients).__name__}"
        )
    if len(clients) == 0:
        raise InvalidParameterError("clients must hold >= 1 client; got 0")
    pairs = [_pair(c, f"clients[{k}]") for k, c in enumerate(clients)]
    x, y = _stack(pairs, "clients")
    sizes = np.array([len(py) for _, py in pairs], dtype=np.int64)
    rows = np.arange(int(sizes.sum()), dtype=np.int64)
    parts = np.split(rows, np.cumsum(sizes)[:-1])
    test_x = test_y = None
    test_parts = None
    tests: list[tuple[Any, Any]] = []
    if test is not None:
        tests.append(_pair(test, "test"))
    if client_tests is not None:
        if len(client_tests) != len(clients):
            raise InvalidParameterError(
                f"client_tests must have one entry per client ({len(clients)}); "
                f"got {len(client_tests)}"
            )
        own = [_pair(c, f"client_tests[{k}]") for k, c in enumerate(client_tests)]
        start = len(tests[0][1]) if tests else 0
        own_sizes = np.array([len(py) for _, py in own], dtype=np.int64)
        test_rows = np.arange(start, start + int(own_sizes.sum()), dtype=np.int64)
        test_parts = np.split(test_rows, np.cumsum(own_sizes)[:-1])
        tests += own
    if tests:
        test_x, test_y = _stack(tests, "test sets")
        if test_x.shape[1:] != x.shape[1:]:
            raise InvalidParameterError(
                f"test records must have shape {x.shape[1:]}; got {test_x.shape[1:]}"
            )
    fed = federate(
        x,
        y,
        partition=parts,
        num_classes=num_classes,
        test_features=test_x,
        test_labels=test_y,
        name=name,
    )
    if test_parts is None:
        return fed
    return dataclasses.replace(fed, client_test_indices=test_parts)


def _torch_arrays(dataset: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, tuple) and len(tensors) == 2:  # a TensorDataset
        return _check_features(tensors[0]), _check_labels(tensors[1])
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise InvalidParameterError(
            f"{what} must be a map-style dataset (len() and [i]); got "
            f"{type(dataset).__name__}"
        )
    n = len(dataset)
    if n == 0:
        raise InvalidParameterError(f"{what} is empty")
    xs, ys = [], []
    for i in range(n):
        item = dataset[i]
        if not isinstance(item, (tuple, list)) or len(item) < 2:
            raise InvalidParameterError(
                f"{what}[{i}] must be an (x, y) pair; got {type(item).__name__}"
            )
        xs.append(np.asarray(_to_numpy(item[0]), dtype=np.float32))
        ys.append(int(_to_numpy(item[1])))
    shapes = {x.shape for x in xs}
    if len(shapes) > 1:
        raise InvalidParameterError(
            f"{what} must yield records of one shape; got {sorted(shapes)[:3]}"
        )
    return np.stack(xs), np.asarray(ys, dtype=np.int64)


def federate_torch(
    dataset: Any,
    partition: Any = "iid",
    num_clients: int | None = None,
    *,
    test: Any = None,
    **kwargs: Any,
) -> FederatedDataset:
    """A federated dataset from a ``torch.utils.data.Dataset`` and a partition.

    The dataset's items are read once, in index order, into shared arrays
    (``TensorDataset`` directly from its tensors); give it the transform that
    turns a record into a tensor (e.g. ``ToTensor()`` for images). Random
    augmentation is frozen by this single read.

    Parameters
    ----------
    dataset : torch.utils.data.Dataset
        Map-style dataset whose items are ``(x, y)`` with ``y`` an integer.
    partition : str or sequence of index arrays, optional
        As :func:`dpfl.data.federate` (default ``"iid"``); index arrays are
        positions in ``dataset``.
    num_clients : int, optional
        Number of clients, for named partitions.
    test : torch.utils.data.Dataset, optional
        A shared test set.
    **kwargs
        Further arguments of :func:`dpfl.data.federate` (``seed``,
        ``client_ids`` for ``"natural"``, ``shards_per_client``, ...).

    Returns
    -------
    FederatedDataset
        The partitioned records.

    Raises
    ------
    InvalidParameterError
        If an item is not an ``(x, y)`` pair or records differ in shape.
    """
    x, y = _torch_arrays(dataset, "dataset")
    if test is not None:
        kwargs["test_features"], kwargs["test_labels"] = _torch_arrays(test, "test")
    return federate(x, y, partition=partition, num_clients=num_clients, **kwargs)


# -- files ----------------------------------------------------------------------------
