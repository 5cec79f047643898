"""Evaluation shared by the algorithms: test loss and accuracy of a model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from dpfl.models.losses import predicted_labels

__all__ = ["evaluate_model"]


def evaluate_model(
    model: nn.Module,
    features: Any,
    labels: Any,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batch_size: int,
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """Mean loss and accuracy of ``model`` on ``(features, labels)``.

    Parameters
    ----------
    model : torch.nn.Module
        A classifier (logits out); put in eval mode while evaluated.
    features, labels : array-like or None
        The test set (features may be a lazy source indexable by slices).
    loss_fn : callable
        ``loss_fn(output, target)``, mean over the batch.
    batch_size : int
        Examples per forward pass.
    device : str or torch.device
        Where the model lives.

    Returns
    -------
    dict of str to float
        ``{"test_loss", "test_accuracy"}``; empty if there is no test set or
        it holds no record (never an accuracy of 0 over nothing).
    """
    if features is None or labels is None or len(labels) == 0:
        return {}  # no test set (an empty one included): nothing to report
    n = len(labels)
    loss_sum, correct = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, n, batch_size):
                stop = min(start + batch_size, n)
                x = torch.as_tensor(np.asarray(features[start:stop])).to(device)
                y = torch.as_tensor(np.asarray(labels[start:stop])).to(device)
                out = model(x)
                loss_sum += float(loss_fn(out, y)) * (stop - start)
                correct += int((predicted_labels(out) == y).sum())
    finally:
        model.train(was_training)
    return {"test_loss": loss_sum / max(n, 1), "test_accuracy": correct / max(n, 1)}
