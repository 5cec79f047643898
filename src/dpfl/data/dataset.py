"""Federated and centralised dataset containers.

A :class:`FederatedDataset` keeps one shared feature array and one shared label
array; each client is a list of indices into them, never a copy. Only the
clients a round touches are ever gathered, so memory and time grow with the
work of a round, not with the number of clients.

``features`` is either a float32 :class:`numpy.ndarray` or a *lazy feature
source* (see :class:`LazyFeatures`): an object with ``shape``, ``dtype``,
``nbytes``, ``__len__`` and ``__getitem__`` that builds float32 records on
demand (procedural images, or uint8 storage scaled on access). Code that
consumes a dataset should read records through :meth:`FederatedDataset.client`
or :meth:`FederatedDataset.take`, which work for both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dpfl.errors import InvalidParameterError

__all__ = [
    "Dataset",
    "FederatedDataset",
    "LazyFeatures",
    "ScaledUint8Features",
]


@runtime_checkable
class LazyFeatures(Protocol):
    """A feature source that builds float32 records on demand.

    Indexing with an integer, a slice or an integer array returns a float32
    :class:`numpy.ndarray` of the selected records; ``nbytes`` is the memory
    the source actually holds (not the size of the materialised array).
    """

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the (virtual) full feature array, ``(N, ...)``."""
        ...

    @property
    def dtype(self) -> np.dtype[Any]:
        """Data type of the records returned (float32)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes held in memory by the source."""
        ...

    def __len__(self) -> int:
        """Return the number of records."""
        ...

    def __getitem__(self, index: Any) -> np.ndarray:
        """Return the selected records as a float32 array."""
        ...


