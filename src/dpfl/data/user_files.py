"""A user's own files: CSV, npz and IDX, read into a centralised Dataset.

:func:`load_csv`, :func:`load_npz` and :func:`load_idx_files` read a file
into a :class:`~dpfl.data.Dataset`, which :meth:`Dataset.federate
<dpfl.data.Dataset.federate>` partitions (a CSV client column or an npz
client array gives the ``"natural"`` partition). They serve the run
configuration too: ``data.name: csv``, ``npz`` or ``idx`` with ``data.path``
(see :func:`dpfl.data.get_dataset`).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpfl._validate import check_count, check_probability
from dpfl.data.dataset import Dataset
from dpfl.data.loaders import DatasetNotFoundError, load_idx
from dpfl.data.partition import _check_features, _check_labels
from dpfl.errors import DpflError, InvalidParameterError

__all__ = ["load_csv", "load_idx_files", "load_npz"]


def _existing(path: str | os.PathLike[str], what: str) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise DatasetNotFoundError(f"{what} not found: {p} (resolved {p.resolve()})")
    return p


def _column(
    spec: str | int, names: list[str], path: Path, param: str, header: bool
) -> int:
    if isinstance(spec, bool) or not isinstance(spec, (str, int)):
        raise InvalidParameterError(
            f"{param} must be a column name or number; got {spec!r}"
        )
    if isinstance(spec, int):
        j = spec + len(names) if spec < 0 else spec
        if not 0 <= j < len(names):
            raise InvalidParameterError(
                f"{param} must be a column number in [-{len(names)}, {len(names)}) "
                f"of {path}; got {spec}"
            )
        return j
    if not header:
        raise InvalidParameterError(
            f"{param} must be a column number when header=False; got {spec!r}"
        )
    if spec not in names:
        raise InvalidParameterError(
            f"{param} {spec!r} is not a column of {path}; its columns are {names}"
        )
    return names.index(spec)


def _read_csv(
    path: Path, delimiter: str, header: bool
) -> tuple[list[str], list[list[str]], int]:
    """Return the column names, the columns (lists of cells), the first line."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.reader(f, delimiter=delimiter) if r]
    if not rows:
        raise DpflError(f"{path}: empty file")
    names = [c.strip() for c in rows[0]] if header else []
    body = rows[1:] if header else rows
    width = len(rows[0])
    first = 2 if header else 1
    for i, r in enumerate(body):
        if len(r) != width:
            raise DpflError(
                f"{path}:{i + first}: expected {width} fields (as the first line); "
                f"got {len(r)}"
            )
    if not body:
        raise DpflError(f"{path}: no records")
    if not header:
        names = [str(j) for j in range(width)]
    return names, [list(col) for col in zip(*body, strict=True)], first


def _numeric(cells: list[str], name: str, path: Path, first: int) -> np.ndarray:
    try:
        col = np.array(cells, dtype=np.float64)
    except ValueError:
        for i, v in enumerate(cells):
            try:
                float(v)
            except ValueError:
                raise DpflError(
                    f"{path}:{i + first}: column {name!r} holds {v.strip()!r}, not "
                    "a number; encode it as numbers or leave it out with "
                    "feature_columns="
                ) from None
        raise  # pragma: no cover - np.array and float() agree
    bad = ~np.isfinite(col)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DpflError(
            f"{path}:{i + first}: column {name!r} holds {cells[i].strip()!r}; "
            "features must be finite numbers (fill or drop missing values first)"
        )
    return col


def _text(cells: list[str]) -> np.ndarray:
    return np.array([c.strip() for c in cells], dtype=str)


def _ids(cells: list[str]) -> np.ndarray:
    text = _text(cells)
    try:
        return text.astype(np.int64)
    except ValueError:
        return text.astype(object)


