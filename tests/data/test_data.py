"""Tests of dpfl.data: loaders on small files in the real formats, partitions,
procedural generators and the registry."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dpfl.data import (
    DATASETS,
    Dataset,
    DatasetNotFoundError,
    FederatedDataset,
    ProceduralImages,
    ScaledUint8Features,
    client_test_split,
    dirichlet,
    dirichlet_per_client,
    equal_size,
    federate,
    get_dataset,
    iid,
    load_adult,
    load_cifar10,
    load_digits,
    load_idx,
    load_mnist,
    shards,
    synthetic,
    synthetic_images,
)
from dpfl.data import loaders as loaders_mod
from dpfl.data.synthetic import _hash_normal
from dpfl.errors import DpflError, InvalidParameterError

# ---------------------------------------------------------------------------
# helpers: writers for the real on-disk formats


def write_idx(path: Path, arr: np.ndarray, *, compress: bool = False) -> None:
    """IDX per LeCun's spec: 0,0,type code,ndim; big-endian uint32 dims; data."""
    codes = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C}
    codes.update({np.float32: 0x0D, np.float64: 0x0E})
    code = codes[arr.dtype.type]
    head = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    body = arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    opener = gzip.open if compress else open
    with opener(path, "wb") as f:
        f.write(head + body)


def write_mnist_dir(d: Path, n_train=12, n_test=5, prefix="", test="t10k", seed=0):
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for split, n in (("train", n_train), (test, n_test)):
        x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = rng.integers(1 if "letters" in prefix else 0, 10, n).astype(np.uint8)
        write_idx(d / f"{prefix}{split}-images-idx3-ubyte.gz", x, compress=True)
        write_idx(d / f"{prefix}{split}-labels-idx1-ubyte.gz", y, compress=True)
        arrays[split] = (x, y)
    return arrays


def isolate_search(monkeypatch, tmp_path):
    """Point $DPFL_DATA, ~ and the Debian directory at empty temporary places."""
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(loaders_mod, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "deb"))


# ---------------------------------------------------------------------------
# IDX


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.float32])
def test_load_idx_roundtrip(tmp_path, compress, dtype):
    arr = (np.arange(2 * 3 * 4) - 5).reshape(2, 3, 4).astype(dtype)
    if dtype == np.uint8:
        arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "a.idx"  # no .gz suffix: gzip must be found from the magic
    write_idx(path, arr, compress=compress)
    out = load_idx(path)
    assert out.shape == (2, 3, 4)
    assert out.dtype.isnative
    np.testing.assert_array_equal(out, arr)


def test_load_idx_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x08\x01\x00\x00\x00\x02ab")
    with pytest.raises(DpflError, match="not an IDX"):
        load_idx(bad)
    short = tmp_path / "short"
    short.write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05abc")  # promises 5, has 3
    with pytest.raises(DpflError, match="promises"):
        load_idx(short)
    with pytest.raises(FileNotFoundError):
        load_idx(tmp_path / "missing")


def test_load_mnist_from_root_and_env(tmp_path, monkeypatch):
    isolate_search(monkeypatch, tmp_path)
    arrays = write_mnist_dir(tmp_path / "root")
    ds = load_mnist(tmp_path / "root")
    assert isinstance(ds, Dataset)
    assert ds.features.shape == (12, 1, 28, 28) and ds.features.dtype == np.float32
    assert ds.test_features.shape == (5, 1, 28, 28)
    np.testing.assert_allclose(ds.features[:, 0], arrays["train"][0] / 255.0, atol=1e-7)
    np.testing.assert_array_equal(ds.labels, arrays["train"][1])
    assert ds.labels.dtype == np.int64 and ds.num_classes == 10
    # the same files as Fashion-MNIST under $DPFL_DATA/fashion-mnist
    write_mnist_dir(tmp_path / "env" / "fashion-mnist", seed=3)
    fm = load_mnist(kind="fashion")
    assert fm.name == "fashion-mnist" and fm.source.endswith("fashion-mnist")
    # lean storage gives the same numbers
    lean = load_mnist(tmp_path / "root", lean=True)
    assert isinstance(lean.features, ScaledUint8Features)
    np.testing.assert_array_equal(lean.features[[0, 3]], ds.features[[0, 3]])
    assert lean.features.nbytes * 4 == ds.features.nbytes


