"""FEMNIST (EMNIST by writer) from TensorFlow Federated's HDF5 or LEAF's JSON files.

The search is :mod:`dpfl.data.loaders`'s; nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpfl.data.dataset import Dataset
from dpfl.data.loaders import DatasetNotFoundError, _image_dataset, _search_dirs
from dpfl.errors import DpflError

__all__ = ["load_femnist", "locate_femnist"]


_FEMNIST_HOW = (
    "run `dpfl data fetch femnist` (downloads TensorFlow Federated's "
    "fed_emnist.tar.bz2 and extracts fed_emnist_train.h5 and "
    "fed_emnist_test.h5 into $DPFL_DATA/femnist; reading them needs h5py: pip "
    "install 'dpfl[data]'), or build LEAF's JSON files (github.com/TalwalkarLab/"
    "leaf, data/femnist: ./preprocess.sh -s niid --sf 1.0 -k 0 -t sample) and "
    "copy its data/train and data/test folders into $DPFL_DATA/femnist"
)


def _femnist_files(
    d: Path, only_digits: bool
) -> tuple[str, list[Path], list[Path]] | None:
    stem = "fed_emnist_digitsonly" if only_digits else "fed_emnist"
    train, test = d / f"{stem}_train.h5", d / f"{stem}_test.h5"
    if train.is_file() and test.is_file():
        return "tff", [train], [test]
    tr = sorted((d / "train").glob("*.json")) if (d / "train").is_dir() else []
    te = sorted((d / "test").glob("*.json")) if (d / "test").is_dir() else []
    if tr and te:
        return "leaf", tr, te
    return None


def _read_leaf(
    files: Sequence[Path],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    import json

    xs, ys, ids = [], [], []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            blob = json.load(fh)
        if not isinstance(blob, dict) or "user_data" not in blob:
            raise DpflError(f"{f}: not a LEAF file (no 'user_data' entry)")
        users = blob.get("users", list(blob["user_data"]))
        for u in users:
            rec = blob["user_data"][u]
            x = np.asarray(rec["x"], dtype=np.float64)
            y = np.asarray(rec["y"], dtype=np.int64)
            if x.ndim != 2 or x.shape[1] != 784 or len(x) != len(y):
                raise DpflError(
                    f"{f}: user {u!r} has x {x.shape} and y {y.shape}; expected "
                    "(n, 784) pixel rows and n labels"
                )
            xs.append(np.rint(x * 255.0).astype(np.uint8).reshape(-1, 28, 28))
            ys.append(y)
            ids.append(np.full(len(y), u, dtype=object))
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ids)


def _read_tff(files: Sequence[Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    (path,) = files
    try:
        import h5py
    except ImportError as err:
        raise DpflError(
            f"{path} is TensorFlow Federated's HDF5 layout; reading it needs "
            "h5py: pip install 'dpfl[data]' (or pip install h5py)"
        ) from err
    xs, ys, ids = [], [], []
    with h5py.File(path, "r") as h5:
        if "examples" not in h5:
            raise DpflError(f"{path}: no 'examples' group (not a TFF EMNIST file)")
        for u in sorted(h5["examples"]):
            grp = h5["examples"][u]
            x = np.asarray(grp["pixels"], dtype=np.float64)
            y = np.asarray(grp["label"], dtype=np.int64)
            if x.ndim != 3 or x.shape[1:] != (28, 28) or len(x) != len(y):
                raise DpflError(
                    f"{path}: client {u!r} has pixels {x.shape} and label "
                    f"{y.shape}; expected (n, 28, 28) and (n,)"
                )
            xs.append(np.rint(x * 255.0).astype(np.uint8))
            ys.append(y)
            ids.append(np.full(len(y), u, dtype=object))
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ids)


def locate_femnist(
    root: str | os.PathLike[str] | None, only_digits: bool = False
) -> tuple[Path, tuple[str, list[Path], list[Path]]]:
    """The folder of FEMNIST's files and what it holds (the format and files)."""
    dirs = _search_dirs(root, ("femnist", "fed_emnist", "leaf/data/femnist/data"))
    for d in dirs:
        found = _femnist_files(d, only_digits)
        if found is not None:
            return d, found
    looked = "\n  ".join(str(d) for d in dirs)
    raise DatasetNotFoundError(
        "femnist not found: no directory holds fed_emnist_train.h5 and "
        f"fed_emnist_test.h5, or LEAF's train/*.json and test/*.json. Looked "
        f"in:\n  {looked}\nTo get it: {_FEMNIST_HOW}."
    )


