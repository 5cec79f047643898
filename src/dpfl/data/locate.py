"""Where a real data set's files are, found without reading them (dpfl data list)."""

from __future__ import annotations

import os
from pathlib import Path

from dpfl.data.adult import locate_adult
from dpfl.data.cifar10 import locate_cifar10
from dpfl.data.femnist import locate_femnist
from dpfl.data.loaders import IDX_KINDS, _idx_key, _locate_idx
from dpfl.errors import InvalidParameterError

__all__ = ["REAL_DATASETS", "locate"]


#: Names :func:`locate` knows: the real data sets whose files dpfl looks for.
REAL_DATASETS = ("mnist", "fashion-mnist", "emnist", "femnist", "cifar10", "adult")


def locate(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """Return the directory a real data set would be read from, without reading it.

    The same search as the data set's loader (see :mod:`dpfl.data.loaders`).

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
        return locate_cifar10(root)[0]
    if name == "adult":
        return locate_adult(root)[0]
    if name == "femnist":
        return locate_femnist(root)[0]
    if name in IDX_KINDS or name in ("fashion-mnist", "emnist"):
        return _locate_idx(root, _idx_key(name))[0]
    raise InvalidParameterError(
        f"name must be one of {REAL_DATASETS} or {IDX_KINDS}; got {name!r}"
    )
