"""A cohort's SGD step for ReLU MLPs under softmax cross-entropy, without autograd.

For a model that is an ``nn.Sequential`` of ``nn.Linear`` layers with
``nn.ReLU`` between them (:func:`mlp_plan`) and the softmax cross-entropy
loss, the forward pass, the gradient of the summed per-example losses and
the SGD update of every client's parameters are a fixed, short list of
batched matrix products, written out here: the output gradient is
``softmax(z) − onehot(y)``, each layer's weight update is one ``baddbmm_``
of the output gradient and the layer input into the stacked weights, and
the gradient reaches the layer below through the weights *before* their
update and the ReLU's mask. It computes what autograd computes (the same
products, summed in the same order up to float rounding) with about half
the operator calls and no graph; :func:`dpfl.sim.grad.cohort.cohort_sgd_inplace`
takes it when it applies.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from dpfl.models.losses import classification_loss
from dpfl.sim.grad.checks import LossFn, Params

__all__ = ["mlp_plan", "mlp_sgd_step"]

#: Losses that are the softmax cross-entropy on ``[batch, K]`` logits.
_SOFTMAX_LOSSES: tuple[LossFn, ...] = (F.cross_entropy, classification_loss)
_PLANS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[str, bool], ...] | None] = (
    weakref.WeakKeyDictionary()
)


def mlp_plan(model: nn.Module, loss_fn: LossFn) -> tuple[tuple[str, bool], ...] | None:
    """The linear layers of a ReLU MLP under softmax cross-entropy, or ``None``.

    Parameters
    ----------
    model : torch.nn.Module
        The model.
    loss_fn : callable
        The loss (``torch.nn.functional.cross_entropy`` or
        :func:`dpfl.models.classification_loss`, whose 2-D logits take the
        same loss).

    Returns
    -------
    tuple of (str, bool) or None
        ``(parameter prefix, has bias)`` of each ``nn.Linear`` in order, when
        ``model`` is an ``nn.Sequential`` alternating ``nn.Linear`` and
        ``nn.ReLU`` (starting and ending with a linear layer, every linear
        layer with more than one output) and ``loss_fn`` is one of those;
        else ``None``.
    """
    if loss_fn not in _SOFTMAX_LOSSES:
        return None
    if model in _PLANS:
        return _PLANS[model]
    plan: tuple[tuple[str, bool], ...] | None = None
    if type(model) is nn.Sequential and len(model) % 2 == 1:
        mods = list(model.named_children())
        linear = mods[0::2]
        relus = mods[1::2]
        if all(
            type(m) is nn.Linear and m.out_features > 1 and m.weight.requires_grad
            for _, m in linear
        ) and all(type(r) is nn.ReLU for _, r in relus):
            plan = tuple((f"{name}.", m.bias is not None) for name, m in linear)
    _PLANS[model] = plan
    return plan


def mlp_sgd_step(
    plan: tuple[tuple[str, bool], ...],
    stacked: Params,
    xb: torch.Tensor,
    yb: torch.Tensor,
    scale: torch.Tensor | float,
) -> None:
    """``θ_k += Σ_i s_i ∇ℓ(θ_k; x_ki, y_ki)`` for every client, in place.

    Parameters
    ----------
    plan : tuple
        :func:`mlp_plan` of the model.
    stacked : dict of str to torch.Tensor
        ``[m, *shape]`` per parameter; updated in place.
    xb : torch.Tensor
        ``[m, B, in]`` inputs.
    yb : torch.Tensor
        ``[m, B]`` integer labels.
    scale : torch.Tensor or float
        ``[m·B]`` per-example factors, or one for all.
    """
    m, b = int(xb.shape[0]), int(xb.shape[1])
    h = xb.reshape(m, b, -1)
    inputs = []
    last = len(plan) - 1
    for i, (prefix, bias) in enumerate(plan):
        w = stacked[prefix + "weight"]
        inputs.append(h)
        if bias:
            z = torch.baddbmm(
                stacked[prefix + "bias"].unsqueeze(1), h, w.transpose(1, 2)
            )
        else:
            z = torch.bmm(h, w.transpose(1, 2))
        h = z.relu_() if i < last else z
    # d(Σ_i ℓ_i)/dz of softmax cross-entropy: softmax(z) − onehot(y); the
    # softmax written out (aten's takes 85 µs on [50, 10, 10] here, this 18)
    g = h.sub_(h.amax(-1, keepdim=True)).exp_()
    g.div_(g.sum(-1, keepdim=True))
    g.view(m * b, -1).scatter_add_(
        1, yb.reshape(m * b, 1), g.new_full((m * b, 1), -1.0)
    )
    alpha = 1.0
    if isinstance(scale, torch.Tensor):
        g.mul_(scale.view(m, b, 1))
    else:
        alpha = float(scale)
    for i in range(last, -1, -1):
        prefix, bias = plan[i]
        w, a = stacked[prefix + "weight"], inputs[i]
        below = None
        if i > 0:  # through w before its step, then the ReLU (autograd's own op)
            below = torch.ops.aten.threshold_backward(torch.bmm(g, w), a, 0)
        w.baddbmm_(g.transpose(1, 2), a, alpha=alpha)
        if bias:
            stacked[prefix + "bias"].add_(g.sum(1), alpha=alpha)
        if below is not None:
            g = below
