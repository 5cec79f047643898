"""Datasets by name: ``get_dataset("fashion-mnist", num_clients=100, …)``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from dpfl.data.dataset import Dataset, FederatedDataset
from dpfl.data.loaders import (
    load_adult,
    load_cifar10,
    load_digits,
    load_mnist,
)
from dpfl.data.partition import federate
from dpfl.data.synthetic import synthetic, synthetic_images
from dpfl.errors import DpflError, InvalidParameterError

__all__ = ["DATASETS", "get_dataset"]


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


# Centralised loaders (partitioned by `federate`) and generators (already federated).
_LOADERS: dict[str, Callable[..., Dataset]] = {
    "digits": _digits,
    "mnist": _mnist,
    "fashion-mnist": _fashion,
    "emnist": _emnist,
    "cifar10": load_cifar10,
    "adult": load_adult,
}
_GENERATORS: dict[str, Callable[..., FederatedDataset]] = {
    "synthetic": synthetic,
    "synthetic-images": synthetic_images,
}

#: Names :func:`get_dataset` accepts.
DATASETS = tuple(_LOADERS) + tuple(_GENERATORS)

_FEDERATE_KEYS = {
    "partition",
    "num_clients",
    "seed",
    "client_test_records",
    "shards_per_client",
    "beta",
    "records_per_client",
    "min_size",
    "allow_repeats",
}


def _params(fn: Callable[..., Any]) -> set[str]:
    return set(inspect.signature(fn).parameters)


def get_dataset(name: str, **kwargs: Any) -> FederatedDataset:
    """Build a federated dataset by name.

    Parameters
    ----------
    name : str
        One of ``"digits"``, ``"synthetic"``, ``"synthetic-images"``,
        ``"mnist"``, ``"fashion-mnist"``, ``"emnist"``, ``"cifar10"``,
        ``"adult"``.
    **kwargs
        For ``"synthetic"`` and ``"synthetic-images"``: the generator's
        arguments (:func:`~dpfl.data.synthetic`,
        :func:`~dpfl.data.synthetic_images`). For the others: the loader's
        (``root``, ``lean``; ``split`` for EMNIST, default ``"byclass"``;
        ``test_fraction``, ``flatten`` for digits) and the partition's, passed
        to :func:`~dpfl.data.federate` (``partition`` default ``"iid"``,
        ``num_clients`` default 10, ``seed`` default 0, ``shards_per_client``,
        ``beta``, ``records_per_client``, ``min_size``, ``allow_repeats``,
        ``client_test_records``).

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
    fed.setdefault("num_clients", 10)
    partition = fed.get("partition", "iid")
    label = partition if isinstance(partition, str) else "custom"
    return federate(
        data.features,
        data.labels,
        test_features=data.test_features,
        test_labels=data.test_labels,
        num_classes=data.num_classes,
        name=f"{data.name}/{label}",
        input_shape=data.input_shape,
        **fed,
    )
