"""The chacha20-v2 secure normals as one fused Triton kernel (CUDA).

:mod:`dpfl.sim.secure_noise` computes a draw on a GPU as torch operations:
the ChaCha20 keystream (RFC 8439) of a piece, then the float64 Gaussian
transform, each writing its intermediates to memory. The kernel here does
all of it in registers: each program instance takes 128 *units* of 8
outputs; unit ``u`` of a draw is group ``g = u // 128``, columns ``8c … 8c +
7`` (``c = u % 128``), and it needs the four keystream blocks ``512 g + 128 r
+ c`` (rows ``r = 0 … 3`` of the group), whose 64-bit words ``k = 0 … 7`` are
output ``8u + k``'s four words. Each block is computed with the block counter
as the position (RFC 8439's block function on 32-bit words), then the same
53-bit integers, uniforms, float64 Box–Muller radii and angles and the
guard's sum as :func:`dpfl.sim.chacha._transform`, then the scale, cast
to the output's dtype and stored. Every step is the same IEEE-754 operation
in the same order as the torch path (the float64 logarithm, sine and cosine
from CUDA's libdevice, as torch's own CUDA kernels use; no fused
multiply-adds), so the outputs are the same bits; the caller checks that on
the device before trusting the kernel (:func:`dpfl.sim.secure_noise`'s probe).

Importing this module needs Triton; nothing else in dpfl does.
"""

from __future__ import annotations

import contextlib
import math
import struct
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

__all__ = ["UNIT", "fill_normals", "fill_rows", "keystream_words"]

#: Outputs per unit (a unit reads half of each of four 64-byte blocks).
UNIT = 8
#: Units per program instance (one per thread with four warps).
BLOCK_UNITS = 128
_NUM_WARPS = 4
#: Added to every 32-bit word passed to a kernel: the argument is then always a
#: 64-bit integer (one compiled signature), and the kernel keeps the low 32 bits.
_WIDE = 1 << 32
#: θ = s·π/2⁵², the angle of the chacha20-v2 transform (as its float64 bits).
_ANGLE_BITS = struct.unpack("<q", struct.pack("<d", math.pi * 2.0**-52))[0]


@triton.jit
def _rotl(x, r: tl.constexpr):
    return (x << r) | (x >> (32 - r))


@triton.jit
def _quarter(a, b, c, d):
    a = a + b
    d = _rotl(d ^ a, 16)
    c = c + d
    b = _rotl(b ^ c, 12)
    a = a + b
    d = _rotl(d ^ a, 8)
    c = c + d
    b = _rotl(b ^ c, 7)
    return a, b, c, d


@triton.jit
def _word(w):
    """A 32-bit word passed as a 64-bit integer argument, as uint32."""
    return w.to(tl.int64).to(tl.uint32)


@triton.jit
def _block(counter, k0, k1, k2, k3, k4, k5, k6, k7, n0, n1, n2):
    """RFC 8439's block function for a vector of counters: its 16 output words."""
    zero = counter * 0
    i0 = zero + 0x61707865  # "expand 32-byte k"
    i1 = zero + 0x3320646E
    i2 = zero + 0x79622D32
    i3 = zero + 0x6B206574
    i4 = zero + _word(k0)
    i5 = zero + _word(k1)
    i6 = zero + _word(k2)
    i7 = zero + _word(k3)
    i8 = zero + _word(k4)
    i9 = zero + _word(k5)
    i10 = zero + _word(k6)
    i11 = zero + _word(k7)
    i13 = zero + _word(n0)
    i14 = zero + _word(n1)
    i15 = zero + _word(n2)
    x0, x1, x2, x3, x4, x5, x6, x7 = i0, i1, i2, i3, i4, i5, i6, i7
    x8, x9, x10, x11, x12, x13, x14, x15 = i8, i9, i10, i11, counter, i13, i14, i15
    for _ in range(10):  # 20 rounds: a column round, then a diagonal round
        x0, x4, x8, x12 = _quarter(x0, x4, x8, x12)
        x1, x5, x9, x13 = _quarter(x1, x5, x9, x13)
        x2, x6, x10, x14 = _quarter(x2, x6, x10, x14)
        x3, x7, x11, x15 = _quarter(x3, x7, x11, x15)
        x0, x5, x10, x15 = _quarter(x0, x5, x10, x15)
        x1, x6, x11, x12 = _quarter(x1, x6, x11, x12)
        x2, x7, x8, x13 = _quarter(x2, x7, x8, x13)
        x3, x4, x9, x14 = _quarter(x3, x4, x9, x14)
    return (
        x0 + i0,
        x1 + i1,
        x2 + i2,
        x3 + i3,
        x4 + i4,
        x5 + i5,
        x6 + i6,
        x7 + i7,
        x8 + i8,
        x9 + i9,
        x10 + i10,
        x11 + i11,
        x12 + counter,
        x13 + i13,
        x14 + i14,
        x15 + i15,
    )


