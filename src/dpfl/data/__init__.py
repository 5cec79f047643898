"""Datasets for federated simulation: embedded, procedural and real loaders.

Nothing is downloaded: :func:`load_digits` uses scikit-learn's bundled digits,
:func:`synthetic` and :func:`synthetic_images` generate any number of clients,
and the real loaders read standard local files (IDX, CIFAR pickles, Adult CSV).
"""

from dpfl.data.dataset import (
    Dataset,
    FederatedDataset,
    LazyFeatures,
    ScaledUint8Features,
)
from dpfl.data.loaders import (
    DEBIAN_FASHION_MNIST_DIR,
    IDX_KINDS,
    DatasetNotFoundError,
    load_adult,
    load_cifar10,
    load_digits,
    load_idx,
    load_mnist,
)
from dpfl.data.partition import (
    client_test_split,
    dirichlet,
    dirichlet_per_client,
    equal_size,
    federate,
    iid,
    shards,
)
from dpfl.data.registry import DATASETS, get_dataset
from dpfl.data.synthetic import ProceduralImages, synthetic, synthetic_images

__all__ = [
    "DATASETS",
    "DEBIAN_FASHION_MNIST_DIR",
    "IDX_KINDS",
    "Dataset",
    "DatasetNotFoundError",
    "FederatedDataset",
    "LazyFeatures",
    "ProceduralImages",
    "ScaledUint8Features",
    "client_test_split",
    "dirichlet",
    "dirichlet_per_client",
    "equal_size",
    "federate",
    "get_dataset",
    "iid",
    "load_adult",
    "load_cifar10",
    "load_digits",
    "load_idx",
    "load_mnist",
    "shards",
    "synthetic",
    "synthetic_images",
]
