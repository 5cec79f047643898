"""Convolutional reference models of the papers (28×28×1 inputs).

Neither model uses BatchNorm: per-sample gradients (and therefore DP-SGD
clipping) need every example to pass through the network independently.
"""

from __future__ import annotations

import torch
from torch import nn

from dpfl._validate import check_count

__all__ = ["PaperCNN", "PriFedSyncCNN"]


class PaperCNN(nn.Module):
    """The CNN of the random-participation paper (Appendix B, Figure 8).

    Layers, for a ``1 × 28 × 28`` input::

        Conv2d(1, 16, kernel 8, stride 2, padding 3) -> ReLU -> MaxPool(2, stride 1)
        Conv2d(16, 32, kernel 4, stride 2)           -> ReLU -> MaxPool(2, stride 1)
        Flatten (32·4·4 = 512) -> Linear(512, 256) -> ReLU -> Linear(256, num_classes)

    The figure draws ReLU and max-pooling side by side without an order; the two
    commute (both are monotone), so the order does not change the function.
    The softmax of the figure is folded into the cross-entropy loss: the model
    returns logits. The paper uses EMNIST ByClass, hence 62 classes by default.
    This is also the MNIST CNN of the Opacus and TF-Privacy examples; it has
    156,526 parameters with 62 classes (9,264 in the convolutions).

    Parameters
    ----------
    num_classes : int
        Number of output logits (62 for EMNIST ByClass, 10 for MNIST).
    in_channels : int
        Input channels (1 for grey-scale images).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``num_classes`` or ``in_channels`` is not a positive integer.

    References
    ----------
    Hasircioglu & Gündüz, "Communication efficient federated learning with
    differential privacy and random participation", arXiv 2205.01556, App. B.
    """

    def __init__(self, num_classes: int = 62, *, in_channels: int = 1) -> None:
        super().__init__()
        num_classes = check_count("num_classes", num_classes, minimum=1)
        in_channels = check_count("in_channels", in_channels, minimum=1)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 16, kernel_size=8, stride=2, padding=3),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=1),
            nn.Conv2d(16, 32, kernel_size=4, stride=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=1),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, 256),
            nn.ReLU(),
            nn.Linear(256, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``[batch, num_classes]`` for ``[batch, C, 28, 28]`` images."""
        return self.classifier(self.features(x))


class PriFedSyncCNN(nn.Module):
    """The MNIST CNN of the federated f-DP paper (PriFedSync, §4.1).

    The paper's text says: "a CNN model with two convolution layers with 3 x 3
    kernels, followed by an FC layer with 128 units and ReLu activation, and a
    final softmax output layer". It gives no channel counts; we take them from
    the PyTorch ``examples/mnist`` network, which has exactly that description::

        Conv2d(1, 32, 3) -> ReLU -> Conv2d(32, 64, 3) -> ReLU -> MaxPool(2)
        Flatten (64·12·12 = 9216) -> Linear(9216, 128) -> ReLU -> Linear(128, C)

    The PyTorch example also has dropout (0.25, 0.5); it is left out here
    because a random mask per example would need ``randomness="different"``
    under ``vmap`` and is not part of the paper's description. 1,199,882
    parameters with 10 classes.

    Parameters
    ----------
    num_classes : int
        Number of output logits.
    in_channels : int
        Input channels.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``num_classes`` or ``in_channels`` is not a positive integer.

    References
    ----------
    Zheng, Chen, Long & Su, "Federated f-differential privacy", AISTATS 2021,
    §4.1; PyTorch examples, ``mnist/main.py`` (``Net``).
    """

    def __init__(self, num_classes: int = 10, *, in_channels: int = 1) -> None:
        super().__init__()
        num_classes = check_count("num_classes", num_classes, minimum=1)
        in_channels = check_count("in_channels", in_channels, minimum=1)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, kernel_size=3),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 12 * 12, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``[batch, num_classes]`` for ``[batch, C, 28, 28]`` images."""
        return self.classifier(self.features(x))
