"""Loaders for local dataset files; nothing is ever downloaded.

This module holds the search every real data set shares, the IDX files
(MNIST, Fashion-MNIST, EMNIST) and scikit-learn's digits; CIFAR-10, Adult
and FEMNIST have their own modules (:mod:`dpfl.data.cifar10`,
:mod:`dpfl.data.adult`, :mod:`dpfl.data.femnist`) built on the same search,
and :func:`dpfl.data.locate.locate` finds any of them without reading it.

Image loaders return float32 in [0, 1], channels first (``N × C × H × W``),
with no mean/std normalisation (the models do that). With ``lean=True`` the
features stay uint8 and are scaled on access (:class:`ScaledUint8Features`),
a quarter of the memory: use it for EMNIST (697,932 images are 2.19 GB as
float32, 547 MB as uint8).

Where files are looked for, in order (the first directory holding all the
files wins):

1. ``root`` as given, then its conventional sub-folders (``mnist/``,
   ``fashion-mnist/``, ``MNIST/raw/`` as torchvision lays them out, …);
2. ``$DPFL_DATA/<sub-folder>``;
3. ``~/.dpfl/data/<sub-folder>``;
4. for Fashion-MNIST, ``/usr/share/datasets/fashion-mnist``, where Debian's
   ``dataset-fashion-mnist`` package installs the four ``*-ubyte.gz`` files
   (``apt-get install dataset-fashion-mnist``).

Only ``root`` itself is searched without a sub-folder: the environment and
home directories are shared by several datasets whose files have the same
names (MNIST and Fashion-MNIST).
"""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpfl._validate import check_count, check_probability
from dpfl.data.dataset import Dataset, ScaledUint8Features
from dpfl.errors import DpflError, InvalidParameterError

__all__ = [
    "DEBIAN_FASHION_MNIST_DIR",
    "DatasetNotFoundError",
    "IDX_KINDS",
    "load_digits",
    "load_idx",
    "load_mnist",
]

#: Where ``apt-get install dataset-fashion-mnist`` (Debian/Ubuntu) puts the
#: Fashion-MNIST IDX files (``dpkg -L dataset-fashion-mnist``).
DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


class DatasetNotFoundError(DpflError, FileNotFoundError):
    """A dataset's files were not found; the message lists where dpfl looked."""


# kind -> (sub-folders, file prefix, number of classes, how to get it)
_IDX_SPECS: dict[str, tuple[tuple[str, ...], str, int, str]] = {
    "mnist": (
        ("mnist", "MNIST/raw", "MNIST"),
        "",
        10,
        "run `dpfl data fetch mnist`, or copy train-images-idx3-ubyte.gz, "
        "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
        "t10k-labels-idx1-ubyte.gz into $DPFL_DATA/mnist (or pass root=)",
    ),
    "fashion": (
        ("fashion-mnist", "fashion_mnist", "FashionMNIST/raw", "FashionMNIST"),
        "",
        10,
        "run `apt-get install dataset-fashion-mnist` (Debian/Ubuntu) or `dpfl "
        "data fetch fashion-mnist`, or copy the four *-ubyte.gz files into "
        "$DPFL_DATA/fashion-mnist",
    ),
}
_EMNIST_CLASSES = {
    "byclass": 62,
    "bymerge": 47,
    "balanced": 47,
    "letters": 26,
    "digits": 10,
    "mnist": 10,
}
for _split, _n in _EMNIST_CLASSES.items():
    _IDX_SPECS[f"emnist-{_split}"] = (
        ("emnist", "emnist/gzip", "gzip", "EMNIST/raw", "EMNIST"),
        f"emnist-{_split}-",
        _n,
        "run `dpfl data fetch emnist`, or copy "
        f"emnist-{_split}-{{train,test}}-{{images-idx3,labels-idx1}}-ubyte.gz "
        "(the 'gzip' folder of the NIST EMNIST release) into $DPFL_DATA/emnist",
    )

#: Accepted ``kind`` values of :func:`load_mnist`.
IDX_KINDS = tuple(_IDX_SPECS)

_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _open(path: Path) -> Any:
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gz else open(path, "rb")


#: The largest IDX body read (bytes): 64 GiB, far above any image set.
_IDX_MAX_BYTES = 1 << 36


