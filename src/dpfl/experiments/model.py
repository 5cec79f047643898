"""The run's model and loss, from its configuration, checked against its data.

A built-in model by name (:func:`dpfl.models.build_model`) or the user's
``model.factory``, and the user's ``loss.factory`` if any
(:mod:`dpfl.experiments.factory` imports them); :func:`check_model_accepts`
runs the model (and loss) once on two records so that a mismatch with the
data is named before any work. Used by :mod:`dpfl.experiments.build` to
assemble a run and by :mod:`dpfl.experiments.checks` to size the model.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dpfl.errors import InvalidParameterError
from dpfl.experiments.config import RunConfig

if TYPE_CHECKING:
    from torch import nn

    from dpfl.data.dataset import FederatedDataset

__all__ = ["build_loss", "build_model", "check_model_accepts", "make_model"]


def make_model(config: RunConfig, dataset: FederatedDataset) -> nn.Module:
    """The configured model for ``dataset``, with torch's current randomness.

    A built-in model by name (:func:`dpfl.models.build_model`), or the
    user's ``model.factory`` (:mod:`dpfl.experiments.factory`) called with
    ``model.options`` and, when its signature takes them, the data's
    ``input_shape`` and ``num_classes``. :func:`build_model` seeds it.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the factory fails or returns something other than a
        ``torch.nn.Module`` (naming ``model.factory``).
    """
    from torch import nn

    from dpfl.experiments.factory import call_factory, load_factory
    from dpfl.models import build_model as build

    section = config.model
    if section.factory is None:
        named: nn.Module = build(
            str(section.name),
            input_shape=dataset.input_shape,
            num_classes=dataset.num_classes,
            **section.options,
        )
        return named
    factory = load_factory(section.factory, "model.factory", section.factory_sha256)
    model = call_factory(
        "model.factory",
        factory,
        section.options,
        {
            "input_shape": tuple(int(n) for n in dataset.input_shape),
            "num_classes": int(dataset.num_classes),
        },
    )
    if not isinstance(model, nn.Module):
        raise InvalidParameterError(
            f"model.factory {section.factory!r} must return a torch.nn.Module; "
            f"got {type(model).__name__}"
        )
    return model


def build_model(config: RunConfig, dataset: FederatedDataset) -> nn.Module:
    """The run's model (:func:`make_model`), shaped for ``dataset``.

    Its initial weights come from the run's ``seed``, drawn in a forked torch
    generator (the process' global generator is left as it was).
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return make_model(config, dataset)


def build_loss(config: RunConfig) -> Callable[[Any, Any], Any] | None:
    """The run's training loss: ``loss.factory`` called with ``loss.options``.

    Returns
    -------
    callable or None
        ``loss(output, target)``; ``None`` without a ``loss`` section (the
        algorithm's built-in loss, :func:`dpfl.models.classification_loss`).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the factory fails or returns something that is not callable.
    """
    if config.loss is None:
        return None
    from dpfl.experiments.factory import call_factory, load_factory

    section = config.loss
    factory = load_factory(section.factory, "loss.factory", section.factory_sha256)
    loss = call_factory("loss.factory", factory, section.options)
    if not callable(loss):
        raise InvalidParameterError(
            f"loss.factory {section.factory!r} must return the loss, a callable "
            f"loss(output, target); got {type(loss).__name__}"
        )
    out: Callable[[Any, Any], Any] = loss
    return out


def check_model_accepts(
    model: nn.Module,
    data: FederatedDataset,
    device: str,
    loss_fn: Callable[[Any, Any], Any] | None = None,
    *,
    names: tuple[str, str] = ("model", "loss_fn"),
) -> None:
    """One forward pass (and loss) on two training records, so a mismatch is named.

    Runs before the noise calibration: a model that cannot train on the data,
    or a loss that cannot compare its output with the data's labels (an MSE
    loss given class labels), is refused at once, in one line.

    Parameters
    ----------
    model : torch.nn.Module
        The model.
    data : FederatedDataset
        The data (two records of its largest client are used).
    device : str
        Where to compute.
    loss_fn : callable or None
        ``loss_fn(output, target)``, checked on the output (``None``: not
        checked).
    names : tuple of (str, str)
        How the messages name the model and the loss (e.g. the configuration
        keys that give them).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the forward pass fails, its output is not ``[batch, num_classes]``
        scores (or ``[batch]`` binary logits for 2 classes), or ``loss_fn``
        fails on that output and the records' labels.
    """
    import numpy as np
    import torch

    rows = np.asarray(data.client_indices[int(data.client_sizes().argmax())][:2])
    features, labels = data.take(rows.astype(np.int64))
    x = torch.as_tensor(np.ascontiguousarray(features)).to(device)
    model.to(device)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x)
    except (RuntimeError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InvalidParameterError(
            f"{names[0]} must accept the data's records (shape {tuple(x.shape[1:])}, "
            f"dtype {x.dtype}); a forward pass on 2 of them failed: "
            f"{type(exc).__name__}: {first}"
        ) from None
    finally:
        model.train(training)
    classes = int(data.num_classes)
    binary = isinstance(out, torch.Tensor) and out.ndim == 1 and classes == 2
    if not binary and (
        not isinstance(out, torch.Tensor)
        or out.ndim != 2
        or out.shape[0] != x.shape[0]
        or out.shape[1] < classes
    ):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out)
        raise InvalidParameterError(
            f"{names[0]} must output [batch, num_classes] scores for the data's "
            f"{classes} classes; got output of shape {shape} for a batch of 2"
        )
    if loss_fn is None:
        return
    y = torch.as_tensor(np.ascontiguousarray(labels)).to(device)
    try:
        with warnings.catch_warnings():  # torch warns of a broadcast, then fails
            warnings.simplefilter("ignore", UserWarning)
            loss = loss_fn(model(x), y)
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ValueError("it must return one number (the batch's mean)")
            loss.backward()  # type: ignore[no-untyped-call]  # a wrong dtype fails here
    except (RuntimeError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise InvalidParameterError(
            f"{names[1]} must take the model's output (shape {tuple(out.shape)}) and "
            f"the data's labels (shape {tuple(y.shape)}, dtype {y.dtype}: class "
            "indices) and return the batch's mean loss; on 2 records it failed: "
            f"{type(exc).__name__}: {first}. A regression loss such as MSE needs "
            "one-hot or real targets: use cross-entropy for class labels"
        ) from None
    finally:
        model.zero_grad(set_to_none=True)
