"""The ChaCha20 noise stream on torch devices: keystream, transform, kernels.

The construction is :mod:`dpfl.sim.secure_noise`'s (streams ``chacha20-v2``
and ``chacha20-v3``): ChaCha20 (RFC 8439) keystream words under the stream
key, with the draw as nonce and the position as block counter, turned into
guarded normals by :func:`_transform`. This module computes them with torch
operations on any device: the keystream as 32-bit words held in int64
(:func:`chacha20_keystream`, eager or compiled with ``torch.compile``), and
on CUDA one fused Triton kernel (:mod:`dpfl.sim._chacha_triton`) when a
probe on the device gives the torch operations' outputs bit for bit.
:func:`~dpfl.sim.secure_noise.noise_kernel` says which a device uses. The
CPU path with OpenSSL's keystream is in :mod:`dpfl.sim.secure_noise`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
from collections.abc import Callable

import torch

from dpfl.errors import InvalidParameterError
from dpfl.sim.keys import (
    check_key,
    derive_key,
)

__all__ = ["GROUP", "chacha20_keystream"]

log = logging.getLogger(__name__)


#: Outputs per group of the ChaCha20 stream (32 KiB of keystream, 512 blocks).
GROUP = 1024


_GROUP_BLOCKS = GROUP * 32 // 64


#: Groups per piece on the CPU (8,192 outputs: the piece's buffers, 704 KiB,
#: stay in cache).
_CPU_GROUPS = 8


#: Groups per piece elsewhere (a million outputs: 32 MiB of keystream words).
_DEVICE_GROUPS = 1024


_U53 = 2.0**-53


# chacha20-v2: u = (s + 2^52 + 1)·2^-53 and θ = s·π/2^52
_U_OFFSET = 0.5 + _U53


_ANGLE = math.pi * 2.0**-52


#: Those two as float64 scalar tensors, per device (an int64 tensor and a
#: float64 scalar tensor give float64; a Python float would give float32).
_SCALARS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


_SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"


_M32 = 0xFFFFFFFF


# -- chacha20-v2: the keystream -----------------------------------------------------
def _nonce(draw: int) -> bytes:
    """The 96-bit nonce of draw ``draw``: 8 little-endian bytes, 4 zero bytes."""
    return draw.to_bytes(8, "little") + bytes(4)


def _initial_state(key: bytes, nonce: bytes, counter: int) -> list[int]:
    """RFC 8439's 16-word initial state: constants, key, counter, nonce."""
    words = [int.from_bytes(key[i : i + 4], "little") for i in range(0, 32, 4)]
    nonce_words = [int.from_bytes(nonce[i : i + 4], "little") for i in range(0, 12, 4)]
    return [*_SIGMA, *words, counter, *nonce_words]


def _rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) & _M32) | (x >> (32 - r))


