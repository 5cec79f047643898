"""The ``"vmap"`` kernel: materialised per-example gradients.

``torch.func.vmap(torch.func.grad(...))`` over examples, for any model whose
examples pass through it independently (no BatchNorm). Per-sample gradients
``[b, *param.shape]`` are built a chunk of examples at a time, so memory
grows with the chunk times the number of parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from dpfl.sim.grad.checks import (
    LossFn,
    Params,
    check_batch,
    check_finite,
    check_model,
    resolve_params,
)
from dpfl.sim.grad.sums import accumulate, full_precision

__all__ = ["VMAP_CHUNK_BYTES", "default_chunk", "per_sample_grads", "vmap_chunk"]

#: Per-sample gradient memory aimed at by the default chunk size of "vmap".
VMAP_CHUNK_BYTES = 256 * 2**20


def per_sample_grads(
    model: nn.Module,
    params: Mapping[str, torch.Tensor] | None,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn = F.cross_entropy,
    *,
    chunk_size: int | None = None,
) -> Params:
    """Per-example gradients with ``vmap(grad(...))``.

    Parameters
    ----------
    model : torch.nn.Module
        The model, called functionally with ``params``.
    params : mapping of str to torch.Tensor or None
        Parameters to differentiate (by name); ``None`` uses the model's own.
    x : torch.Tensor
        Inputs ``[batch, ...]``.
    y : torch.Tensor
        Targets ``[batch, ...]``.
    loss_fn : callable
        ``loss_fn(output, target)``, mean over the batch.
    chunk_size : int, optional
        ``vmap``'s ``chunk_size`` (examples evaluated at once).

    Returns
    -------
    dict of str to torch.Tensor
        ``[batch, *param.shape]`` per parameter.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the batch dimensions differ or the model contains BatchNorm.
    """
    check_model(model)
    check_batch(x, y)
    p = resolve_params(model, params)
    buffers = dict(model.named_buffers())

    def sample_loss(
        q: Params, b: Params, xi: torch.Tensor, yi: torch.Tensor
    ) -> torch.Tensor:
        out = functional_call(model, (q, b), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    fn = vmap(grad(sample_loss), in_dims=(None, None, 0, 0), chunk_size=chunk_size)
    return dict(fn(p, buffers, x, y))


def default_chunk(params: Mapping[str, torch.Tensor]) -> int:
    """Examples per chunk that keep per-sample gradients within 256 MiB (≤ 1024).

    Parameters
    ----------
    params : mapping of str to torch.Tensor
        The parameters differentiated (non-empty).

    Returns
    -------
    int
        The chunk size, at least 1.
    """
    n_params = sum(t.numel() for t in params.values())
    bytes_per = n_params * next(iter(params.values())).element_size()
    return max(1, min(1024, VMAP_CHUNK_BYTES // max(bytes_per, 1)))


def vmap_chunk(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    loss_fn: LossFn,
    clip: float,
    sums: Params,
    seg: torch.Tensor | None,
    num_segments: int | None,
    unwritten: set[str],
) -> torch.Tensor:
    """Add one chunk's clipped per-example gradients into ``sums``.

    The chunk kernel of :func:`dpfl.sim.grad.sums.clipped_sum` (see there for
    the arguments). Returns the chunk's unclipped per-example norms.

    Raises
    ------
    dpfl.errors.NonFiniteUpdateError
        If a per-example gradient holds NaN or Inf.
    """
    b = x.shape[0]
    grads = per_sample_grads(model, params, x, y, loss_fn)
    check_finite(grads, "per-sample gradients")
    with full_precision():  # the sums of the very tensors whose norms clip them
        sq = [g.reshape(b, -1).pow(2).sum(1) for g in grads.values()]
        norm = torch.stack(sq).sum(0).sqrt()
        factor = (clip / norm).clamp(max=1.0)
        for name, g in grads.items():
            accumulate(sums, name, g, factor, seg, overwrite=name in unwritten)
            unwritten.discard(name)
    return norm
