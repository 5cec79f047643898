"""CIFAR-10 from its binary or python batches, read without running their code.

The search is :mod:`dpfl.data.loaders`'s; nothing is downloaded.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.data.dataset import Dataset
from dpfl.data.loaders import DatasetNotFoundError, _find, _image_dataset, _search_dirs
from dpfl.errors import DpflError

__all__ = ["load_cifar10", "locate_cifar10"]


_CIFAR_NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
_CIFAR_RECORD = 1 + 3 * 32 * 32  # the binary version: label byte, R, G, B planes


def locate_cifar10(root: str | os.PathLike[str] | None) -> tuple[Path, list[Path]]:
    """The folder and six batch files: the binary version first, else the python one."""
    how = (
        "run `dpfl data fetch cifar10`, or extract cifar-10-binary.tar.gz or "
        "cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) "
        "into $DPFL_DATA"
    )
    binary = _search_dirs(root, ("cifar-10-batches-bin",))
    try:
        return _find(binary, [[f"{n}.bin"] for n in _CIFAR_NAMES], "cifar10", how)
    except DatasetNotFoundError:
        pass
    dirs = _search_dirs(root, ("cifar-10-batches-py", "cifar10", "cifar-10"))
    return _find(dirs, [[n] for n in _CIFAR_NAMES], "cifar10", how)


def _latin1(text: str, encoding: str) -> bytes:
    """``_codecs.encode`` as Python 3 pickles ``bytes`` (protocol 2): latin-1 only."""
    if encoding != "latin1" or not isinstance(text, str):
        raise DpflError(f"refused to unpickle _codecs.encode with {encoding!r}")
    return text.encode("latin1")


#: What a CIFAR-10 python batch may name: numpy arrays, numpy scalars and
#: dtypes (in numpy 1's and numpy 2's module names), and latin-1 bytes.
_NDARRAY_RECONSTRUCT = np.ndarray(0).__reduce__()[0]
_SCALAR = np.int64(0).__reduce__()[0]
_FROMBUFFER = np.zeros(1).__reduce_ex__(5)[0]  # arrays in pickle protocol 5
_CIFAR_PICKLE_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _NDARRAY_RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _NDARRAY_RECONSTRUCT,
    ("numpy.core.multiarray", "scalar"): _SCALAR,
    ("numpy._core.multiarray", "scalar"): _SCALAR,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1,
}


class _BatchUnpickler(pickle.Unpickler):
    """An unpickler that builds only dicts, lists, strings, numbers and arrays.

    A pickle calls whatever callable it names (``os.system`` through
    ``__reduce__``, for one); this one resolves only the names a CIFAR-10
    batch needs (:data:`_CIFAR_PICKLE_GLOBALS`: numpy's array, scalar and
    dtype reconstruction) and refuses every other before calling anything,
    so a planted file cannot execute code.
    """

    def __init__(self, fh: Any, path: Path) -> None:
        super().__init__(fh, encoding="bytes")
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        found = _CIFAR_PICKLE_GLOBALS.get((module, name))
        if found is None:
            raise DpflError(
                f"{self._path}: refused to unpickle {module}.{name}: a CIFAR-10 "
                "batch holds only arrays, lists and strings (this file is not "
                "one, and loading it could run code)"
            )
        return found


def _read_cifar_pickle(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as fh:
        try:
            batch = _BatchUnpickler(fh, path).load()
        except DpflError:
            raise
        except Exception as exc:  # a truncated or foreign file
            raise DpflError(f"{path}: not a CIFAR-10 python batch ({exc})") from None
    if not isinstance(batch, dict):
        raise DpflError(f"{path}: not a CIFAR-10 python batch (not a dict)")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise DpflError(f"{path}: batch has no data/labels entries")
    try:
        data = np.asarray(data, dtype=np.uint8)
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DpflError(f"{path}: batch data/labels are not numbers ({exc})") from None
    return data, labels


def _read_cifar_binary(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % _CIFAR_RECORD:
        raise DpflError(
            f"{path}: a CIFAR-10 binary batch is a whole number of "
            f"{_CIFAR_RECORD}-byte records; got {raw.size} bytes"
        )
    records = raw.reshape(-1, _CIFAR_RECORD)
    return records[:, 1:], records[:, 0].astype(np.int64)


def load_cifar10(
    root: str | os.PathLike[str] | None = None, *, lean: bool = False
) -> Dataset:
    """Load CIFAR-10 from its binary or python batches, without running their code.

    Reads ``data_batch_1`` … ``data_batch_5`` and ``test_batch`` from the
    first folder that holds them: the binary version (``*.bin`` in
    ``cifar-10-batches-bin``: 3073-byte records, a label byte then the R, G,
    B planes) is preferred; else the python version (a pickled dict with
    ``b"data"``, uint8 ``N × 3072`` in R, G, B planes, and ``b"labels"``),
    read by an unpickler that builds only arrays, lists, strings and numbers
    and refuses any other object a file names (a pickle can otherwise run
    arbitrary code). Folders: ``root``, then its ``cifar-10-batches-bin`` and
    ``cifar-10-batches-py`` sub-folders, then the same under ``$DPFL_DATA``
    and ``~/.dpfl/data``.

    Parameters
    ----------
    root : str or os.PathLike, optional
        Directory to look in first.
    lean : bool, optional
        Keep pixels as uint8, scaled on access (default False).

    Returns
    -------
    Dataset
        50,000 train and 10,000 test images ``(N, 3, 32, 32)``, 10 classes.

    Raises
    ------
    DatasetNotFoundError
        If the batches are not found (the message lists where dpfl looked).
    DpflError
        If a batch is malformed, or a python batch names anything but numpy
        arrays (it is refused before anything in it runs).
    """
    where, files = locate_cifar10(root)
    read = _read_cifar_binary if files[0].suffix == ".bin" else _read_cifar_pickle
    xs, ys = [], []
    for f in files:
        data, labels = read(f)
        if data.ndim != 2 or data.shape[1] != 3072 or labels.shape != (len(data),):
            raise DpflError(
                f"{f}: expected uint8 N x 3072 data and N labels; got "
                f"{data.shape} and {labels.shape}"
            )
        if len(labels) and (labels.min() < 0 or labels.max() > 9):
            raise DpflError(f"{f}: CIFAR-10 labels are 0..9; got {labels.max()}")
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(labels)
    return _image_dataset(
        np.concatenate(xs[:5]),
        np.concatenate(ys[:5]),
        xs[5],
        ys[5],
        10,
        "cifar10",
        str(where),
        lean,
    )