def test_load_emnist_transposes_and_shifts_letters(tmp_path, monkeypatch):
    isolate_search(monkeypatch, tmp_path)
    arrays = write_mnist_dir(
        tmp_path / "env" / "emnist", prefix="emnist-letters-", test="test"
    )
    ds = load_mnist(kind="emnist-letters")
    x, y = arrays["train"]
    # EMNIST stores images transposed; the loader turns them upright.
    np.testing.assert_allclose(ds.features[:, 0], x.transpose(0, 2, 1) / 255.0)
    np.testing.assert_array_equal(ds.labels, y.astype(np.int64) - 1)
    assert ds.num_classes == 26


def test_load_mnist_missing_lists_places(tmp_path, monkeypatch):
    isolate_search(monkeypatch, tmp_path)
    with pytest.raises(DatasetNotFoundError) as err:
        load_mnist(tmp_path / "nowhere", kind="fashion")
    msg = str(err.value)
    assert str(tmp_path / "nowhere") in msg
    assert str(tmp_path / "env" / "fashion-mnist") in msg
    assert str(tmp_path / "deb") in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    assert isinstance(err.value, DpflError) and isinstance(err.value, FileNotFoundError)
    with pytest.raises(InvalidParameterError, match="kind"):
        load_mnist(kind="kmnist")


@pytest.mark.skipif(
    not os.path.isdir(loaders_mod.DEBIAN_FASHION_MNIST_DIR),
    reason="Debian package dataset-fashion-mnist not installed",
)
def test_debian_fashion_mnist_found_without_being_told(monkeypatch, tmp_path):
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    ds = load_mnist(kind="fashion")
    # Xiao, Rasul, Vollgraf 2017: 60,000 train / 10,000 test, 6,000 / 1,000 per
    # class (exact counts).
    assert ds.source == loaders_mod.DEBIAN_FASHION_MNIST_DIR
    assert ds.features.shape == (60_000, 1, 28, 28)
    np.testing.assert_array_equal(np.bincount(ds.labels), np.full(10, 6000))
    np.testing.assert_array_equal(np.bincount(ds.test_labels), np.full(10, 1000))


# ---------------------------------------------------------------------------
# CIFAR-10 and Adult


def test_load_cifar10(tmp_path, monkeypatch):
    isolate_search(monkeypatch, tmp_path)
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    rng = np.random.default_rng(0)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, (4, 3072), dtype=np.uint8)
        labels = list(rng.integers(0, 10, 4))
        batches[name] = (data, labels)
        with open(d / name, "wb") as f:
            pickle.dump({b"batch_label": b"x", b"data": data, b"labels": labels}, f)
    ds = load_cifar10(tmp_path)  # finds the cifar-10-batches-py sub-folder
    assert ds.features.shape == (20, 3, 32, 32) and ds.test_features.shape[0] == 4
    data1, labels1 = batches["data_batch_1"]
    # row = 1024 red, 1024 green, 1024 blue values, each a 32x32 image row-major
    np.testing.assert_allclose(
        ds.features[0, 1], data1[0, 1024:2048].reshape(32, 32) / 255.0
    )
    np.testing.assert_array_equal(ds.labels[:4], labels1)
    np.testing.assert_array_equal(ds.test_labels, batches["test_batch"][1])
    with pytest.raises(DatasetNotFoundError, match="data_batch_1"):
        load_cifar10(tmp_path / "empty")


ADULT_TRAIN = [
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical,"
    " Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K",
    "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse,"
    " Exec-managerial, Husband, White, Male, 0, 0, 13, United-States, <=50K",
    "38, Private, 215646, HS-grad, 9, Divorced, Handlers-cleaners,"
    " Not-in-family, White, Male, 0, 0, 40, United-States, <=50K",
    "52, Self-emp-not-inc, 209642, HS-grad, 9, Married-civ-spouse,"
    " Exec-managerial, Husband, White, Male, 0, 0, 45, United-States, >50K",
    "54, ?, 180211, Some-college, 10, Married-civ-spouse, ?, Husband,"
    " Asian-Pac-Islander, Male, 0, 0, 60, South, >50K",
    "",
]
ADULT_TEST = [
    "|1x3 Cross validator",
    "25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child,"
    " Black, Male, 0, 0, 40, United-States, <=50K.",
    "44, Private, 160323, Some-college, 10, Married-civ-spouse, Machine-op-inspct,"
    " Husband, Black, Male, 7688, 0, 40, ?, >50K.",
]


