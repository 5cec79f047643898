"""Logistic regression and a small MLP (flattened inputs)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from dpfl._validate import check_count

__all__ = ["MLP", "LogisticRegression"]


class LogisticRegression(nn.Module):
    """Multinomial (or binary) logistic regression on flattened inputs.

    ``forward`` flattens every dimension after the batch dimension, so an
    ``8 × 8`` image and a 64-vector are the same input. With ``num_classes=1``
    the model returns one logit per example (shape ``[batch]``), to be used
    with binary cross-entropy and labels in {0, 1}
    (:func:`dpfl.models.classification_loss` picks it from the output's shape);
    this is the model of the MS-PAFL experiments (Adult, 14 features; use
    ``bias=False`` for the paper's d = 14 coordinates, split 7 private / 7
    public). From a run config: ``model: {name: logistic_regression, options:
    {binary: true}}`` on 2-class data. The
    paper's L2 regulariser (λ/2)‖w‖² is not part of the model: add it to the
    loss or as weight decay.

    Parameters
    ----------
    in_features : int
        Number of input features (product of the input shape).
    num_classes : int
        Number of classes; 1 means a single binary logit.
    bias : bool
        Whether to learn an intercept.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``in_features`` or ``num_classes`` is not a positive integer.

    References
    ----------
    Li, Wang, Tian, Wang & Su, "MS-PAFL", arXiv 2509.25906, §V-A.
    """

    def __init__(self, in_features: int, num_classes: int, *, bias: bool = True):
        super().__init__()
        self.in_features = check_count("in_features", in_features, minimum=1)
        self.num_classes = check_count("num_classes", num_classes, minimum=1)
        self.linear = nn.Linear(self.in_features, self.num_classes, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``[batch, num_classes]`` (``[batch]`` if one class)."""
        out = self.linear(x.reshape(x.shape[0], -1))
        return out.squeeze(-1) if self.num_classes == 1 else out


class MLP(nn.Module):
    """Fully connected ReLU network on flattened inputs.

    The default shape fits scikit-learn's 8 × 8 digits: 64 inputs, one hidden
    layer of 64 units, 10 classes (4,810 parameters).

    Parameters
    ----------
    in_features : int
        Number of input features (64 for the 8 × 8 digits).
    hidden : int or sequence of int
        Width of each hidden layer; an empty sequence gives logistic regression.
    num_classes : int
        Number of output logits.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If a size is not a positive integer.
    """

    def __init__(
        self,
        in_features: int = 64,
        hidden: int | Sequence[int] = (64,),
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        in_features = check_count("in_features", in_features, minimum=1)
        num_classes = check_count("num_classes", num_classes, minimum=1)
        widths = [hidden] if isinstance(hidden, int) else list(hidden)
        widths = [check_count("hidden", w, minimum=1) for w in widths]
        layers: list[nn.Module] = []
        previous = in_features
        for width in widths:
            layers += [nn.Linear(previous, width), nn.ReLU()]
            previous = width
        layers.append(nn.Linear(previous, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``[batch, num_classes]``."""
        return self.net(x.reshape(x.shape[0], -1))
