"""Conv2d kernels of the layer rule: per-example weight gradients, cohort conv.

:class:`dpfl.sim.grad.layers.Conv2dRule` is a thin rule over these:
:func:`conv2d_per_sample_weight_grad` gives per-example weight gradients from
a layer's input and output gradient (the ghost kernel), and
:func:`cohort_conv2d` applies each client's own weights to its images of a
flat cohort batch (the cohort forward), with :class:`_Relayout` copying
between the layouts the two routes want.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "COHORT_IM2COL_MAX_CIN",
    "cohort_conv2d",
    "conv2d_per_sample_weight_grad",
    "conv2d_weight_grad_from_columns",
]


def conv2d_per_sample_weight_grad(
    conv: nn.Conv2d, a: torch.Tensor, g: torch.Tensor
) -> torch.Tensor:
    """Per-example weight gradient of a Conv2d, ``[b, *conv.weight.shape]``.

    One input channel: ``gw[i, o] = Σ_{u,v} g[i, o, u, v] · x̃[i, s·(u, v) +
    d·(p, q)]`` over the padded input ``x̃`` is a *forward* convolution of
    ``x̃`` (the batch as channels) with the output gradients as ``b`` groups of
    kernels, dilated by the stride and strided by the dilation: no im2col
    columns are written. Inside a training round this is faster than both
    alternatives (paper CNN's first layer, b = 68: ≈ 0.7–1.1 ms against
    0.9–1.6 ms for gathered columns, and faster than a grouped weight-gradient
    convolution at b = 68–700), because the columns (16× the input) leave the
    cache. More input channels: ``gw[i] = g[i] @ cols[i]ᵀ`` with ``cols[i]``
    the im2col matrix ``[cin·kh·kw, L]`` of example ``i``, all examples in one
    batched matrix product; the columns are gathered with one
    ``index_select`` through a cached index (``F.unfold`` is slow on CPU, and
    so is copying a strided view of the input, short strided runs).
    """
    b = a.shape[0]
    cout, cin, kh, kw = conv.weight.shape
    stride = cast(tuple[int, int], conv.stride)
    padding = cast(tuple[int, int], conv.padding)
    dilation = cast(tuple[int, int], conv.dilation)
    if cin == 1:  # the convolution pads the input itself
        out = F.conv2d(
            a.reshape(1, b, a.shape[2], a.shape[3]),
            g.reshape(b * cout, 1, g.shape[2], g.shape[3]),
            stride=dilation,
            padding=padding,
            dilation=stride,
            groups=b,
        )
        return out[:, :, :kh, :kw].reshape(b, cout, 1, kh, kw)
    ph, pw = padding
    ap = F.pad(a, (pw, pw, ph, ph)) if ph or pw else a
    ho, wo = g.shape[2], g.shape[3]
    index = _im2col_index(
        (cin, ap.shape[2], ap.shape[3]), (kh, kw), stride, dilation, (ho, wo), a.device
    )
    cols = ap.reshape(b, -1).index_select(1, index).view(b, cin * kh * kw, ho * wo)
    gw = torch.bmm(g.reshape(b, cout, ho * wo), cols.transpose(1, 2))
    return gw.view(b, cout, cin, kh, kw)


@functools.lru_cache(maxsize=64)
def _im2col_index(
    shape: tuple[int, int, int],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    dilation: tuple[int, int],
    out: tuple[int, int],
    device: torch.device,
) -> torch.Tensor:
    """Flat im2col index into one (padded) example ``[C, H, W]``.

    Entry ``(c, i, j, u, v)`` (in that order, ``[C·kh·kw·Ho·Wo]``) is the
    position of input pixel ``(c, u·s₀ + i·d₀, v·s₁ + j·d₁)``; cached per
    geometry and device.
    """
    c, h, w = shape
    kh, kw = kernel
    ho, wo = out
    grid = torch.arange(c * h * w, device=device).view(c, h, w)
    return grid.as_strided(
        (c, kh, kw, ho, wo),
        (h * w, w * dilation[0], dilation[1], w * stride[0], stride[1]),
    ).reshape(-1)


#: A per-client convolution with fewer input channels than this, whose input
#: needs no gradient (a first layer), runs as im2col + one matrix product per
#: client: oneDNN's grouped convolution is slow for so few channels per group
#: (1 -> 8 channels, 500 images of 28 x 28: ≈ 14 ms grouped against ≈ 4 ms,
#: about the cost of one shared-weight convolution of the batch).
COHORT_IM2COL_MAX_CIN = 4


def cohort_conv2d(
    conv: nn.Conv2d,
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    m: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Client ``k``'s images of ``x`` ``[m·B, C, H, W]`` through its ``w[k]``.

    Returns the output and, when the im2col route was taken, the columns
    ``[m, C·kh·kw, B·L]`` (reused for the weight gradients).

    Few input channels and no input gradient (a first layer): per client,
    im2col and one matrix product ``w[k] @ cols[k]``. Otherwise one grouped
    convolution with the clients as groups. Either way the output, and the
    gradient handed back to the input, are laid out channels-last: CPU
    max-pooling of small images is ≈ 6× faster on it than on contiguous NCHW,
    and a pooling backward pass given a gradient in another layout first
    copies it.
    """
    cin = x.shape[1]
    cout, _, kh, kw = w.shape[1:]
    stride = cast(tuple[int, int], conv.stride)
    padding = cast(tuple[int, int], conv.padding)
    dilation = cast(tuple[int, int], conv.dilation)
    if cin < COHORT_IM2COL_MAX_CIN and not x.requires_grad:
        cols, ho, wo = _cohort_im2col(x, m, (kh, kw), stride, padding, dilation)
        wk = w.reshape(m, cout, -1)
        if bias is None:
            out = torch.bmm(wk, cols)  # [m, cout, B·L]
        else:
            out = torch.baddbmm(bias.unsqueeze(2), wk, cols)
        return _Relayout.apply(out, m, (ho, wo), "columns"), cols
    out = F.conv2d(
        _Relayout.apply(x, m, None, "to_groups"),
        w.reshape(m * cout, cin, kh, kw),
        None if bias is None else bias.reshape(-1),
        stride,
        padding,
        dilation,
        groups=m,
    )
    return _Relayout.apply(out, m, None, "from_groups"), None


