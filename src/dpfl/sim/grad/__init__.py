"""Clipped per-sample gradient sums, batched across the clients of a round.

This is the hot path of every simulation. Two kernels compute the same thing:

``"vmap"`` (:mod:`dpfl.sim.grad.per_sample`)
    ``torch.func.vmap(torch.func.grad(...))`` over examples, for any model whose
    examples pass through it independently (no BatchNorm). Per-sample gradients
    are materialised, a chunk of ``max_batch`` examples at a time.
``"ghost"`` (:mod:`dpfl.sim.grad.ghost`)
    One ordinary backward pass that records, for each layer with parameters,
    the layer input ``a_i`` and output gradient ``g_i`` of every example
    ("book-keeping", Bu et al. 2023); the layer's rule
    (:mod:`dpfl.sim.grad.layers`) turns them into per-example norms and
    clipped sums. A linear layer's per-sample norm is ``‖g_i‖·‖a_i‖`` (the
    "ghost norm" of Goodfellow 2015 / Li et al. 2022) and its clipped sum
    ``Σ_i c_i g_i a_iᵀ`` is one matrix product, so the per-sample gradients
    of the big layers are never built; convolutions use per-sample gradients
    from unfolded activations (small tensors). Only models whose every
    parameter sits in a layer with a registered rule qualify
    (:func:`ghost_supported`); ``nn.Linear`` and ``nn.Conv2d`` come with
    dpfl, other layers can be added with :func:`register_layer`.

``method="auto"`` takes ``"ghost"`` when it applies and ``"vmap"`` otherwise.
When ``"auto"`` falls back to ``"vmap"`` because a layer has no usable rule, a
``UserWarning`` naming the layer type(s) is issued, once per process for each
set of types. Both kernels are tested against a per-example Python loop.
:func:`batched_client_grads` runs either kernel over a cohort of clients, each
with its own parameters (:mod:`dpfl.sim.grad.cohort`).

Conventions
-----------
``loss_fn(output, target)`` returns the *mean* loss over the batch (the torch
default, e.g. ``torch.nn.functional.cross_entropy``); a loss of a batch of one
is the per-example loss. A loss that couples examples is not supported.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping
from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import nn

from dpfl._validate import check_count, check_positive
from dpfl.errors import InvalidParameterError
from dpfl.sim.grad import ghost, per_sample
from dpfl.sim.grad.checks import (
    LossFn,
    Method,
    Params,
    check_batch,
    check_cohort_inputs,
    check_finite,
    check_method,
    check_model,
    check_segments,
    resolve_params,
)
from dpfl.sim.grad.cohort import cohort_ghost, cohort_vmap, stack_params
from dpfl.sim.grad.layers import (
    LayerRule,
    ModelLayers,
    Outer,
    PerExample,
    model_layers,
    register_layer,
    unregister_layer,
)
from dpfl.sim.grad.per_sample import per_sample_grads
from dpfl.sim.grad.sums import ChunkKernel, clipped_sum

__all__ = [
    "LayerRule",
    "LossFn",
    "Outer",
    "PerExample",
    "batched_client_grads",
    "check_finite",
    "clipped_grad_sum",
    "ghost_supported",
    "per_sample_grads",
    "register_layer",
    "stack_params",
    "unregister_layer",
]

#: Sets of layer types already warned about (the vmap fallback of "auto").
_WARNED: set[tuple[str, ...]] = set()


def ghost_supported(model: nn.Module) -> bool:
    """Whether ``method="ghost"`` applies to ``model``.

    True when the model has no BatchNorm and every module holding parameters
    has a rule registered for its exact type (:func:`register_layer`) that
    accepts its configuration: with the built-in rules, every parameter
    belongs to an ``nn.Linear`` or to an ``nn.Conv2d`` with ``groups=1`` and
    zero padding given as numbers (not ``"same"``).

    Parameters
    ----------
    model : torch.nn.Module
        The model.

    Returns
    -------
    bool
        Whether the ghost kernel can compute its per-sample norms.
    """
    return model_layers(model).ghost


def _unsupported_message(info: ModelLayers) -> str:
    types = info.unsupported_types()
    example = types[0] if types else "MyLayer"
    return (
        f"method='ghost' has no usable layer rule for {', '.join(types)} "
        f"({'; '.join(info.unsupported)}); register one with "
        f"dpfl.sim.grad.register_layer({example}) (see dpfl.sim.grad.layers), "
        "or use method='vmap'"
    )


def _use_ghost(
    model: nn.Module, names: Collection[str], method: Method, what: str
) -> bool:
    """Whether to take the ghost kernel; raise if ``"ghost"`` cannot be had.

    ``"auto"`` falls back to ``"vmap"`` for a layer without a usable rule
    (warning once per set of layer types) or when ``names`` is not every
    parameter of the model (silently: a caller's choice).
    """
    if method == "vmap":
        return False
    info = model_layers(model)
    if not info.ghost:
        if method == "ghost":
            raise InvalidParameterError(_unsupported_message(info))
        key = tuple(info.unsupported_types())
        if key and key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(
                f"dpfl.sim.grad: no ghost-kernel rule for {', '.join(key)}; "
                "method='auto' uses the slower vmap kernel (register a rule "
                "with dpfl.sim.grad.register_layer to use the ghost kernel)",
                UserWarning,
                stacklevel=3,
            )
        return False
    if set(names) != info.param_names:
        if method == "ghost":
            raise InvalidParameterError(
                f"method='ghost' needs {what} for every parameter of the model"
            )
        return False
    return True


@overload
def clipped_grad_sum(
    model: nn.Module,
    params: Mapping[str, torch.Tensor] | None,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    clip: float,
    loss_fn: LossFn = ...,
    segment_ids: torch.Tensor | None = ...,
    num_segments: int | None = ...,
    max_batch: int | None = ...,
    method: Literal["auto", "vmap", "ghost"] = ...,
    return_norms: Literal[False] = ...,
) -> Params: ...


@overload
def clipped_grad_sum(
    model: nn.Module,
    params: Mapping[str, torch.Tensor] | None,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    clip: float,
    loss_fn: LossFn = ...,
    segment_ids: torch.Tensor | None = ...,
    num_segments: int | None = ...,
    max_batch: int | None = ...,
    method: Literal["auto", "vmap", "ghost"] = ...,
    return_norms: Literal[True],
) -> tuple[Params, torch.Tensor]: ...


def clipped_grad_sum(
    model: nn.Module,
    params: Mapping[str, torch.Tensor] | None,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    clip: float,
    loss_fn: LossFn = F.cross_entropy,
    segment_ids: torch.Tensor | None = None,
    num_segments: int | None = None,
    max_batch: int | None = None,
    method: Literal["auto", "vmap", "ghost"] = "auto",
    return_norms: bool = False,
) -> Params | tuple[Params, torch.Tensor]:
    """Sum of per-example gradients clipped to L2 norm ``clip``, per segment.

    Each example's gradient ``g_i`` (all parameters jointly) is scaled by
    ``min(1, clip / ‖g_i‖)`` and the results are summed over the examples of
    each segment (a segment is a client). All examples of all participating
    clients of a round go through one batched computation, ``max_batch``
    examples at a time.

    Parameters
    ----------
    model : torch.nn.Module
        The model (no BatchNorm).
    params : mapping of str to torch.Tensor or None
        Parameters to differentiate; ``None`` uses the model's own (detached).
    x : torch.Tensor
        Inputs ``[batch, ...]``; moved chunk by chunk to the parameters' device.
    y : torch.Tensor
        Targets ``[batch, ...]``.
    clip : float
        Clipping norm C > 0.
    loss_fn : callable
        ``loss_fn(output, target)``, the mean of per-example losses.
    segment_ids : torch.Tensor, optional
        Integer segment (client) of each example, ``[batch]``, values in
        ``[0, num_segments)``. ``None`` sums over the whole batch.
    num_segments : int, optional
        Number of segments; defaults to ``max(segment_ids) + 1``. Segments with
        no example get zeros.
    max_batch : int, optional
        Examples per chunk. Default: 1024 for ``"ghost"``; for ``"vmap"`` as many
        as keep the per-sample gradients within 256 MiB.
    method : {"auto", "vmap", "ghost"}
        Kernel (see the module docstring); ``"auto"`` prefers ``"ghost"``, and
        falls back to ``"vmap"`` for a model it does not support (a layer
        without a rule: with a warning, once; ``params`` naming only some
        parameters, or a layer called twice per forward pass: silently).
    return_norms : bool
        Also return the unclipped per-example norms ``‖g_i‖`` (``[batch]``).

    Returns
    -------
    dict of str to torch.Tensor or tuple
        Per parameter, ``[num_segments, *param.shape]`` with segments, else
        ``param.shape``; with ``return_norms``, ``(sums, norms)``. Without
        segments, when all parameters share a dtype and device, the sums are
        views into one flat buffer in the order of ``params`` (so a caller can
        update them all with one operation).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a bad clip, batch, segment ids, method, or a model with BatchNorm
        (or ``method="ghost"`` for a model it does not support: the message
        names the layer types without a rule and how to register one).
    dpfl.errors.NonFiniteUpdateError
        If any per-example gradient holds NaN or Inf (checked before summing).

    References
    ----------
    Abadi et al., "Deep learning with differential privacy", CCS 2016 (clipping).
    Goodfellow, "Efficient per-example gradient computations", 2015, and Li et
    al., "Large language models can be strong differentially private learners",
    ICLR 2022 (ghost norms). Bu et al., "Differentially private optimization on
    large model at small cost", ICML 2023 (book-keeping).
    """
    clip = check_positive("clip", clip)
    if not model_layers(model).ghost:  # ghost support implies no BatchNorm (cached)
        check_model(model)
    batch = check_batch(x, y)
    p = resolve_params(model, params)
    check_method(method)
    use_ghost = _use_ghost(model, p, method, "params")
    if not p:
        raise InvalidParameterError("params is empty: nothing to differentiate")
    device = next(iter(p.values())).device
    seg, num_segments = check_segments(segment_ids, num_segments, batch, device)
    if max_batch is not None:
        max_batch = check_count("max_batch", max_batch, minimum=1)

    def run(kernel: ChunkKernel, default_chunk: int) -> tuple[Params, torch.Tensor]:
        return clipped_sum(
            kernel,
            model,
            p,
            x,
            y,
            loss_fn=loss_fn,
            clip=clip,
            seg_all=seg,
            num_segments=num_segments,
            max_batch=default_chunk if max_batch is None else max_batch,
        )

    result: tuple[Params, torch.Tensor] | None = None
    if use_ghost:
        try:
            result = run(ghost.ghost_chunk, ghost.GHOST_CHUNK)
        except ghost.GhostUnsupported as exc:
            if method == "ghost":
                raise InvalidParameterError(
                    f"method='ghost' does not support this model: {exc}"
                ) from exc
    if result is None:
        result = run(per_sample.vmap_chunk, per_sample.default_chunk(p))
    return result if return_norms else result[0]


def batched_client_grads(
    model: nn.Module,
    stacked_params: Mapping[str, torch.Tensor],
    xb: torch.Tensor,
    yb: torch.Tensor,
    *,
    loss_fn: LossFn = F.cross_entropy,
    clip: float | None = None,
    sample_mask: torch.Tensor | None = None,
    max_clients: int | None = None,
    method: Literal["auto", "vmap", "ghost"] = "auto",
) -> Params:
    """Per-client gradient *sums* for a cohort, each client with its own params.

    Client ``k`` returns ``Σ_i m_ki g_ki`` where ``g_ki`` is the gradient of
    example ``i``'s loss at client ``k``'s parameters, clipped to norm ``clip``
    if given, and ``m_ki`` the sample mask (1 by default). Divide by the batch
    size for a mean. Each chunk of ``max_clients`` clients is one batched
    computation, with one of two kernels (:mod:`dpfl.sim.grad.cohort`):

    ``"vmap"``
        ``vmap`` over the client dimension of ``functional_call`` + ``grad``
        (nested ``vmap`` over examples when clipping): per-example gradients
        ``[clients, batch, P]`` are materialised. Any model without BatchNorm.
    ``"ghost"``
        One forward pass over the flat batch of all clients' examples in
        which each layer with a rule (``nn.Linear``, ``nn.Conv2d``, or one
        registered with :func:`register_layer`) applies each client's own
        weights (batched matrix products, or a convolution grouped by client)
        and everything else runs once over the flat batch. Without ``clip``
        one backward pass to the stacked weights gives the per-client sums.
        With ``clip`` the backward pass stops at the layer outputs ``g``; the
        per-example norms are ghost norms (``‖a_i‖²‖g_i‖²`` + ``‖g_i‖²`` for
        a Linear layer on 2-d inputs) and the clipped sums are batched
        products ``Σ_i c_i g_i a_iᵀ``, as in :func:`clipped_grad_sum`. Only
        models whose parameters all sit in such layers
        (:func:`ghost_supported`), each called once per forward pass, whose
        other operations treat each example alone.

    Parameters
    ----------
    model : torch.nn.Module
        The model (structure only; parameters come from ``stacked_params``).
    stacked_params : mapping of str to torch.Tensor
        ``[num_clients, *shape]`` per parameter (see :func:`stack_params`).
    xb : torch.Tensor
        Inputs ``[num_clients, batch, ...]``.
    yb : torch.Tensor
        Targets ``[num_clients, batch, ...]``.
    loss_fn : callable
        ``loss_fn(output, target)``, the mean of per-example losses.
    clip : float, optional
        Per-example clipping norm (DP-SGD local steps); ``None`` for none.
    sample_mask : torch.Tensor, optional
        ``[num_clients, batch]`` 0/1 weights, to pad clients with fewer
        examples (padding must hold finite values, e.g. zeros).
    max_clients : int, optional
        Clients per chunk, to bound memory (default: all at once).
    method : {"auto", "vmap", "ghost"}
        Kernel (see above); ``"auto"`` takes ``"ghost"`` when the model
        supports it and ``stacked_params`` names every parameter, else
        ``"vmap"`` (warning once when a layer has no rule, as
        :func:`clipped_grad_sum`).

    Returns
    -------
    dict of str to torch.Tensor
        ``[num_clients, *shape]`` per parameter.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On mismatched shapes, a bad ``clip`` or ``method``, a model with
        BatchNorm, or ``method="ghost"`` for a model it does not support.
    dpfl.errors.NonFiniteUpdateError
        If a client's gradient sum (``"vmap"``) or an example's gradient
        norm (``"ghost"``, checked before summing) holds NaN or Inf.
    """
    check_model(model)
    if clip is not None:
        clip = check_positive("clip", clip)
    check_method(method)
    n, _, mask = check_cohort_inputs(stacked_params, xb, yb, sample_mask)
    chunk = (
        n if max_clients is None else check_count("max_clients", max_clients, minimum=1)
    )
    params = dict(stacked_params)
    args = (model, params, xb, yb, mask)
    if _use_ghost(model, params, method, "stacked_params"):
        try:
            return cohort_ghost(*args, clip=clip, loss_fn=loss_fn, chunk=chunk)
        except ghost.GhostUnsupported as exc:
            if method == "ghost":
                raise InvalidParameterError(
                    f"method='ghost' does not support this model: {exc}"
                ) from exc
    return cohort_vmap(*args, clip=clip, loss_fn=loss_fn, chunk=chunk)
