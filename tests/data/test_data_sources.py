"""A user's own data into a FederatedDataset: arrays, tensors, per-client lists,
torch datasets, CSV, npz and IDX files, from Python and from a run configuration.

Every file is written by the test in its real format (csv module, numpy.savez,
the IDX layout of LeCun et al.'s MNIST page)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from test_data import write_idx

from dpfl.data import (
    DatasetNotFoundError,
    federate,
    federate_clients,
    federate_torch,
    get_dataset,
    load_csv,
    load_idx_files,
    load_npz,
    natural,
)
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.experiments.build import build_dataset as _build_dataset
from dpfl.experiments.config import ConfigError, config_from_dict


# -- arrays and tensors -----------------------------------------------------------
def test_federate_takes_tensors_and_any_numeric_dtype():
    x = torch.arange(24, dtype=torch.float64).reshape(12, 2)
    y = torch.tensor([0, 1, 2] * 4)
    ds = federate(x, y, partition="iid", num_clients=3, seed=1)
    assert ds.features.dtype == np.float32 and ds.labels.dtype == np.int64
    assert ds.num_classes == 3 and ds.client_sizes().tolist() == [4, 4, 4]
    np.testing.assert_array_equal(ds.features, x.numpy().astype(np.float32))
    # Labels stored as integral floats are accepted; fractional ones are not.
    federate(np.ones((3, 2)), np.array([0.0, 1.0, 1.0]), partition=[np.arange(3)])
    with pytest.raises(InvalidParameterError, match="labels must be"):
        federate(np.ones((3, 2)), np.array([0.5, 1.0, 1.0]), partition=[np.arange(3)])
    with pytest.raises(InvalidParameterError, match="features must be a numeric"):
        federate(np.array([["a", "b"]] * 3), [0, 1, 0], partition=[np.arange(3)])


def test_any_partitioners_index_lists_plug_in():
    # What a partitioner such as flwr-datasets' gives, per client: row numbers
    # (e.g. the values of an added "row" column in each loaded partition).
    x = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    y = np.arange(10) % 2
    parts = [[0, 3, 7], np.array([1, 2]), torch.tensor([4, 5, 6, 8, 9])]
    ds = federate(x, y, partition=parts)
    assert ds.name == "custom" and ds.client_sizes().tolist() == [3, 2, 5]
    np.testing.assert_array_equal(ds.client(0)[0], x[[0, 3, 7]])
    assert ds.features is x  # float32 arrays are kept, not copied
    with pytest.raises(InvalidParameterError, match=r"partition\[1\] must be"):
        federate(x, y, partition=[[0], [0.5]])
    with pytest.raises(InvalidParameterError, match=r"must lie in \[0, 10\)"):
        federate(x, y, partition=[[0, 10]])


def test_natural_partition_one_client_per_id():
    ids = np.array(["b", "a", "b", "c", "a", "b"])
    parts = natural(ids)
    assert [p.tolist() for p in parts] == [[1, 4], [0, 2, 5], [3]]
    rng = np.random.default_rng(0)
    two = natural(ids, 2, rng)
    assert len(two) == 2 and all(any(np.array_equal(t, p) for p in parts) for t in two)
    with pytest.raises(InvalidParameterError, match="num_clients must be <= the 3"):
        natural(ids, 4, rng)
    x = np.zeros((6, 1), np.float32)
    with pytest.raises(InvalidParameterError, match="needs client_ids"):
        federate(x, np.zeros(6, int), partition="natural")
    ds = federate(x, np.zeros(6, int), partition="natural", client_ids=ids)
    assert ds.client_sizes().tolist() == [2, 3, 1]


# -- per-client lists and torch datasets ---------------------------------------------
def test_federate_clients_keeps_each_clients_records():
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(n, 2, 2)), rng.integers(0, 3, n)) for n in (4, 1, 6)]
    clients[1] = (torch.tensor(clients[1][0]), torch.tensor(clients[1][1]))
    tests = [(rng.normal(size=(2, 2, 2)), [0, 1]) for _ in range(3)]
    ds = federate_clients(
        clients, test=(rng.normal(size=(5, 2, 2)), [2] * 5), client_tests=tests
    )
    assert ds.client_sizes().tolist() == [4, 1, 6]
    for k, (cx, cy) in enumerate(clients):
        x, y = ds.client(k)
        np.testing.assert_allclose(x, np.asarray(cx, np.float32))
        np.testing.assert_array_equal(y, np.asarray(cy))
    assert len(ds.test_labels) == 5 + 6
    np.testing.assert_allclose(ds.client_test(2)[0], tests[2][0].astype(np.float32))
    assert ds.input_shape == (2, 2)
    with pytest.raises(InvalidParameterError, match="one shape"):
        federate_clients([(np.ones((2, 3)), [0, 1]), (np.ones((2, 4)), [0, 1])])
    with pytest.raises(InvalidParameterError, match=r"clients\[0\] must hold as many"):
        federate_clients([(np.ones((2, 3)), [0])])
    with pytest.raises(InvalidParameterError, match="one entry per client"):
        federate_clients(clients, client_tests=tests[:2])


class _Squares(torch.utils.data.Dataset):
    """A map-style dataset built on the fly: x = (i, i²), y = i mod 3."""

    def __len__(self) -> int:
        return 9

    def __getitem__(self, i: int):
        return torch.tensor([i, i * i], dtype=torch.float32), i % 3


def test_federate_torch_dataset_and_tensor_dataset():
    ds = federate_torch(_Squares(), "shards", 3, shards_per_client=1, seed=0)
    assert ds.num_records == 9 and ds.num_classes == 3
    np.testing.assert_array_equal(ds.features[4], [4.0, 16.0])
    # Label shards of one class each: every client sees a single label.
    assert (ds.label_counts() > 0).sum(axis=1).tolist() == [1, 1, 1]
    tds = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.arange(8) % 2)
    fed = federate_torch(tds, [np.arange(4), np.arange(4, 8)], test=_Squares())
    assert fed.client_sizes().tolist() == [4, 4] and len(fed.test_labels) == 9
    with pytest.raises(InvalidParameterError, match="map-style"):
        federate_torch(iter([]), num_clients=1)


# -- CSV ----------------------------------------------------------------------
def write_csv(path: Path, rows, header=("label", "client", "x1", "x2")) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        if header:
            w.writerow(header)
        w.writerows(rows)
    return path


ROWS = [
    ("yes", "alice", 1.0, 2.0),
    ("no", "bob", 3.0, 4.0),
    ("yes", "bob", 5.0, 6.0),
    ("no", "carol", 7.0, 8.5),
    ("no", "alice", 9.0, 10.0),
]


def test_load_csv_label_names_and_natural_clients(tmp_path):
    data = load_csv(write_csv(tmp_path / "r.csv", ROWS), client_column="client")
    assert data.num_classes == 2 and data.labels.tolist() == [1, 0, 1, 0, 0]
    np.testing.assert_array_equal(data.features[3], [7.0, 8.5])
    fed = data.federate()  # natural is the default with a client column
    assert fed.name == "r/natural"
    assert [c.tolist() for c in fed.client_indices] == [[0, 4], [1, 2], [3]]
    assert data.federate("iid", 2).num_clients == 2


def test_load_csv_errors_name_the_column_and_line(tmp_path):
    p = write_csv(tmp_path / "r.csv", ROWS)
    with pytest.raises(DpflError, match=r"r.csv:2: column 'client' holds 'alice'"):
        load_csv(p)  # the client column read as a feature
    with pytest.raises(InvalidParameterError, match=r"'target' is not a column .*"):
        load_csv(p, label_column="target")
    bad = write_csv(tmp_path / "b.csv", [*ROWS[:2], ("no", "bob", "", 1.0)])
    with pytest.raises(DpflError, match=r"b.csv:4: column 'x1' holds ''"):
        load_csv(bad, client_column="client")
    short = tmp_path / "s.csv"
    short.write_text("label,x\n1,2\n3\n")
    with pytest.raises(DpflError, match=r"s.csv:3: expected 2 fields"):
        load_csv(short)
    with pytest.raises(DatasetNotFoundError, match="CSV file not found"):
        load_csv(tmp_path / "none.csv")
    with pytest.raises(InvalidParameterError, match="delimiter must be a single"):
        load_csv(p, delimiter=", ")
    semi = tmp_path / "semi.csv"
    semi.write_text("label;x\n1;2.5\n0;3\n")
    assert load_csv(semi, delimiter=";").features.tolist() == [[2.5], [3.0]]


def test_load_csv_without_header_and_with_test_sets(tmp_path):
    rows = [(i % 3, i, 2 * i) for i in range(20)]
    p = write_csv(tmp_path / "n.csv", rows, header=None)
    data = load_csv(p, header=False, label_column=0, test_fraction=0.25, seed=3)
    assert len(data.labels) == 15 and len(data.test_labels) == 5
    assert data.num_classes == 3 and data.input_shape == (2,)
    # Every record is in exactly one of the two sets, with its own label.
    xs = np.concatenate([data.features, data.test_features])
    assert sorted(xs[:, 0].tolist()) == list(range(20))
    with pytest.raises(InvalidParameterError, match="column number when header"):
        load_csv(p, header=False, label_column="label")
    train = write_csv(tmp_path / "tr.csv", ROWS)
    test = write_csv(tmp_path / "te.csv", [("maybe", "dan", 0, 0)])
    with pytest.raises(DpflError, match=r"labels \['maybe'\]"):
        load_csv(train, client_column="client", test_path=test)
    test = write_csv(tmp_path / "te.csv", [("yes", "dan", 0, 0)])
    data = load_csv(train, client_column="client", test_path=test)
    assert data.test_labels.tolist() == [1]
    assert data.federate().client_test_indices is None  # dan is no client
    rows = [("no", "bob", 1, 1), ("yes", "alice", 2, 2), ("no", "carol", 3, 3)]
    test = write_csv(tmp_path / "te.csv", [*rows, ("yes", "bob", 4, 4)])
    fed = load_csv(train, client_column="client", test_path=test).federate()
    # Clients alice, bob, carol: each one's own test records.
    assert [fed.client_test(k)[0][:, 0].tolist() for k in range(3)] == [
        [2.0],
        [1.0, 4.0],
        [3.0],
    ]


# -- npz and IDX -----------------------------------------------------------------------
def test_load_npz_default_names_and_keras_layout(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (6, 4, 4), dtype=np.uint8)
    np.savez(
        tmp_path / "k.npz",
        x_train=x,
        y_train=np.arange(6) % 3,
        x_test=x[:2],
        y_test=[0, 2],
        writers=np.array([5, 5, 7, 7, 7, 9]),
    )
    data = load_npz(tmp_path / "k.npz")
    assert data.features.shape == (6, 1, 4, 4) and data.features.dtype == np.float32
    np.testing.assert_allclose(data.features[:, 0], x / 255.0, rtol=1e-6)
    assert data.num_classes == 3 and data.test_features.shape == (2, 1, 4, 4)
    assert data.federate().client_sizes().tolist() == [2, 3, 1]
    np.savez(tmp_path / "o.npz", a=np.ones((3, 2)), b=[0, 1, 1])
    with pytest.raises(InvalidParameterError, match=r"it holds \['a', 'b'\]"):
        load_npz(tmp_path / "o.npz")
    data = load_npz(tmp_path / "o.npz", features="a", labels="b")
    assert data.test_features is None and data.input_shape == (2,)
    with pytest.raises(InvalidParameterError, match="'c' is not an array"):
        load_npz(tmp_path / "o.npz", features="c", labels="b")


def test_load_idx_files_by_name_and_by_directory(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (7, 5, 5), dtype=np.uint8)
    y = (np.arange(7) % 4).astype(np.uint8)
    write_idx(tmp_path / "my-images.idx", x)
    write_idx(tmp_path / "my-labels.idx", y, compress=True)
    data = load_idx_files(tmp_path / "my-images.idx", tmp_path / "my-labels.idx")
    assert data.features.shape == (7, 1, 5, 5) and data.num_classes == 4
    d = tmp_path / "dir"
    d.mkdir()
    write_idx(d / "k-train-images-idx3-ubyte.gz", x, compress=True)
    write_idx(d / "k-train-labels-idx1-ubyte.gz", y, compress=True)
    write_idx(d / "k-test-images-idx3-ubyte.gz", x[:3], compress=True)
    write_idx(d / "k-test-labels-idx1-ubyte.gz", y[:3], compress=True)
    data = load_idx_files(d)
    assert len(data.labels) == 7 and len(data.test_labels) == 3
    write_idx(d / "z-train-images-idx3-ubyte.gz", x, compress=True)
    with pytest.raises(InvalidParameterError, match="several training images"):
        load_idx_files(d)
    with pytest.raises(InvalidParameterError, match="labels is required"):
        load_idx_files(tmp_path / "my-images.idx")
    write_idx(tmp_path / "few.idx", y[:3])
    with pytest.raises(InvalidParameterError, match="holds labels"):
        load_idx_files(tmp_path / "my-images.idx", tmp_path / "few.idx")


# -- by name and from the run configuration ------------------------------------
def test_get_dataset_reads_files_by_name(tmp_path):
    p = write_csv(tmp_path / "r.csv", ROWS)
    fed = get_dataset("csv", path=p, client_column="client", num_clients=2, seed=0)
    assert fed.num_clients == 2 and fed.name == "r/natural"
    assert get_dataset("csv", path=p, client_column="client").num_clients == 3
    fed = get_dataset("csv", path=p, feature_columns=["x2"], num_clients=5)
    assert fed.num_clients == 5 and fed.input_shape == (1,)
    np.savez(tmp_path / "a.npz", feats=np.ones((6, 3)), labs=[0, 1] * 3)
    fed = get_dataset(
        "npz", path=tmp_path / "a.npz", features="feats", labels="labs", num_clients=2
    )
    assert fed.client_sizes().tolist() == [3, 3] and fed.name == "a/iid"
    d = tmp_path / "idx"
    d.mkdir()
    write_idx(d / "train-images-idx3-ubyte", np.zeros((4, 2, 2), np.uint8))
    write_idx(d / "train-labels-idx1-ubyte", np.array([0, 1, 2, 3], np.uint8))
    fed = get_dataset("idx", path=d, num_clients=4)
    assert fed.num_classes == 4 and fed.name == "idx/iid"
    with pytest.raises(InvalidParameterError, match="path is required"):
        get_dataset("npz")
    with pytest.raises(InvalidParameterError, match="does not take"):
        get_dataset("csv", path=p, colour=1)


def test_run_config_reads_a_csv_file(tmp_path, monkeypatch):
    write_csv(tmp_path / "r.csv", ROWS)
    monkeypatch.chdir(tmp_path)
    cfg = config_from_dict(
        {
            "data": {
                "name": "csv",
                "path": "r.csv",  # relative to the working directory
                "partition": "natural",
                "num_clients": None,
                "options": {"client_column": "client", "test_fraction": 0.2},
            }
        }
    )
    ds = _build_dataset(cfg)
    assert ds.num_clients <= 3 and len(ds.test_labels) == 1
    assert sum(ds.client_sizes()) == 4
    assert config_from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="data.path is required"):
        config_from_dict({"data": {"name": "npz"}})
    with pytest.raises(ConfigError, match="data.options.root"):
        config_from_dict({"data": {"name": "mnist", "path": "x"}})
    with pytest.raises(ConfigError, match="num_clients may be null only"):
        config_from_dict({"data": {"num_clients": None}})
    cfg = config_from_dict(
        {"data": {"name": "npz", "path": "none.npz", "partition": "iid"}}
    )
    with pytest.raises(DatasetNotFoundError, match="none.npz"):
        _build_dataset(cfg)


def test_dirichlet_per_client_test_sets_follow_the_drawn_mix():
    """federated f-DP §4.2: a client's test labels ~ Multinomial(200, q), with q
    the Dirichlet draw of its training labels, not their empirical mix."""
    from dpfl.data import dirichlet_per_client

    y = np.repeat(np.arange(5), 400)
    x = np.zeros((y.size, 1), np.float32)
    test_y = np.repeat(np.arange(5), 400)
    fed = federate(
        x,
        y,
        partition="dirichlet-per-client",
        num_clients=20,
        records_per_client=4,
        beta=1.0,
        seed=3,
        client_test_records=3000,
        test_features=np.zeros((test_y.size, 1)),
        test_labels=test_y,
    )
    q: list[np.ndarray] = []
    parts = dirichlet_per_client(y, 20, 4, 1.0, np.random.default_rng(3), proportions=q)
    assert all(np.array_equal(a, b) for a, b in zip(parts, fed.client_indices))
    to_q, to_emp = [], []
    for k in range(20):
        freq = np.bincount(fed.client_test(k)[1], minlength=5) / 3000
        emp = np.bincount(y[parts[k]], minlength=5) / 4
        to_q.append(np.abs(freq - q[k]).max())
        to_emp.append(np.abs(freq - emp).max())
    # 3000 draws: a frequency's sd is <= 0.0092, so 0.05 is > 5 sd.
    assert max(to_q) < 0.05
    # 4 training records cannot show q: the empirical mix is far off.
    assert np.mean(to_emp) > 0.1
