"""Build a reference model by name."""

from __future__ import annotations

import inspect
import math
import typing
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from dpfl._validate import check_count
from dpfl.errors import InvalidParameterError
from dpfl.models.cnn import McMahanCNN, PaperCNN, PriFedSyncCNN, TfTutorialCNN
from dpfl.models.linear import MLP, LogisticRegression

__all__ = ["MODEL_NAMES", "build_model", "model_options"]


def _image_shape(name: str, input_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(channels, height, width)`` of an image input: ``(H, W)`` or ``(C, H, W)``."""
    if len(input_shape) == 2:
        return (1, *input_shape)
    if len(input_shape) == 3:
        return input_shape[0], input_shape[1], input_shape[2]
    raise InvalidParameterError(
        f"model {name!r} needs images, input_shape (C, H, W) or (H, W); "
        f"got {input_shape!r}"
    )


def _cnn(name: str, cls: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    def build(shape: tuple[int, ...], num_classes: int, **kw: Any) -> nn.Module:
        channels, height, width = _image_shape(name, shape)
        return cls(num_classes, in_channels=channels, image_size=(height, width), **kw)

    return build


def _logistic(
    shape: tuple[int, ...], num_classes: int, *, binary: bool = False, **kw: Any
) -> nn.Module:
    if binary:
        if num_classes != 2:
            raise InvalidParameterError(
                "binary logistic regression (binary: true) needs 2 classes; the "
                f"data has num_classes = {num_classes}"
            )
        num_classes = 1
    return LogisticRegression(math.prod(shape), num_classes, **kw)


def _mlp(shape: tuple[int, ...], num_classes: int, **kw: Any) -> nn.Module:
    return MLP(math.prod(shape), num_classes=num_classes, **kw)


_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "paper_cnn": _cnn("paper_cnn", PaperCNN),
    "prifedsync_cnn": _cnn("prifedsync_cnn", PriFedSyncCNN),
    "mcmahan_cnn": _cnn("mcmahan_cnn", McMahanCNN),
    "tf_tutorial_cnn": _cnn("tf_tutorial_cnn", TfTutorialCNN),
    "logistic_regression": _logistic,
    "mlp": _mlp,
}

MODEL_NAMES: tuple[str, ...] = tuple(sorted(_REGISTRY))

#: Per model, the class whose keyword arguments are its options, the options
#: its builder adds, and the arguments the builder sets from the data.
_OPTIONS: dict[str, tuple[Callable[..., Any], dict[str, Any], tuple[str, ...]]] = {
    **{
        name: (cls.__init__, {}, ("num_classes", "in_channels", "image_size"))
        for name, cls in (
            ("paper_cnn", PaperCNN),
            ("prifedsync_cnn", PriFedSyncCNN),
            ("mcmahan_cnn", McMahanCNN),
            ("tf_tutorial_cnn", TfTutorialCNN),
        )
    },
    "logistic_regression": (
        LogisticRegression.__init__,
        {"binary": (bool, False)},
        ("in_features", "num_classes"),
    ),
    "mlp": (MLP.__init__, {}, ("in_features", "num_classes")),
}


def model_options(name: str) -> dict[str, tuple[Any, bool]] | None:
    """The keyword options of model ``name``: each one's type and if required.

    Parameters
    ----------
    name : str
        A model name (as :func:`build_model` reads it).

    Returns
    -------
    dict or None
        Option name to ``(type hint, required)``; ``None`` for an unknown
        name (:func:`build_model` refuses it, listing the names).
    """
    key = str(name).strip().lower().replace("-", "_")
    if key not in _OPTIONS:
        return None
    init, extra, fixed = _OPTIONS[key]
    hints = typing.get_type_hints(init)
    out: dict[str, tuple[Any, bool]] = {
        k: (hints.get(k, Any), p.default is inspect.Parameter.empty)
        for k, p in inspect.signature(init).parameters.items()
        if k != "self" and k not in fixed and p.kind is not p.VAR_KEYWORD
    }
    out.update({k: (tp, False) for k, (tp, _) in extra.items()})
    return out


def build_model(
    name: str, *, input_shape: Sequence[int], num_classes: int, **kwargs: Any
) -> nn.Module:
    """Build a reference model by name.

    Parameters
    ----------
    name : str
        One of ``MODEL_NAMES``: ``"paper_cnn"`` (random-participation App. B,
        EMNIST), ``"prifedsync_cnn"`` (federated f-DP MNIST CNN),
        ``"mcmahan_cnn"`` (McMahan et al. 2017's MNIST CNN, client-level
        DP-FedAvg), ``"tf_tutorial_cnn"`` (the TensorFlow tutorial's CIFAR-10
        CNN, federated f-DP on CIFAR-10), ``"logistic_regression"`` (MS-PAFL;
        ``binary=True`` gives one logit for 2-class data, trained with binary
        cross-entropy), ``"mlp"`` (8 × 8 digits). The CNNs take images of any
        size and channel count. Case and ``-`` are ignored.
    input_shape : sequence of int
        Shape of one example, without the batch dimension, e.g. ``(1, 28, 28)``
        or ``(64,)``.
    num_classes : int
        Number of classes (1 gives a binary logistic regression).
    **kwargs
        Extra keyword arguments of the model class (e.g. ``hidden`` for the
        MLP, ``bias`` and ``binary`` for logistic regression).

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
