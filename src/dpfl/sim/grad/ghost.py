"""The ``"ghost"`` kernel: clipped sums from one backward pass (book-keeping).

One ordinary backward pass records, for each layer holding parameters, the
layer input ``a_i`` and output gradient ``g_i`` of every example
("book-keeping", Bu et al. 2023). The layer's rule
(:mod:`dpfl.sim.grad.layers`) turns them into per-example gradient records:
for an ``nn.Linear`` on ``[b, in]`` inputs an outer product ``g_i a_iᵀ``
whose norm is ``‖g_i‖·‖a_i‖`` (the "ghost norm" of Goodfellow 2015 / Li et
al. 2022) and whose clipped sum ``Σ_i c_i g_i a_iᵀ`` is one matrix product,
so the per-sample gradients of the big layers are never built; for a
convolution, per-sample gradients from its input (small tensors).

Only the gradients of the layer outputs are computed, never those of the
parameters. :func:`ghost_chunk` is the chunk kernel of
:func:`dpfl.sim.grad.sums.clipped_sum`; the cohort kernel
(:mod:`dpfl.sim.grad.cohort`) shares :func:`layer_records` and
:func:`clip_factors`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.func import functional_call

from dpfl.errors import InvalidParameterError
from dpfl.sim.grad.checks import LossFn, Params, check_finite
from dpfl.sim.grad.layers import ModelLayers, Outer, PerExample, Record, model_layers
from dpfl.sim.grad.sums import Segments, accumulate, full_precision

__all__ = [
    "GHOST_CHUNK",
    "GhostUnsupported",
    "LayerGrad",
    "clip_factors",
    "ghost_chunk",
    "layer_records",
    "output_grads",
    "own_parameters",
]

#: Default chunk of the "ghost" kernel (memory is that of one forward pass).
GHOST_CHUNK = 1024


class GhostUnsupported(Exception):
    """The ghost kernel cannot run this model (e.g. a layer called twice)."""


class LayerGrad(NamedTuple):
    """One layer's book-keeping: its input and output gradient, ``[b, ...]``."""

    name: str
    module: nn.Module
    a: torch.Tensor
    g: torch.Tensor
    saved: Any  # what the layer's cohort forward kept for its rule, or None


