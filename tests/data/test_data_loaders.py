"""The papers' own data: Federated EMNIST by writer (LEAF's JSON files and
TensorFlow Federated's HDF5 files, written here in their real layouts), and
where dpfl looks for every real data set."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_data import ADULT_TEST, ADULT_TRAIN, isolate_search, write_mnist_dir

from dpfl.data import (
    REAL_DATASETS,
    DatasetNotFoundError,
    get_dataset,
    load_adult,
    load_femnist,
    locate,
)
from dpfl.errors import DpflError, InvalidParameterError

# Three writers; pixels are multiples of 1/255 as LEAF's preprocessing
# (``vec / 255`` of 8-bit grey levels) and TFF's files store them.
WRITERS = {"f0001_12": (3, 2), "f0002_07": (2, 1), "f0417_33": (4, 2)}


def _writer_data(seed: int) -> dict[str, tuple[np.ndarray, ...]]:
    rng = np.random.default_rng(seed)
    out = {}
    for w, (n_tr, n_te) in WRITERS.items():
        grey = rng.integers(0, 256, (n_tr + n_te, 28, 28))
        labels = rng.integers(0, 62, n_tr + n_te)
        labels[0] = 3  # every writer has a digit
        out[w] = (grey[:n_tr], labels[:n_tr], grey[n_tr:], labels[n_tr:])
    return out


def write_leaf(d: Path, data) -> None:
    """LEAF's layout: train/*.json and test/*.json, {users, num_samples, user_data}."""
    for split, (xi, yi) in (("train", (0, 1)), ("test", (2, 3))):
        (d / split).mkdir(parents=True)
        # Two files, as LEAF writes at most 100 writers per file.
        groups = [list(WRITERS)[:2], list(WRITERS)[2:]]
        for g, users in enumerate(groups):
            blob = {
                "users": users,
                "num_samples": [len(data[u][yi]) for u in users],
                "user_data": {
                    u: {
                        "x": (data[u][xi].reshape(-1, 784) / 255).tolist(),
                        "y": data[u][yi].tolist(),
                    }
                    for u in users
                },
            }
            path = d / split / f"all_data_{g}_niid_0_keep_0_{split}_9.json"
            path.write_text(json.dumps(blob))


def write_tff(d: Path, data, prefix: str = "fed_emnist") -> None:
    """TFF's layout: examples/<writer>/{pixels (n,28,28) float32, label (n,) int32}."""
    h5py = pytest.importorskip("h5py")
    d.mkdir(parents=True, exist_ok=True)
    for split, (xi, yi) in (("train", (0, 1)), ("test", (2, 3))):
        with h5py.File(d / f"{prefix}_{split}.h5", "w") as h5:
            for u in WRITERS:
                g = h5.create_group(f"examples/{u}")
                g["pixels"] = (data[u][xi] / 255).astype(np.float32)
                g["label"] = data[u][yi].astype(np.int32)


def _check_writers(ds, data) -> None:
    assert ds.num_classes == 62 and ds.features.shape[1:] == (1, 28, 28)
    assert len(ds.client_ids) == len(ds.labels) == 9 and len(ds.test_labels) == 5
    for w in WRITERS:
        rows = ds.client_ids == w
        np.testing.assert_allclose(ds.features[rows][:, 0], data[w][0] / 255, atol=1e-6)
        assert ds.labels[rows].tolist() == data[w][1].tolist()
    fed = ds.federate()  # one client per writer, in sorted writer order
    assert fed.name == "femnist/natural"
    assert fed.client_sizes().tolist() == [3, 2, 4]
    # Each writer's test images are its personalised test set.
    for k, w in enumerate(sorted(WRITERS)):
        x, y = fed.client_test(k)
        np.testing.assert_allclose(x[:, 0], data[w][2] / 255, atol=1e-6)
        assert y.tolist() == data[w][3].tolist()


