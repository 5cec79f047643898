"""Per-client gradient sums of a cohort, each client with its own parameters.

Parameters are stacked ``[num_clients, *shape]`` (:func:`stack_params`) and
inputs ``[num_clients, batch, ...]``. Two kernels, chosen by
:func:`dpfl.sim.grad.batched_client_grads`:

``"ghost"`` (:func:`cohort_ghost`)
    One forward pass over the flat batch of all clients' examples in which
    each layer with a rule applies each client's own weights (the rule's
    ``cohort_forward``: batched matrix products, or a convolution grouped by
    client; :class:`_CohortForward`) and everything else runs once over the
    flat batch. Unclipped, one backward pass to the stacked weights gives the
    per-client sums; clipped, the backward pass stops at the layer outputs
    and the rules' records give ghost norms and batched clipped sums.
``"vmap"`` (:func:`cohort_vmap`)
    ``vmap`` over the client dimension of ``functional_call`` + ``grad``
    (nested ``vmap`` over examples when clipping).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from dpfl._validate import check_count
from dpfl.sim.grad.checks import LossFn, Params, check_finite
from dpfl.sim.grad.ghost import (
    GhostUnsupported,
    LayerGrad,
    clip_factors,
    layer_records,
    output_grads,
)
from dpfl.sim.grad.layers import LinearRule, PerExample, Record, model_layers
from dpfl.sim.grad.mlp import mlp_plan, mlp_sgd_step
from dpfl.sim.grad.sums import full_precision

__all__ = [
    "cohort_ghost",
    "cohort_sgd_inplace",
    "cohort_vmap",
    "fused_sgd_supported",
    "stack_params",
]


def stack_params(params: Mapping[str, torch.Tensor], n: int) -> Params:
    """Copy parameters ``n`` times along a new leading (client) dimension.

    Parameters
    ----------
    params : mapping of str to torch.Tensor
        One set of parameters (e.g. the global model).
    n : int
        Number of clients.

    Returns
    -------
    dict of str to torch.Tensor
        ``[n, *shape]`` per parameter, detached, contiguous and writable.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``n`` is not a positive integer.
    """
    n = check_count("n", n, minimum=1)
    return {
        k: v.detach().unsqueeze(0).expand(n, *v.shape).clone()
        for k, v in params.items()
    }


class _CohortForward:
    """Run a model once over a whole cohort, each client with its own weights.

    While active, every layer holding parameters (each with a rule, checked by
    :func:`dpfl.sim.grad.ghost_supported`) computes, for the flat batch
    ``[m·B, ...]`` of ``m`` clients' examples in client-major order, client
    ``k``'s examples with client ``k``'s parameters from ``stacked`` (its
    rule's ``cohort_forward``), and records its input, output and what the
    rule saved. Everything between those layers (activations, pooling,
    flatten) acts on each example alone, so it runs once over the flat batch
    as in an ordinary forward pass. This replaces ``vmap`` over the clients,
    whose batching rule turns each convolution into a grouped convolution
    with a slow backward pass on CPU (≈ 4× the cost of the flat batch here).
    """

    def __init__(self, model: nn.Module, stacked: Mapping[str, torch.Tensor], m: int):
        info = model_layers(model)
        self.layers: dict[str, nn.Module] = dict(info.layers)
        self.rules = info.rules
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.saved: dict[str, object] = {}  # e.g. im2col of convolutions' inputs
        self.reused = False
        self._stacked = stacked
        self._m = m

    def __enter__(self) -> _CohortForward:
        # A forward already set on an instance (a user's patch) is put back.
        self._saved = {n: vars(mod).get("forward") for n, mod in self.layers.items()}
        for name, module in self.layers.items():
            module.forward = self._forward(name, module)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        for name, module in self.layers.items():
            saved = self._saved[name]
            if saved is not None:
                module.forward = saved  # type: ignore[method-assign]
            elif "forward" in vars(module):
                del module.forward

    def _forward(
        self, name: str, module: nn.Module
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        prefix = f"{name}." if name else ""
        own = {
            pname: self._stacked[prefix + pname]
            for pname, p in module._parameters.items()
            if p is not None
        }
        rule = self.rules[name]
        m = self._m

        def forward(x: torch.Tensor) -> torch.Tensor:
            if name in self.outputs:
                self.reused = True
            out, saved = rule.cohort_forward(module, x, own, m)
            if saved is not None:
                self.saved[name] = saved
            if not out.requires_grad:  # nothing upstream needs a gradient
                out = out.detach().requires_grad_(True)
            self.inputs[name] = x.detach()
            self.outputs[name] = out
            return out

        return forward


def _flat(xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[m, B, ...]`` inputs and targets as flat batches ``[m·B, ...]``."""
    m, b = int(xb.shape[0]), int(xb.shape[1])
    return xb.reshape(m * b, *xb.shape[2:]), yb.reshape(m * b, *yb.shape[2:])


def _cohort_sums(
    model: nn.Module,
    stacked: Params,
    xb: torch.Tensor,
    yb: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_fn: LossFn,
) -> Params:
    """Per-client unclipped gradient sums, all clients in one pass.

    One forward pass over the flat batch of all ``m·B`` examples with each
    client's weights (:class:`_CohortForward`) and one backward pass of the
    sum of the masked per-example losses to the stacked weights. The mask
    scales each example's output gradient, which equals masking its loss
    because examples do not interact.
    """
    m, b = int(xb.shape[0]), int(xb.shape[1])
    x, y = _flat(xb, yb)
    leaves = {k: v.detach().requires_grad_(True) for k, v in stacked.items()}
    weights = mask.reshape(-1)
    with torch.enable_grad(), _CohortForward(model, leaves, m) as fwd:
        out = model(x)
        if not bool((weights == 1).all()):
            out.register_hook(
                lambda g: g * weights.view(-1, *(1,) * (g.dim() - 1)).to(g.dtype)
            )
        total = loss_fn(out, y) * (m * b)  # sum of the per-example losses
    if fwd.reused:
        raise GhostUnsupported("a layer is called more than once per forward pass")
    grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=True)
    sums = {
        k: torch.zeros_like(v) if g is None else g
        for (k, v), g in zip(stacked.items(), grads)
    }
    check_finite(sums, "per-client gradient sums")
    return sums


