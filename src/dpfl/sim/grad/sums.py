"""Clipped sums over chunks of examples and over segments (clients).

Both kernels of :func:`dpfl.sim.grad.clipped_grad_sum` run through
:func:`clipped_sum`: it allocates the sums, feeds the kernel one chunk of
examples at a time and collects the per-example norms. A kernel adds
``Σ_i c_i g_i`` of its chunk, per segment, with the helpers here, inside
:func:`full_precision`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import torch
from torch import nn

from dpfl.sim._flat import flat_zeros
from dpfl.sim.grad.checks import LossFn, Params

__all__ = ["ChunkKernel", "Segments", "accumulate", "clipped_sum", "full_precision"]


#: (backend, operation) pairs with their own float32 precision (torch >= 2.9).
_PRECISIONS = tuple(
    (backend, op) for backend in ("cuda", "mkldnn") for op in ("matmul", "conv", "rnn")
)


def _precisions() -> dict[tuple[str, str], str]:
    """Each backend operation's ``fp32_precision`` ({} before torch 2.9)."""
    get = getattr(torch._C, "_get_fp32_precision_getter", None)
    return {} if get is None else {k: str(get(*k)) for k in _PRECISIONS}


def _set_precisions(values: dict[tuple[str, str], str]) -> None:
    for (backend, op), value in values.items():
        torch._C._set_fp32_precision_setter(backend, op, value)


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """Compute float32 matrix products and convolutions in full float32 inside.

    The per-example norms that set the clip factors ``c_i = min(1, C/‖g_i‖)``
    are computed apart from the products that sum ``Σ_i c_i g_i`` (the
    ghost kernel never forms a clipped ``c_i g_i``). If those products round
    their inputs to TF32 (cuBLAS and cuDNN on Ampere and later GPUs:
    ``torch.backends.cudnn.allow_tf32`` is on by default) or to bfloat16
    (oneDNN with ``torch.set_float32_matmul_precision("medium")``), an
    example's contribution to the sum can exceed C by about 10⁻³ of C,
    which breaks the sensitivity the noise is calibrated to. Inside this
    context they round as float32 does (a contribution exceeds C by float32
    rounding only, ~10⁻⁷ relative); the settings in force before are
    restored on exit, through the API the caller used (the legacy
    ``allow_tf32`` flags and ``set_float32_matmul_precision``, and the
    per-backend ``fp32_precision`` of torch >= 2.9).

    The settings are process-wide: another thread's products run in full
    precision meanwhile too.
    """
    matmul = torch.get_float32_matmul_precision()
    saved = _precisions()
    try:  # the legacy cuDNN flag (unreadable once a caller mixed the two APIs)
        legacy_cudnn: bool | None = bool(torch.backends.cudnn.allow_tf32)
    except RuntimeError:
        legacy_cudnn = None
    try:
        torch.set_float32_matmul_precision("highest")
        if legacy_cudnn is not None:
            torch.backends.cudnn.allow_tf32 = False
        _set_precisions(dict.fromkeys(saved, "ieee"))
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        if legacy_cudnn is not None:
            torch.backends.cudnn.allow_tf32 = legacy_cudnn
        _set_precisions(saved)


class ChunkKernel(Protocol):
    """Add one chunk's clipped per-example gradients into ``sums``.

    Returns the chunk's unclipped per-example norms ``[b]``. ``seg`` holds
    the chunk's segment ids (``None``: one sum). ``unwritten`` names the sums
    not written yet: the kernel overwrites those (and discards their names)
    instead of adding to them.
    """

    def __call__(  # noqa: D102
        self,
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
    ) -> torch.Tensor: ...