def load_femnist(
    root: str | os.PathLike[str] | None = None,
    *,
    only_digits: bool = False,
    invert: bool = False,
    lean: bool = False,
) -> Dataset:
    """Load Federated EMNIST: EMNIST grouped by writer, one client per writer.

    The NIST EMNIST release (IDX files, :func:`load_mnist`) carries no writer
    ids; LEAF's FEMNIST [1]_ regroups NIST Special Database 19 by writer, and
    TensorFlow Federated redistributes that grouping as two HDF5 files. Both
    layouts are read:

    * TensorFlow Federated's ``fed_emnist_train.h5`` and
      ``fed_emnist_test.h5`` (``fed_emnist_digitsonly_*`` with
      ``only_digits=True``): group ``examples/<writer>`` with datasets
      ``pixels`` (n × 28 × 28 float32) and ``label`` (n,). 3,400 writers
      (3,383 digits-only), 671,585 training and 77,483 test images; each
      writer's images are split between the two files. Needs ``h5py``.
    * LEAF's JSON files, ``train/*.json`` and ``test/*.json`` as LEAF's
      ``preprocess.sh`` writes them: ``{"users": [...], "num_samples":
      [...], "user_data": {writer: {"x": [784 floats, ...], "y": [...]}}}``.

    Where files are looked for: ``root``, then ``root/femnist``, …,
    ``$DPFL_DATA/femnist`` and ``~/.dpfl/data/femnist``; the first directory
    holding either layout wins (HDF5 first).

    Parameters
    ----------
    root : str or os.PathLike, optional
        Directory to look in first.
    only_digits : bool, optional
        TensorFlow Federated's digits-only files (10 classes) instead of the
        62-class ones (default False). LEAF's files hold what they were built
        with; with ``only_digits`` the letters are dropped.
    invert : bool, optional
        Both layouts store the background as 1.0 and the ink as 0.0, the
        inverse of MNIST; ``invert=True`` returns ``1 - pixel`` (ink 1.0), as
        MNIST-trained models expect (default False: the files' values).
    lean : bool, optional
        Keep pixels as uint8, scaled on access (default False). The files
        store multiples of 1/255, so uint8 is lossless.

    Returns
    -------
    Dataset
        Images ``(N, 1, 28, 28)`` in [0, 1]; labels 0–9 digits, 10–35
        upper-case, 36–61 lower-case letters (62 classes; 10 with
        ``only_digits``); ``client_ids`` and ``test_client_ids`` the writer of
        each image, so that :meth:`Dataset.federate` gives the natural
        per-writer partition by default, each writer's test images being its
        personalised test set.

    Raises
    ------
    DatasetNotFoundError
        If no searched directory holds either layout; the message lists the
        directories and how to get the files.
    DpflError
        If a file is malformed, or h5py is missing for the HDF5 layout.

    References
    ----------
    .. [1] Caldas, Duddu, Wu, Li, Konečný, McMahan, Smith, Talwalkar. LEAF: A
       benchmark for federated settings. arXiv:1812.01097, 2018.
    """
    where, (layout, train_files, test_files) = locate_femnist(root, only_digits)
    read = _read_tff if layout == "tff" else _read_leaf
    x_tr, y_tr, ids = read(train_files)
    x_te, y_te, test_ids = read(test_files)
    num_classes = 62
    if only_digits:
        num_classes = 10
        keep_tr, keep_te = y_tr < 10, y_te < 10
        x_tr, y_tr, ids = x_tr[keep_tr], y_tr[keep_tr], ids[keep_tr]
        x_te, y_te, test_ids = x_te[keep_te], y_te[keep_te], test_ids[keep_te]
    if invert:
        x_tr, x_te = 255 - x_tr, 255 - x_te
    data = _image_dataset(
        x_tr[:, None],
        y_tr,
        x_te[:, None],
        y_te,
        num_classes,
        "femnist-digits" if only_digits else "femnist",
        str(where),
        lean,
    )
    return dataclasses.replace(
        data, client_ids=ids.astype(str), test_client_ids=test_ids.astype(str)
    )