def _cohort_layer_grads(
    model: nn.Module,
    stacked: Params,
    xb: torch.Tensor,
    yb: torch.Tensor,
    loss_fn: LossFn,
) -> list[LayerGrad]:
    """Each layer's input and output gradient over the flat cohort batch."""
    m, b = int(xb.shape[0]), int(xb.shape[1])
    x, y = _flat(xb, yb)
    with torch.enable_grad(), _CohortForward(model, stacked, m) as fwd:
        out = model(x)
        total = loss_fn(out, y) * (m * b)  # sum of the per-example losses
    if fwd.reused:
        raise GhostUnsupported("a layer is called more than once per forward pass")
    return output_grads(total, fwd.layers, fwd.inputs, fwd.outputs, fwd.saved)


def _add_client_sums(
    sums: Params, name: str, record: Record, factor: torch.Tensor | float, m: int
) -> None:
    """Add ``Σ_i f_i grad_i`` per client into ``sums[name]`` ``[m, *shape]``.

    ``factor``: ``[m·B]`` per-example weights, or one number for all.
    """
    if not isinstance(factor, torch.Tensor):  # one weight: alpha of the product
        if isinstance(record, PerExample):
            grad = record.grad
            b = grad.shape[0] // m
            sums[name].view(m, -1).add_(grad.reshape(m, b, -1).sum(1), alpha=factor)
        else:
            g, a = record
            b = g.shape[0] // m
            sums[name].baddbmm_(
                g.view(m, b, -1).transpose(1, 2), a.reshape(m, b, -1), alpha=factor
            )
        return
    b = factor.shape[0] // m
    if isinstance(record, PerExample):  # [m, 1, B] @ [m, B, D]
        sums[name].view(m, 1, -1).baddbmm_(
            factor.view(m, 1, b), record.grad.reshape(m, b, -1)
        )
    else:  # Σ_i f_i g_i a_iᵀ per client: [m, out, B] @ [m, B, in]
        g, a = record
        gf = (g * factor[:, None]).view(m, b, -1)
        sums[name].baddbmm_(gf.transpose(1, 2), a.reshape(m, b, -1))