@triton.jit
def _s53(lo, hi):
    """``s``: the 64-bit word ``lo | hi << 32`` as a signed integer, ``>> 11``."""
    return (hi.to(tl.int32, bitcast=True).to(tl.int64) << 21) + (lo >> 11).to(tl.int64)


@triton.jit
def _log(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def _sqrt(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.sqrt_rn(x)
    else:
        return tl.sqrt(x)  # float64: correctly rounded (no approximate form)


@triton.jit
def _cos_plus_sin(t, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.cos(t) + libdevice.sin(t)
    else:
        return tl.cos(t) + tl.sin(t)


@triton.jit
def _radius(s, LIBDEVICE: tl.constexpr):
    """``sqrt(-2 log u)``, ``u = (s + 2⁵² + 1)·2⁻⁵³`` (exact: an integer <= 2⁵³)."""
    u = (s + 4503599627370497).to(tl.float64) * 1.1102230246251565e-16
    return _sqrt(_log(u, LIBDEVICE) * -2.0, LIBDEVICE)


@triton.jit
def _pair(s, r, angle, LIBDEVICE: tl.constexpr):
    """``r (cos θ + sin θ)``, ``θ = s·π/2⁵²``."""
    return _cos_plus_sin(s.to(tl.float64) * angle, LIBDEVICE) * r


@triton.jit
def _store(out_ptr, j, o, scale, n):
    tl.store(out_ptr + j, (o * scale).to(out_ptr.dtype.element_ty), mask=j < n)


@triton.jit
def _normals(
    out_ptr,
    rel,
    n,
    u0,
    k0,
    k1,
    k2,
    k3,
    k4,
    k5,
    k6,
    k7,
    w12,
    n0,
    n1,
    n2,
    scale_bits,
    angle_bits,
    LIBDEVICE: tl.constexpr,
):
    """Units ``u0 + rel`` of a draw, stored from ``out_ptr``.

    Output ``8·(u0 + rel) + k`` of the draw goes to ``out_ptr[8·rel + k]``
    where that index is ``< n``.
    """
    unit = rel + u0.to(tl.int64)
    group = unit >> 7
    column = unit & 127
    first = group * 512 + column + w12.to(tl.int64)  # row 0's block
    scale = scale_bits.to(tl.int64).to(tl.float64, bitcast=True)
    angle = angle_bits.to(tl.int64).to(tl.float64, bitcast=True)
    j = rel * 8
    # Rows 0 and 2 give the first Box–Muller pair of each output (radius,
    # angle), rows 1 and 3 the second; output o = c₀ + c₁.
    y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15 = _block(
        first.to(tl.uint32), k0, k1, k2, k3, k4, k5, k6, k7, n0, n1, n2
    )
    r0 = _radius(_s53(y0, y1), LIBDEVICE)
    r1 = _radius(_s53(y2, y3), LIBDEVICE)
    r2 = _radius(_s53(y4, y5), LIBDEVICE)
    r3 = _radius(_s53(y6, y7), LIBDEVICE)
    r4 = _radius(_s53(y8, y9), LIBDEVICE)
    r5 = _radius(_s53(y10, y11), LIBDEVICE)
    r6 = _radius(_s53(y12, y13), LIBDEVICE)
    r7 = _radius(_s53(y14, y15), LIBDEVICE)
    y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15 = _block(
        (first + 256).to(tl.uint32), k0, k1, k2, k3, k4, k5, k6, k7, n0, n1, n2
    )
    c0 = _pair(_s53(y0, y1), r0, angle, LIBDEVICE)
    c1 = _pair(_s53(y2, y3), r1, angle, LIBDEVICE)
    c2 = _pair(_s53(y4, y5), r2, angle, LIBDEVICE)
    c3 = _pair(_s53(y6, y7), r3, angle, LIBDEVICE)
    c4 = _pair(_s53(y8, y9), r4, angle, LIBDEVICE)
    c5 = _pair(_s53(y10, y11), r5, angle, LIBDEVICE)
    c6 = _pair(_s53(y12, y13), r6, angle, LIBDEVICE)
    c7 = _pair(_s53(y14, y15), r7, angle, LIBDEVICE)
    y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15 = _block(
        (first + 128).to(tl.uint32), k0, k1, k2, k3, k4, k5, k6, k7, n0, n1, n2
    )
    r0 = _radius(_s53(y0, y1), LIBDEVICE)
    r1 = _radius(_s53(y2, y3), LIBDEVICE)
    r2 = _radius(_s53(y4, y5), LIBDEVICE)
    r3 = _radius(_s53(y6, y7), LIBDEVICE)
    r4 = _radius(_s53(y8, y9), LIBDEVICE)
    r5 = _radius(_s53(y10, y11), LIBDEVICE)
    r6 = _radius(_s53(y12, y13), LIBDEVICE)
    r7 = _radius(_s53(y14, y15), LIBDEVICE)
    y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15 = _block(
        (first + 384).to(tl.uint32), k0, k1, k2, k3, k4, k5, k6, k7, n0, n1, n2
    )
    _store(out_ptr, j, c0 + _pair(_s53(y0, y1), r0, angle, LIBDEVICE), scale, n)
    _store(out_ptr, j + 1, c1 + _pair(_s53(y2, y3), r1, angle, LIBDEVICE), scale, n)
    _store(out_ptr, j + 2, c2 + _pair(_s53(y4, y5), r2, angle, LIBDEVICE), scale, n)
    _store(out_ptr, j + 3, c3 + _pair(_s53(y6, y7), r3, angle, LIBDEVICE), scale, n)
    _store(out_ptr, j + 4, c4 + _pair(_s53(y8, y9), r4, angle, LIBDEVICE), scale, n)
    _store(out_ptr, j + 5, c5 + _pair(_s53(y10, y11), r5, angle, LIBDEVICE), scale, n)
    _store(out_ptr, j + 6, c6 + _pair(_s53(y12, y13), r6, angle, LIBDEVICE), scale, n)
    _store(out_ptr, j + 7, c7 + _pair(_s53(y14, y15), r7, angle, LIBDEVICE), scale, n)


@triton.jit(
    do_not_specialize=[
        "n",
        "u0",
        "k0",
        "k1",
        "k2",
        "k3",
        "k4",
        "k5",
        "k6",
        "k7",
        "w12",
        "n0",
        "n1",
        "n2",
        "scale_bits",
        "angle_bits",
    ]
)
def _normals_kernel(
    out_ptr,
    n,
    u0,
    k0,
    k1,
    k2,
    k3,
    k4,
    k5,
    k6,
    k7,
    w12,
    n0,
    n1,
    n2,
    scale_bits,
    angle_bits,
    BLOCK: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    """Outputs ``8·u0 + j``, ``j < n``, of a draw into ``out_ptr[j]``."""
    pid = tl.program_id(0).to(tl.int64)
    rel = pid * BLOCK + tl.arange(0, BLOCK).to(tl.int64)  # unit, from u0
    _normals(
        out_ptr,
        rel,
        n,
        u0,
        k0,
        k1,
        k2,
        k3,
        k4,
        k5,
        k6,
        k7,
        w12,
        n0,
        n1,
        n2,
        scale_bits,
        angle_bits,
        LIBDEVICE,
    )


@triton.jit(do_not_specialize=["n", "row_stride", "scale_bits", "angle_bits"])
def _rows_kernel(
    out_ptr,
    words_ptr,
    n,
    row_stride,
    scale_bits,
    angle_bits,
    BLOCK: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    """Row ``r`` (program axis 1): outputs ``j < n`` of draw ``r``.

    Into ``out_ptr[r·row_stride + j]``.

    Draw ``r``'s key, counter and nonce words are ``words_ptr[12 r …]`` (as
    :func:`_words` gives them).
    """
    row = tl.program_id(1).to(tl.int64)
    rel = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    w = words_ptr + row * 12
    _normals(
        out_ptr + row * row_stride,
        rel,
        n,
        row * 0,  # every row is a whole draw, from its first output
        tl.load(w),
        tl.load(w + 1),
        tl.load(w + 2),
        tl.load(w + 3),
        tl.load(w + 4),
        tl.load(w + 5),
        tl.load(w + 6),
        tl.load(w + 7),
        tl.load(w + 8),
        tl.load(w + 9),
        tl.load(w + 10),
        tl.load(w + 11),
        scale_bits,
        angle_bits,
        LIBDEVICE,
    )


@triton.jit(
    do_not_specialize=[
        "nblocks",
        "k0",
        "k1",
        "k2",
        "k3",
        "k4",
        "k5",
        "k6",
        "k7",
        "w12",
        "n0",
        "n1",
        "n2",
    ]
)
def _keystream_kernel(
    out_ptr,
    nblocks,
    k0,
    k1,
    k2,
    k3,
    k4,
    k5,
    k6,
    k7,
    w12,
    n0,
    n1,
    n2,
    BLOCK: tl.constexpr,
):
    """Blocks ``w12 + b``, ``b < nblocks``: their 16 words at ``out_ptr[16 b …]``."""
    b = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    keep = b < nblocks
    y0, y1, y2, y3, y4, y5, y6, y7, y8, y9, y10, y11, y12, y13, y14, y15 = _block(
        (b + w12.to(tl.int64)).to(tl.uint32), k0, k1, k2, k3, k4, k5, k6, k7, n0, n1, n2
    )
    at = out_ptr + b * 16
    tl.store(at, y0.to(tl.int64), mask=keep)
    tl.store(at + 1, y1.to(tl.int64), mask=keep)
    tl.store(at + 2, y2.to(tl.int64), mask=keep)
    tl.store(at + 3, y3.to(tl.int64), mask=keep)
    tl.store(at + 4, y4.to(tl.int64), mask=keep)
    tl.store(at + 5, y5.to(tl.int64), mask=keep)
    tl.store(at + 6, y6.to(tl.int64), mask=keep)
    tl.store(at + 7, y7.to(tl.int64), mask=keep)
    tl.store(at + 8, y8.to(tl.int64), mask=keep)
    tl.store(at + 9, y9.to(tl.int64), mask=keep)
    tl.store(at + 10, y10.to(tl.int64), mask=keep)
    tl.store(at + 11, y11.to(tl.int64), mask=keep)
    tl.store(at + 12, y12.to(tl.int64), mask=keep)
    tl.store(at + 13, y13.to(tl.int64), mask=keep)
    tl.store(at + 14, y14.to(tl.int64), mask=keep)
    tl.store(at + 15, y15.to(tl.int64), mask=keep)


def _words(state: list[int]) -> list[int]:
    """The key, counter and nonce words of a 16-word state, as kernel arguments."""
    return [w + _WIDE for w in (*state[4:12], *state[12:16])]


def fill_normals(
    out: torch.Tensor,
    state: list[int],
    scale: float,
    *,
    first: int = 0,
    libdevice: bool = True,
) -> torch.Tensor:
    """Fill the flat, contiguous ``out`` with outputs ``first …`` of a draw.

    Output ``i`` of the draw whose ChaCha20 initial state is ``state``
    (RFC 8439's 16 words: constants, key, block counter of the draw's first
    block, nonce) is the chacha20-v2 normal of :mod:`dpfl.sim.secure_noise`,
    times ``scale`` (in float64), cast to ``out``'s dtype.

    Parameters
    ----------
    out : torch.Tensor
        Flat, contiguous float32 or float64 tensor on a CUDA device (or on
        the CPU under Triton's interpreter, ``TRITON_INTERPRET=1``).
    state : list of int
        The draw's initial state (16 words below 2³²).
    scale : float
        The factor of every output (the guard's 1/2 times the std).
    first : int
        The draw's output that ``out[0]`` receives (a multiple of 8).
    libdevice : bool
        The float64 logarithm, sine and cosine from CUDA's libdevice (as
        torch's CUDA kernels), else Triton's own (``tl.log``, ...; what the
        interpreter runs).

    Returns
    -------
    torch.Tensor
        ``out``.
    """
    n = out.numel()
    if first % UNIT:
        raise ValueError(f"first must be a multiple of {UNIT}; got {first}")
    if n == 0:
        return out
    units = -(-n // UNIT)
    scale_bits = struct.unpack("<q", struct.pack("<d", float(scale)))[0]
    grid = (triton.cdiv(units, BLOCK_UNITS),)
    with _on(out.device):  # Triton launches on the current CUDA device
        _normals_kernel[grid](
            out,
            n,
            first // UNIT,
            *_words(state),
            scale_bits,
            _ANGLE_BITS,
            BLOCK=BLOCK_UNITS,
            LIBDEVICE=libdevice,
            num_warps=_NUM_WARPS,
            enable_fp_fusion=False,
        )
    return out


def fill_rows(
    out: torch.Tensor,
    states: list[list[int]],
    scale: float,
    *,
    libdevice: bool = True,
) -> torch.Tensor:
    """Fill row ``r`` of the 2-D ``out`` with the draw of ``states[r]``, in one launch.

    Row ``r`` gets what :func:`fill_normals` gives ``out[r]`` for
    ``states[r]`` (outputs 0 … of that draw, times ``scale``): the same
    operations, one program grid over every row.

    Parameters
    ----------
    out : torch.Tensor
        ``[rows, n]`` float32 or float64 tensor whose rows are contiguous
        (unit stride along a row), on a CUDA device (or on the CPU under
        Triton's interpreter).
    states : list of list of int
        Each row's draw's initial state (16 words below 2³²).
    scale : float
        The factor of every output.
    libdevice : bool
        As for :func:`fill_normals`.

    Returns
    -------
    torch.Tensor
        ``out``.
    """
    if out.dim() != 2 or len(states) != out.shape[0]:
        raise ValueError(
            f"out must be [rows, n] with one state a row; got shape "
            f"{tuple(out.shape)} and {len(states)} states"
        )
    rows, n = out.shape
    if rows == 0 or n == 0:
        return out
    if out.stride(1) != 1:
        raise ValueError("out's rows must be contiguous")
    words = torch.tensor([_words(s) for s in states], dtype=torch.int64)
    if out.device.type == "cuda":
        # pinned, so the copy is queued without waiting for the device
        words = words.pin_memory().to(out.device, non_blocking=True)
    else:
        words = words.to(out.device)
    scale_bits = struct.unpack("<q", struct.pack("<d", float(scale)))[0]
    units = -(-n // UNIT)
    per_launch = 65535  # CUDA's limit on the grid's second axis
    with _on(out.device):
        for r0 in range(0, rows, per_launch):
            r1 = min(rows, r0 + per_launch)
            _rows_kernel[(triton.cdiv(units, BLOCK_UNITS), r1 - r0)](
                out[r0:r1],
                words[r0:r1],
                n,
                out.stride(0),
                scale_bits,
                _ANGLE_BITS,
                BLOCK=BLOCK_UNITS,
                LIBDEVICE=libdevice,
                num_warps=_NUM_WARPS,
                enable_fp_fusion=False,
            )
    return out


def _on(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """``device`` made the current CUDA device (nothing for the interpreter's CPU)."""
    if device.type == "cuda":
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def keystream_words(
    state: list[int], nblocks: int, device: str | torch.device
) -> torch.Tensor:
    """ChaCha20 blocks ``state[12] + b``, ``b < nblocks``, by the kernel's rounds.

    Returns
    -------
    torch.Tensor
        ``[nblocks, 16]`` int64: each block's 32-bit output words (RFC 8439's
        serialisation is their little-endian bytes, in order).
    """
    out = torch.empty(nblocks, 16, dtype=torch.int64, device=device)
    block = 64
    with _on(out.device):
        _keystream_kernel[(triton.cdiv(nblocks, block),)](
            out, nblocks, *_words(state), BLOCK=block, num_warps=2
        )
    return out