def test_load_adult(tmp_path, monkeypatch):
    isolate_search(monkeypatch, tmp_path)
    d = tmp_path / "adult"
    d.mkdir()
    (d / "adult.data").write_text("\n".join(ADULT_TRAIN) + "\n")
    (d / "adult.test").write_text("\n".join(ADULT_TEST) + "\n")
    ds = load_adult(tmp_path)
    # 6 numeric + categories seen in training (missing "?" excluded):
    # workclass 3, education 3, marital 3, occupation 3, relationship 2,
    # race 2, sex 1, country 2  -> 6 + 19 = 25 columns (counted by hand).
    assert ds.features.shape == (5, 25) and ds.test_features.shape == (2, 25)
    np.testing.assert_array_equal(ds.labels, [0, 0, 0, 1, 1])
    np.testing.assert_array_equal(ds.test_labels, [0, 1])  # trailing "." dropped
    # numerics standardised with training moments (closed form: age column)
    age = np.array([39, 50, 38, 52, 54.0])
    np.testing.assert_allclose(
        ds.features[:, 0], (age - age.mean()) / age.std(), rtol=1e-6
    )
    np.testing.assert_allclose(
        ds.test_features[0, 0], (25 - age.mean()) / age.std(), rtol=1e-6
    )
    # one-hot blocks: each present categorical has exactly one 1; "?" gives none
    onehot = ds.features[:, 6:]
    assert set(np.unique(onehot)) <= {0.0, 1.0}
    # row 4 has two missing categoricals -> 8 - 2 = 6 ones
    np.testing.assert_array_equal(onehot.sum(axis=1), [8, 8, 8, 8, 6])
    # test rows: categories unseen in training encode as zeros. Row 0 has 4 seen
    # (Private, Never-married, Male, United-States); row 1 has 5 (Private,
    # Some-college, Married-civ-spouse, Husband, Male; its country is "?").
    np.testing.assert_array_equal(ds.test_features[:, 6:].sum(axis=1), [4, 5])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adult.data").write_text("1, 2, 3\n")
    (bad / "adult.test").write_text("")
    with pytest.raises(DpflError, match="15 comma-separated"):
        load_adult(bad)


# ---------------------------------------------------------------------------
# digits


def test_load_digits_split():
    ds = load_digits(seed=1)
    # scikit-learn docs: 1,797 images, 8x8, 10 classes; 0.25 stratified -> 450
    assert len(ds.labels) + len(ds.test_labels) == 1797
    assert len(ds.test_labels) == 450
    assert ds.features.shape[1:] == (1, 8, 8)
    assert 0.0 == ds.features.min() and ds.features.max() == 1.0
    # stratified: per class test count is round(0.25 n_c), n_c from the full set
    full = np.bincount(np.concatenate([ds.labels, ds.test_labels]))
    np.testing.assert_array_equal(np.bincount(ds.test_labels), np.round(0.25 * full))
    again = load_digits(seed=1)
    np.testing.assert_array_equal(again.test_labels, ds.test_labels)
    np.testing.assert_array_equal(again.features, ds.features)
    other = load_digits(seed=2)
    assert not np.array_equal(other.features, ds.features)
    assert load_digits(flatten=True).features.shape[1:] == (64,)


# ---------------------------------------------------------------------------
# partitions


def assert_disjoint_cover(parts, n, cover=True):
    allrows = np.concatenate(parts)
    assert len(np.unique(allrows)) == len(allrows), "partition overlaps"
    if cover:
        np.testing.assert_array_equal(np.sort(allrows), np.arange(n))
    for p in parts:
        assert p.dtype == np.int64


def test_iid_partition():
    parts = iid(103, 10, np.random.default_rng(0))
    assert_disjoint_cover(parts, 103)
    assert sorted(len(p) for p in parts) == [10] * 7 + [11] * 3
    again = iid(103, 10, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = iid(103, 10, np.random.default_rng(1))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))
    with pytest.raises(InvalidParameterError, match="num_clients"):
        iid(5, 6, np.random.default_rng(0))
    with pytest.raises(InvalidParameterError, match="rng"):
        iid(5, 2, 0)


