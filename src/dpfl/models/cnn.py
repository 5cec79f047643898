"""Convolutional reference models of the papers, for any image size and channels.

Every model takes ``in_channels`` and ``image_size`` (height, width) and sizes
its first fully connected layer from them, so the same architecture runs on
28 × 28 grey-scale images (MNIST, Fashion-MNIST, EMNIST) and on 32 × 32 colour
images (CIFAR-10). At the size each paper used, the parameter counts are the
papers' (the tests check them where a paper states one).

None of the models uses BatchNorm: per-sample gradients (and therefore DP-SGD
clipping) need every example to pass through the network independently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from dpfl._validate import check_count
from dpfl.errors import InvalidParameterError

__all__ = ["McMahanCNN", "PaperCNN", "PriFedSyncCNN", "TfTutorialCNN"]


def _image_size(value: int | Sequence[int]) -> tuple[int, int]:
    """``image_size`` as ``(height, width)``; an int means a square image."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != 2:
        raise InvalidParameterError(
            f"image_size must be an int or (height, width); got {value!r}"
        )
    return (
        check_count("image_size height", value[0], minimum=1),
        check_count("image_size width", value[1], minimum=1),
    )


def _flat_features(
    features: nn.Module, in_channels: int, size: tuple[int, int], name: str
) -> int:
    """Width of ``features``' flattened output for one ``in_channels × size`` image.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the image is too small for the convolution and pooling stack.
    """
    try:
        with torch.no_grad():
            out = features(torch.zeros(1, in_channels, *size))
    except RuntimeError as exc:
        raise InvalidParameterError(
            f"{name} cannot take {in_channels} x {size[0]} x {size[1]} images: "
            f"too small for its convolutions and pooling ({exc})"
        ) from None
    return int(out.numel())