def test_femnist_leaf_json(tmp_path, monkeypatch):
    isolate_search(monkeypatch, tmp_path)
    data = _writer_data(0)
    write_leaf(tmp_path / "env" / "femnist", data)
    ds = load_femnist()
    _check_writers(ds, data)
    assert ds.source == str(tmp_path / "env" / "femnist")
    inv = load_femnist(invert=True, lean=True)
    np.testing.assert_allclose(inv.features[:], 1 - ds.features, atol=1e-6)
    digits = load_femnist(only_digits=True)
    assert digits.num_classes == 10 and digits.labels.max() < 10
    assert set(digits.client_ids) == set(WRITERS)


def test_femnist_tff_hdf5(tmp_path, monkeypatch):
    isolate_search(monkeypatch, tmp_path)
    data = _writer_data(1)
    write_tff(tmp_path / "root", data)
    _check_writers(load_femnist(tmp_path / "root"), data)
    # By name: the natural partition by default, or a random subset of writers.
    fed = get_dataset("femnist", root=tmp_path / "root", num_clients=2, seed=0)
    assert fed.num_clients == 2 and set(fed.client_sizes()) <= {2, 3, 4}
    fed = get_dataset("femnist", root=tmp_path / "root", partition="iid", num_clients=3)
    assert fed.client_sizes().tolist() == [3, 3, 3]


def test_femnist_malformed_and_missing(tmp_path, monkeypatch):
    isolate_search(monkeypatch, tmp_path)
    with pytest.raises(DatasetNotFoundError) as err:
        load_femnist()
    msg = str(err.value)
    assert "dpfl data fetch femnist" in msg and "preprocess.sh" in msg
    assert str(tmp_path / "env" / "femnist") in msg
    d = tmp_path / "env" / "femnist"
    for split in ("train", "test"):
        (d / split).mkdir(parents=True)
        (d / split / "a.json").write_text(
            json.dumps({"users": ["u"], "user_data": {"u": {"x": [[0.0]], "y": [1]}}})
        )
    with pytest.raises(DpflError, match=r"user 'u' has x \(1, 1\)"):
        load_femnist()


def test_locate_finds_without_reading_and_says_how(tmp_path, monkeypatch):
    isolate_search(monkeypatch, tmp_path)
    write_mnist_dir(tmp_path / "env" / "mnist")
    assert locate("mnist") == tmp_path / "env" / "mnist"
    for name in REAL_DATASETS:
        if name == "mnist":
            continue
        with pytest.raises(DatasetNotFoundError, match=f"dpfl data fetch {name}"):
            locate(name)
    with pytest.raises(InvalidParameterError, match="name must be one of"):
        locate("imagenet")


def test_adult_ordinal_encoding_has_the_14_attributes(tmp_path, monkeypatch):
    isolate_search(monkeypatch, tmp_path)
    d = tmp_path / "adult"
    d.mkdir()
    (d / "adult.data").write_text("\n".join(ADULT_TRAIN) + "\n")
    (d / "adult.test").write_text("\n".join(ADULT_TEST) + "\n")
    ds = load_adult(tmp_path, encoding="ordinal")
    assert ds.input_shape == (14,) and ds.test_features.shape == (2, 14)
    # workclass: State-gov, Self-emp-not-inc, Private, Self-emp-not-inc, ?
    # -> codes 2, 1, 0, 1 (sorted: Private 0, Self-emp-not-inc 1, State-gov 2),
    # mean 1, sd sqrt(0.5); '?' sits at the mean. By hand:
    r = np.sqrt(2.0)
    np.testing.assert_allclose(ds.features[:, 1], [r, 0, -r, 0, 0], atol=1e-6)
    np.testing.assert_allclose(ds.test_features[:, 1], [-r, -r], atol=1e-6)
    np.testing.assert_allclose(ds.features.mean(axis=0), 0, atol=1e-6)
    with pytest.raises(InvalidParameterError, match="encoding must be"):
        load_adult(tmp_path, encoding="binary")
