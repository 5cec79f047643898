"""Datasets for federated simulation: embedded, procedural, real and a user's own.

Nothing is downloaded at run time: :func:`load_digits` uses scikit-learn's
bundled digits, :func:`synthetic` and :func:`synthetic_images` generate any
number of clients, and the real loaders read standard local files (IDX, CIFAR
batches, Adult CSV) without running code from them. A user's own data come in
as arrays or tensors (:func:`federate`), per-client lists
(:func:`federate_clients`), a torch
dataset (:func:`federate_torch`) or files (:func:`load_csv`,
:func:`load_npz`, :func:`load_idx_files`).
"""

from dpfl.data.adult import load_adult
from dpfl.data.cifar10 import load_cifar10
from dpfl.data.dataset import (
    ClientIndices,
    Dataset,
    FederatedDataset,
    LazyFeatures,
    ScaledUint8Features,
)
from dpfl.data.federate import client_test_split, federate
from dpfl.data.femnist import load_femnist
from dpfl.data.loaders import (
    DEBIAN_FASHION_MNIST_DIR,
    IDX_KINDS,
    DatasetNotFoundError,
    load_digits,
    load_idx,
    load_mnist,
)
from dpfl.data.locate import REAL_DATASETS, locate
from dpfl.data.partition import (
    dirichlet,
    dirichlet_per_client,
    equal_size,
    iid,
    label_subsets,
    natural,
    shards,
)
from dpfl.data.registry import DATASETS, get_dataset
from dpfl.data.sources import federate_clients, federate_torch
from dpfl.data.synthetic import ProceduralImages, synthetic, synthetic_images
from dpfl.data.user_files import load_csv, load_idx_files, load_npz

__all__ = [
    "DATASETS",
    "DEBIAN_FASHION_MNIST_DIR",
    "IDX_KINDS",
    "REAL_DATASETS",
    "ClientIndices",
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
    "federate_clients",
    "federate_torch",
    "get_dataset",
    "iid",
    "label_subsets",
    "load_adult",
    "load_cifar10",
    "load_csv",
    "load_digits",
    "load_femnist",
    "load_idx",
    "load_idx_files",
    "load_mnist",
    "load_npz",
    "locate",
    "natural",
    "shards",
    "synthetic",
    "synthetic_images",
]