def load_csv(
    path: str | os.PathLike[str],
    *,
    label_column: str | int = "label",
    client_column: str | int | None = None,
    feature_columns: Sequence[str | int] | None = None,
    header: bool = True,
    delimiter: str = ",",
    test_path: str | os.PathLike[str] | None = None,
    test_fraction: float | None = None,
    seed: int = 0,
) -> Dataset:
    """Read a table of numeric features, a label column and optionally a client column.

    Parameters
    ----------
    path : str or os.PathLike
        The CSV file.
    label_column : str or int, optional
        Name (with a header) or number (0-based, negative from the end) of the
        label column (default ``"label"``). Integer labels are used as they
        are (they must be >= 0); any other values are classes numbered in
        sorted order (``"no"`` → 0, ``"yes"`` → 1).
    client_column : str or int, optional
        The column naming each record's client: the records of one value
        form one client under the ``"natural"`` partition, which becomes the
        default partition.
    feature_columns : sequence of str or int, optional
        The feature columns, in order; default every column but the label and
        client columns. Each must hold finite numbers only.
    header : bool, optional
        Whether the first line names the columns (default True).
    delimiter : str, optional
        Field separator (default ``","``).
    test_path : str or os.PathLike, optional
        A test file with the same columns.
    test_fraction : float, optional
        Instead of ``test_path``: hold out this fraction of the records, drawn
        at random with ``seed``, as the test set.
    seed : int, optional
        Seed of ``test_fraction``'s draw (default 0).

    Returns
    -------
    Dataset
        float32 features ``(N, number of feature columns)``, int64 labels,
        ``client_ids`` (and ``test_client_ids``) from ``client_column``: under
        the natural partition each client's test records become its
        personalised test set when every client has some.

    Raises
    ------
    DatasetNotFoundError
        If a file does not exist.
    InvalidParameterError
        If a column named does not exist (the message lists the columns), or
        both ``test_path`` and ``test_fraction`` are given.
    DpflError
        If a line has the wrong number of fields or a feature is not a finite
        number (the message names the line and the column).

    Examples
    --------
    ``label,client,x1,x2`` rows, one client per distinct ``client`` value::

        ds = load_csv("records.csv", label_column="label", client_column="client")
        fed = ds.federate()                  # the natural partition
        fed = ds.federate("iid", 10)         # or any other
    """
    p = _existing(path, "CSV file")
    if not isinstance(delimiter, str) or len(delimiter) != 1:
        raise InvalidParameterError(
            f"delimiter must be a single character; got {delimiter!r}"
        )
    if not isinstance(header, bool):
        raise InvalidParameterError(f"header must be True or False; got {header!r}")
    if test_path is not None and test_fraction is not None:
        raise InvalidParameterError(
            "give test_path or test_fraction, not both; got "
            f"test_path={str(test_path)!r}, test_fraction={test_fraction!r}"
        )
    names, cols, first = _read_csv(p, delimiter, header)
    j_label = _column(label_column, names, p, "label_column", header)
    j_client = (
        None
        if client_column is None
        else _column(client_column, names, p, "client_column", header)
    )
    if feature_columns is None:
        j_feat = [j for j in range(len(names)) if j not in (j_label, j_client)]
    else:
        j_feat = [
            _column(c, names, p, f"feature_columns[{i}]", header)
            for i, c in enumerate(feature_columns)
        ]
        clash = {j_label, j_client} & set(j_feat)
        if clash:
            raise InvalidParameterError(
                f"feature_columns must not hold the label or client column; got "
                f"{[names[j] for j in sorted(x for x in clash if x is not None)]}"
            )
    if not j_feat:
        raise InvalidParameterError(f"{p} has no feature columns; columns {names}")
    x = np.column_stack([_numeric(cols[j], names[j], p, first) for j in j_feat])
    raw_y = _text(cols[j_label])
    ids = None if j_client is None else _ids(cols[j_client])
    classes: list[str] | None = None
    try:
        y = raw_y.astype(np.int64)
    except ValueError:
        classes = sorted(set(raw_y.tolist()))
        lookup = {c: i for i, c in enumerate(classes)}
        y = np.array([lookup[v] for v in raw_y], dtype=np.int64)
    if y.min() < 0:
        i = int(np.argmin(y))
        raise DpflError(
            f"{p}:{i + first}: column {names[j_label]!r} holds {str(raw_y[i])!r}; "
            "integer labels must be >= 0"
        )
    test_x: np.ndarray | None = None
    test_y: np.ndarray | None = None
    test_ids: np.ndarray | None = None
    if test_path is not None:
        tp = _existing(test_path, "CSV test file")
        t_names, t_cols, t_first = _read_csv(tp, delimiter, header)
        if header and t_names != names:
            raise DpflError(
                f"{tp}: columns {t_names} differ from those of {p}: {names}"
            )
        if len(t_cols) != len(cols):
            raise DpflError(f"{tp}: {len(t_cols)} columns; {p} has {len(cols)}")
        test_x = np.column_stack(
            [_numeric(t_cols[j], names[j], tp, t_first) for j in j_feat]
        )
        t_raw = _text(t_cols[j_label])
        test_ids = None if j_client is None else _ids(t_cols[j_client])
        if classes is None:
            try:
                test_y = t_raw.astype(np.int64)
            except ValueError:
                raise DpflError(
                    f"{tp}: column {names[j_label]!r} is not integer, as in {p}"
                ) from None
        else:
            unseen = sorted(set(t_raw.tolist()) - set(classes))
            if unseen:
                raise DpflError(
                    f"{tp}: labels {unseen[:5]} of column {names[j_label]!r} do "
                    f"not occur in {p} (classes {classes[:10]})"
                )
            lookup = {c: i for i, c in enumerate(classes)}
            test_y = np.array([lookup[v] for v in t_raw], dtype=np.int64)
    elif test_fraction is not None:
        frac = check_probability(
            "test_fraction", test_fraction, allow_zero=False, allow_one=False
        )
        rng = np.random.default_rng(check_count("seed", seed, minimum=0))
        n_test = int(round(frac * len(y)))
        if not 0 < n_test < len(y):
            raise InvalidParameterError(
                f"test_fraction must leave >= 1 record on each side of {len(y)}; "
                f"got {test_fraction!r}"
            )
        held = np.zeros(len(y), dtype=bool)
        held[rng.choice(len(y), n_test, replace=False)] = True
        test_x, test_y = x[held], y[held]
        x, y = x[~held], y[~held]
        if ids is not None:
            ids, test_ids = ids[~held], ids[held]
    top = int(y.max())
    if test_y is not None and test_y.size:
        top = max(top, int(test_y.max()))
    num_classes = len(classes) if classes is not None else top + 1
    return Dataset(
        features=x.astype(np.float32),
        labels=y,
        test_features=None if test_x is None else test_x.astype(np.float32),
        test_labels=test_y,
        num_classes=num_classes,
        name=p.stem,
        input_shape=(len(j_feat),),
        source=str(p),
        client_ids=ids,
        test_client_ids=test_ids,
    )


