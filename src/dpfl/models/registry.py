"""Build a reference model by name."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from dpfl._validate import check_count
from dpfl.errors import InvalidParameterError
from dpfl.models.cnn import PaperCNN, PriFedSyncCNN
from dpfl.models.linear import MLP, LogisticRegression

__all__ = ["MODEL_NAMES", "build_model"]


def _image_channels(name: str, input_shape: tuple[int, ...]) -> int:
    if input_shape == (28, 28):
        return 1
    if len(input_shape) == 3 and input_shape[1:] == (28, 28):
        return input_shape[0]
    raise InvalidParameterError(
        f"model {name!r} needs 28 x 28 images, input_shape (C, 28, 28) or (28, 28); "
        f"got {input_shape!r}"
    )


def _paper_cnn(shape: tuple[int, ...], num_classes: int, **kw: Any) -> nn.Module:
    return PaperCNN(num_classes, in_channels=_image_channels("paper_cnn", shape), **kw)


def _prifedsync_cnn(shape: tuple[int, ...], num_classes: int, **kw: Any) -> nn.Module:
    channels = _image_channels("prifedsync_cnn", shape)
    return PriFedSyncCNN(num_classes, in_channels=channels, **kw)


def _logistic(shape: tuple[int, ...], num_classes: int, **kw: Any) -> nn.Module:
    return LogisticRegression(math.prod(shape), num_classes, **kw)


def _mlp(shape: tuple[int, ...], num_classes: int, **kw: Any) -> nn.Module:
    return MLP(math.prod(shape), num_classes=num_classes, **kw)


_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "paper_cnn": _paper_cnn,
    "prifedsync_cnn": _prifedsync_cnn,
    "logistic_regression": _logistic,
    "mlp": _mlp,
}

MODEL_NAMES: tuple[str, ...] = tuple(sorted(_REGISTRY))


def build_model(
    name: str, *, input_shape: Sequence[int], num_classes: int, **kwargs: Any
) -> nn.Module:
    """Build a reference model by name.

    Parameters
    ----------
    name : str
        One of ``MODEL_NAMES``: ``"paper_cnn"`` (random-participation App. B),
        ``"prifedsync_cnn"`` (federated f-DP MNIST CNN), ``"logistic_regression"``
        (MS-PAFL), ``"mlp"`` (8 × 8 digits). Case and ``-`` are ignored.
    input_shape : sequence of int
        Shape of one example, without the batch dimension, e.g. ``(1, 28, 28)``
        or ``(64,)``.
    num_classes : int
        Number of classes (1 gives a binary logistic regression).
    **kwargs
        Extra keyword arguments of the model class (e.g. ``hidden`` for the
        MLP, ``bias`` for logistic regression).

    Returns
    -------
    torch.nn.Module
        A freshly initialised model (torch's default initialisation; seed it
        with ``torch.manual_seed`` for reproducibility).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the name is unknown, the input shape does not fit the model, or a
        keyword argument is not accepted by the model.
    """
    key = str(name).strip().lower().replace("-", "_")
    if key not in _REGISTRY:
        raise InvalidParameterError(
            f"unknown model {name!r}; available: {', '.join(MODEL_NAMES)}"
        )
    if isinstance(input_shape, int | str) or len(input_shape) == 0:
        raise InvalidParameterError(
            f"input_shape must be a non-empty sequence of ints; got {input_shape!r}"
        )
    shape = tuple(check_count("input_shape", s, minimum=1) for s in input_shape)
    num_classes = check_count("num_classes", num_classes, minimum=1)
    try:
        return _REGISTRY[key](shape, num_classes, **kwargs)
    except TypeError as exc:
        raise InvalidParameterError(
            f"model {key!r} does not accept keyword arguments {sorted(kwargs)}: {exc}"
        ) from exc