def test_shards_label_counts():
    labels = np.repeat(np.arange(10), 60)  # 600 rows, 60 per class
    rng = np.random.default_rng(0)
    parts = shards(labels, 20, 2, rng)  # 40 shards of 15 -> each one label
    assert_disjoint_cover(parts, 600)
    assert all(len(p) == 30 for p in parts)
    for p in parts:
        counts = np.bincount(labels[p], minlength=10)
        assert np.count_nonzero(counts) <= 2
        assert set(counts[counts > 0]) <= {15, 30}  # whole shards only
    again = shards(labels, 20, 2, np.random.default_rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    with pytest.raises(InvalidParameterError, match="shards_per_client"):
        shards(labels, 400, 2, rng)


def _mean_tv(labels, parts):
    """Mean total-variation distance of client label mixes from the global one."""
    k = labels.max() + 1
    glob = np.bincount(labels, minlength=k) / len(labels)
    tv = [
        0.5 * np.abs(np.bincount(labels[p], minlength=k) / len(p) - glob).sum()
        for p in parts
    ]
    return float(np.mean(tv))


def test_dirichlet_skew_decreases_with_beta():
    labels = np.repeat(np.arange(10), 500)
    tvs = []
    for beta in (0.05, 0.5, 5.0, 500.0):
        parts = dirichlet(labels, 20, beta, np.random.default_rng(0), min_size=5)
        assert_disjoint_cover(parts, len(labels))
        assert min(len(p) for p in parts) >= 5
        tvs.append(_mean_tv(labels, parts))
    # strictly less skew as beta grows; with beta=500 the mixes are near global
    # (expected TV ~ 0.03 for 250 rows per client), with beta=0.05 near one class.
    assert tvs == sorted(tvs, reverse=True) and len(set(tvs)) == 4
    assert tvs[0] > 0.6 and tvs[-1] < 0.1
    again = dirichlet(labels, 20, 0.5, np.random.default_rng(0), min_size=5)
    first = dirichlet(labels, 20, 0.5, np.random.default_rng(0), min_size=5)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    with pytest.raises(DpflError, match="min_size"):
        dirichlet(labels, 20, 0.01, np.random.default_rng(0), min_size=240, max_tries=3)


def test_dirichlet_per_client_sizes_and_skew():
    labels = np.repeat(np.arange(10), 100)
    parts = dirichlet_per_client(labels, 10, 100, 0.5, np.random.default_rng(0))
    assert_disjoint_cover(parts, 1000)  # 10 x 100 uses every row
    assert all(len(p) == 100 for p in parts)
    wide = dirichlet_per_client(labels, 5, 100, 1000.0, np.random.default_rng(0))
    narrow = dirichlet_per_client(labels, 5, 100, 0.05, np.random.default_rng(0))
    assert _mean_tv(labels, narrow) > _mean_tv(labels, wide)


def test_equal_size():
    parts = equal_size(697_932, 23_264, 30, np.random.default_rng(0))
    # random-participation paper §6: 23,264 EMNIST clients x d = 30 records
    assert len(parts) == 23_264 and all(len(p) == 30 for p in parts)
    assert_disjoint_cover(parts, 697_932, cover=False)
    assert len(np.concatenate(parts)) == 697_920  # 12 rows left out
    # lean: all clients are views of one shared array of 697,920 int64
    assert parts[0].base is not None and parts[0].base is parts[-1].base
    with pytest.raises(InvalidParameterError, match="allow_repeats"):
        equal_size(100, 11, 10, np.random.default_rng(0))
    rep = equal_size(600, 3, 600, np.random.default_rng(0), allow_repeats=True)
    counts = np.bincount(np.concatenate(rep), minlength=600)
    np.testing.assert_array_equal(counts, np.full(600, 3))


def test_client_test_split_follows_client_labels():
    labels = np.repeat(np.arange(10), 60)
    parts = shards(labels, 20, 2, np.random.default_rng(0))
    test_labels = np.tile(np.arange(10), 30)
    tests = client_test_split(labels, parts, test_labels, 20, np.random.default_rng(1))
    for p, t in zip(parts, tests):
        assert len(t) == 20 and len(np.unique(t)) == 20  # without replacement
        assert set(test_labels[t]) <= set(labels[p])


# ---------------------------------------------------------------------------
# FederatedDataset and federate


def test_federate_and_dataset_access():
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    y = np.repeat(np.arange(4), 5)
    ds = federate(
        x,
        y,
        partition="iid",
        num_clients=4,
        seed=0,
        test_features=x[:8],
        test_labels=np.tile(np.arange(4), 2),
        client_test_records=3,
    )
    assert isinstance(ds, FederatedDataset)
    assert ds.num_clients == 4 and ds.num_classes == 4 and ds.input_shape == (2,)
    np.testing.assert_array_equal(ds.client_sizes(), [5, 5, 5, 5])
    xk, yk = ds.client(2)
    rows = ds.client_indices[2]
    np.testing.assert_array_equal(xk, x[rows])
    np.testing.assert_array_equal(yk, y[rows])
    assert ds.label_counts().sum() == 20
    assert ds.client_test(0)[0].shape == (3, 2)
    assert "clients: 4" in ds.summary()
    # contiguous rows give views, not copies
    blocks = federate(x, y, partition=[np.arange(0, 10), np.arange(10, 20)])
    xb, _ = blocks.client(1)
    assert np.shares_memory(xb, x)
    with pytest.raises(InvalidParameterError, match="k must be in"):
        ds.client(4)
    with pytest.raises(InvalidParameterError, match="client_indices"):
        federate(x, y, partition=[np.arange(0, 21)])
    with pytest.raises(InvalidParameterError, match="float32"):
        FederatedDataset(x.astype(np.float64), y, [np.arange(20)], num_classes=4)
    with pytest.raises(InvalidParameterError, match="partition"):
        federate(x, y, partition="random", num_clients=2)


# ---------------------------------------------------------------------------
# Synthetic(alpha, beta)


def test_synthetic_shapes_and_determinism():
    a = synthetic(num_clients=40, alpha=0.5, beta=0.5, seed=3)
    b = synthetic(num_clients=40, alpha=0.5, beta=0.5, seed=3)
    np.testing.assert_array_equal(a.features, b.features)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert a.features.dtype == np.float32 and a.input_shape == (60,)
    sizes = a.client_sizes()
    assert sizes.min() >= 50  # FedProx: int(lognormal(4, 2)) + 50
    c = synthetic(num_clients=40, alpha=0.5, beta=0.5, seed=4)
    assert not np.array_equal(c.labels[:50], a.labels[:50])
    # prefix-stable: the first 5 clients of a 40-client run equal a 5-client run
    small = synthetic(num_clients=5, alpha=0.5, beta=0.5, seed=3)
    for k in range(5):
        np.testing.assert_array_equal(small.client(k)[0], a.client(k)[0])
    xk, _ = a.client(7)
    assert np.shares_memory(xk, a.features)  # client-major storage: views
    t = synthetic(
        num_clients=6,
        alpha=1,
        beta=1,
        records_per_client=10,
        seed=0,
        test_records_per_client=4,
    )
    assert t.client_test(5)[0].shape == (4, 60)


def test_synthetic_moments_match_the_model():
    # iid: x ~ N(0, diag(j^-1.2)). Sample variance of n = 20,000 draws has
    # relative s.e. sqrt(2/n) = 1%; tolerance 5%.
    ds = synthetic(num_clients=1000, alpha=0, beta=0, records_per_client=20, iid=True)
    var = ds.features.astype(np.float64).var(axis=0)
    np.testing.assert_allclose(var, np.arange(1, 61) ** -1.2, rtol=0.05)
    # non-iid, beta = 2 read as a standard deviation (FedProx code): the mean of
    # client k's d = 30 records in dimension 0 is B_k + N(0,1) + N(0, 1/30),
    # variance 4 + 1 + 1/30 = 5.033 (it would be 3.033 if beta were a variance).
    # Across 3000 clients the variance estimate has s.e. 2.6%; tolerance 10%.
    ds = synthetic(num_clients=3000, alpha=0, beta=2, records_per_client=30, seed=1)
    means = ds.features[:, 0].reshape(3000, 30).mean(axis=1)
    assert means.var() == pytest.approx(5.0 + 1 / 30, rel=0.10)


def test_synthetic_heterogeneity_grows_with_alpha_beta():
    iid_ds = synthetic(
        num_clients=200, alpha=0, beta=0, records_per_client=50, iid=True
    )
    het = synthetic(num_clients=200, alpha=1, beta=1, records_per_client=50)
    tv_iid = _mean_tv(iid_ds.labels, iid_ds.client_indices)
    tv_het = _mean_tv(het.labels, het.client_indices)
    assert tv_het > 2 * tv_iid  # measured: 0.82 vs 0.15


def test_synthetic_memory_at_random_participation_scale():
    # 23,264 clients x 30 records x 60 dims (random-participation paper §6 sizes)
    tracemalloc.start()
    try:
        ds = synthetic(num_clients=23_264, alpha=1, beta=1, records_per_client=30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    n = 23_264 * 30
    assert ds.features.nbytes == n * 60 * 4  # 167.5 MB: float32, no copies
    assert ds.labels.nbytes == n * 8
    # the indices: one arange of the rows plus one int64 offset a client (and a last)
    assert ds.nbytes() == n * 60 * 4 + 2 * n * 8 + 8 * (23_264 + 1)
    # peak = output + one chunk of work; measured 180 MiB vs 170 MiB output
    assert peak < ds.nbytes() + 64 * 2**20


# ---------------------------------------------------------------------------
# procedural images


def test_hash_normals_are_standard_normal():
    # 10^6 draws: s.e. of mean 1e-3, of variance 1.4e-3; tolerance 5 s.e.
    z = _hash_normal(12345, np.arange(1000), 1000).astype(np.float64).ravel()
    assert abs(z.mean()) < 5e-3
    assert abs(z.var() - 1) < 7e-3
    assert stats.kstest(z[:20000], "norm").pvalue > 1e-3


def test_synthetic_images_lazy_and_deterministic():
    ds = synthetic_images(num_clients=23_264, records_per_client=30, seed=0)
    assert isinstance(ds.features, ProceduralImages)
    assert ds.features.shape == (697_920, 1, 28, 28)
    # stored: labels (5.6 MB) + templates + index arange, not 2.19 GB of pixels
    assert ds.nbytes() < 12 * 2**20
    rows = np.array([5, 697_919, 123_456, 5])
    x, y = ds.take(rows)
    assert x.shape == (4, 1, 28, 28) and x.dtype == np.float32
    assert 0.0 <= x.min() and x.max() <= 1.0
    np.testing.assert_array_equal(x[0], x[3])
    np.testing.assert_array_equal(x[1], ds.features[697_919])  # batch-independent
    np.testing.assert_array_equal(ds.client(4)[0], ds.features[120:150])
    again = synthetic_images(num_clients=23_264, records_per_client=30, seed=0)
    np.testing.assert_array_equal(again.take(rows)[0], x)


def test_synthetic_images_carry_label_signal():
    def nearest_template_accuracy(noise):
        ds = synthetic_images(
            num_clients=50, records_per_client=40, seed=1, noise=noise
        )
        x, y = ds.take(np.arange(2000))
        t = ds.features.templates.reshape(10, -1)
        dist = ((x.reshape(2000, 1, -1) - t[None]) ** 2).sum(-1)
        return (dist.argmin(1) == y).mean()

    # measured: 0.95 at noise 0.5; chance is 0.1
    assert nearest_template_accuracy(0.5) > 0.8
    assert nearest_template_accuracy(20.0) < 0.3


def test_synthetic_images_label_skew():
    ds = synthetic_images(
        num_clients=200,
        records_per_client=50,
        seed=0,
        label_concentration=0.1,
        test_records_per_client=5,
    )
    skew = _mean_tv(ds.labels, ds.client_indices)
    flat = synthetic_images(num_clients=200, records_per_client=50, seed=0)
    assert skew > 2 * _mean_tv(flat.labels, flat.client_indices)
    assert ds.client_test(3)[0].shape == (5, 1, 28, 28)


# ---------------------------------------------------------------------------
# registry


def test_get_dataset_registry(tmp_path, monkeypatch):
    isolate_search(monkeypatch, tmp_path)
    assert set(DATASETS) == {
        "digits",
        "synthetic",
        "synthetic-images",
        "mnist",
        "fashion-mnist",
        "emnist",
        "femnist",
        "cifar10",
        "adult",
        "csv",
        "npz",
        "idx",
    }
    ds = get_dataset("digits", num_clients=5, partition="shards", shards_per_client=2)
    assert ds.num_clients == 5 and ds.name == "digits/shards"
    assert ds.client_sizes().sum() == 1347
    syn = get_dataset("synthetic", num_clients=3, alpha=0, beta=0, records_per_client=4)
    assert syn.client_sizes().tolist() == [4, 4, 4]
    with pytest.raises(DpflError, match="synthetic-images"):
        get_dataset("imagenet")
    with pytest.raises(
        DatasetNotFoundError, match="apt-get install dataset-fashion-mnist"
    ):
        get_dataset("fashion-mnist")
    with pytest.raises(InvalidParameterError, match="colour"):
        get_dataset("digits", colour=True)
    write_mnist_dir(tmp_path / "env" / "emnist", prefix="emnist-byclass-", test="test")
    em = get_dataset("emnist", num_clients=2)
    assert em.num_classes == 62 and em.num_records == 12
