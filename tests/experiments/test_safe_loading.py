"""Loading never runs code from a file: CIFAR-10 batches, YAML, checkpoints, npz.

A pickle names callables that the unpickler calls (``os.system`` through
``__reduce__``); a run config that points ``data.options.root`` at a folder
of planted "CIFAR batches" must not execute them.
"""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpfl.data import load_cifar10
from dpfl.errors import DpflError

ROOT = Path(__file__).resolve().parents[2]
NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


@pytest.fixture(autouse=True)
def _isolate(monkeypatch, tmp_path):
    # look only under the test's folders, never in the user's data folders
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "no-env"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


class _Shell:
    """Unpickling this runs a shell command (what an attacker plants)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


def _batch(rng, n=4):
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, 10, n)]
    return data, labels


def _write_python(folder: Path, rng, *, protocol=pickle.HIGHEST_PROTOCOL, poison=None):
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in NAMES:
        data, labels = _batch(rng)
        batch = {b"batch_label": b"x", b"data": data, b"labels": labels}
        if poison is not None and name == poison[0]:
            batch = poison[1](batch)
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))
        out[name] = (data, labels)
    return out


def test_python_batches_load_with_numpy_1_and_2_names(tmp_path):
    # The official files are protocol-2 pickles naming numpy.core.multiarray
    # (numpy 1); numpy 2 writes numpy._core.multiarray; both load.
    rng = np.random.default_rng(0)
    folder = tmp_path / "cifar-10-batches-py"
    batches = _write_python(folder, rng, protocol=2)
    first = (folder / "data_batch_1").read_bytes()
    if b"numpy._core.multiarray" in first:
        old = first.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
        (folder / "data_batch_1").write_bytes(old)
    ds = load_cifar10(tmp_path)
    data, labels = batches["data_batch_1"]
    np.testing.assert_allclose(
        ds.features[0, 2], data[0, 2048:].reshape(32, 32) / 255.0
    )
    np.testing.assert_array_equal(ds.labels[:4], labels)
    assert ds.features.shape == (20, 3, 32, 32) and ds.test_labels.shape == (4,)


@pytest.mark.parametrize("payload", [_Shell, _Eval])
@pytest.mark.parametrize("where", ["data_batch_1", "test_batch"])
def test_a_malicious_pickle_is_refused_and_never_runs(tmp_path, payload, where):
    marker = tmp_path / "pwned"
    folder = tmp_path / "cifar-10-batches-py"
    # the payload hides inside an otherwise valid batch (as its labels)
    _write_python(
        folder,
        np.random.default_rng(1),
        poison=(where, lambda b: {**b, b"labels": payload(marker)}),
    )
    with pytest.raises(DpflError, match="refused to unpickle"):
        load_cifar10(tmp_path)
    assert not marker.exists()


def test_a_run_config_pointing_at_planted_pickles_never_runs_them(tmp_path):
    # The attack end to end: `dpfl train` on a config with
    # data.name: cifar10 and data.options.root: DIR. One clear error line,
    # no traceback, and the planted command has not run.
    marker = tmp_path / "pwned"
    root = tmp_path / "planted"
    _write_python(
        root / "cifar-10-batches-py",
        np.random.default_rng(2),
        poison=("data_batch_1", lambda b: _Shell(marker)),
    )
    config = tmp_path / "run.yaml"
    config.write_text(
        "name: attack\n"
        f"output_dir: {tmp_path / 'runs'}\n"
        "rounds: 1\n"
        "data:\n"
        "  name: cifar10\n"
        f"  options: {{root: {root}}}\n"
        "privacy: {epsilon: 4.0, delta: 1.0e-5}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run(
        [sys.executable, "-m", "dpfl.cli", "train", str(config), "--no-progress"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode != 0
    assert "refused to unpickle posix.system" in res.stderr or (
        "refused to unpickle nt.system" in res.stderr
    ), res.stderr
    assert "Traceback" not in res.stderr
    assert not marker.exists()


def test_the_binary_version_is_read_and_preferred(tmp_path):
    # cifar-10-batches-bin: 3073-byte records (label, R, G, B). With both
    # versions present, the binary one is read and the pickles are not opened.
    rng = np.random.default_rng(3)
    marker = tmp_path / "pwned"
    _write_python(
        tmp_path / "cifar-10-batches-py",
        rng,
        poison=("data_batch_1", lambda b: _Shell(marker)),
    )
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    want = {}
    for name in NAMES:
        data, labels = _batch(rng, n=3)
        records = np.concatenate(
            [np.asarray(labels, dtype=np.uint8)[:, None], data], axis=1
        )
        records.tofile(folder / f"{name}.bin")
        want[name] = (data, labels)
    ds = load_cifar10(tmp_path)
    assert ds.features.shape == (15, 3, 32, 32)
    data, labels = want["data_batch_2"]
    np.testing.assert_array_equal(ds.labels[3:6], labels)
    np.testing.assert_allclose(ds.features[3, 0], data[0, :1024].reshape(32, 32) / 255)
    np.testing.assert_array_equal(ds.test_labels, want["test_batch"][1])
    assert not marker.exists()
    # a torn file, or a label outside 0..9, is refused
    (folder / "test_batch.bin").write_bytes(b"\x00" * 3072)
    with pytest.raises(DpflError, match="3073-byte records"):
        load_cifar10(tmp_path)
    bad = np.zeros((1, 3073), dtype=np.uint8)
    bad[0, 0] = 11
    bad.tofile(folder / "test_batch.bin")
    with pytest.raises(DpflError, match="labels are 0..9"):
        load_cifar10(tmp_path)


def test_foreign_and_truncated_pickles_are_clear_errors(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    _write_python(folder, np.random.default_rng(4))
    (folder / "data_batch_3").write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(DpflError, match="not a dict"):
        load_cifar10(tmp_path)
    (folder / "data_batch_3").write_bytes(b"\x80\x04\x95")
    with pytest.raises(DpflError, match="not a CIFAR-10 python batch"):
        load_cifar10(tmp_path)


# ------------------------------------------------ every loader in src/ is safe
def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            base = node.func.value
            if isinstance(base, ast.Name):
                yield base.id, node.func.attr, node


def _safe_loaders(tree: ast.AST) -> set[str]:
    """Classes of the module that subclass ``yaml.SafeLoader`` (or each other)."""
    safe = {"SafeLoader", "CSafeLoader"}
    grew = True
    while grew:
        grew = False
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name not in safe:
                bases = {
                    b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                    for b in node.bases
                }
                if bases & safe:
                    safe.add(node.name)
                    grew = True
    return safe


def _loader_is_safe(node: ast.Call, safe: set[str]) -> bool:
    for kw in node.keywords:
        if kw.arg == "Loader":
            v = kw.value
            name = v.attr if isinstance(v, ast.Attribute) else getattr(v, "id", "")
            return name in safe
    return False


def _keyword(node: ast.Call, name: str):
    for kw in node.keywords:
        if kw.arg == name and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return None


def test_no_unsafe_deserialisation_in_the_package():
    # yaml: safe_load, or load with a SafeLoader subclass; torch.load:
    # weights_only=True; np.load: allow_pickle=False; no pickle/marshal/shelve
    # loads (the CIFAR reader's restricted Unpickler subclass is the one
    # unpickler, and is not a call).
    bad = []
    checked = 0
    for path in sorted((ROOT / "src" / "dpfl").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        safe = _safe_loaders(tree)
        for base, attr, node in _calls(tree):
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            if base == "yaml" and attr in ("load", "load_all"):
                # only with a SafeLoader (or a subclass defined beside it)
                checked += 1
                if not _loader_is_safe(node, safe):
                    bad.append(f"{where} yaml.{attr} without a SafeLoader")
            elif base == "yaml" and attr in ("unsafe_load", "full_load"):
                bad.append(f"{where} yaml.{attr}")
            elif base == "torch" and attr == "load":
                checked += 1
                if _keyword(node, "weights_only") is not True:
                    bad.append(f"{where} torch.load without weights_only=True")
            elif base in ("np", "numpy") and attr == "load":
                checked += 1
                if _keyword(node, "allow_pickle") is not False:
                    bad.append(f"{where} np.load without allow_pickle=False")
            elif base in ("pickle", "marshal", "shelve", "dill") and attr in (
                "load",
                "loads",
                "open",
                "Unpickler",
            ):
                bad.append(f"{where} {base}.{attr}")
    assert not bad, bad
    assert checked >= 2  # the runner's checkpoint and the npz reader were seen