def _as_images(x: np.ndarray, channels_last: bool) -> np.ndarray:
    if channels_last and x.ndim == 4:
        x = x.transpose(0, 3, 1, 2)
    if x.ndim == 3:  # (N, H, W) greyscale images
        x = x[:, None]
    if x.dtype == np.uint8:
        return x.astype(np.float32) * np.float32(1.0 / 255.0)
    return _check_features(x)


_NPZ_DEFAULTS = {
    "features": ("x", "x_train", "features", "images"),
    "labels": ("y", "y_train", "labels", "targets"),
    "test_features": ("x_test", "test_features", "test_images"),
    "test_labels": ("y_test", "test_labels", "test_targets"),
    "clients": ("client_ids", "clients", "users", "writers"),
}


def load_npz(
    path: str | os.PathLike[str],
    *,
    features: str | None = None,
    labels: str | None = None,
    test_features: str | None = None,
    test_labels: str | None = None,
    clients: str | None = None,
    channels_last: bool = False,
) -> Dataset:
    """Read named arrays from a ``.npz`` file (``numpy.savez``).

    Parameters
    ----------
    path : str or os.PathLike
        The file; it is opened with ``allow_pickle=False``.
    features, labels : str, optional
        Names of the training arrays; by default the first present of
        ``x``/``x_train``/``features``/``images`` and
        ``y``/``y_train``/``labels``/``targets`` (Keras's ``mnist.npz``
        layout, ``x_train, y_train, x_test, y_test``, works as is).
    test_features, test_labels : str, optional
        Names of the test arrays; default ``x_test``/``test_features``/
        ``test_images`` and ``y_test``/``test_labels``/``test_targets`` if
        present (both or neither).
    clients : str, optional
        Name of an array giving each training record's client (the
        ``"natural"`` partition); default ``client_ids``/``clients``/
        ``users``/``writers`` if present.
    channels_last : bool, optional
        Move the last axis of 4-d ``(N, H, W, C)`` arrays first (default
        False).

    Returns
    -------
    Dataset
        Features as float32; uint8 arrays are read as pixels and scaled by
        1/255, and 3-d ``(N, H, W)`` arrays get a channel axis ``(N, 1, H, W)``.

    Raises
    ------
    DatasetNotFoundError
        If the file does not exist.
    InvalidParameterError
        If a named array is missing (the message lists those present) or the
        arrays disagree in length.
    """
    p = _existing(path, "npz file")
    with np.load(p, allow_pickle=False) as z:
        present = list(z.files)

        def pick(param: str, given: str | None, required: bool) -> np.ndarray | None:
            if given is not None:
                if given not in present:
                    raise InvalidParameterError(
                        f"{param} {given!r} is not an array of {p}; it holds {present}"
                    )
                return z[given]
            hit = next((n for n in _NPZ_DEFAULTS[param] if n in present), None)
            if hit is None and required:
                raise InvalidParameterError(
                    f"{p} has none of {list(_NPZ_DEFAULTS[param])} for {param}; it "
                    f"holds {present}: name the array with {param}="
                )
            return None if hit is None else z[hit]

        x = pick("features", features, True)
        y = pick("labels", labels, True)
        tx = pick("test_features", test_features, False)
        ty = pick("test_labels", test_labels, False)
        ids = pick("clients", clients, False)
    assert x is not None and y is not None
    if (tx is None) != (ty is None):
        raise InvalidParameterError(
            f"{p}: test features and test labels must both be present or both "
            f"absent; it holds {present}"
        )
    x = _as_images(x, channels_last)
    y = _check_labels(y)
    if len(x) != len(y):
        raise InvalidParameterError(
            f"{p}: {len(x)} feature records but {len(y)} labels"
        )
    if ids is not None and len(ids) != len(y):
        raise InvalidParameterError(f"{p}: {len(ids)} client ids for {len(y)} records")
    if tx is not None and ty is not None:
        tx = _as_images(tx, channels_last)
        ty = _check_labels(ty)
    top = int(y.max(initial=0))
    if ty is not None and ty.size:
        top = max(top, int(ty.max()))
    return Dataset(
        features=x,
        labels=y,
        test_features=tx,
        test_labels=ty,
        num_classes=top + 1,
        name=p.stem,
        input_shape=tuple(x.shape[1:]),
        source=str(p),
        client_ids=ids,
    )


