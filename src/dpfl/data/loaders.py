"""Loaders for local dataset files; nothing is ever downloaded.

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

import dataclasses
import gzip
import math
import os
import pickle
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
    "load_adult",
    "load_cifar10",
    "load_digits",
    "load_femnist",
    "load_idx",
    "load_mnist",
    "locate",
    "REAL_DATASETS",
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


_CIFAR_NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
_CIFAR_RECORD = 1 + 3 * 32 * 32  # the binary version: label byte, R, G, B planes


def _locate_cifar10(root: str | os.PathLike[str] | None) -> tuple[Path, list[Path]]:
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
    where, files = _locate_cifar10(root)
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


_ADULT_COLUMNS = (
    ("age", "num"),
    ("workclass", "cat"),
    ("fnlwgt", "num"),
    ("education", "cat"),
    ("education-num", "num"),
    ("marital-status", "cat"),
    ("occupation", "cat"),
    ("relationship", "cat"),
    ("race", "cat"),
    ("sex", "cat"),
    ("capital-gain", "num"),
    ("capital-loss", "num"),
    ("hours-per-week", "num"),
    ("native-country", "cat"),
)


def _read_adult(path: Path) -> tuple[list[list[str]], np.ndarray]:
    rows, labels = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("|"):  # adult.test opens with "|1x3 …"
                continue
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != 15:
                raise DpflError(
                    f"{path}:{lineno}: expected 15 comma-separated fields; got "
                    f"{len(cells)}"
                )
            label = cells[14].rstrip(".")
            if label not in (">50K", "<=50K"):
                raise DpflError(f"{path}:{lineno}: unknown label {cells[14]!r}")
            rows.append(cells[:14])
            labels.append(label == ">50K")
    return rows, np.asarray(labels, dtype=np.int64)


def _locate_adult(root: str | os.PathLike[str] | None) -> tuple[Path, list[Path]]:
    return _find(
        _search_dirs(root, ("adult",)),
        [["adult.data"], ["adult.test"]],
        "adult",
        "run `dpfl data fetch adult`, or copy adult.data and adult.test from the "
        "UCI repository (archive.ics.uci.edu/dataset/2/adult) into "
        "$DPFL_DATA/adult",
    )


def load_adult(
    root: str | os.PathLike[str] | None = None, *, encoding: str = "onehot"
) -> Dataset:
    """Load UCI Adult (census income) from ``adult.data`` and ``adult.test``.

    With ``encoding="onehot"`` (the default), the 6 numeric columns (age,
    fnlwgt, education-num, capital-gain, capital-loss, hours-per-week) come
    first, standardised with the training mean and standard deviation; then
    the 8 categorical columns, in file order, each one-hot encoded over the
    categories seen in training, sorted.
    A missing value (``?``) and a test category unseen in training both
    encode as all zeros. With ``encoding="ordinal"``, the 14 attributes in
    file order, each standardised with the training mean and standard
    deviation, a categorical one as its category's number in sorted order
    (the "14 normalized features" of MS-PAFL's experiment); a missing or
    unseen category is set to the mean (0). The label is 1 for income
    ``>50K`` (the test file's trailing ``.`` is dropped).

    Parameters
    ----------
    root : str or os.PathLike, optional
        Directory to look in first (also ``root/adult``,
        ``$DPFL_DATA/adult``, ``~/.dpfl/data/adult``).
    encoding : str, optional
        ``"onehot"`` (105 features) or ``"ordinal"`` (14 features).

    Returns
    -------
    Dataset
        float32 features ``(N, 6 + number of categories)`` (6 + 99 = 105 for
        the full UCI files by the category lists of ``adult.names``; encoders
        that give ``?`` its own column get 108) or ``(N, 14)`` ordinal,
        binary int64 labels; 32,561 train and 16,281 test rows.

    Raises
    ------
    DatasetNotFoundError
        If the files are not found (the message lists where dpfl looked).
    DpflError
        If a line is malformed.
    """
    where, (train_path, test_path) = _locate_adult(root)
    train_rows, y_tr = _read_adult(train_path)
    test_rows, y_te = _read_adult(test_path)
    if not train_rows:
        raise DpflError(f"{train_path}: no records")
    tr = np.asarray(train_rows, dtype=object)
    te = np.asarray(test_rows, dtype=object).reshape(-1, 14)
    if encoding not in ("onehot", "ordinal"):
        raise InvalidParameterError(
            f"encoding must be 'onehot' or 'ordinal'; got {encoding!r}"
        )
    num_tr: list[np.ndarray] = []
    num_te: list[np.ndarray] = []
    cat_tr: list[np.ndarray] = []
    cat_te: list[np.ndarray] = []
    for j, (_, typ) in enumerate(_ADULT_COLUMNS):
        if typ == "num" or encoding == "ordinal":
            if typ == "num":
                a = tr[:, j].astype(np.float64)
                b = te[:, j].astype(np.float64)
            else:  # category codes in sorted order; '?' and unseen are missing
                cats = sorted({c for c in tr[:, j] if c != "?"})
                code = {c: float(i) for i, c in enumerate(cats)}
                a = np.array([code.get(c, np.nan) for c in tr[:, j]])
                b = np.array([code.get(c, np.nan) for c in te[:, j]])
            mu, sd = float(np.nanmean(a)), float(np.nanstd(a))
            sd = sd if sd > 0 else 1.0
            # Standardised; a missing value sits at the training mean (0).
            num_tr.append(np.nan_to_num((a - mu) / sd)[:, None])
            num_te.append(np.nan_to_num((b - mu) / sd)[:, None])
        else:
            cats = sorted({c for c in tr[:, j] if c != "?"})
            lookup = {c: i for i, c in enumerate(cats)}
            for col, out in ((tr[:, j], cat_tr), (te[:, j], cat_te)):
                onehot = np.zeros((len(col), len(cats)))
                pos = np.array([lookup.get(c, -1) for c in col], dtype=np.int64)
                hit = pos >= 0
                onehot[np.flatnonzero(hit), pos[hit]] = 1.0
                out.append(onehot)
    blocks_tr, blocks_te = num_tr + cat_tr, num_te + cat_te
    x_tr = np.hstack(blocks_tr).astype(np.float32)
    x_te = np.hstack(blocks_te).astype(np.float32)
    return Dataset(
        features=x_tr,
        labels=y_tr,
        test_features=x_te,
        test_labels=y_te,
        num_classes=2,
        name="adult",
        input_shape=(x_tr.shape[1],),
        source=str(where),
    )


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


def _locate_femnist(
    root: str | os.PathLike[str] | None, only_digits: bool = False
) -> tuple[Path, tuple[str, list[Path], list[Path]]]:
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


#: Names :func:`locate` knows: the real data sets whose files dpfl looks for.
REAL_DATASETS = ("mnist", "fashion-mnist", "emnist", "femnist", "cifar10", "adult")


def locate(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """Return the directory a real data set would be read from, without reading it.

    The same search as the data set's loader (see the module docstring).

    Parameters
    ----------
    name : str
        One of :data:`REAL_DATASETS`, or an IDX ``kind`` of :func:`load_mnist`
        (``"emnist-letters"``, ...).
    root : str or os.PathLike, optional
        Directory to look in first.

    Returns
    -------
    pathlib.Path
        The directory holding the files.

    Raises
    ------
    InvalidParameterError
        On an unknown name.
    DatasetNotFoundError
        If the files are not found; the message lists where dpfl looked and
        how to get them.
    """
    if name == "cifar10":
        return _locate_cifar10(root)[0]
    if name == "adult":
        return _locate_adult(root)[0]
    if name == "femnist":
        return _locate_femnist(root)[0]
    if name in IDX_KINDS or name in ("fashion-mnist", "emnist"):
        return _locate_idx(root, _idx_key(name))[0]
    raise InvalidParameterError(
        f"name must be one of {REAL_DATASETS} or {IDX_KINDS}; got {name!r}"
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
    where, (layout, train_files, test_files) = _locate_femnist(root, only_digits)
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