def clipped_sum(
    kernel: ChunkKernel,
    model: nn.Module,
    params: Params,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    loss_fn: LossFn,
    clip: float,
    seg_all: torch.Tensor | None,
    num_segments: int | None,
    max_batch: int,
) -> tuple[Params, torch.Tensor]:
    """Run ``kernel`` over chunks of ``max_batch`` examples; return sums and norms.

    Parameters
    ----------
    kernel : ChunkKernel
        :func:`dpfl.sim.grad.ghost.ghost_chunk` or
        :func:`dpfl.sim.grad.per_sample.vmap_chunk`.
    model : torch.nn.Module
        The model.
    params : dict of str to torch.Tensor
        Parameters to differentiate (non-empty).
    x, y : torch.Tensor
        Inputs and targets ``[batch, ...]``; each chunk is moved to the
        parameters' device.
    loss_fn : callable
        ``loss_fn(output, target)``, the mean of per-example losses.
    clip : float
        Clipping norm.
    seg_all : torch.Tensor or None
        Segment id of each example (``long``, on the parameters' device).
    num_segments : int or None
        Number of segments (with ``seg_all``).
    max_batch : int
        Examples per chunk.

    Returns
    -------
    tuple
        ``(sums, norms)``: per parameter ``[num_segments, *shape]`` (or
        ``shape`` without segments, then views into one flat buffer), and the
        unclipped per-example norms ``[batch]``.
    """
    any_param = next(iter(params.values()))
    device = any_param.device
    lead: tuple[int, ...] = () if seg_all is None else (int(num_segments or 1),)
    # Without segments the first chunk writes each sum (no zero fill to pay
    # for); sums it never writes (a layer that did not run) are zeroed after.
    sums = flat_zeros(params, lead, zero=bool(lead))
    unwritten = set() if lead else set(sums)
    norms: list[torch.Tensor] = []
    for start in range(0, x.shape[0], max_batch):
        norm = kernel(
            model,
            params,
            x[start : start + max_batch].to(device),
            y[start : start + max_batch].to(device),
            loss_fn=loss_fn,
            clip=clip,
            sums=sums,
            seg=None if seg_all is None else seg_all[start : start + max_batch],
            num_segments=num_segments,
            unwritten=unwritten,
        )
        norms.append(norm.detach())
    for name in unwritten:
        sums[name].zero_()
    if len(norms) == 1:
        return sums, norms[0]
    return sums, torch.cat(norms) if norms else any_param.new_zeros(0)


class Segments:
    """Padded layout of a chunk's examples by segment, for batched products.

    Parameters
    ----------
    seg : torch.Tensor
        Segment id of each example, ``[b]`` (``long``).
    num_segments : int
        Number of segments.
    """

    def __init__(self, seg: torch.Tensor, num_segments: int) -> None:
        b = seg.numel()
        counts = torch.bincount(seg, minlength=num_segments)
        self.order = torch.argsort(seg, stable=True)
        sorted_seg = seg[self.order]
        offsets = torch.cumsum(counts, 0) - counts
        self.pos = torch.arange(b, device=seg.device) - offsets[sorted_seg]
        self.seg_sorted = sorted_seg
        self.width = int(counts.max()) if b else 0
        self.num_segments = num_segments
        # Padding costs num_segments * width rows instead of b; use it only when
        # that is at most twice the work of the unpadded product.
        self.use_padded = num_segments * self.width <= 2 * max(b, 1)

    def pad(self, t: torch.Tensor) -> torch.Tensor:
        """``[b, ...]`` → ``[num_segments, width, ...]``, zeros where no example."""
        out = t.new_zeros(self.num_segments, self.width, *t.shape[1:])
        out[self.seg_sorted, self.pos] = t[self.order]
        return out


def accumulate(
    sums: Params,
    name: str,
    contribution: torch.Tensor,
    factor: torch.Tensor,
    seg: torch.Tensor | None,
    *,
    overwrite: bool = False,
) -> None:
    """Add ``Σ_i factor_i · contribution_i`` (per segment) into ``sums[name]``.

    ``contribution`` is a temporary ``[b, ...]`` and is scaled in place (with
    segments). With ``overwrite`` (no segments only), write the sum instead of
    adding it, so ``sums[name]`` need not be initialised.

    Parameters
    ----------
    sums : dict of str to torch.Tensor
        The running sums, ``[num_segments, *shape]`` or ``shape``.
    name : str
        Which sum.
    contribution : torch.Tensor
        Per-example tensors ``[b, *shape]``.
    factor : torch.Tensor
        Per-example weights ``[b]``.
    seg : torch.Tensor or None
        Segment of each example ``[b]``, or ``None`` for one sum.
    overwrite : bool
        Write instead of add (no segments).
    """
    b = contribution.shape[0]
    flat = contribution.reshape(b, -1)
    if seg is None:
        if overwrite:
            torch.mv(flat.T, factor, out=sums[name].view(-1))
        else:
            sums[name].view(-1).addmv_(flat.T, factor)
    else:
        flat.mul_(factor[:, None])
        rows = sums[name].view(sums[name].shape[0], -1)
        if rows.device.type == "cpu":
            rows.index_add_(0, seg, flat)
        else:  # CUDA's index_add_ adds floats atomically, in no fixed order;
            # the sort-based accumulating index_put_ sums in a fixed order, so
            # a round (and its replay on resume) gives the same bits
            rows.index_put_((seg,), flat, accumulate=True)
