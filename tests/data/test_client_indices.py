"""ClientIndices: every client's rows in one flat array plus offsets (CSR).

The layout must read exactly like the list of per-client arrays it replaced
(the same rows, in the same order, as int64), refuse what the list refused,
and cost 8 bytes a client beyond the row numbers.
"""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from dpfl.data import ClientIndices, FederatedDataset, federate
from dpfl.errors import InvalidParameterError

X = np.arange(40, dtype=np.float32).reshape(20, 2)
Y = np.repeat(np.arange(4), 5)


def _parts() -> list[np.ndarray]:
    # unequal, unordered, one empty and one of another integer type
    return [
        np.array([5, 1, 9]),
        np.array([], dtype=np.int64),
        np.array([0, 19], dtype=np.int32),
        np.arange(10, 15),
    ]


def test_a_list_of_arrays_reads_back_unchanged():
    parts = _parts()
    ds = FederatedDataset(X, Y, parts, num_classes=4)
    table = ds.client_indices
    assert isinstance(table, ClientIndices)
    assert len(table) == 4 and ds.num_clients == 4
    for k, part in enumerate(parts):
        assert table[k].dtype == np.int64
        np.testing.assert_array_equal(table[k], part)
        np.testing.assert_array_equal(table[k - 4], part)  # negative, as a list
    # iteration, list(), slices and the sizes agree with the list
    for got, part in zip(table, parts, strict=True):
        np.testing.assert_array_equal(got, part)
    assert [r.tolist() for r in list(table)] == [p.tolist() for p in parts]
    assert [r.tolist() for r in table[1:3]] == [p.tolist() for p in parts[1:3]]
    np.testing.assert_array_equal(ds.client_sizes(), [3, 0, 2, 5])
    # each client's rows are a view of the one flat array
    assert all(np.shares_memory(table[k], table.rows) for k in (0, 2, 3))
    with pytest.raises(IndexError):
        table[4]
    with pytest.raises(IndexError):
        table[-5]
    # records and label counts as from the list
    xk, yk = ds.client(3)
    np.testing.assert_array_equal(xk, X[10:15])
    counts = np.zeros((4, 4), dtype=np.int64)
    for k, part in enumerate(parts):
        np.add.at(counts[k], Y[part], 1)
    np.testing.assert_array_equal(ds.label_counts(), counts)


def test_csr_given_directly_is_kept_and_equals_the_list():
    parts = _parts()
    rows = np.concatenate(parts).astype(np.int64)
    table = ClientIndices.from_sizes(rows, [len(p) for p in parts])
    ds = FederatedDataset(X, Y, table, num_classes=4)
    assert ds.client_indices is table and table.rows is rows  # no copy
    assert table == FederatedDataset(X, Y, parts, num_classes=4).client_indices
    assert table != ClientIndices.from_sizes(rows, [3, 1, 1, 5])
    # dataclasses.replace (as the canary audit uses) keeps the table
    named = dataclasses.replace(ds, name="renamed")
    assert named.client_indices is table
    # extending the clients as a list of arrays works as it did on the list
    grown = dataclasses.replace(
        ds, client_indices=list(ds.client_indices) + [np.array([2, 3])]
    )
    assert grown.num_clients == 5 and grown.client_indices[4].tolist() == [2, 3]
    restored = pickle.loads(pickle.dumps(table))
    assert restored == table and len(restored) == 4


def test_memory_is_the_rows_plus_one_offset_a_client():
    k = 100_000
    table = ClientIndices.from_sizes(np.arange(2 * k), np.full(k, 2))
    assert table.nbytes == 8 * 2 * k + 8 * (k + 1)
    ds = FederatedDataset(
        np.zeros((2 * k, 1), np.float32), np.zeros(2 * k, np.int64), table, 1
    )
    assert ds.nbytes() == 4 * 2 * k + 8 * 2 * k + table.nbytes


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([np.arange(3), [4, 5]], r"client_indices\[1\] must be a 1-d numpy array"),
        (
            [np.arange(3), np.zeros((2, 2), np.int64)],
            r"client_indices\[1\] must be a 1-d numpy array; got ndarray of shape",
        ),
        ([np.zeros((1, 2), np.int64)], r"client_indices\[0\] must be a 1-d"),
        ([np.array(3)], r"client_indices\[0\] must be a 1-d numpy array"),
        (
            [np.arange(2), np.array([1.0, 2.0])],
            r"client_indices\[1\] must hold integers; got dtype float64",
        ),
        ([np.array([True])], r"client_indices\[0\] must hold integers"),
        ([np.arange(3), np.array([20])], r"must lie in \[0, 20\); got range \[0, 20\]"),
        ([np.array([-1])], r"must lie in \[0, 20\); got range \[-1, -1\]"),
        ([], r"client_indices must hold >= 1 client; got 0"),
    ],
)
def test_bad_client_indices_are_refused_by_entry(table, message):
    with pytest.raises(InvalidParameterError, match=message):
        FederatedDataset(X, Y, table, num_classes=4)


def test_an_empty_entry_of_any_type_is_taken():
    ds = FederatedDataset(X, Y, [np.arange(3), np.array([])], num_classes=4)
    assert ds.client_indices[1].dtype == np.int64
    np.testing.assert_array_equal(ds.client_sizes(), [3, 0])


@pytest.mark.parametrize(
    ("rows", "offsets", "message"),
    [
        (np.arange(4), [0, 2], r"offsets must run from 0 to len\(rows\) \(4\)"),
        (np.arange(4), [1, 4], r"offsets must run from 0"),
        (np.arange(4), [], r"offsets must run from 0 to len\(rows\) \(4\); got \[\]"),
        (np.arange(4), [0, 3, 1, 4], r"non-decreasing; got offsets\[1\] = 3"),
        (np.arange(4.0), [0, 4], r"rows must hold integers"),
        (np.arange(4).reshape(2, 2), [0, 2], r"rows must be a 1-d array"),
    ],
)
def test_bad_csr_arrays_are_refused(rows, offsets, message):
    with pytest.raises(InvalidParameterError, match=message):
        ClientIndices(rows, offsets)


def test_from_sizes_refuses_negative_or_mismatched_sizes():
    with pytest.raises(InvalidParameterError, match="sizes must be >= 0; got min"):
        ClientIndices.from_sizes(np.arange(2), [3, -1])
    with pytest.raises(InvalidParameterError, match=r"len\(rows\) \(2\)"):
        ClientIndices.from_sizes(np.arange(2), [1, 2])


def test_client_test_indices_share_the_layout():
    ds = federate(
        X,
        Y,
        partition="iid",
        num_clients=4,
        seed=0,
        test_features=X[:8],
        test_labels=np.tile(np.arange(4), 2),
        client_test_records=3,
    )
    assert isinstance(ds.client_test_indices, ClientIndices)
    assert len(ds.client_test_indices) == 4
    assert ds.client_test(2)[0].shape == (3, 2)
    with pytest.raises(InvalidParameterError, match="one entry per client"):
        dataclasses.replace(ds, client_test_indices=[np.arange(3)])