class ScaledUint8Features:
    """uint8 storage that reads as float32 in [0, 1] (value / 255).

    A quarter of the memory of float32: 697,932 EMNIST images of 28×28 take
    547 MB instead of 2.19 GB.

    Parameters
    ----------
    data : numpy.ndarray
        uint8 array of shape ``(N, ...)``; kept, not copied.
    """

    def __init__(self, data: np.ndarray) -> None:
        if data.dtype != np.uint8:
            raise InvalidParameterError(
                f"data must have dtype uint8; got {data.dtype!r}"
            )
        self.data = data

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the feature array."""
        return tuple(self.data.shape)

    @property
    def dtype(self) -> np.dtype[Any]:
        """float32, the type of the records returned."""
        return np.dtype(np.float32)

    @property
    def nbytes(self) -> int:
        """Bytes of the uint8 storage."""
        return int(self.data.nbytes)

    def __len__(self) -> int:
        """Return the number of records."""
        return int(self.data.shape[0])

    def __getitem__(self, index: Any) -> np.ndarray:
        """Return the selected records as float32 in [0, 1]."""
        out = np.asarray(self.data[index], dtype=np.float32)
        out *= np.float32(1.0 / 255.0)
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """Materialise all records (float32, N × ...)."""
        out = self[:]
        return out if dtype is None else out.astype(dtype)


def _feature_len(features: Any) -> int:
    return int(len(features))


@dataclass(frozen=True)
class Dataset:
    """A centralised dataset: train and (optional) test arrays.

    Returned by the loaders (:func:`dpfl.data.load_mnist`, …); turn it into a
    federated one with :func:`dpfl.data.federate`.

    Attributes
    ----------
    features : numpy.ndarray or LazyFeatures
        Training inputs, float32, shape ``(N, *input_shape)``.
    labels : numpy.ndarray
        Training labels, int64, shape ``(N,)``, values in ``[0, num_classes)``.
    test_features, test_labels : numpy.ndarray or None
        Held-out inputs and labels, same conventions.
    num_classes : int
        Number of classes.
    name : str
        Short name, e.g. ``"fashion-mnist"``.
    input_shape : tuple of int
        Shape of one record, e.g. ``(1, 28, 28)`` (channels first).
    source : str
        Where the data was read from (a path), or ``"generated"``.
    client_ids : numpy.ndarray or None
        The owner of each training record when the data come partitioned
        (FEMNIST's writers, a CSV file's client column): the ``"natural"``
        partition gives each distinct id its own client.
    test_client_ids : numpy.ndarray or None
        The owner of each test record, if known: under the ``"natural"``
        partition each client's own test records become its personalised
        test set (``client_test_indices``).
    """

    features: Any
    labels: np.ndarray
    test_features: Any
    test_labels: np.ndarray | None
    num_classes: int
    name: str
    input_shape: tuple[int, ...]
    source: str = ""
    client_ids: np.ndarray | None = None
    test_client_ids: np.ndarray | None = None

    def federate(
        self,
        partition: Any = None,
        num_clients: int | None = None,
        **kwargs: Any,
    ) -> FederatedDataset:
        """Partition the training records among clients.

        Parameters
        ----------
        partition : str or sequence of index arrays, optional
            As :func:`dpfl.data.federate`; default ``"natural"`` when the data
            carry ``client_ids``, else ``"iid"``.
        num_clients : int, optional
            Number of clients (for ``"natural"``: how many of the ids to draw;
            default all).
        **kwargs
            Further arguments of :func:`dpfl.data.federate` (``seed``,
            ``client_test_records``, ``shards_per_client``, ``beta``, ...).

        Returns
        -------
        FederatedDataset
            Named ``"<name>/<partition>"``, with this data set's test set.
            Under ``"natural"``, when the test records' owners are known
            (``test_client_ids``) and every client kept has at least one,
            each client's own test records are its ``client_test_indices``
            (unless ``client_test_records`` asks for drawn ones).
        """
        from dpfl.data.federate import federate

        if partition is None:
            partition = "natural" if self.client_ids is not None else "iid"
        label = partition if isinstance(partition, str) else "custom"
        kwargs.setdefault("name", f"{self.name}/{label}")
        fed = federate(
            self.features,
            self.labels,
            partition=partition,
            num_clients=num_clients,
            client_ids=self.client_ids,
            num_classes=self.num_classes,
            test_features=self.test_features,
            test_labels=self.test_labels,
            input_shape=self.input_shape,
            **kwargs,
        )
        own = self._own_test_rows(fed, partition, kwargs)
        return fed if own is None else dataclasses.replace(fed, client_test_indices=own)

    def _own_test_rows(
        self, fed: FederatedDataset, partition: Any, kwargs: dict[str, Any]
    ) -> list[np.ndarray] | None:
        """Each natural client's own test rows, or None where not all have some."""
        if (
            partition != "natural"
            or self.client_ids is None
            or self.test_client_ids is None
            or kwargs.get("client_test_records") is not None
        ):
            return None
        ids, owner = np.unique(np.asarray(self.test_client_ids), return_inverse=True)
        order = np.argsort(owner, kind="stable").astype(np.int64)
        groups = dict(
            zip(
                ids.tolist(),
                np.split(order, np.cumsum(np.bincount(owner))[:-1]),
                strict=True,
            )
        )
        empty = np.empty(0, dtype=np.int64)
        own = [
            groups.get(self.client_ids[rows[0]], empty) for rows in fed.client_indices
        ]
        return own if all(r.size for r in own) else None