def _to_groups(x: torch.Tensor, m: int) -> torch.Tensor:
    """``[m·B, C, H, W]`` (client-major) → ``[B, m·C, H, W]``, channels-last."""
    mb, c, h, w = x.shape
    b = mb // m
    out = x.reshape(m, b, c, h, w).permute(1, 3, 4, 0, 2).reshape(b, h, w, m * c)
    return out.permute(0, 3, 1, 2)


def _from_groups(y: torch.Tensor, m: int) -> torch.Tensor:
    """``[B, m·C, H, W]`` → ``[m·B, C, H, W]`` (client-major), channels-last."""
    b, mc, h, w = y.shape
    c = mc // m
    out = y.permute(0, 2, 3, 1).reshape(b, h, w, m, c).permute(3, 0, 1, 2, 4)
    return out.reshape(m * b, h, w, c).permute(0, 3, 1, 2)


def _from_columns(y: torch.Tensor, m: int, size: tuple[int, int]) -> torch.Tensor:
    """``[m, C, B·Ho·Wo]`` (per-client products) → ``[m·B, C, Ho, Wo]``, CL."""
    c = y.shape[1]
    ho, wo = size
    b = y.shape[2] // (ho * wo)
    out = y.view(m, c, b, ho, wo).permute(0, 2, 3, 4, 1).reshape(m * b, ho, wo, c)
    return out.permute(0, 3, 1, 2)


def _to_columns(x: torch.Tensor, m: int) -> torch.Tensor:
    """Inverse of :func:`_from_columns`: ``[m·B, C, Ho, Wo]`` → ``[m, C, B·L]``."""
    mb, c, ho, wo = x.shape
    out = x.permute(0, 2, 3, 1).reshape(m, mb // m, ho, wo, c).permute(0, 4, 1, 2, 3)
    return out.reshape(m, c, -1)


class _Relayout(torch.autograd.Function):
    """One copy between the cohort kernel's layouts, and one copy back.

    Autograd's own backward of a chain of permutes and reshapes hands the
    gradient back in whatever strides the chain produced, and the next
    operation then copies it again (slowly, from scattered strides). Here
    each direction is one explicit copy into the layout the next operation
    wants.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        x: torch.Tensor,
        m: int,
        size: tuple[int, int] | None,
        kind: str,
    ) -> torch.Tensor:
        ctx.m, ctx.kind = m, kind
        if kind == "to_groups":
            return _to_groups(x, m)
        if kind == "from_groups":
            return _from_groups(x, m)
        return _from_columns(x, m, cast(tuple[int, int], size))

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, g: torch.Tensor
    ) -> tuple[torch.Tensor, None, None, None]:
        if ctx.kind == "to_groups":
            return _from_groups(g, ctx.m), None, None, None
        if ctx.kind == "from_groups":
            return _to_groups(g, ctx.m), None, None, None
        return _to_columns(g, ctx.m), None, None, None


def _cohort_im2col(
    x: torch.Tensor,
    m: int,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
) -> tuple[torch.Tensor, int, int]:
    """Per-client columns ``[m, C·kh·kw, B·L]`` of ``x`` ``[m·B, C, H, W]``.

    Examples are client-major in ``x``. A strided view of the padded input,
    copied once: at this size (≈ 7·10⁶ entries) the copy is 2.4× faster than
    the ``index_select`` gather of :func:`conv2d_per_sample_weight_grad`,
    which wins for the small batches of one model. Also returns ``(Ho, Wo)``.
    """
    kh, kw = kernel
    ph, pw = padding
    xp = F.pad(x, (pw, pw, ph, ph)) if ph or pw else x.contiguous()
    mb, cin, hp, wp = xp.shape
    b = mb // m
    ho = (hp - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wp - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    sb, sc, sh, sw = xp.stride()
    view = xp.as_strided(
        (m, cin, kh, kw, b, ho, wo),
        (
            b * sb,
            sc,
            sh * dilation[0],
            sw * dilation[1],
            sb,
            sh * stride[0],
            sw * stride[1],
        ),
    )
    return view.reshape(m, cin * kh * kw, b * ho * wo), ho, wo


def conv2d_weight_grad_from_columns(
    cols: torch.Tensor, g: torch.Tensor, weight_shape: torch.Size
) -> torch.Tensor:
    """Per-example weight gradients ``[m·B, *weight_shape]`` from cohort columns.

    ``cols`` ``[m, C·kh·kw, B·L]`` are the columns kept by the im2col route of
    :func:`cohort_conv2d` and ``g`` ``[m·B, cout, Ho, Wo]`` the output
    gradients of the flat batch: per example, ``g_i @ cols_iᵀ``, all in one
    batched matrix product.
    """
    m, ckk = cols.shape[0], cols.shape[1]
    mb = g.shape[0]
    cols = cols.view(m, ckk, mb // m, -1).transpose(1, 2).reshape(mb, ckk, -1)
    gw = torch.bmm(g.reshape(mb, g.shape[1], -1), cols.transpose(1, 2))
    return gw.view(mb, *weight_shape)