def load_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (the MNIST format), plain or gzip-compressed.

    The header is two zero bytes, a type code (0x08 uint8, 0x09 int8, 0x0B
    int16, 0x0C int32, 0x0D float32, 0x0E float64), the number of dimensions,
    then each dimension as a big-endian uint32; the data follow, big-endian.
    Gzip is detected from the file's magic bytes, not its name.

    Parameters
    ----------
    path : str or os.PathLike
        File to read.

    Returns
    -------
    numpy.ndarray
        The array, in native byte order, of the shape the header gives.

    Raises
    ------
    DatasetNotFoundError
        If the file does not exist.
    DpflError
        If the header is malformed or the data size does not match it.

    References
    ----------
    .. [1] LeCun, Cortes, Burges. The MNIST database, "file formats" section.
    """
    p = Path(path)
    if not p.is_file():
        raise DatasetNotFoundError(f"IDX file not found: {p}")
    with _open(p) as f:
        magic = f.read(4)
        if len(magic) < 4 or magic[0] != 0 or magic[1] != 0:
            raise DpflError(f"{p}: not an IDX file (magic {magic[:4]!r})")
        code, ndim = magic[2], magic[3]
        if code not in _IDX_DTYPES:
            raise DpflError(f"{p}: unknown IDX type code 0x{code:02X}")
        header = f.read(4 * ndim)
        if len(header) < 4 * ndim:
            raise DpflError(f"{p}: truncated IDX header")
        dims = tuple(int(v) for v in np.frombuffer(header, dtype=">u4", count=ndim))
        dtype = _IDX_DTYPES[code]
        # Python integers: exact, never wrapping around (2**64 is not 0)
        expected = math.prod(dims) * dtype.itemsize
        if expected > _IDX_MAX_BYTES:
            raise DpflError(
                f"{p}: IDX header promises {dims} of {dtype} ({expected} bytes), "
                f"more than the {_IDX_MAX_BYTES} bytes an IDX file may hold here"
            )
        # at most one byte more than the header promises
        body = f.read(expected + 1)
    if len(body) != expected:
        raise DpflError(
            f"{p}: IDX header promises {dims} of {dtype} ({expected} bytes) but "
            + (
                f"more than {expected} bytes follow"
                if len(body) > expected
                else f"{len(body)} bytes follow"
            )
        )
    arr = np.frombuffer(body, dtype=dtype).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def _search_dirs(
    root: str | os.PathLike[str] | None, subdirs: Sequence[str]
) -> list[Path]:
    dirs: list[Path] = []
    if root is not None:
        r = Path(root).expanduser()
        dirs += [r] + [r / s for s in subdirs]
    env = os.environ.get("DPFL_DATA")
    if env:
        dirs += [Path(env).expanduser() / s for s in subdirs]
    home = Path("~/.dpfl/data").expanduser()
    dirs += [home / s for s in subdirs]
    return dirs


def _find(
    dirs: Sequence[Path], names: Sequence[Sequence[str]], what: str, how: str
) -> tuple[Path, list[Path]]:
    """Return the first dir holding one spelling of every name, and the files."""
    for d in dirs:
        found = []
        for spellings in names:
            hit = next((d / s for s in spellings if (d / s).is_file()), None)
            if hit is None:
                break
            found.append(hit)
        else:
            return d, found
    looked = "\n  ".join(str(d) for d in dirs)
    wanted = ", ".join(n[0] for n in names)
    raise DatasetNotFoundError(
        f"{what} not found: no directory holds {wanted}. Looked in:\n  {looked}\n"
        f"To get it: {how}."
    )


def _idx_spellings(stem: str) -> list[str]:
    # "train-images-idx3-ubyte" also ships as "train-images.idx3-ubyte".
    alt = stem.replace("-idx", ".idx")
    return [stem + ".gz", stem, alt + ".gz", alt]


def _idx_key(kind: str) -> str:
    key = {"fashion-mnist": "fashion", "emnist": "emnist-byclass"}.get(kind, kind)
    if key not in _IDX_SPECS:
        raise InvalidParameterError(f"kind must be one of {IDX_KINDS}; got {kind!r}")
    return key


def _locate_idx(
    root: str | os.PathLike[str] | None, key: str
) -> tuple[Path, list[Path]]:
    subdirs, prefix, _, how = _IDX_SPECS[key]
    dirs = _search_dirs(root, subdirs)
    if key == "fashion":
        dirs.append(Path(DEBIAN_FASHION_MNIST_DIR))
    if key.startswith("emnist"):
        stems = [f"{prefix}{s}-{t}" for s in ("train", "test") for t in _IDX_TYPES]
    else:
        stems = [f"{s}-{t}" for s in ("train", "t10k") for t in _IDX_TYPES]
    return _find(dirs, [_idx_spellings(s) for s in stems], key, how)


def load_mnist(
    root: str | os.PathLike[str] | None = None,
    kind: str = "mnist",
    *,
    lean: bool = False,
) -> Dataset:
    """Load MNIST, Fashion-MNIST or an EMNIST split from local IDX files.

    Parameters
    ----------
    root : str or os.PathLike, optional
        Directory to look in first (see the module docstring for the search
        order; Fashion-MNIST is found in ``/usr/share/datasets/fashion-mnist``
        after ``apt-get install dataset-fashion-mnist``).
    kind : str, optional
        ``"mnist"`` (default), ``"fashion"`` (or ``"fashion-mnist"``),
        ``"emnist"`` (= ``"emnist-byclass"``, 62 classes, the
        random-participation paper's split), ``"emnist-bymerge"``,
        ``"emnist-balanced"``, ``"emnist-letters"``, ``"emnist-digits"``,
        ``"emnist-mnist"``.
    lean : bool, optional
        Keep pixels as uint8, scaled to [0, 1] on access (default False).

    Returns
    -------
    Dataset
        Train and test images ``(N, 1, 28, 28)`` and int64 labels.

    Raises
    ------
    InvalidParameterError
        On an unknown ``kind``.
    DatasetNotFoundError
        If no searched directory holds the four files; the message lists the
        directories and how to get the data.
    DpflError
        If the files are malformed or inconsistent.

    Notes
    -----
    EMNIST's IDX images are stored transposed relative to MNIST; they are
    transposed back so that digits stand upright. EMNIST-letters labels are
    1..26 in the files and are shifted to 0..25.
    """
    key = _idx_key(kind)
    num_classes = _IDX_SPECS[key][2]
    where, files = _locate_idx(root, key)
    x_tr, y_tr, x_te, y_te = (load_idx(f) for f in files)
    for x, y, split in ((x_tr, y_tr, "train"), (x_te, y_te, "test")):
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise DpflError(
                f"{where}: {split} images {x.shape} and labels {y.shape} do not match"
            )
    if key.startswith("emnist"):
        x_tr, x_te = x_tr.transpose(0, 2, 1), x_te.transpose(0, 2, 1)
    if key == "emnist-letters":
        y_tr, y_te = y_tr.astype(np.int64) - 1, y_te.astype(np.int64) - 1
    name = {"mnist": "mnist", "fashion": "fashion-mnist"}.get(key, key)
    return _image_dataset(
        x_tr[:, None], y_tr, x_te[:, None], y_te, num_classes, name, str(where), lean
    )


_IDX_TYPES = ("images-idx3-ubyte", "labels-idx1-ubyte")


def _image_dataset(
    x_tr: np.ndarray,
    y_tr: np.ndarray,
    x_te: np.ndarray,
    y_te: np.ndarray,
    num_classes: int,
    name: str,
    source: str,
    lean: bool,
) -> Dataset:
    if x_tr.dtype != np.uint8:
        raise DpflError(f"{source}: expected uint8 pixels; got {x_tr.dtype}")
    y_tr, y_te = y_tr.astype(np.int64), y_te.astype(np.int64)
    for y in (y_tr, y_te):
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise DpflError(
                f"{source}: labels outside [0, {num_classes}): [{y.min()}, {y.max()}]"
            )

    def conv(x: np.ndarray) -> Any:
        x = np.ascontiguousarray(x)
        if lean:
            return ScaledUint8Features(x)
        return x.astype(np.float32) * np.float32(1.0 / 255.0)

    return Dataset(
        features=conv(x_tr),
        labels=y_tr,
        test_features=conv(x_te),
        test_labels=y_te,
        num_classes=num_classes,
        name=name,
        input_shape=tuple(x_tr.shape[1:]),
        source=source,
    )


def load_digits(
    *, test_fraction: float = 0.25, seed: int = 0, flatten: bool = False
) -> Dataset:
    """Load scikit-learn's bundled handwritten digits (1,797 real 8×8 images).

    Pixels (0..16) are scaled to [0, 1]. The train/test split is stratified by
    class and seeded: from each class, ``round(test_fraction · n_c)`` random
    images go to the test set.

    Parameters
    ----------
    test_fraction : float, optional
        Fraction held out, in [0, 1) (default 0.25: 1,347 train / 450 test).
    seed : int, optional
        Seed of the split (default 0).
    flatten : bool, optional
        Return ``(N, 64)`` rows instead of ``(N, 1, 8, 8)`` images.

    Returns
    -------
    Dataset
        Train and test arrays, 10 classes.

    Raises
    ------
    InvalidParameterError
        On a bad ``test_fraction``.
    DpflError
        If scikit-learn is not installed.

    References
    ----------
    .. [1] scikit-learn ``sklearn.datasets.load_digits`` (UCI optical
       recognition of handwritten digits, test part).
    """
    test_fraction = check_probability(
        "test_fraction", test_fraction, allow_zero=True, allow_one=False
    )
    seed = check_count("seed", seed, minimum=0)
    try:
        from sklearn.datasets import load_digits as _sk_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise DpflError(
            "load_digits needs scikit-learn: pip install 'dpfl[train]' or "
            "pip install scikit-learn"
        ) from err
    bunch = _sk_digits()
    x = (np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0)).reshape(
        -1, 1, 8, 8
    )
    if flatten:
        x = x.reshape(len(x), 64)
    y = np.asarray(bunch.target, dtype=np.int64)
    rng = np.random.default_rng(seed)
    test = []
    for c in range(10):
        rows = rng.permutation(np.flatnonzero(y == c))
        test.append(rows[: int(round(test_fraction * rows.size))])
    test_rows = np.sort(np.concatenate(test))
    mask = np.ones(len(y), dtype=bool)
    mask[test_rows] = False
    return Dataset(
        features=np.ascontiguousarray(x[mask]),
        labels=y[mask],
        test_features=np.ascontiguousarray(x[test_rows]),
        test_labels=y[test_rows],
        num_classes=10,
        name="digits",
        input_shape=tuple(x.shape[1:]),
        source="sklearn.datasets.load_digits",
    )