def _cohort_clipped_sums(
    model: nn.Module,
    stacked: Params,
    xb: torch.Tensor,
    yb: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float,
    loss_fn: LossFn,
) -> Params:
    """Per-client clipped sums with the ghost kernel, all clients in one pass.

    One forward pass over the flat batch of all ``m·B`` examples with each
    client's weights (:class:`_CohortForward`) records every layer's input
    ``a``; one backward pass of the sum of all per-example losses gives the
    layer output gradients ``g``, both ``[m·B, ...]``. The rules' records
    (as in the single-model kernel) give per-example norms; the clipped sums
    per client are batched matrix products over ``[m, B, ·]``.

    Raises ``GhostUnsupported`` if a layer is called twice per forward pass.
    """
    m = int(xb.shape[0])
    layers = _cohort_layer_grads(model, stacked, xb, yb, loss_fn)
    with full_precision():  # the norms and the sums they clip, in float32
        records = layer_records(layers, model_layers(model), stacked)
        factor = mask.reshape(-1)
        if records:
            factor = clip_factors(records, clip)[1] * factor
        sums = {n: torch.zeros_like(t) for n, t in stacked.items()}
        for name, record in records.items():
            _add_client_sums(sums, name, record, factor, m)
    return sums


def fused_sgd_supported(model: nn.Module) -> bool:
    """Whether :func:`cohort_sgd_inplace` can step ``model``.

    Every layer holding parameters must be an ``nn.Linear`` (through the
    built-in rule): its weight's per-client gradient sum is then one batched
    matrix product of recorded inputs and output gradients, which the step
    adds into the weights directly.
    """
    info = model_layers(model)
    return (
        info.ghost
        and not info.batchnorm
        and bool(info.rules)
        and all(type(rule) is LinearRule for rule in info.rules.values())
    )


def cohort_sgd_inplace(
    model: nn.Module,
    stacked: Params,
    xb: torch.Tensor,
    yb: torch.Tensor,
    scale: torch.Tensor | float,
    *,
    loss_fn: LossFn,
    chunk: int,
) -> None:
    """``θ_k += Σ_i s_i ∇ℓ(θ_k; x_ki, y_ki)`` for every client, in place.

    One forward pass over the flat batch of the cohort's examples with each
    client's weights (:class:`_CohortForward`), one backward pass to the
    layer outputs, and each parameter's update as one batched matrix product
    added into the stacked parameters (``baddbmm_``): the SGD step is fused
    into the gradient kernel, and no gradient tensor is formed. Nothing is
    synchronised with the host and nothing is checked: a non-finite
    gradient makes the parameters non-finite for good (``θ − η·g`` is never
    finite again once ``θ`` is not), so the caller checks them once at the
    end. Needs :func:`fused_sgd_supported`. A ReLU MLP under softmax
    cross-entropy (:func:`dpfl.sim.grad.mlp.mlp_plan`) takes the step written
    out without autograd (:func:`dpfl.sim.grad.mlp.mlp_sgd_step`).

    Parameters
    ----------
    model : torch.nn.Module
        The model (structure only).
    stacked : dict of str to torch.Tensor
        ``[m, *shape]`` per parameter; updated in place.
    xb, yb : torch.Tensor
        ``[m, B, ...]`` inputs and targets (padding must be finite).
    scale : torch.Tensor or float
        ``[m·B]`` per-example factors (``−η/b_k`` for a real example of
        client ``k``, 0 for padding), or one factor for every example.
    loss_fn : callable
        ``loss_fn(output, target)``, the mean of per-example losses.
    chunk : int
        Clients per pass.
    """
    info = model_layers(model)
    plan = mlp_plan(model, loss_fn) if xb.dim() == 3 and yb.dim() == 2 else None
    n, b = int(xb.shape[0]), int(xb.shape[1])
    if n <= chunk and plan is not None:  # the usual case: one pass, no slices
        mlp_sgd_step(plan, stacked, xb, yb, scale)
        return
    for s in range(0, n, chunk):
        sl = slice(s, s + chunk)
        p = {k: v[sl] for k, v in stacked.items()}
        m = int(xb[sl].shape[0])
        if plan is not None:  # a ReLU MLP: the step written out, no autograd
            f = scale
            if isinstance(scale, torch.Tensor):
                f = scale[s * b : s * b + m * b]
            mlp_sgd_step(plan, p, xb[sl], yb[sl], f)
            continue
        layers = _cohort_layer_grads(model, p, xb[sl], yb[sl], loss_fn)
        records = layer_records(layers, info, p)
        f = scale
        if isinstance(scale, torch.Tensor):
            f = scale[s * b : s * b + m * b]
        for name, record in records.items():
            _add_client_sums(p, name, record, f, m)


