"""Reference models of the papers and the MS-PAFL public/private split.

None of the models uses BatchNorm, so per-sample gradients are well defined.
"""

from dpfl.models.cnn import McMahanCNN, PaperCNN, PriFedSyncCNN, TfTutorialCNN
from dpfl.models.linear import MLP, LogisticRegression
from dpfl.models.losses import classification_loss, predicted_labels
from dpfl.models.registry import MODEL_NAMES, build_model
from dpfl.models.split import ParameterSplit, split_parameters

__all__ = [
    "MLP",
    "MODEL_NAMES",
    "LogisticRegression",
    "McMahanCNN",
    "PaperCNN",
    "ParameterSplit",
    "PriFedSyncCNN",
    "TfTutorialCNN",
    "build_model",
    "classification_loss",
    "predicted_labels",
    "split_parameters",
]
