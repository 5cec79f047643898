"""Partition ``label-subsets``: MS-PAFL's clients, each holding a subset of the labels.

Li et al. (arXiv 2509.25906, §V-B): "the training samples are uniformly
distributed across clients, with each client holding only a subset of the
labels". Checked exactly: label counts per client, sizes, and coverage.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpfl.data import federate, label_subsets
from dpfl.errors import InvalidParameterError


def test_each_client_holds_exactly_its_labels_and_every_row_once():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 10, 6_000)
    parts = label_subsets(y, 40, 3, np.random.default_rng(0))
    assert len(parts) == 40
    assert all(len(np.unique(y[p])) == 3 for p in parts)
    rows = np.concatenate(parts)
    assert np.array_equal(np.sort(rows), np.arange(y.size))  # disjoint, complete
    sizes = [p.size for p in parts]
    # one slot holds n / (K L) = 50 rows whatever its label, up to rounding:
    # a client about 150
    assert 140 <= min(sizes) and max(sizes) <= 160


def test_adult_like_imbalance_gives_slots_in_proportion():
    # 24% positives (Adult's ">50K"), one label per client: 24 of 100 clients
    # hold only positives, every client about 100 rows
    y = np.r_[np.zeros(7_600, dtype=np.int64), np.ones(2_400, dtype=np.int64)]
    parts = label_subsets(y, 100, 1, np.random.default_rng(1))
    only_pos = sum(bool(np.all(y[p] == 1)) for p in parts)
    assert only_pos == 24
    assert {p.size for p in parts} == {100}


def test_is_seeded_and_reachable_through_federate():
    y = np.arange(1_000) % 4
    x = np.zeros((1_000, 2), dtype=np.float32)
    a = federate(x, y, partition="label-subsets", num_clients=20, labels_per_client=2)
    b = federate(x, y, partition="label_subsets", num_clients=20, labels_per_client=2)
    assert all(np.array_equal(i, j) for i, j in zip(a.client_indices, b.client_indices))
    assert {len(np.unique(y[i])) for i in a.client_indices} == {2}


def test_refuses_impossible_requests():
    y = np.arange(100) % 5
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidParameterError, match="labels_per_client must be <="):
        label_subsets(y, 10, 6, rng)
    with pytest.raises(InvalidParameterError, match="every label is dealt"):
        label_subsets(y, 2, 2, rng)
    with pytest.raises(InvalidParameterError, match="rows for"):
        label_subsets(np.array([0, 1]), 3, 1, rng)  # 3 slots for 2 rows
