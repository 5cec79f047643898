"""Federated and centralised dataset containers.

A :class:`FederatedDataset` keeps one shared feature array and one shared label
array; each client is a run of row numbers into them, never a copy. The row
numbers of all clients lie in one flat array with one offset per client
(:class:`ClientIndices`, a compressed sparse row layout: 8 bytes a client
beyond the row numbers themselves). Only the clients a round touches are ever
gathered, so memory and time grow with the work of a round, not with the
number of clients.

``features`` is either a float32 :class:`numpy.ndarray` or a *lazy feature
source* (see :class:`LazyFeatures`): an object with ``shape``, ``dtype``,
``nbytes``, ``__len__`` and ``__getitem__`` that builds float32 records on
demand (procedural images, or uint8 storage scaled on access). Code that
consumes a dataset should read records through :meth:`FederatedDataset.client`
or :meth:`FederatedDataset.take`, which work for both.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload, runtime_checkable

import numpy as np

from dpfl.errors import InvalidParameterError

__all__ = [
    "ClientIndices",
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


class ClientIndices(Sequence[np.ndarray]):
    """Every client's row numbers in one flat array, plus offsets (CSR).

    Client ``k``'s rows are ``rows[offsets[k]:offsets[k + 1]]``, and indexing
    returns exactly that slice: a view, not a copy. It reads like the list of
    per-client arrays it stands for (``len``, indexing, iteration,
    ``list(...)``), and costs 8 bytes a client for the offset where a list of
    arrays costs about 100 (each array's header) and a build that visits every
    array.

    Parameters
    ----------
    rows : numpy.ndarray
        1-d integer array: client 0's rows, then client 1's, and so on
        (converted to int64; an int64 array is kept, not copied).
    offsets : numpy.ndarray
        1-d integer array of ``num_clients + 1`` non-decreasing offsets into
        ``rows``, from 0 to ``len(rows)`` (converted to int64).

    Raises
    ------
    InvalidParameterError
        If either array has the wrong shape or type, or the offsets do not
        run from 0 to ``len(rows)`` without decreasing.

    Examples
    --------
    >>> ix = ClientIndices.from_sizes(np.array([4, 5, 6, 0]), [3, 0, 1])
    >>> len(ix), ix[0].tolist(), ix[1].tolist(), ix[-1].tolist()
    (3, [4, 5, 6], [], [0])
    >>> ix.sizes().tolist()
    [3, 0, 1]
    """

    __slots__ = ("offsets", "rows")

    def __init__(self, rows: Any, offsets: Any) -> None:
        flat = _integer_vector("rows", rows)
        bounds = _integer_vector("offsets", offsets)
        if bounds.size == 0 or bounds[0] != 0 or bounds[-1] != flat.size:
            got = f"[{bounds[0]}, ..., {bounds[-1]}]" if bounds.size else "[]"
            raise InvalidParameterError(
                f"offsets must run from 0 to len(rows) ({flat.size}); got {got}"
            )
        if bounds.size > 2 and bool(np.any(bounds[1:] < bounds[:-1])):
            k = int(np.argmax(bounds[1:] < bounds[:-1]))
            raise InvalidParameterError(
                f"offsets must be non-decreasing; got offsets[{k}] = "
                f"{bounds[k]} > offsets[{k + 1}] = {bounds[k + 1]}"
            )
        self.rows: np.ndarray = flat
        self.offsets: np.ndarray = bounds

    @classmethod
    def from_sizes(cls, rows: Any, sizes: Any) -> ClientIndices:
        """Clients holding ``sizes[k]`` consecutive entries of ``rows`` each, in order.

        Parameters
        ----------
        rows : numpy.ndarray
            1-d integer array of ``sum(sizes)`` row numbers.
        sizes : array_like of int
            Each client's number of rows (>= 0).

        Returns
        -------
        ClientIndices
            Client ``k`` holds ``rows[sum(sizes[:k]) : sum(sizes[:k + 1])]``.

        Raises
        ------
        InvalidParameterError
            If ``sizes`` is not a 1-d array of counts >= 0 summing to
            ``len(rows)``.
        """
        counts = _integer_vector("sizes", sizes)
        if counts.size and int(counts.min()) < 0:
            raise InvalidParameterError(
                f"sizes must be >= 0; got minimum {int(counts.min())}"
            )
        offsets = np.zeros(counts.size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(rows, offsets)

    @classmethod
    def of(
        cls, table: Sequence[np.ndarray], name: str = "client_indices"
    ) -> ClientIndices:
        """``table`` as a :class:`ClientIndices`: itself if it is one, else joined.

        Parameters
        ----------
        table : ClientIndices or sequence of numpy.ndarray
            Per-client 1-d integer arrays (a list of arrays, as the
            partitions return), or a :class:`ClientIndices`.
        name : str
            The parameter's name in error messages.

        Returns
        -------
        ClientIndices
            ``table`` itself when it is one; else its arrays copied, in
            order, into one int64 array.

        Raises
        ------
        InvalidParameterError
            If an entry is not a 1-d numpy array of integers (an empty one
            may have any type).
        """
        if isinstance(table, ClientIndices):
            return table
        return _join(name, table)

    def sizes(self) -> np.ndarray:
        """Return each client's number of rows (int64, a new array)."""
        return np.diff(self.offsets)

    @property
    def nbytes(self) -> int:
        """Bytes of the two arrays (rows and offsets)."""
        return int(self.rows.nbytes) + int(self.offsets.nbytes)

    def __len__(self) -> int:
        """Return the number of clients."""
        return int(self.offsets.size) - 1

    @overload
    def __getitem__(self, k: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, k: slice) -> list[np.ndarray]: ...

    def __getitem__(self, k: int | slice) -> np.ndarray | list[np.ndarray]:
        """Client ``k``'s rows (a view), or a list of them for a slice of clients."""
        n = len(self)
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(n))]
        i = operator.index(k)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"client {k} out of range for {n} clients")
        return self.rows[self.offsets[i] : self.offsets[i + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        """Each client's rows in turn (views)."""
        rows = self.rows
        step = 65536  # offsets read as Python ints a block at a time
        for start in range(0, len(self), step):
            bounds = self.offsets[start : start + step + 1].tolist()
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                yield rows[lo:hi]

    def __eq__(self, other: object) -> bool:
        """Equal when both hold the same rows in the same clients."""
        if not isinstance(other, ClientIndices):
            return NotImplemented
        return bool(
            np.array_equal(self.offsets, other.offsets)
            and np.array_equal(self.rows, other.rows)
        )

    __hash__ = None  # type: ignore[assignment]  # mutable arrays: unhashable

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle as the two arrays."""
        return (type(self), (self.rows, self.offsets))

    def __repr__(self) -> str:
        """Return a short description (clients and rows)."""
        return f"ClientIndices({len(self)} clients, {self.rows.size} rows)"


def _integer_vector(name: str, value: Any) -> np.ndarray:
    """``value`` as a 1-d int64 array (not copied when it is one already)."""
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise InvalidParameterError(
            f"{name} must be a 1-d array; got shape {arr.shape}"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InvalidParameterError(f"{name} must hold integers; got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _join(name: str, table: Sequence[np.ndarray]) -> ClientIndices:
    """Per-client arrays copied into one :class:`ClientIndices`, checked."""
    count = len(table)
    if count == 0:
        return ClientIndices(np.empty(0, np.int64), np.zeros(1, np.int64))
    # Fast path: one pass in C when every entry is a plain 1-d integer array;
    # anything else is checked entry by entry, naming the first bad one.
    rows: np.ndarray | None = None
    try:
        if set(map(type, table)) == {np.ndarray}:
            sizes = np.fromiter(map(len, table), np.int64, count)
            joined = np.concatenate(table)
            if joined.ndim == 1 and (
                joined.size == 0 or np.issubdtype(joined.dtype, np.integer)
            ):
                rows = joined
    except (TypeError, ValueError):
        rows = None
    if rows is None:
        for k, ix in enumerate(table):
            if not isinstance(ix, np.ndarray) or ix.ndim != 1:
                raise InvalidParameterError(
                    f"{name}[{k}] must be a 1-d numpy array; got {type(ix).__name__}"
                    + (f" of shape {ix.shape}" if isinstance(ix, np.ndarray) else "")
                )
            if ix.size and not np.issubdtype(ix.dtype, np.integer):
                raise InvalidParameterError(
                    f"{name}[{k}] must hold integers; got dtype {ix.dtype}"
                )
        sizes = np.fromiter(map(len, table), np.int64, count)
        rows = np.concatenate([ix.astype(np.int64, copy=False) for ix in table])
    return ClientIndices.from_sizes(rows.astype(np.int64, copy=False), sizes)


def _check_range(name: str, table: ClientIndices, n: int) -> None:
    """Every row of ``table`` in ``[0, n)``."""
    if table.rows.size == 0:
        return
    lo, hi = int(table.rows.min()), int(table.rows.max())
    if lo < 0 or hi >= n:
        raise InvalidParameterError(
            f"{name} must lie in [0, {n}); got range [{lo}, {hi}]"
        )


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
    client_indices : ClientIndices
        ``client_indices[k]`` holds the row numbers of client ``k``'s records
        (int64, a view). Given as a :class:`ClientIndices` (kept as it is:
        the way to build millions of clients) or as any sequence of 1-d
        integer arrays, such as the list a partition returns (copied into
        one). Partitions are disjoint unless a partition was asked to repeat
        records (see :func:`dpfl.data.partition.equal_size`).
    num_classes : int
        Number of classes.
    name : str
        Short name of the dataset and partition.
    input_shape : tuple of int
        Shape of one record.
    test_features, test_labels : numpy.ndarray or None
        A shared test set (optional).
    client_test_indices : ClientIndices or None
        Per-client test rows into ``test_features`` for personalised
        evaluation (optional; given as ``client_indices`` is); clients may
        share test rows.

    Raises
    ------
    InvalidParameterError
        If shapes, dtypes or indices are inconsistent.
    """

    features: Any
    labels: np.ndarray
    client_indices: Sequence[np.ndarray]
    num_classes: int
    name: str = ""
    input_shape: tuple[int, ...] = ()
    test_features: Any = None
    test_labels: np.ndarray | None = None
    client_test_indices: Sequence[np.ndarray] | None = None

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
        table = ClientIndices.of(self.client_indices, "client_indices")
        _check_range("client_indices", table, n)
        object.__setattr__(self, "client_indices", table)
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
                tests = ClientIndices.of(
                    self.client_test_indices, "client_test_indices"
                )
                _check_range("client_test_indices", tests, n_test)
                object.__setattr__(self, "client_test_indices", tests)
        elif self.client_test_indices is not None:
            raise InvalidParameterError(
                "client_test_indices needs test_features and test_labels"
            )

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
        return self._table.sizes()

    @property
    def _table(self) -> ClientIndices:
        """``client_indices`` as the :class:`ClientIndices` it is stored as."""
        return ClientIndices.of(self.client_indices)

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

    def _client_rows(
        self, k: int, table: Sequence[np.ndarray], name: str
    ) -> np.ndarray:
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
        total += self._table.nbytes
        if self.test_features is not None:
            total += int(self.test_features.nbytes)
            total += int(np.asarray(self.test_labels).nbytes)
        if self.client_test_indices is not None:
            total += ClientIndices.of(self.client_test_indices).nbytes
        return total

    def label_counts(self) -> np.ndarray:
        """Return a ``(num_clients, num_classes)`` matrix of label counts."""
        table = self._table
        owner = np.repeat(np.arange(self.num_clients), table.sizes())
        rows = table.rows
        counts = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        np.add.at(counts, (owner, self.labels[rows]), 1)
        return counts

    def summary(self) -> str:
        """Return a short human-readable description."""
        sizes = self.client_sizes()
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