class _ImageCNN(nn.Module):
    """A feature stack and a classifier; logits out for ``[batch, C, H, W]``."""

    features: nn.Sequential
    classifier: nn.Sequential

    def _assemble(
        self,
        layers: Callable[[int], list[nn.Module]],
        *,
        hidden: int,
        num_classes: int,
        in_channels: int,
        image_size: int | Sequence[int],
    ) -> None:
        """Validate the sizes and build the two stacks.

        ``features`` is ``layers(in_channels)``; the classifier is
        ``Flatten -> Linear(flat, hidden) -> ReLU -> Linear(hidden, K)``, with
        ``flat`` measured on one image of ``image_size``.
        """
        num_classes = check_count("num_classes", num_classes, minimum=1)
        in_channels = check_count("in_channels", in_channels, minimum=1)
        size = _image_size(image_size)
        self.features = nn.Sequential(*layers(in_channels))
        flat = _flat_features(self.features, in_channels, size, type(self).__name__)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(flat, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits ``[batch, num_classes]`` for ``[batch, C, H, W]`` images."""
        return self.classifier(self.features(x))


class PaperCNN(_ImageCNN):
    """The CNN of the random-participation paper (Appendix B, Figure 8).

    Layers, for a ``1 × 28 × 28`` input::

        Conv2d(C, 16, kernel 8, stride 2, padding 3) -> ReLU -> MaxPool(2, stride 1)
        Conv2d(16, 32, kernel 4, stride 2)           -> ReLU -> MaxPool(2, stride 1)
        Flatten (32·4·4 = 512) -> Linear(512, 256) -> ReLU -> Linear(256, num_classes)

    Other image sizes change only the width of the flattened features (800 for
    32 × 32). The figure draws ReLU and max-pooling side by side without an
    order; the two commute (both are monotone), so the order does not change the
    function. The softmax of the figure is folded into the cross-entropy loss:
    the model returns logits. The paper uses EMNIST ByClass, hence 62 classes by
    default. This is also the MNIST CNN of the Opacus and TF-Privacy examples
    (it is *not* McMahan et al.'s CNN: see :class:`McMahanCNN`); it has 156,526
    parameters with 62 classes at 1 × 28 × 28 (9,264 in the convolutions).

    Parameters
    ----------
    num_classes : int
        Number of output logits (62 for EMNIST ByClass, 10 for MNIST).
    in_channels : int
        Input channels (1 for grey-scale images).
    image_size : int or (int, int)
        Height and width of the input images.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If a size is not a positive integer or the image is too small.

    References
    ----------
    Hasircioglu & Gündüz, "Privacy Amplification via Random Participation in
    Federated Learning", arXiv 2205.01556, Appendix B.
    """

    def __init__(
        self,
        num_classes: int = 62,
        *,
        in_channels: int = 1,
        image_size: int | Sequence[int] = 28,
    ) -> None:
        super().__init__()
        self._assemble(
            lambda c: [
                nn.Conv2d(c, 16, kernel_size=8, stride=2, padding=3),
                nn.ReLU(),
                nn.MaxPool2d(kernel_size=2, stride=1),
                nn.Conv2d(16, 32, kernel_size=4, stride=2),
                nn.ReLU(),
                nn.MaxPool2d(kernel_size=2, stride=1),
            ],
            hidden=256,
            num_classes=num_classes,
            in_channels=in_channels,
            image_size=image_size,
        )


class PriFedSyncCNN(_ImageCNN):
    """The MNIST CNN of the federated f-DP paper (PriFedSync, §4.1).

    The paper's text says: "a CNN model with two convolution layers with 3 x 3
    kernels, followed by an FC layer with 128 units and ReLu activation, and a
    final softmax output layer". It gives no channel counts; we take them from
    the PyTorch ``examples/mnist`` network, which has exactly that description::

        Conv2d(C, 32, 3) -> ReLU -> Conv2d(32, 64, 3) -> ReLU -> MaxPool(2)
        Flatten (64·12·12 = 9216) -> Linear(9216, 128) -> ReLU -> Linear(128, K)

    The PyTorch example also has dropout (0.25, 0.5); it is left out here
    because a random mask per example would need ``randomness="different"``
    under ``vmap`` and is not part of the paper's description. 1,199,882
    parameters with 10 classes at 1 × 28 × 28.

    Parameters
    ----------
    num_classes : int
        Number of output logits.
    in_channels : int
        Input channels.
    image_size : int or (int, int)
        Height and width of the input images.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If a size is not a positive integer or the image is too small.

    References
    ----------
    Zheng, Chen, Long & Su, "Federated f-differential privacy", AISTATS 2021,
    §4.1; PyTorch examples, ``mnist/main.py`` (``Net``).
    """

    def __init__(
        self,
        num_classes: int = 10,
        *,
        in_channels: int = 1,
        image_size: int | Sequence[int] = 28,
    ) -> None:
        super().__init__()
        self._assemble(
            lambda c: [
                nn.Conv2d(c, 32, kernel_size=3),
                nn.ReLU(),
                nn.Conv2d(32, 64, kernel_size=3),
                nn.ReLU(),
                nn.MaxPool2d(kernel_size=2),
            ],
            hidden=128,
            num_classes=num_classes,
            in_channels=in_channels,
            image_size=image_size,
        )


class McMahanCNN(_ImageCNN):
    """The MNIST CNN of McMahan et al. (2017), used by client-level DP-FedAvg.

    "A CNN with two 5x5 convolution layers (the first with 32 channels, the
    second with 64, each followed with 2x2 max pooling), a fully connected layer
    with 512 units and ReLu activation, and a final softmax output layer
    (1,663,370 total parameters)" (McMahan et al. 2017, §3). The convolutions
    keep the image size ("same" padding, as in the authors' TensorFlow code);
    only that reading gives the stated count at 1 × 28 × 28::

        Conv2d(C, 32, 5, padding 2) -> ReLU -> MaxPool(2)
        Conv2d(32, 64, 5, padding 2) -> ReLU -> MaxPool(2)
        Flatten (64·7·7 = 3136) -> Linear(3136, 512) -> ReLU -> Linear(512, K)

    Geyer, Klein & Nabi (2017) train "the same setup as [McMahan et al.]".

    Parameters
    ----------
    num_classes : int
        Number of output logits (10 for MNIST).
    in_channels : int
        Input channels.
    image_size : int or (int, int)
        Height and width of the input images.
    channels : (int, int)
        Output channels of the two convolutions (the paper: 32 and 64).
    hidden : int
        Units of the fully connected layer (the paper: 512). Narrower
        ``channels`` and ``hidden`` give the same architecture at reduced
        width, e.g. for CPU tests of the paper's set-up.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If a size is not a positive integer or the image is too small.

    References
    ----------
    McMahan, Moore, Ramage, Hampson & Agüera y Arcas, "Communication-efficient
    learning of deep networks from decentralized data", AISTATS 2017, §3.
    Geyer, Klein & Nabi, "Differentially private federated learning: a client
    level perspective", 2017, §4.
    """

    def __init__(
        self,
        num_classes: int = 10,
        *,
        in_channels: int = 1,
        image_size: int | Sequence[int] = 28,
        channels: Sequence[int] = (32, 64),
        hidden: int = 512,
    ) -> None:
        super().__init__()
        if isinstance(channels, str | int) or len(channels) != 2:
            raise InvalidParameterError(
                f"channels must be two channel counts (c1, c2); got {channels!r}"
            )
        c1 = check_count("channels[0]", channels[0], minimum=1)
        c2 = check_count("channels[1]", channels[1], minimum=1)
        self._assemble(
            lambda c: [
                nn.Conv2d(c, c1, kernel_size=5, padding=2),
                nn.ReLU(),
                nn.MaxPool2d(kernel_size=2),
                nn.Conv2d(c1, c2, kernel_size=5, padding=2),
                nn.ReLU(),
                nn.MaxPool2d(kernel_size=2),
            ],
            hidden=check_count("hidden", hidden, minimum=1),
            num_classes=num_classes,
            in_channels=in_channels,
            image_size=image_size,
        )


class TfTutorialCNN(_ImageCNN):
    """The CIFAR-10 CNN of the TensorFlow tutorial, used by PriFedSync on CIFAR-10.

    Zheng et al. (2021, §4.2) "use the CNN model from the TensorFlow tutorial"
    (tensorflow.org/tutorials/images/cnn), for 32 × 32 × 3 images::

        Conv2d(C, 32, 3) -> ReLU -> MaxPool(2)
        Conv2d(32, 64, 3) -> ReLU -> MaxPool(2)
        Conv2d(64, 64, 3) -> ReLU
        Flatten (64·4·4 = 1024) -> Linear(1024, 64) -> ReLU -> Linear(64, K)

    The convolutions are unpadded ("valid", Keras' default); 122,570 parameters
    with 10 classes at 3 × 32 × 32, the count the tutorial prints.

    Parameters
    ----------
    num_classes : int
        Number of output logits (10 for CIFAR-10).
    in_channels : int
        Input channels (3 for colour images).
    image_size : int or (int, int)
        Height and width of the input images.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If a size is not a positive integer or the image is too small.

    References
    ----------
    Zheng, Chen, Long & Su, "Federated f-differential privacy", AISTATS 2021,
    §4.2; TensorFlow tutorial "Convolutional Neural Network (CNN)".
    """

    def __init__(
        self,
        num_classes: int = 10,
        *,
        in_channels: int = 3,
        image_size: int | Sequence[int] = 32,
    ) -> None:
        super().__init__()
        self._assemble(
            lambda c: [
                nn.Conv2d(c, 32, kernel_size=3),
                nn.ReLU(),
                nn.MaxPool2d(kernel_size=2),
                nn.Conv2d(32, 64, kernel_size=3),
                nn.ReLU(),
                nn.MaxPool2d(kernel_size=2),
                nn.Conv2d(64, 64, kernel_size=3),
                nn.ReLU(),
            ],
            hidden=64,
            num_classes=num_classes,
            in_channels=in_channels,
            image_size=image_size,
        )
