"""Reference models of the papers and the MS-PAFL public/private split.

None of the models uses BatchNorm, so per-sample gradients are well defined.
"""

from dpfl.models.cnn import PaperCNN, PriFedSyncCNN
from dpfl.models.linear import MLP, LogisticRegression
from dpfl.models.registry import MODEL_NAMES, build_model
from dpfl.models.split import ParameterSplit, split_parameters

__all__ = [
    "MLP",
    "MODEL_NAMES",
    "LogisticRegression",
    "PaperCNN",
    "ParameterSplit",
    "PriFedSyncCNN",
    "build_model",
    "split_parameters",
]
