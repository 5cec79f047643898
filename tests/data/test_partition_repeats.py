"""Label shards with records repeated across clients (Geyer, Klein & Nabi 2017, §4).

The paper gives K = 1,000 and 10,000 clients exactly 600 MNIST images each,
two label-sorted shards per client, "data points are repeated". The checks
below are exact counts on synthetic labels (no tolerance): label sets, sizes,
how often each row is reused, and determinism under a seed.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpfl.data import federate
from dpfl.data.partition import shards
from dpfl.errors import InvalidParameterError

# 10 labels x 600 rows, sorted-label shards of 30 never straddle two labels
# (600 is a multiple of 30), as with Fashion-MNIST's 6,000 per label and
# shards of 300.
LABELS = np.repeat(np.arange(10), 600)


def _geyer(num_clients: int, seed: int = 0) -> list[np.ndarray]:
    return shards(
        LABELS,
        num_clients,
        2,
        np.random.default_rng(seed),
        records_per_client=60,
        allow_repeats=True,
    )


def test_each_client_has_two_shards_of_at_most_two_labels() -> None:
    parts = _geyer(1000)  # 2,000 shards of 30 from 200 per pass: 10 passes
    assert len(parts) == 1000
    assert all(p.shape == (60,) for p in parts)
    for p in parts:
        counts = np.bincount(LABELS[p], minlength=10)
        assert np.count_nonzero(counts) <= 2
        # Whole shards only: each label held 30 or 60 times.
        assert set(counts[counts > 0].tolist()) <= {30, 60}


def test_reuse_counts_are_exact_when_passes_divide() -> None:
    parts = _geyer(1000)
    uses = np.bincount(np.concatenate(parts), minlength=LABELS.size)
    # 1000 * 60 = 60,000 = 10 passes over 6,000 rows: every row exactly 10 times.
    assert uses.min() == uses.max() == 10
    # 200 shards per pass is even: no client straddles two passes, so no
    # client holds a row twice.
    assert all(np.unique(p).size == p.size for p in parts)


def test_reuse_is_bounded_by_the_number_of_passes() -> None:
    # 6,001 rows, shards of 30: 200 per pass (one row left out each pass);
    # 333 clients * 2 = 666 shards -> 4 passes (the last partly used).
    labels = np.concatenate([LABELS, [3]])
    parts = shards(
        labels,
        333,
        2,
        np.random.default_rng(1),
        records_per_client=60,
        allow_repeats=True,
    )
    uses = np.bincount(np.concatenate(parts), minlength=labels.size)
    assert uses.sum() == 333 * 60
    assert uses.max() <= 4
    assert np.count_nonzero(uses) > 6000 * 0.99  # rows are really spread


def test_shards_with_repeats_are_deterministic_and_seeded() -> None:
    a, b, c = _geyer(300, 7), _geyer(300, 7), _geyer(300, 8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_repeat_passes_regroup_rows() -> None:
    # A fresh shuffle each pass: a row's shard-mates change between passes
    # (not the same 200 shards dealt again).
    parts = _geyer(200)  # 400 shards: 2 passes
    found = [
        frozenset(p[LABELS[p] == c].tolist())
        for p in parts
        for c in np.unique(LABELS[p])
        if np.count_nonzero(LABELS[p] == c) == 30  # one shard of label c
    ]
    assert len(found) > 300
    # Dealing the same 200 shards twice would leave at most 200 distinct.
    assert len(set(found)) == len(found)


def test_without_repeats_records_per_client_fixes_sizes() -> None:
    parts = shards(
        LABELS, 50, 2, np.random.default_rng(0), records_per_client=60
    )  # 100 shards of 30 of the 200 a pass has: disjoint
    rows = np.concatenate(parts)
    assert rows.size == 3000 and np.unique(rows).size == 3000


def test_errors_name_the_parameter() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidParameterError, match="allow_repeats"):
        shards(LABELS, 1000, 2, rng, records_per_client=60)
    with pytest.raises(InvalidParameterError, match="records_per_client"):
        shards(LABELS, 10, 2, rng, allow_repeats=True)
    with pytest.raises(InvalidParameterError, match="multiple of shards_per_client"):
        shards(LABELS, 10, 2, rng, records_per_client=61, allow_repeats=True)


def test_federate_passes_repeats_to_shards() -> None:
    x = np.zeros((LABELS.size, 2), dtype=np.float32)
    ds = federate(
        x,
        LABELS,
        partition="shards",
        num_clients=1000,
        records_per_client=60,
        allow_repeats=True,
        seed=3,
    )
    assert ds.num_clients == 1000
    assert {len(ds.client_indices[k]) for k in range(1000)} == {60}
    assert max(np.unique(LABELS[ds.client_indices[k]]).size for k in range(1000)) <= 2