def cohort_ghost(
    model: nn.Module,
    params: Params,
    xb: torch.Tensor,
    yb: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None,
    loss_fn: LossFn,
    chunk: int,
) -> Params:
    """The ``"ghost"`` cohort kernel, ``chunk`` clients at a time.

    Parameters
    ----------
    model : torch.nn.Module
        The model (ghost-supported; structure only).
    params : dict of str to torch.Tensor
        ``[n, *shape]`` for every parameter of the model.
    xb, yb : torch.Tensor
        ``[n, batch, ...]`` inputs and targets.
    mask : torch.Tensor
        ``[n, batch]`` example weights.
    clip : float or None
        Per-example clipping norm; ``None``: plain sums.
    loss_fn : callable
        ``loss_fn(output, target)``, the mean of per-example losses.
    chunk : int
        Clients per pass.

    Returns
    -------
    dict of str to torch.Tensor
        ``[n, *shape]`` per parameter.

    Raises
    ------
    GhostUnsupported
        If a layer is called more than once per forward pass.
    dpfl.errors.NonFiniteUpdateError
        If a sum (unclipped) or a per-example norm (clipped) is not finite.
    """
    n = int(xb.shape[0])
    pieces = []
    for s in range(0, n, chunk):
        sl = slice(s, s + chunk)
        p = {k: v[sl] for k, v in params.items()}
        if clip is None:  # one backward pass to the weights
            pieces.append(
                _cohort_sums(model, p, xb[sl], yb[sl], mask[sl], loss_fn=loss_fn)
            )
        else:
            pieces.append(
                _cohort_clipped_sums(
                    model, p, xb[sl], yb[sl], mask[sl], clip=clip, loss_fn=loss_fn
                )
            )
    if len(pieces) == 1:
        return pieces[0]
    return {k: torch.cat([pc[k] for pc in pieces]) for k in params}


def cohort_vmap(
    model: nn.Module,
    params: Params,
    xb: torch.Tensor,
    yb: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None,
    loss_fn: LossFn,
    chunk: int,
) -> Params:
    """The ``"vmap"`` cohort kernel, ``chunk`` clients at a time.

    Arguments as :func:`cohort_ghost`; ``params`` may name a subset of the
    model's parameters. Per-example gradients ``[clients, batch, P]`` are
    materialised when clipping.

    Raises
    ------
    dpfl.errors.NonFiniteUpdateError
        If a client's gradient sum is not finite.
    """
    buffers = dict(model.named_buffers())

    def sample_loss(q: Params, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (q, buffers), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    def client_sum(
        q: Params, xk: torch.Tensor, yk: torch.Tensor, mk: torch.Tensor
    ) -> Params:
        if clip is None:

            def batch_loss(q2: Params) -> torch.Tensor:
                out = functional_call(model, (q2, buffers), (xk,))
                per = vmap(lambda o, t: loss_fn(o.unsqueeze(0), t.unsqueeze(0)))(
                    out, yk
                )
                return (per * mk).sum()

            return grad(batch_loss)(q)
        gs = vmap(grad(sample_loss), in_dims=(None, 0, 0))(q, xk, yk)
        sq = sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in gs.values())
        factor = (clip / torch.sqrt(sq)).clamp(max=1.0) * mk
        return {k: torch.tensordot(factor, g, dims=1) for k, g in gs.items()}

    fn = vmap(client_sum)
    pieces = []
    # clipping: the per-example gradients, their norms and the weighted sums
    # are one vmapped computation, all of it in full float32
    exact = full_precision() if clip is not None else contextlib.nullcontext()
    with exact:
        for s in range(0, int(xb.shape[0]), chunk):
            sl = slice(s, s + chunk)
            pieces.append(
                fn({k: v[sl] for k, v in params.items()}, xb[sl], yb[sl], mask[sl])
            )
    out = {k: torch.cat([pc[k] for pc in pieces]) for k in params}
    check_finite(out, "per-client gradient sums")
    return out