def _quarter(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """RFC 8439's quarter round on rows of 32-bit words held in int64."""
    a = (a + b) & _M32
    d = _rotl(d ^ a, 16)
    c = (c + d) & _M32
    b = _rotl(b ^ c, 12)
    a = (a + b) & _M32
    d = _rotl(d ^ a, 8)
    c = (c + d) & _M32
    b = _rotl(b ^ c, 7)
    return a, b, c, d


def _blocks(init: torch.Tensor, nblocks: int) -> torch.Tensor:
    """ChaCha20 blocks ``init[12] + j``, ``j < nblocks``: ``[16, nblocks]`` words.

    ``init`` is the initial state (int64, 16 words below 2³²). The four
    column quarter rounds run at once on rows of the state; the diagonal
    ones after rotating rows 4-15 so that diagonals become columns.
    """
    counter = init[12] + torch.arange(nblocks, device=init.device, dtype=init.dtype)
    x0 = torch.cat(
        [
            init[:12, None].expand(12, nblocks),
            counter[None],
            init[13:, None].expand(3, nblocks),
        ]
    )
    a, b, c, d = x0[0:4], x0[4:8], x0[8:12], x0[12:16]
    for _ in range(10):
        a, b, c, d = _quarter(a, b, c, d)
        b, c, d = b.roll(-1, 0), c.roll(-2, 0), d.roll(-3, 0)
        a, b, c, d = _quarter(a, b, c, d)
        b, c, d = b.roll(1, 0), c.roll(2, 0), d.roll(3, 0)
    return (torch.cat([a, b, c, d]) + x0) & _M32


def _words(init: torch.Tensor, nblocks: int) -> torch.Tensor:
    """The top 53 bits ``s`` of the keystream's 64-bit words, in stream order.

    ``[8·nblocks]`` int64: word ``k`` of a block is ``lo | hi << 32`` of its
    32-bit words ``2k`` and ``2k + 1``; ``s`` is that word read as a signed
    integer and shifted right by 11, computed without forming it.
    """
    x = _blocks(init, nblocks)
    lo, hi = x[0::2], x[1::2]
    signed_hi = hi - ((hi >> 31) << 32)
    return ((signed_hi << 21) + (lo >> 11)).t().reshape(-1)


def chacha20_keystream(
    key: bytes,
    nonce: bytes,
    counter: int,
    nblocks: int,
    *,
    device: str | torch.device = "cpu",
) -> bytes:
    """ChaCha20 keystream (RFC 8439) from dpfl's torch implementation.

    What a device computes for the secure stream, as bytes, for checking
    against the RFC's test vectors and other implementations.

    Parameters
    ----------
    key : bytes
        32-byte key.
    nonce : bytes
        12-byte nonce.
    counter : int
        First block counter (``0 <= counter``, ``counter + nblocks <= 2³²``).
    nblocks : int
        Number of 64-byte blocks (>= 1).
    device : str or torch.device
        Where to compute.

    Returns
    -------
    bytes
        ``64·nblocks`` bytes.
    """
    check_key("key", key)
    if not isinstance(nonce, bytes) or len(nonce) != 12:
        raise InvalidParameterError(f"nonce must be 12 bytes; got {nonce!r}")
    if not 0 <= counter or counter + nblocks > 2**32 or nblocks < 1:
        raise InvalidParameterError(
            "counter and nblocks must satisfy 0 <= counter, nblocks >= 1, "
            f"counter + nblocks <= 2**32; got {counter} and {nblocks}"
        )
    state = _initial_state(key, nonce, counter)
    init = torch.tensor(state, dtype=torch.int64, device=device)
    words = _blocks(init, nblocks).t().contiguous().cpu().numpy()
    return words.astype("<u4").tobytes()


_COMPILED: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {}


_COMPILE_LOCK = threading.Lock()


def _words_kernel(device: torch.device) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """:func:`_words`, compiled for a CUDA device when that works.

    ``torch.compile`` fuses the ~600 integer operations of the rounds into
    one kernel. It is tried once per process and kept only if it gives the
    eager operations' words bit for bit on a probe; any failure (no Triton,
    no C compiler) falls back to the eager operations, with a warning.
    ``DPFL_NOISE_COMPILE=0`` in the environment skips it.
    """
    if device.type != "cuda" or os.environ.get("DPFL_NOISE_COMPILE") == "0":
        return _words
    with _COMPILE_LOCK:
        if "cuda" not in _COMPILED:
            kernel: Callable[[torch.Tensor, int], torch.Tensor] = _words
            try:
                compiled = torch.compile(_words, dynamic=True, fullgraph=True)
                probe = torch.tensor(
                    _initial_state(bytes(range(32)), _nonce(2**40 + 3), 2**31 - 700),
                    dtype=torch.int64,
                    device=device,
                )
                want = _words(probe, 2 * _GROUP_BLOCKS)
                if not torch.equal(compiled(probe, 2 * _GROUP_BLOCKS), want):
                    raise RuntimeError("compiled keystream differs from eager")
                kernel = compiled
            except Exception as exc:  # noqa: BLE001 - any failure: eager ops
                log.warning(
                    "secure noise on CUDA: torch.compile of the ChaCha20 kernel "
                    "failed (%s: %s); using eager torch operations (slower)",
                    type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "",
                )
            _COMPILED["cuda"] = kernel
        return _COMPILED["cuda"]


@dataclasses.dataclass(frozen=True)
class _Fused:
    """The fused kernel's launchers on one device, once probed.

    ``fill(out, state, scale)`` fills a flat tensor with one draw;
    ``rows(out, states, scale)`` fills each row of a 2-D tensor with its own
    draw in one launch (``None`` where that kernel did not pass its probe:
    ``rows_why`` says why).
    """

    fill: Callable[..., torch.Tensor]
    rows: Callable[..., torch.Tensor] | None
    rows_why: str = ""


#: The fused Triton kernels of each CUDA device, once probed: their
#: launchers, or the reason they are not used there.
_FUSED: dict[torch.device, _Fused | str] = {}


_FUSED_LOCK = threading.Lock()


#: The device types where the fused kernel is tried (Triton's GPU backend).
_FUSED_DEVICE_TYPES = ("cuda",)


#: The fused kernel's dtypes (others: torch operations, whose cast from float64
#: the kernel would not reproduce for every format).
_FUSED_DTYPES = (torch.float32, torch.float64)


def _fused_kernel(device: torch.device) -> Callable[..., torch.Tensor] | None:
    """The fused Triton kernel of a draw on ``device``, if it is trusted there.

    The kernel (:mod:`dpfl.sim._chacha_triton`) computes the keystream and the
    Gaussian transform in registers, in one pass; it is used on CUDA only,
    only where Triton imports, and only after a probe on the device gave the
    torch operations' outputs bit for bit (float32 and float64, a draw's
    start and pieces whose block counters cross 2³¹ and end at 2³²), once
    per device and process. Otherwise (or with ``DPFL_NOISE_TRITON=0`` in the
    environment) the torch operations draw, with one warning saying why.
    """
    found = _fused(device)
    return None if found is None else found.fill


def _fused_rows(device: torch.device) -> Callable[..., torch.Tensor] | None:
    """The fused kernel that draws many rows at once on ``device``, if trusted.

    Probed with :func:`_fused_kernel`'s kernel (rows of several keys and
    draws, each equal bit for bit to the torch operations' draw); ``None``
    where either is not trusted (the rows are then drawn one at a time).
    """
    found = _fused(device)
    return None if found is None else found.rows


def _fused(device: torch.device) -> _Fused | None:
    """The probed fused kernels of ``device`` (``None``: not used there)."""
    if (
        device.type not in _FUSED_DEVICE_TYPES
        or os.environ.get("DPFL_NOISE_TRITON") == "0"
    ):
        return None
    with _FUSED_LOCK:
        if device not in _FUSED:
            found, why = _probe_fused(device)
            _FUSED[device] = found if found is not None else why
            if found is None:
                log.warning(
                    "secure noise on %s: the fused Triton kernel is not used (%s); "
                    "drawing with torch operations (slower)",
                    device,
                    why,
                )
            elif found.rows is None:
                log.warning(
                    "secure noise on %s: the fused Triton kernel of many rows is "
                    "not used (%s); drawing one row at a time",
                    device,
                    found.rows_why,
                )
        entry = _FUSED[device]
    return None if isinstance(entry, str) else entry


def _probe_fused(device: torch.device) -> tuple[_Fused | None, str]:
    """The fused kernels' launchers if they give the torch operations' bits.

    On ``device``; ``None`` and why not where the one-draw kernel does not
    (the many-rows kernel is probed after it: :func:`_probe_rows`).

    Tries the float64 logarithm, sine and cosine of CUDA's libdevice (those
    of torch's own kernels) first, then Triton's.
    """
    try:
        from dpfl.sim import _chacha_triton
    except Exception as exc:  # noqa: BLE001 - no Triton, or one that fails to load
        return None, f"Triton is unavailable: {type(exc).__name__}: {exc}"
    key = derive_key(bytes(range(32)), "noise")
    state = _initial_state(key, _nonce(2**40 + 3), 0)
    # (dtype, first group, outputs): a draw's start, then two groups whose
    # blocks cross counter 2³¹, then the last two groups a draw can have.
    cases = [
        (torch.float32, 0, 2 * GROUP + 37),
        (torch.float64, 0, 2 * GROUP + 37),
        (torch.float32, 2**22 - 1, 2 * GROUP),
        (torch.float64, 2**23 - 2, 2 * GROUP),
    ]
    scale = 0.5 * 1.3
    failures = []
    for libdevice in (True, False):
        try:
            for dtype, g0, n in cases:
                want = torch.empty(n, dtype=dtype, device=device)
                _fill_groups(state, g0, want, scale, _words)
                got = torch.full((n,), math.nan, dtype=dtype, device=device)
                _chacha_triton.fill_normals(
                    got, state, scale, first=g0 * GROUP, libdevice=libdevice
                )
                if not torch.equal(got, want):
                    wrong = int((got != want).sum())
                    raise RuntimeError(
                        f"{wrong} of {n} {dtype} outputs differ from the torch "
                        "operations'"
                    )
        except Exception as exc:  # noqa: BLE001 - any failure: not trusted
            failures.append(
                f"{'libdevice' if libdevice else 'Triton math'}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            )
            continue

        def fill(
            out: torch.Tensor, state: list[int], scale: float, *, _lib: bool = libdevice
        ) -> torch.Tensor:
            with _FUSED_LOCK:  # one compile at a time (a draw in the background)
                return _chacha_triton.fill_normals(out, state, scale, libdevice=_lib)

        def rows(
            out: torch.Tensor,
            states: list[list[int]],
            scale: float,
            *,
            _lib: bool = libdevice,
        ) -> torch.Tensor:
            with _FUSED_LOCK:
                return _chacha_triton.fill_rows(out, states, scale, libdevice=_lib)

        why = _probe_rows(device, libdevice, scale)
        return _Fused(fill, rows if not why else None, why), ""
    return None, "; ".join(failures)


def _probe_rows(device: torch.device, libdevice: bool, scale: float) -> str:
    """Why the fused kernel of many rows is not trusted on ``device`` ("": it is).

    Three rows (three keys; draws 0, 2⁴⁰ + 3 and 2⁶³ + 5) of a wider tensor,
    so that rows start unaligned, in float32 and float64, against the torch
    operations' draws. Runs under :data:`_FUSED_LOCK` (the probe's), so it
    calls the kernel directly.
    """
    from dpfl.sim import _chacha_triton

    n = 2 * GROUP + 37
    states = [
        _initial_state(derive_key(bytes([k]) * 32, "noise"), _nonce(draw), 0)
        for k, draw in ((1, 0), (2, 2**40 + 3), (3, 2**63 + 5))
    ]
    try:
        for dtype in (torch.float32, torch.float64):
            got = torch.full((len(states), n + 3), math.nan, dtype=dtype, device=device)
            _chacha_triton.fill_rows(got[:, :n], states, scale, libdevice=libdevice)
            for r, state in enumerate(states):
                want = torch.empty(n, dtype=dtype, device=device)
                _fill_groups(state, 0, want, scale, _words)
                if not torch.equal(got[r, :n], want):
                    wrong = int((got[r, :n] != want).sum())
                    return (
                        f"{wrong} of {n} {dtype} outputs of row {r} differ from the "
                        "torch operations'"
                    )
            if not bool(got[:, n:].isnan().all()):
                return "it wrote outside its rows"
    except Exception as exc:  # noqa: BLE001 - any failure: not trusted
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return ""


# -- chacha20-v2: the Gaussian transform ------------------------------------------
def _transform(
    s: torch.Tensor, r: torch.Tensor, t: torch.Tensor, c: torch.Tensor, o: torch.Tensor
) -> None:
    """Guarded normals, summed but not yet halved, of ``s`` (``[k, 4, GROUP]``).

    ``r``, ``t``, ``c`` (``[k, 2, GROUP]``) and ``o`` (``[k, GROUP]``) are
    float64 buffers on ``s``'s device; ``o`` receives
    ``r₀(cos θ₀ + sin θ₀) + r₁(cos θ₁ + sin θ₁)`` per output.
    """
    scalars = _SCALARS.get(s.device)
    if scalars is None:
        scalars = (
            torch.tensor(_U_OFFSET, dtype=torch.float64, device=s.device),
            torch.tensor(_ANGLE, dtype=torch.float64, device=s.device),
        )
        _SCALARS[s.device] = scalars
    offset, angle = scalars
    torch.add(offset, s[:, :2], alpha=_U53, out=r)  # u ∈ (0, 1], exact
    r.log_().mul_(-2.0).sqrt_()
    torch.mul(s[:, 2:], angle, out=t)  # θ ∈ [-π, π)
    torch.cos(t, out=c)
    c.add_(t.sin_()).mul_(r)
    torch.add(c[:, 0], c[:, 1], out=o)


def _fill_torch(
    key: bytes, draw: int, target: torch.Tensor, scale: float, compiled: bool = True
) -> None:
    """Draw ``draw`` on ``target``'s device from :func:`_words` (torch operations)."""
    device = target.device
    kernel = _words_kernel(device) if compiled else _words
    state = _initial_state(key, _nonce(draw), 0)
    try:
        _fill_groups(state, 0, target, scale, kernel)
    except Exception as exc:  # noqa: BLE001 - a compiled kernel failing later
        if kernel is _words:
            raise
        log.warning(
            "secure noise: the compiled ChaCha20 kernel failed (%s); using "
            "eager torch operations from now on",
            type(exc).__name__,
        )
        _COMPILED[device.type] = _words
        _fill_groups(state, 0, target, scale, _words)


def _fill_groups(
    state: list[int],
    g0: int,
    target: torch.Tensor,
    scale: float,
    kernel: Callable[[torch.Tensor, int], torch.Tensor],
) -> None:
    """Outputs ``GROUP·g0 …`` of the draw whose initial state is ``state``.

    Into the flat ``target``, on its device, with the keystream ``kernel``
    (:func:`_words` or its compiled form) and the torch transform.
    """
    n = target.numel()
    device = target.device
    groups = -(-n // GROUP)
    state = list(state)
    base = state[12]
    per_piece = _CPU_GROUPS if device.type == "cpu" else _DEVICE_GROUPS
    for p0 in range(0, groups, per_piece):
        k = min(per_piece, groups - p0)
        state[12] = base + (g0 + p0) * _GROUP_BLOCKS
        init = torch.tensor(state, dtype=torch.int64, device=device)
        s = kernel(init, k * _GROUP_BLOCKS).view(k, 4, GROUP)
        r, t, c = (
            torch.empty(k, 2, GROUP, dtype=torch.float64, device=device) for _ in "rtc"
        )
        o = torch.empty(k, GROUP, dtype=torch.float64, device=device)
        _transform(s, r, t, c, o)
        start = p0 * GROUP
        m = min(k * GROUP, n - start)
        torch.mul(o.view(-1)[:m], scale, out=target[start : start + m])