@dataclass(frozen=True)
class FederatedDataset:
    """Shared arrays plus, per client, the indices of its records.

    Attributes
    ----------
    features : numpy.ndarray or LazyFeatures
        All training inputs, float32, shape ``(N, *input_shape)``.
    labels : numpy.ndarray
        All training labels, int64, shape ``(N,)``.
    client_indices : list of numpy.ndarray
        ``client_indices[k]`` holds the row numbers of client ``k``'s records
        (int64). Partitions are disjoint unless a partition was asked to
        repeat records (see :func:`dpfl.data.partition.equal_size`).
    num_classes : int
        Number of classes.
    name : str
        Short name of the dataset and partition.
    input_shape : tuple of int
        Shape of one record.
    test_features, test_labels : numpy.ndarray or None
        A shared test set (optional).
    client_test_indices : list of numpy.ndarray or None
        Per-client test rows into ``test_features`` for personalised
        evaluation (optional); clients may share test rows.

    Raises
    ------
    InvalidParameterError
        If shapes, dtypes or indices are inconsistent.
    """

    features: Any
    labels: np.ndarray
    client_indices: list[np.ndarray]
    num_classes: int
    name: str = ""
    input_shape: tuple[int, ...] = ()
    test_features: Any = None
    test_labels: np.ndarray | None = None
    client_test_indices: list[np.ndarray] | None = None
    _sizes: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not all(hasattr(self.features, a) for a in ("shape", "dtype", "__len__")):
            raise InvalidParameterError(
                "features must be a numpy array or a LazyFeatures source; got "
                f"{type(self.features).__name__}"
            )
        n = _feature_len(self.features)
        if np.dtype(self.features.dtype) != np.float32:
            raise InvalidParameterError(
                f"features must be float32; got {self.features.dtype!r}"
            )
        labels = np.asarray(self.labels)
        if labels.dtype != np.int64 or labels.shape != (n,):
            raise InvalidParameterError(
                f"labels must be int64 of shape ({n},); got {labels.dtype} "
                f"{labels.shape}"
            )
        if self.num_classes < 1:
            raise InvalidParameterError(
                f"num_classes must be >= 1; got {self.num_classes!r}"
            )
        if n and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise InvalidParameterError(
                f"labels must lie in [0, {self.num_classes}); got range "
                f"[{labels.min()}, {labels.max()}]"
            )
        if len(self.client_indices) == 0:
            raise InvalidParameterError("client_indices must hold >= 1 client; got 0")
        sizes = np.fromiter(
            (len(ix) for ix in self.client_indices),
            dtype=np.int64,
            count=len(self.client_indices),
        )
        _check_indices("client_indices", self.client_indices, n)
        if not self.input_shape:
            object.__setattr__(self, "input_shape", tuple(self.features.shape[1:]))
        if (self.test_features is None) != (self.test_labels is None):
            raise InvalidParameterError(
                "test_features and test_labels must be given together"
            )
        if self.test_features is not None and self.test_labels is not None:
            n_test = _feature_len(self.test_features)
            test_shape = np.shape(self.test_labels)
            if test_shape != (n_test,):
                raise InvalidParameterError(
                    f"test_labels must have shape ({n_test},); got {test_shape}"
                )
            if self.client_test_indices is not None:
                if len(self.client_test_indices) != len(self.client_indices):
                    raise InvalidParameterError(
                        "client_test_indices must have one entry per client "
                        f"({len(self.client_indices)}); got "
                        f"{len(self.client_test_indices)}"
                    )
                _check_indices("client_test_indices", self.client_test_indices, n_test)
        elif self.client_test_indices is not None:
            raise InvalidParameterError(
                "client_test_indices needs test_features and test_labels"
            )
        object.__setattr__(self, "_sizes", sizes)

    # -- shape -------------------------------------------------------------
    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.client_indices)

    @property
    def num_records(self) -> int:
        """Number of training records in the shared arrays."""
        return _feature_len(self.features)

    def client_sizes(self) -> np.ndarray:
        """Return the number of records of each client (int64, length K)."""
        return self._sizes.copy()

    # -- access ------------------------------------------------------------
    def client(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Return client ``k``'s records ``(x, y)``.

        A view of the shared arrays when the client's rows are one ascending
        contiguous run (as :func:`~dpfl.data.synthetic` produces), else a
        gathered copy of just that client's records.

        Parameters
        ----------
        k : int
            Client number in ``[0, num_clients)``.

        Returns
        -------
        tuple of numpy.ndarray
            Features (float32) and labels (int64).

        Raises
        ------
        InvalidParameterError
            If ``k`` is out of range.
        """
        idx = self._client_rows(k, self.client_indices, "k")
        return self.take(idx)

    def client_test(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Return client ``k``'s personalised test records ``(x, y)``.

        Raises
        ------
        InvalidParameterError
            If the dataset has no per-client test indices or ``k`` is out of range.
        """
        if self.client_test_indices is None or self.test_labels is None:
            raise InvalidParameterError(
                f"dataset {self.name!r} has no client_test_indices"
            )
        idx = self._client_rows(k, self.client_test_indices, "k")
        sl = _as_slice(idx)
        key = sl if sl is not None else idx
        return self.test_features[key], self.test_labels[key]

    def take(self, indices: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        """Return the training records at ``indices`` ``(x, y)``.

        Parameters
        ----------
        indices : numpy.ndarray or slice
            Row numbers (int) into the shared arrays.

        Returns
        -------
        tuple of numpy.ndarray
            Features (float32) and labels (int64).
        """
        if isinstance(indices, slice):
            return self.features[indices], self.labels[indices]
        sl = _as_slice(np.asarray(indices))
        key: Any = sl if sl is not None else indices
        return self.features[key], self.labels[key]

    def _client_rows(self, k: int, table: list[np.ndarray], name: str) -> np.ndarray:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
            raise InvalidParameterError(f"{name} must be an integer; got {k!r}")
        if not 0 <= int(k) < len(table):
            raise InvalidParameterError(
                f"{name} must be in [0, {len(table)}); got {k!r}"
            )
        return table[int(k)]

    # -- reporting -----------------------------------------------------------
    def nbytes(self) -> int:
        """Return the bytes held by the arrays (features, labels, indices)."""
        total = int(self.features.nbytes) + int(self.labels.nbytes)
        total += _index_bytes(self.client_indices)
        if self.test_features is not None:
            total += int(self.test_features.nbytes)
            total += int(np.asarray(self.test_labels).nbytes)
        if self.client_test_indices is not None:
            total += _index_bytes(self.client_test_indices)
        return total

    def label_counts(self) -> np.ndarray:
        """Return a ``(num_clients, num_classes)`` matrix of label counts."""
        owner = np.repeat(np.arange(self.num_clients), self._sizes)
        rows = (
            np.concatenate(self.client_indices)
            if self.num_clients
            else np.empty(0, np.int64)
        )
        counts = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        np.add.at(counts, (owner, self.labels[rows]), 1)
        return counts

    def summary(self) -> str:
        """Return a short human-readable description."""
        sizes = self._sizes
        lines = [
            f"FederatedDataset {self.name!r}",
            f"  records: {self.num_records:,} of shape {self.input_shape}, "
            f"{self.num_classes} classes",
            f"  clients: {self.num_clients:,}; records per client min "
            f"{sizes.min()}, median {int(np.median(sizes))}, max {sizes.max()}, "
            f"total {int(sizes.sum()):,}",
        ]
        if self.num_clients <= 100_000 and self.num_records <= 10_000_000:
            present = (self.label_counts() > 0).sum(axis=1)
            lines.append(
                f"  classes per client: min {present.min()}, mean "
                f"{present.mean():.2f}, max {present.max()}"
            )
        if self.test_labels is not None:
            test = f"  test records: {len(self.test_labels):,}"
            if self.client_test_indices is not None:
                test += " (with per-client test indices)"
            lines.append(test)
        lines.append(f"  memory: {self.nbytes() / 2**20:.1f} MiB")
        return "\n".join(lines)


def _as_slice(idx: np.ndarray) -> slice | None:
    """Return a slice equal to ``idx`` if it is one ascending run, else None."""
    if idx.ndim != 1 or idx.size == 0:
        return None
    start, stop = int(idx[0]), int(idx[-1]) + 1
    if stop - start != idx.size:
        return None
    if idx.size > 1 and not np.all(np.diff(idx) == 1):
        return None
    return slice(start, stop)


def _index_bytes(table: list[np.ndarray]) -> int:
    # Views of one shared index array own no memory of their own; count the base
    # once.
    seen: set[int] = set()
    total = 0
    for ix in table:
        base = ix.base if ix.base is not None else ix
        if id(base) not in seen:
            seen.add(id(base))
            total += int(base.nbytes)
    return total


def _check_indices(name: str, table: list[np.ndarray], n: int) -> None:
    for k, ix in enumerate(table):
        if not isinstance(ix, np.ndarray) or ix.ndim != 1:
            raise InvalidParameterError(
                f"{name}[{k}] must be a 1-d numpy array; got {type(ix).__name__}"
            )
        if ix.size and not np.issubdtype(ix.dtype, np.integer):
            raise InvalidParameterError(
                f"{name}[{k}] must hold integers; got dtype {ix.dtype}"
            )
    nonempty = [ix for ix in table if ix.size]
    if not nonempty:
        return
    lo = min(int(ix.min()) for ix in nonempty)
    hi = max(int(ix.max()) for ix in nonempty)
    if lo < 0 or hi >= n:
        raise InvalidParameterError(
            f"{name} must lie in [0, {n}); got range [{lo}, {hi}]"
        )
