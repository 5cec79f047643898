"""The classification loss and the predicted labels of a model's output.

One rule for every model of :mod:`dpfl.models`: an output of shape
``[batch, K]`` holds K logits (softmax cross-entropy, the label is the largest
logit); an output of shape ``[batch]`` holds one logit of the positive class
(binary cross-entropy, the label is 1 where the logit is positive). The binary
form is the logistic regression of the MS-PAFL experiments (Li et al., arXiv
2509.25906, §V-A, eqs. 24-25).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["classification_loss", "predicted_labels"]


def classification_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean classification loss of a batch of logits.

    Parameters
    ----------
    output : torch.Tensor
        ``[batch, K]`` logits (softmax cross-entropy) or ``[batch]`` binary
        logits (binary cross-entropy with logits).
    target : torch.Tensor
        ``[batch]`` integer labels (in {0, 1} for a binary output).

    Returns
    -------
    torch.Tensor
        The mean loss over the batch (a scalar).
    """
    if output.dim() == 1:
        return F.binary_cross_entropy_with_logits(output, target.to(output.dtype))
    return F.cross_entropy(output, target)


def predicted_labels(output: torch.Tensor) -> torch.Tensor:
    """The labels a batch of logits predicts (see :func:`classification_loss`).

    Parameters
    ----------
    output : torch.Tensor
        ``[batch, K]`` or ``[batch]`` logits.

    Returns
    -------
    torch.Tensor
        ``[batch]`` integer labels.
    """
    if output.dim() == 1:
        return (output > 0).long()
    return output.argmax(1)
