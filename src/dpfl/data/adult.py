"""UCI Adult (census income) from its ``adult.data`` and ``adult.test`` files.

The search is :mod:`dpfl.data.loaders`'s; nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dpfl.data.dataset import Dataset
from dpfl.data.loaders import _find, _search_dirs
from dpfl.errors import DpflError, InvalidParameterError

__all__ = ["load_adult", "locate_adult"]


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


def locate_adult(root: str | os.PathLike[str] | None) -> tuple[Path, list[Path]]:
    """The folder holding ``adult.data`` and ``adult.test``, and the two files."""
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
    where, (train_path, test_path) = locate_adult(root)
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