class _Recorder:
    """Forward hooks recording the input and output of each layer with params."""

    def __init__(self, model: nn.Module) -> None:
        self.layers: dict[str, nn.Module] = dict(model_layers(model).layers)
        self.inputs: dict[str, torch.Tensor] = {}
        self.outputs: dict[str, torch.Tensor] = {}
        self.reused = False
        self._handles = [
            m.register_forward_hook(self._hook(name)) for name, m in self.layers.items()
        ]

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(
            module: nn.Module, inputs: tuple[torch.Tensor, ...], out: object
        ) -> None:
            if name in self.outputs:
                self.reused = True
            self.inputs[name] = inputs[0].detach()
            self.outputs[name] = out  # type: ignore[assignment]

        return hook

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def own_parameters(model: nn.Module, params: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``params`` names exactly the model's parameters, as the same data.

    True when each tensor of ``params`` is (a detached alias of) the model's
    parameter of that name (same memory, shape, strides, dtype) and every
    parameter requires grad, so calling the model directly builds the same
    graph as ``functional_call`` with fresh leaves. False where memory is not
    addressable (a data pointer of 0: an empty tensor, or a backend without
    storage such as torch's lazy tensors), since sameness cannot be told.
    """
    count = 0
    for lname, module in model_layers(model).layers:
        prefix = f"{lname}." if lname else ""
        for pname, param in module._parameters.items():
            if param is None:
                continue
            t = params.get(prefix + pname)
            if (
                t is None
                or not param.requires_grad
                or t.data_ptr() == 0
                or t.data_ptr() != param.data_ptr()
                or t.shape != param.shape
                or t.stride() != param.stride()
                or t.dtype != param.dtype
                or t.device != param.device
            ):
                return False
            count += 1
    return count == len(params)


def output_grads(
    total: torch.Tensor,
    layers: Mapping[str, nn.Module],
    inputs: Mapping[str, torch.Tensor],
    outputs: Mapping[str, torch.Tensor],
    saved: Mapping[str, Any],
) -> list[LayerGrad]:
    """Backward from ``total`` to the recorded layer outputs only.

    A layer whose output does not reach the loss gets a zero gradient.
    """
    names = [n for n in layers if n in outputs]
    grads = torch.autograd.grad(total, [outputs[n] for n in names], allow_unused=True)
    return [
        LayerGrad(
            n,
            layers[n],
            inputs[n],
            torch.zeros_like(outputs[n]) if g is None else g.detach(),
            saved.get(n),
        )
        for n, g in zip(names, grads)
    ]


def _layer_grads(
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
) -> list[LayerGrad]:
    """One forward and one backward pass of the chunk, to the layer outputs.

    When ``params`` are the model's own parameters (:func:`own_parameters`)
    the model is called directly, else through ``functional_call``.
    """
    b = x.shape[0]
    own = own_parameters(model, params)
    rec = _Recorder(model)
    try:
        with torch.enable_grad():
            if own:  # the model's own weights: skip functional_call's swapping
                out = model(x)
            else:
                leaf = {n: t.detach().requires_grad_(True) for n, t in params.items()}
                out = functional_call(model, (leaf, dict(model.named_buffers())), (x,))
            total = loss_fn(out, y) * b  # sum of the per-example losses
    finally:
        rec.remove()
    if rec.reused:
        raise GhostUnsupported("a layer is called more than once per forward pass")
    return output_grads(total, rec.layers, rec.inputs, rec.outputs, {})


def layer_records(
    layers: Iterable[LayerGrad],
    info: ModelLayers,
    params: Mapping[str, torch.Tensor],
) -> dict[str, Record]:
    """Each layer's rule's records, by qualified parameter name.

    Only parameters named in ``params`` are kept, in the order of the layers
    (weight before bias for the built-in rules).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If a rule returns no record for one of its layer's parameters, or
        something other than a record.
    """
    records: dict[str, Record] = {}
    for lg in layers:
        prefix = f"{lg.name}." if lg.name else ""
        rule = info.rules[lg.name]
        found = rule.records(lg.module, lg.a, lg.g, lg.saved)
        if not info.own_params[lg.name] <= found.keys():
            missing = sorted(info.own_params[lg.name] - found.keys())
            raise InvalidParameterError(
                f"layer rule {type(rule).__name__} for {type(lg.module).__name__} "
                f"({lg.name!r}) returned no record for parameter(s) {missing}"
            )
        for pname, record in found.items():
            if not isinstance(record, (PerExample, Outer)):
                raise InvalidParameterError(
                    f"layer rule {type(rule).__name__} returned {type(record)!r} "
                    f"for {pname!r}; records are PerExample or Outer"
                )
            if prefix + pname in params:
                records[prefix + pname] = record
    return records


def clip_factors(
    records: Mapping[str, Record], clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example norms over all records and clipping factors ``min(1, C/‖g_i‖)``.

    Raises
    ------
    dpfl.errors.NonFiniteUpdateError
        If a squared norm is NaN or Inf.
    """
    sq = {n: r.sq_norms() for n, r in records.items()}
    total_sq = torch.stack(list(sq.values())).sum(0)
    # One check: the total is finite iff every term is (for the squares of
    # finite gradients; check_finite names the culprit otherwise).
    if not bool(torch.isfinite(total_sq).all()):
        check_finite(sq, "squared norms of per-sample gradients")
    norm = total_sq.sqrt()
    return norm, (clip / norm).clamp(max=1.0)


def _add_record(
    sums: Params,
    name: str,
    record: Record,
    factor: torch.Tensor,
    seg: torch.Tensor | None,
    layout: Segments | None,
    first: bool,
) -> None:
    """Add ``Σ_i factor_i · grad_i`` of one record into ``sums[name]``.

    ``first``: the sum is not written yet (no segments): overwrite it.
    """
    if isinstance(record, PerExample):
        accumulate(sums, name, record.grad, factor, seg, overwrite=first)
        return
    assert isinstance(record, Outer)
    g, a = record
    if layout is None and first:
        torch.mm((g * factor[:, None]).T, a, out=sums[name])
    elif layout is None:
        sums[name].addmm_((g * factor[:, None]).T, a)
    elif layout.use_padded:  # per segment: [S, out, W] @ [S, W, in]
        gp = layout.pad(g * factor[:, None])
        sums[name].baddbmm_(gp.transpose(1, 2), layout.pad(a))
    else:
        ps = torch.einsum("bo,bi->boi", g * factor[:, None], a)
        accumulate(sums, name, ps, torch.ones_like(factor), seg)


def ghost_chunk(
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
    GhostUnsupported
        If a layer is called more than once per forward pass.
    dpfl.errors.NonFiniteUpdateError
        If a per-example gradient norm is NaN or Inf.
    """
    layers = _layer_grads(model, params, x, y, loss_fn)
    with full_precision():  # the norms and the sums they clip, in float32
        records = layer_records(layers, model_layers(model), params)
        norm, factor = clip_factors(records, clip)
        layout = None if seg is None else Segments(seg, num_segments or 1)
        for name, record in records.items():
            first = name in unwritten
            unwritten.discard(name)
            _add_record(sums, name, record, factor, seg, layout, first)
    return norm
