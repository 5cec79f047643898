"""Datasets by name: ``get_dataset("fashion-mnist", num_clients=100, …)``."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

from dpfl.data.adult import load_adult
from dpfl.data.cifar10 import load_cifar10
from dpfl.data.dataset import Dataset, FederatedDataset
from dpfl.data.femnist import load_femnist
from dpfl.data.loaders import load_digits, load_mnist
from dpfl.data.synthetic import synthetic, synthetic_images
from dpfl.data.user_files import load_csv, load_idx_files, load_npz
from dpfl.errors import DpflError, InvalidParameterError

__all__ = ["DATASETS", "dataset_options", "get_dataset"]


def _emnist(*, root: Any = None, split: str = "byclass", lean: bool = False) -> Dataset:
    return load_mnist(root, kind=f"emnist-{split}", lean=lean)


def _mnist(*, root: Any = None, lean: bool = False) -> Dataset:
    return load_mnist(root, kind="mnist", lean=lean)


def _fashion(*, root: Any = None, lean: bool = False) -> Dataset:
    return load_mnist(root, kind="fashion", lean=lean)


def _digits(
    *, test_fraction: float = 0.25, flatten: bool = False, seed: int = 0
) -> Dataset:
    return load_digits(test_fraction=test_fraction, seed=seed, flatten=flatten)


def _need_path(name: str, path: Any) -> Any:
    if path is None:
        raise InvalidParameterError(
            f"path is required for dataset {name!r} (data.path in a run "
            "configuration); got None"
        )
    return path


def _csv(
    *,
    path: Any = None,
    label_column: str | int = "label",
    client_column: str | int | None = None,
    feature_columns: list[str | int] | None = None,
    header: bool = True,
    delimiter: str = ",",
    test_path: Any = None,
    test_fraction: float | None = None,
    seed: int = 0,
) -> Dataset:
    return load_csv(
        _need_path("csv", path),
        label_column=label_column,
        client_column=client_column,
        feature_columns=feature_columns,
        header=header,
        delimiter=delimiter,
        test_path=test_path,
        test_fraction=test_fraction,
        seed=seed,
    )


def _npz(
    *,
    path: Any = None,
    features: str | None = None,
    labels: str | None = None,
    test_features: str | None = None,
    test_labels: str | None = None,
    clients: str | None = None,
    channels_last: bool = False,
) -> Dataset:
    return load_npz(
        _need_path("npz", path),
        features=features,
        labels=labels,
        test_features=test_features,
        test_labels=test_labels,
        clients=clients,
        channels_last=channels_last,
    )


def _idx(
    *,
    path: Any = None,
    labels: Any = None,
    test_images: Any = None,
    test_labels: Any = None,
) -> Dataset:
    return load_idx_files(
        _need_path("idx", path),
        labels,
        test_images=test_images,
        test_labels=test_labels,
    )


# Centralised loaders (partitioned by `federate`) and generators (already federated).
_LOADERS: dict[str, Callable[..., Dataset]] = {
    "digits": _digits,
    "mnist": _mnist,
    "fashion-mnist": _fashion,
    "emnist": _emnist,
    "femnist": load_femnist,
    "cifar10": load_cifar10,
    "adult": load_adult,
    "csv": _csv,
    "npz": _npz,
    "idx": _idx,
}
_GENERATORS: dict[str, Callable[..., FederatedDataset]] = {
    "synthetic": synthetic,
    "synthetic-images": synthetic_images,
}

#: Names :func:`get_dataset` accepts.
DATASETS = tuple(_LOADERS) + tuple(_GENERATORS)


#: The types of the partition's keywords (:meth:`Dataset.federate` takes them
#: as ``**kwargs``).
_FEDERATE_TYPES: dict[str, Any] = {
    "partition": str,
    "num_clients": int | None,
    "seed": int,
    "client_test_records": int,
    "shards_per_client": int,
    "beta": float,
    "records_per_client": int | None,
    "min_size": int,
    "allow_repeats": bool,
    "labels_per_client": int,
}


def _params(fn: Callable[..., Any]) -> set[str]:
    return set(inspect.signature(fn).parameters)


_FEDERATE_KEYS = set(_FEDERATE_TYPES)


def dataset_options(name: str) -> dict[str, tuple[Any, bool]] | None:
    """The keywords :func:`get_dataset` takes for ``name``: type and if required.

    Parameters
    ----------
    name : str
        A data set name (as :func:`get_dataset` reads it).

    Returns
    -------
    dict or None
        Keyword to ``(type hint, required)``; ``None`` for an unknown name.
    """
    key = name.lower().replace("_", "-")
    key = {"fashion": "fashion-mnist", "cifar-10": "cifar10"}.get(key, key)
    fn = _GENERATORS.get(key) or _LOADERS.get(key)
    if fn is None:
        return None
    hints = typing.get_type_hints(fn)
    out = {
        k: (hints.get(k, Any), p.default is inspect.Parameter.empty)
        for k, p in inspect.signature(fn).parameters.items()
        if p.kind is not p.VAR_KEYWORD
    }
    if key in _LOADERS:
        out.update({k: (tp, False) for k, tp in _FEDERATE_TYPES.items()})
    return out


def get_dataset(name: str, **kwargs: Any) -> FederatedDataset:
    """Build a federated dataset by name.

    Parameters
    ----------
    name : str
        One of ``"digits"``, ``"synthetic"``, ``"synthetic-images"``,
        ``"mnist"``, ``"fashion-mnist"``, ``"emnist"``, ``"femnist"`` (EMNIST
        by writer, :func:`~dpfl.data.load_femnist`), ``"cifar10"``,
        ``"adult"``, or a user's own file: ``"csv"``, ``"npz"``, ``"idx"``
        (with ``path``).
    **kwargs
        For ``"synthetic"`` and ``"synthetic-images"``: the generator's
        arguments (:func:`~dpfl.data.synthetic`,
        :func:`~dpfl.data.synthetic_images`). For the others: the loader's
        (``root``, ``lean``; ``split`` for EMNIST, default ``"byclass"``;
        ``only_digits``, ``invert`` for FEMNIST;
        ``test_fraction``, ``flatten`` for digits; ``path`` and the keywords
        of :func:`~dpfl.data.load_csv`, :func:`~dpfl.data.load_npz` or
        :func:`~dpfl.data.load_idx_files` (``labels``, ``test_images``,
        ``test_labels``) for the files) and the partition's, passed to
        :func:`~dpfl.data.federate` (``partition`` default ``"natural"`` for
        data with client ids, else ``"iid"``; ``num_clients`` default 10, or
        all ids for ``"natural"``; ``seed`` default 0, ``shards_per_client``,
        ``beta``, ``records_per_client``, ``min_size``, ``allow_repeats``,
        ``labels_per_client``, ``client_test_records``).

    Returns
    -------
    FederatedDataset
        The dataset, partitioned.

    Raises
    ------
    DpflError
        If ``name`` is unknown (the message lists the choices).
    InvalidParameterError
        On an argument the dataset does not take.
    DatasetNotFoundError
        If a real dataset's files are missing (the message says how to get
        them).
    """
    key = name.lower().replace("_", "-")
    key = {"fashion": "fashion-mnist", "cifar-10": "cifar10"}.get(key, key)
    if key in _GENERATORS:
        gen = _GENERATORS[key]
        unknown = set(kwargs) - _params(gen)
        if unknown:
            raise InvalidParameterError(
                f"{name} does not take {sorted(unknown)}; it takes "
                f"{sorted(_params(gen))}"
            )
        return gen(**kwargs)
    if key not in _LOADERS:
        raise DpflError(f"unknown dataset {name!r}; choose one of {DATASETS}")
    loader = _LOADERS[key]
    loader_keys = _params(loader)
    unknown = set(kwargs) - loader_keys - _FEDERATE_KEYS
    if unknown:
        raise InvalidParameterError(
            f"{name} does not take {sorted(unknown)}; it takes "
            f"{sorted(loader_keys | _FEDERATE_KEYS)}"
        )
    data = loader(**{k: v for k, v in kwargs.items() if k in loader_keys})
    fed = {k: v for k, v in kwargs.items() if k in _FEDERATE_KEYS}
    natural = "natural" if data.client_ids is not None else "iid"
    if fed.get("partition", natural) != "natural":
        fed.setdefault("num_clients", 10)
    return data.federate(**fed)