def _one(d: Path, patterns: Sequence[str], what: str) -> Path | None:
    hits = sorted({f for pat in patterns for f in d.glob(pat) if f.is_file()})
    if len(hits) > 1:
        raise InvalidParameterError(
            f"{d} holds several {what} files {[h.name for h in hits]}; name them "
            "with images=, labels=, test_images=, test_labels="
        )
    return hits[0] if hits else None


def load_idx_files(
    images: str | os.PathLike[str],
    labels: str | os.PathLike[str] | None = None,
    *,
    test_images: str | os.PathLike[str] | None = None,
    test_labels: str | os.PathLike[str] | None = None,
) -> Dataset:
    """Read images and labels from IDX files (the MNIST format) of any name.

    Parameters
    ----------
    images : str or os.PathLike
        The training images (``(N, H, W)`` or ``(N, C, H, W)``, or ``(N, d)``
        rows), or a directory holding exactly one ``*train*images*`` and one
        ``*train*labels*`` file and optionally one ``*t10k*``/``*test*`` pair.
    labels : str or os.PathLike, optional
        The training labels; required unless ``images`` is a directory.
    test_images, test_labels : str or os.PathLike, optional
        A test pair.

    Returns
    -------
    Dataset
        uint8 images scaled to [0, 1] with a channel axis; other types cast
        to float32.

    Raises
    ------
    DatasetNotFoundError
        If a file does not exist.
    InvalidParameterError
        If the directory's files are missing or ambiguous, or images and
        labels disagree in length.
    """
    img = _existing(images, "IDX images")
    name = img.name if img.is_dir() else img.name.split(".")[0]
    if img.is_dir():
        if labels is not None:
            raise InvalidParameterError(
                f"labels must be None when images is a directory ({img}); got "
                f"{str(labels)!r}"
            )
        tr_x = _one(img, ["*train*images*"], "training images")
        tr_y = _one(img, ["*train*labels*"], "training labels")
        te_x = _one(img, ["*t10k*images*", "*test*images*"], "test images")
        te_y = _one(img, ["*t10k*labels*", "*test*labels*"], "test labels")
        if tr_x is None or tr_y is None:
            raise DatasetNotFoundError(
                f"{img} holds no *train*images* and *train*labels* IDX files; "
                f"it holds {sorted(f.name for f in img.iterdir())[:10]}"
            )
        img, lab = tr_x, tr_y
        if test_images is None and test_labels is None and te_x and te_y:
            test_images, test_labels = te_x, te_y
    elif labels is None:
        raise InvalidParameterError(
            f"labels is required when images is a file ({img}); got None"
        )
    else:
        lab = _existing(labels, "IDX labels")
    if (test_images is None) != (test_labels is None):
        raise InvalidParameterError(
            "test_images and test_labels must be given together; got "
            f"test_images={test_images!r}, test_labels={test_labels!r}"
        )

    def read(xp: Path, yp: Path) -> tuple[np.ndarray, np.ndarray]:
        x, y = load_idx(xp), load_idx(yp)
        if y.ndim != 1 or len(x) != len(y):
            raise InvalidParameterError(
                f"{xp} holds {x.shape} records but {yp} holds labels {y.shape}"
            )
        return _as_images(x, False), _check_labels(y)

    x, y = read(img, lab)
    tx = ty = None
    if test_images is not None and test_labels is not None:
        tx, ty = read(
            _existing(test_images, "IDX test images"),
            _existing(test_labels, "IDX test labels"),
        )
    top = int(y.max(initial=0))
    if ty is not None and ty.size:
        top = max(top, int(ty.max()))
    return Dataset(
        features=x,
        labels=y,
        test_features=tx,
        test_labels=ty,
        num_classes=top + 1,
        name=name or "idx",
        input_shape=tuple(x.shape[1:]),
        source=str(img.parent),
    )
