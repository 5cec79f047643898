"""Input checks of the gradient kernels: finiteness, model, batch, parameters.

Also the types the kernels share (:data:`LossFn`, :data:`Params`,
:data:`Method`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

import torch
from torch import nn

from dpfl._validate import check_count
from dpfl.errors import InvalidParameterError, NonFiniteUpdateError

__all__ = [
    "METHODS",
    "LossFn",
    "Method",
    "Params",
    "check_batch",
    "check_cohort_inputs",
    "check_finite",
    "check_method",
    "check_model",
    "check_segments",
    "resolve_params",
]

#: ``loss_fn(output, target)``: the *mean* loss over the batch.
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: Tensors by parameter name.
Params = dict[str, torch.Tensor]
#: Kernel choice of :func:`dpfl.sim.grad.clipped_grad_sum` and
#: :func:`dpfl.sim.grad.batched_client_grads`.
Method = Literal["auto", "vmap", "ghost"]
METHODS: tuple[str, ...] = ("auto", "vmap", "ghost")


def check_finite(
    tensors: Mapping[str, torch.Tensor] | torch.Tensor | Iterable[torch.Tensor],
    what: str,
) -> None:
    """Raise if any tensor holds NaN or ±Inf.

    Parameters
    ----------
    tensors : mapping of str to torch.Tensor, torch.Tensor or iterable of tensors
        Tensors to check; names (keys, or positions) appear in the message.
    what : str
        What the tensors are (e.g. ``"per-sample gradients"``), for the message.

    Raises
    ------
    dpfl.errors.NonFiniteUpdateError
        Naming the first offending tensor, how many of its entries are NaN and
        how many infinite, out of how many.
    """
    if isinstance(tensors, torch.Tensor):
        items: list[tuple[str, torch.Tensor]] = [("tensor", tensors)]
    elif isinstance(tensors, Mapping):
        items = list(tensors.items())
    else:
        items = [(f"#{i}", t) for i, t in enumerate(tensors)]
    floats = [t for _, t in items if t.is_floating_point() and t.numel()]
    if floats and len({t.device for t in floats}) == 1:
        # Fast path, one pass and one synchronisation: a sum is finite only if
        # every entry is (NaN and ±Inf propagate; Inf − Inf is NaN). A finite
        # sum proves it; a non-finite one may be an overflow of finite
        # entries, which the exact check below tells apart.
        total = torch.stack([t.sum() for t in floats]).sum()
        if math.isfinite(float(total)) and len(floats) == len(items):
            return
    for name, t in items:
        if not (t.is_floating_point() or t.is_complex()):
            continue
        if bool(torch.isfinite(t).all()):
            continue
        n_nan = int(torch.isnan(t).sum())
        n_inf = int(torch.isinf(t).sum())
        raise NonFiniteUpdateError(
            f"{what}: {name!r} has {n_nan + n_inf} non-finite entries "
            f"({n_nan} NaN, {n_inf} Inf) out of {t.numel()}, shape "
            f"{tuple(t.shape)}; the update was not aggregated"
        )


def check_model(model: nn.Module) -> None:
    """Raise if ``model`` mixes examples (BatchNorm).

    Parameters
    ----------
    model : torch.nn.Module
        The model.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the model contains a BatchNorm layer.
    """
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise InvalidParameterError(
                f"model contains BatchNorm ({name or 'model'}: "
                f"{type(module).__name__}); per-sample gradients need examples "
                "processed independently: use GroupNorm instead"
            )


def check_batch(x: torch.Tensor, y: torch.Tensor) -> int:
    """Return the batch size of ``x`` and ``y``, which must agree.

    Parameters
    ----------
    x, y : torch.Tensor
        Inputs and targets, ``[batch, ...]``.

    Returns
    -------
    int
        The batch size.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If their first dimensions differ (or either has none).
    """
    if x.dim() < 1 or y.dim() < 1 or x.shape[0] != y.shape[0]:
        raise InvalidParameterError(
            "x and y must share their first (batch) dimension; got shapes "
            f"{tuple(x.shape)} and {tuple(y.shape)}"
        )
    return int(x.shape[0])


def check_method(method: str) -> None:
    """Raise unless ``method`` is one of ``"auto"``, ``"vmap"``, ``"ghost"``.

    Parameters
    ----------
    method : str
        The requested kernel.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If it is not one of :data:`METHODS`.
    """
    if method not in METHODS:
        raise InvalidParameterError(
            f"method must be 'auto', 'vmap' or 'ghost'; got {method!r}"
        )


def resolve_params(
    model: nn.Module, params: Mapping[str, torch.Tensor] | None
) -> Params:
    """The parameters to differentiate, by name.

    Parameters
    ----------
    model : torch.nn.Module
        The model.
    params : mapping of str to torch.Tensor or None
        Parameters by name (a subset of the model's); ``None`` for the model's
        own, detached.

    Returns
    -------
    dict of str to torch.Tensor
        A new dict.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``params`` names a parameter the model does not have.
    """
    if params is None:
        return {n: p.detach() for n, p in model.named_parameters()}
    known = dict(model.named_parameters())
    unknown = [n for n in params if n not in known]
    if unknown:
        raise InvalidParameterError(
            f"params has names the model does not: {unknown[:5]}; model has "
            f"{list(known)[:5]}..."
        )
    return dict(params)


def check_segments(
    segment_ids: torch.Tensor | None,
    num_segments: int | None,
    batch: int,
    device: torch.device,
) -> tuple[torch.Tensor | None, int | None]:
    """Validate segment ids; return them as ``long`` on ``device``, and their count.

    Parameters
    ----------
    segment_ids : torch.Tensor or None
        Integer segment of each example, ``[batch]``; ``None`` for none.
    num_segments : int or None
        Number of segments; defaults to ``max(segment_ids) + 1``.
    batch : int
        Number of examples.
    device : torch.device
        Where the sums are accumulated.

    Returns
    -------
    tuple
        ``(segment_ids, num_segments)``; ``(None, None)`` without segments.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a bad shape, a non-integer dtype, ids outside ``[0, num_segments)``,
        or ``num_segments`` without ``segment_ids``.
    """
    if segment_ids is None:
        if num_segments is not None:
            raise InvalidParameterError(
                f"num_segments={num_segments!r} given without segment_ids"
            )
        return None, None
    if segment_ids.dim() != 1 or segment_ids.shape[0] != batch:
        raise InvalidParameterError(
            f"segment_ids must have shape [{batch}]; got {tuple(segment_ids.shape)}"
        )
    if segment_ids.dtype.is_floating_point or segment_ids.dtype == torch.bool:
        raise InvalidParameterError(
            f"segment_ids must be integers; got dtype {segment_ids.dtype}"
        )
    seg = segment_ids.to(device=device, dtype=torch.long)
    lo = int(seg.min()) if batch else 0
    hi = int(seg.max()) if batch else -1
    if num_segments is None:
        num_segments = hi + 1
    num_segments = check_count("num_segments", num_segments, minimum=1)
    if lo < 0 or hi >= num_segments:
        raise InvalidParameterError(
            f"segment_ids must lie in [0, {num_segments}); got values in [{lo}, {hi}]"
        )
    return seg, num_segments


def check_cohort_inputs(
    stacked: Mapping[str, torch.Tensor],
    xb: torch.Tensor,
    yb: torch.Tensor,
    sample_mask: torch.Tensor | None,
) -> tuple[int, int, torch.Tensor]:
    """Validate a cohort's stacked parameters, batches and mask.

    Parameters
    ----------
    stacked : mapping of str to torch.Tensor
        ``[num_clients, *shape]`` per parameter.
    xb, yb : torch.Tensor
        Inputs and targets, ``[num_clients, batch, ...]``.
    sample_mask : torch.Tensor or None
        ``[num_clients, batch]`` weights, or ``None`` for all ones.

    Returns
    -------
    tuple
        ``(num_clients, batch, mask)`` with the mask in the parameters' dtype.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On mismatched shapes.
    """
    if xb.dim() < 2 or yb.dim() < 2 or xb.shape[:2] != yb.shape[:2]:
        raise InvalidParameterError(
            "xb and yb must be [num_clients, batch, ...] with equal first two "
            f"dimensions; got {tuple(xb.shape)} and {tuple(yb.shape)}"
        )
    n, b = int(xb.shape[0]), int(xb.shape[1])
    for name, t in stacked.items():
        if t.dim() < 1 or t.shape[0] != n:
            raise InvalidParameterError(
                f"stacked parameter {name!r} must have leading dimension {n} "
                f"(one per client); got shape {tuple(t.shape)}"
            )
    if sample_mask is None:
        mask = xb.new_ones(n, b, dtype=next(iter(stacked.values())).dtype)
    else:
        if tuple(sample_mask.shape) != (n, b):
            raise InvalidParameterError(
                f"sample_mask must have shape ({n}, {b}); got "
                f"{tuple(sample_mask.shape)}"
            )
        mask = sample_mask.to(dtype=next(iter(stacked.values())).dtype)
    return n, b, mask
