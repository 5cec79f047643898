"""Secret, cryptographically secure Gaussian noise, keyed so that it can be replayed.

Why: a run's seed is written to its ``config.yaml``. Noise drawn from seeded
simulator generators (PCG64, torch's Philox/Mersenne) can be drawn again by
anyone who reads the config and runs dpfl's code, and subtracted from a
released model: the noise then protects nothing. By default a run therefore
draws its noise from a stream that only the holder of a secret key can
compute.

**The key** and the keys derived from it for every party of every round are
in :mod:`dpfl.sim.keys`; a party's noise stream is keyed by ``HMAC(party key,
"noise")`` (:class:`SecureGenerator`).

**The stream** (versions ``"chacha20-v2"`` and ``"chacha20-v3"``, the
current :data:`STREAM_VERSION`: the two draw the same noise; in v3 a client's
visiting orders of its records come from :func:`keyed_orders`, in v2 from its
index generator). Draw
``d`` of a stream is the ChaCha20 keystream (RFC 8439: 20 rounds, 32-bit
block counter, 96-bit nonce) under the stream key with nonce ``d`` (8
little-endian bytes, then 4 zero bytes), the block counter starting at 0:
the counter is the position in the draw, so any part of a draw can be
computed on its own, on any device. The keystream is read as little-endian
64-bit words ``w``; each word gives its top 53 bits as a signed integer
``s = w >> 11`` (arithmetic shift of ``w`` read as two's complement, so
``-2⁵² <= s < 2⁵²``). Outputs come in groups of :data:`GROUP` = 1,024 (32
KiB of keystream, 512 blocks): group ``g`` of a draw is keystream bytes
``[32·1024·g, 32·1024·(g + 1))``, read as four rows of 1,024 words, and
output ``i`` of the group takes column ``i``: rows 0 and 1 give the radii of
two Box–Muller pairs from ``u = (s + 2⁵² + 1)·2⁻⁵³ ∈ (0, 1]``, rows 2 and 3
their angles ``θ = s·π/2⁵² ∈ [-π, π)``, all in float64. Output ``n`` of a
draw depends on ``(key, d, n)`` only, never on the draw's length or on how
it is cut into pieces.

**The guard against floating-point attacks.** Mironov (2012, "On
significance of the least significant bits for differential privacy", ACM
CCS) showed that a textbook floating-point Laplace sampler leaves gaps whose
pattern reveals the unnoised value; Holohan & Braghin (2021, "Secure random
sampling in differential privacy", ESORICS) showed the same for Gaussian
samplers (Box–Muller and the polar method) and that summing several
independent normal samples closes the gaps. Each output here is, as in
Opacus's ``secure_mode``, the sum of four independent Box–Muller normals
(both normals ``r·cos θ`` and ``r·sin θ`` of both pairs) divided by 2 (exactly
``N(0, 1)`` in distribution; the division by a power of two is exact in
floating point), then scaled by the noise std:
``std/2 · (r₀(cos θ₀ + sin θ₀) + r₁(cos θ₁ + sin θ₁))`` in float64, cast to
the target's dtype at the end.

**Where it is computed.** On the device of the tensor filled. On the CPU the
keystream comes from OpenSSL's ChaCha20 (through the ``cryptography``
package) and the float64 transform runs in torch, 8,192 outputs at a time in
reused buffers, on the calling thread alone (:func:`_one_thread`: a draw
made in the background does not compete with the training threads). On CUDA
a float32 or float64 draw is one fused Triton kernel
(:mod:`dpfl.sim._chacha_triton`: keystream and transform in registers) when
Triton is installed and a probe on the device gives the torch operations'
outputs bit for bit (once per device and process; ``DPFL_NOISE_TRITON=0`` in
the environment skips it). Otherwise the keystream is computed by torch
integer operations (32-bit words held in int64; :mod:`dpfl.sim.chacha`),
compiled with
``torch.compile`` when that works (checked against the eager operations once
per process; otherwise eager, with a warning; ``DPFL_NOISE_COMPILE=0`` in the
environment skips the compile), and the transform by torch operations.
:func:`noise_kernel` says which a device uses. All give the same keystream
bit for bit, and so the same uniforms; the float64 transcendental functions
of two devices may differ in the last bit or so, which the cast to float32
almost always hides. Without ``cryptography`` the CPU uses the torch
operations too (the same keystream, much slower).

**Versions.** A run records the stream version it started with (in
``run.json``) and resumes with it. ``"shake256-v1"``, the stream of earlier
dpfl releases, stays available for such runs: draw ``d``'s outputs come in
chunks of 8,192, chunk ``c`` being SHAKE-256 (FIPS 202) of ``(domain, key, d,
c)`` read as 64-bit words, the first half giving the ``u₁ ∈ (0, 1]``, the
second half the ``u₂ ∈ [0, 1)`` of the Box–Muller pairs (a pure function of
the draw's length within a chunk), computed on the CPU with numpy.

Cost (``benchmarks/secure_noise.py [--device cuda]`` prints it beside torch's
own generator): 19 ms per million float32 normals on one core of a shared
2-core Xeon, 7.6 times ``Tensor.normal_`` in the same run; the cipher is a
quarter of it, the float64 transform the rest. On CUDA the first draw of a
process compiles and probes the fused kernel (a few seconds; Triton caches
it on disk for later processes), or compiles the keystream kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import sys
import threading
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from dpfl.errors import DpflError, InvalidParameterError
from dpfl.sim import chacha as _chacha
from dpfl.sim.chacha import _CPU_GROUPS, _FUSED_DTYPES, _U53, GROUP
from dpfl.sim.keys import (
    check_key,
    derive_key,
)

try:  # OpenSSL's ChaCha20 for the CPU (the `train` extra installs it)
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    _OPENSSL = sys.byteorder == "little"  # its bytes are read as native int64
except ImportError:  # pragma: no cover - exercised where cryptography is absent
    _OPENSSL = False

__all__ = [
    "CHACHA_VERSIONS",
    "GUARD_SAMPLES",
    "KEYED_ORDER_VERSIONS",
    "MAX_DRAW",
    "STREAM_VERSION",
    "STREAM_VERSIONS",
    "NoiseGenerator",
    "SecureGenerator",
    "check_stream_version",
    "fill_normal_",
    "fill_normal_rows_",
    "noise_kernel",
    "secure_standard_normal",
]

log = logging.getLogger(__name__)

#: Box–Muller normals summed (then divided by the square root, 2) per output.
GUARD_SAMPLES = 4

#: The stream a new run draws from (recorded in its ``run.json``).
STREAM_VERSION = "chacha20-v3"
#: Every stream this dpfl can draw, oldest first (a run resumes with its own).
STREAM_VERSIONS = ("shake256-v1", "chacha20-v2", "chacha20-v3")
#: The versions whose noise is the ChaCha20 stream (v3 differs from v2 only in
#: how a client's epoch orders are drawn: :func:`keyed_orders`).
CHACHA_VERSIONS = ("chacha20-v2", "chacha20-v3")
#: The versions whose clients draw their epoch orders with :func:`keyed_orders`.
KEYED_ORDER_VERSIONS = ("chacha20-v3",)

#: Most outputs of one ChaCha20 draw (its 32-bit block counter, 2 outputs a block).
MAX_DRAW = 2**33

# shake256-v1
_DOMAIN = b"dpfl/secure-normal/v1"
_CHUNK = 1 << 13  # outputs per SHAKE-256 call (256 KiB of stream: stays in cache)
_TWO_PI = 2.0 * np.pi


def check_stream_version(name: str, version: object) -> str:
    """Return ``version`` if it is one of :data:`STREAM_VERSIONS`, else raise.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        Naming ``name``, the known versions and the value.
    """
    if not isinstance(version, str) or version not in STREAM_VERSIONS:
        raise InvalidParameterError(
            f"{name} must be one of {', '.join(STREAM_VERSIONS)} (the secure-noise "
            f"streams this dpfl draws); got {version!r}"
        )
    return version


# -- shake256-v1 ----------------------------------------------------------------------
def _chunk(key: bytes, draw: int, chunk: int, n: int) -> np.ndarray:
    """Outputs ``chunk·8192 …`` of draw ``draw`` of a shake256-v1 stream.

    ``GUARD_SAMPLES·n`` words of SHAKE-256 output; the first half give the
    ``u₁``, the second the ``u₂`` of as many Box–Muller pairs; the
    ``GUARD_SAMPLES·n`` normals, as ``GUARD_SAMPLES`` rows of ``n``, are summed
    over the rows and divided by ``sqrt(GUARD_SAMPLES)`` (= 2, exact).
    """
    tag = _DOMAIN + key + draw.to_bytes(8, "little") + chunk.to_bytes(8, "little")
    words = np.frombuffer(
        hashlib.shake_256(tag).digest(8 * GUARD_SAMPLES * n), dtype="<u8"
    )
    bits = words >> np.uint64(11)  # 53 random bits per word
    half = GUARD_SAMPLES * n // 2
    u1 = bits[:half].astype(np.float64)
    u1 += 1.0
    u1 *= _U53  # (0, 1]: the log is finite
    theta = bits[half:].astype(np.float64)
    theta *= _TWO_PI * _U53  # 2π·[0, 1)
    r = np.log(u1, out=u1)
    r *= -2.0
    np.sqrt(r, out=r)
    cos = np.cos(theta)
    cos *= r
    sin = np.sin(theta, out=theta)
    sin *= r
    out = cos.reshape(-1, n).sum(axis=0)
    out += sin.reshape(-1, n).sum(axis=0)
    out *= 1.0 / math.sqrt(GUARD_SAMPLES)
    return out


def _fill_shake256(key: bytes, draw: int, target: torch.Tensor, std: float) -> None:
    """Fill the flat ``target`` with draw ``draw`` of a shake256-v1 stream."""
    n = target.numel()
    for c, start in enumerate(range(0, n, _CHUNK)):
        stop = min(n, start + _CHUNK)
        z = _chunk(key, draw, c, stop - start)
        if std != 1.0:
            z *= std
        target[start:stop].copy_(torch.from_numpy(z))


def noise_kernel(device: str | torch.device) -> str:
    """What computes a chacha20-v2 draw (float32) on ``device``, for reports.

    ``"openssl"`` (the CPU with ``cryptography``), ``"triton"`` (the fused
    kernel, probed), ``"torch.compile"``, or ``"torch"`` (eager operations).
    Probes or compiles the kernels of ``device`` if not done yet.
    """
    device = torch.device(device)
    if device.type == "cpu":
        return "openssl" if _OPENSSL else "torch"
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if _chacha._fused_kernel(device) is not None:
        return "triton"
    eager = _chacha._words_kernel(device) is _chacha._words
    return "torch" if eager else "torch.compile"


class _CpuBuffers(threading.local):
    """One thread's reused buffers for CPU pieces (704 KiB)."""

    def __init__(self) -> None:
        k = _CPU_GROUPS
        self.zeros = bytes(32 * GROUP * k)
        self.words = torch.empty(k, 4, GROUP, dtype=torch.int64)
        self.raw = self.words.numpy().data.cast("B")
        f64 = torch.float64
        self.r = torch.empty(k, 2, GROUP, dtype=f64)
        self.t = torch.empty(k, 2, GROUP, dtype=f64)
        self.c = torch.empty(k, 2, GROUP, dtype=f64)
        self.o = torch.empty(k, GROUP, dtype=f64)


_CPU = _CpuBuffers()
_OPENMP: Any = None  # threadpoolctl's handle on the OpenMP runtimes, or False
_OPENMP_LOCK = threading.Lock()


def _one_thread() -> contextlib.AbstractContextManager[Any]:
    """Run the calling thread's torch CPU operations on that thread alone.

    torch splits log, sqrt, sin and cos over its OpenMP threads from 2,048
    elements on. A draw is often made in the background while the training
    step computes on those threads, and a second team of OpenMP threads on
    the same cores stalls both; so a CPU draw sets the OpenMP thread count of
    its own thread to 1 (the count is per thread: other threads keep theirs)
    and restores it after, through ``threadpoolctl`` when it is there.
    """
    global _OPENMP
    if _OPENMP is None:
        with _OPENMP_LOCK:
            if _OPENMP is None:
                try:
                    from threadpoolctl import ThreadpoolController

                    _OPENMP = ThreadpoolController().select(user_api="openmp")
                except Exception:  # noqa: BLE001 - no control: torch's own count
                    _OPENMP = False
    if _OPENMP is False or torch.get_num_threads() == 1:
        return contextlib.nullcontext()
    return _OPENMP.limit(limits=1)  # type: ignore[no-any-return]


def _fill_chacha20(
    key: bytes,
    draw: int,
    target: torch.Tensor,
    std: float,
    *,
    openssl: bool | None = None,
    compiled: bool = True,
) -> None:
    """Fill the flat, contiguous ``target`` with draw ``draw`` of a chacha20-v2 stream.

    Computed on ``target``'s device (on the CPU, on the calling thread
    alone); ``openssl`` (default: on the CPU when available) takes the
    keystream from OpenSSL, else from :func:`_words` (``compiled``: by
    :func:`_words_kernel`, else eager).
    """
    n = target.numel()
    if n > MAX_DRAW:
        raise InvalidParameterError(
            f"a secure noise draw holds at most {MAX_DRAW} values (ChaCha20's "
            f"32-bit block counter); got a tensor of {n}"
        )
    scale = 0.5 * std  # the guard's halving and the std: one exact product
    if target.device.type != "cpu":
        if compiled and target.dtype in _FUSED_DTYPES:
            fused = _chacha._fused_kernel(target.device)
            if fused is not None:
                try:
                    state = _chacha._initial_state(key, _chacha._nonce(draw), 0)
                    fused(target, state, scale)
                    return
                except Exception as exc:  # noqa: BLE001 - failing later: torch ops
                    log.warning(
                        "secure noise: the fused Triton kernel failed (%s: %s); "
                        "using torch operations from now on",
                        type(exc).__name__,
                        str(exc).splitlines()[0] if str(exc) else "",
                    )
                    with _chacha._FUSED_LOCK:
                        why = f"it failed: {type(exc).__name__}"
                        _chacha._FUSED[target.device] = why
        _chacha._fill_torch(key, draw, target, scale, compiled)
        return
    with _one_thread():
        if _OPENSSL if openssl is None else openssl:
            _fill_openssl(key, draw, target, scale)
        else:
            _chacha._fill_torch(key, draw, target, scale, compiled)


def _fill_openssl(key: bytes, draw: int, target: torch.Tensor, scale: float) -> None:
    """Draw ``draw`` on the CPU from OpenSSL's keystream, in reused buffers."""
    n = target.numel()
    groups = -(-n // GROUP)
    buf = _CPU
    nonce = bytes(4) + _chacha._nonce(draw)
    cipher = Cipher(algorithms.ChaCha20(key, nonce), mode=None)
    stream = cipher.encryptor()
    for g0 in range(0, groups, _CPU_GROUPS):
        k = min(_CPU_GROUPS, groups - g0)
        size = 32 * GROUP * k
        stream.update_into(buf.zeros[:size], buf.raw[:size])
        s = buf.words[:k].bitwise_right_shift_(11)
        _chacha._transform(s, buf.r[:k], buf.t[:k], buf.c[:k], buf.o[:k])
        start = g0 * GROUP
        m = min(k * GROUP, n - start)
        torch.mul(buf.o[:k].view(-1)[:m], scale, out=target[start : start + m])


def _fill(
    version: str, key: bytes, draw: int, out: torch.Tensor, std: float
) -> torch.Tensor:
    """Fill ``out`` (any layout, any device) with draw ``draw`` of a stream."""
    flat = out.view(-1) if out.is_contiguous() else None
    if version == "shake256-v1":
        target = flat if flat is not None else torch.empty(out.numel(), dtype=out.dtype)
        _fill_shake256(key, draw, target, std)
    else:
        target = (
            flat
            if flat is not None
            else torch.empty(out.numel(), dtype=out.dtype, device=out.device)
        )
        _fill_chacha20(key, draw, target, std)
    if flat is None:
        out.copy_(target.view(out.shape))
    return out


def secure_standard_normal(
    key: bytes, draw: int, n: int, *, version: str = STREAM_VERSION
) -> np.ndarray:
    """``n`` standard normals of draw ``draw`` of the stream keyed by ``key``.

    A pure function of ``(key, draw, n)``; with ``"chacha20-v2"`` output
    ``i`` does not depend on ``n`` (a longer draw extends a shorter one).

    Parameters
    ----------
    key : bytes
        32-byte stream key.
    draw : int
        Index of the draw in the stream (``0 <= draw < 2⁶⁴``).
    n : int
        How many normals (>= 0).
    version : str
        The stream (:data:`STREAM_VERSIONS`).

    Returns
    -------
    numpy.ndarray
        float64 array of shape ``(n,)``.
    """
    check_key("key", key)
    check_stream_version("version", version)
    out = torch.empty(n, dtype=torch.float64)
    return _fill(version, key, _check_draw(draw), out, 1.0).numpy()


def _check_draw(draw: int) -> int:
    if not 0 <= draw < 2**64:
        raise InvalidParameterError(f"draw must be in [0, 2**64); got {draw}")
    return int(draw)


class SecureGenerator:
    """A party's secret noise stream in one round (stands in for a torch.Generator).

    Each call draws the next draw of the stream (:func:`secure_standard_normal`
    with the call's index), so the same key and the same sequence of calls
    give the same noise, on any worker, in any process, after any restart.

    Parameters
    ----------
    key : bytes
        The party's derived 32-byte key (the stream key is
        ``HMAC(key, "noise")``).
    device : str or torch.device
        Where the noise tensors go by default (callers allocate there); each
        draw is computed on the device of the tensor it fills.
    version : str
        The stream (:data:`STREAM_VERSIONS`; default :data:`STREAM_VERSION`):
        a run resumes with the version it started with.

    Attributes
    ----------
    device : torch.device
        As given.
    version : str
        As given.
    draws : int
        Draws made so far.
    """

    __slots__ = ("_key", "device", "draws", "version")

    def __init__(
        self,
        key: bytes,
        device: str | torch.device = "cpu",
        *,
        version: str = STREAM_VERSION,
    ) -> None:
        self._key = derive_key(check_key("key", key), "noise")
        self.device = torch.device(device)
        self.version = check_stream_version("version", version)
        self.draws = 0

    def __repr__(self) -> str:  # never show the key
        return (
            f"SecureGenerator(device={self.device}, version={self.version}, "
            f"draws={self.draws})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        raise DpflError(
            "a SecureGenerator is not shipped: send the party's derived key "
            "and make the generator where it draws"
        )

    def reserve(self) -> int:
        """Take the index of the next draw (for a draw made later or elsewhere)."""
        index = self.draws
        self.draws += 1
        return index

    def normal_(
        self, out: torch.Tensor, std: float = 1.0, *, draw: int | None = None
    ) -> torch.Tensor:
        """Fill ``out`` with ``N(0, std²)`` noise of the next draw, in place.

        Parameters
        ----------
        out : torch.Tensor
            Floating tensor, any device (the draw is computed there).
        std : float
            Standard deviation (applied in float64 before the cast to
            ``out``'s dtype).
        draw : int or None
            A draw index from :meth:`reserve` (``None``: the next one).

        Returns
        -------
        torch.Tensor
            ``out``.
        """
        index = self.reserve() if draw is None else draw
        return _fill(self.version, self._key, index, out, std)


#: What a noise draw takes: a seeded torch generator (reproducible mode) or a
#: secure keyed stream.
NoiseGenerator = torch.Generator | SecureGenerator


def fill_normal_(
    out: torch.Tensor, generator: NoiseGenerator, std: float = 1.0
) -> torch.Tensor:
    """Fill ``out`` with ``N(0, std²)`` from ``generator``, in place.

    The one place where dpfl draws Gaussian noise: a :class:`SecureGenerator`
    draws its next secure draw, a ``torch.Generator`` (reproducible mode)
    ``out.normal_(0, std, generator=generator)``.
    """
    if isinstance(generator, SecureGenerator):
        return generator.normal_(out, std)
    return out.normal_(0.0, std, generator=generator)


def fill_normal_rows_(
    out: torch.Tensor, generators: Sequence[NoiseGenerator], std: float = 1.0
) -> torch.Tensor:
    """Fill row ``j`` of ``out`` with ``N(0, std²)`` from ``generators[j]``, in place.

    Row ``j`` gets exactly what ``fill_normal_(out[j], generators[j], std)``
    gives, the rows in order (so each generator's next draw, as if the rows
    were drawn one after another). On CUDA, where every generator is a
    :class:`SecureGenerator` of ``chacha20-v2`` and the fused Triton kernel
    of many rows passed its probe on the device, all rows are one kernel
    launch; otherwise they are drawn one at a time. Used for the per-client
    noise of a cohort's local steps (one launch a step, not one a client).

    Parameters
    ----------
    out : torch.Tensor
        ``[rows, n]`` floating tensor.
    generators : sequence of torch.Generator or SecureGenerator
        One per row.
    std : float
        The noise's standard deviation.

    Returns
    -------
    torch.Tensor
        ``out``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``out`` is not 2-D or there is not one generator per row.
    """
    if out.dim() != 2 or len(generators) != out.shape[0]:
        raise InvalidParameterError(
            f"out must be [rows, n] with one generator per row; got shape "
            f"{tuple(out.shape)} and {len(generators)} generators"
        )
    rows = (
        _chacha._fused_rows(out.device)  # None except on CUDA
        if out.shape[0] > 1
        and out.dtype in _FUSED_DTYPES
        and out.stride(1) == 1
        and 0 < out.shape[1] <= MAX_DRAW
        and all(
            isinstance(g, SecureGenerator) and g.version in CHACHA_VERSIONS
            for g in generators
        )
        else None
    )
    if rows is None:
        for row, g in zip(out, generators, strict=True):
            fill_normal_(row, g, std)
        return out
    secure = cast(Sequence[SecureGenerator], generators)
    draws = [g.reserve() for g in secure]
    states = [
        _chacha._initial_state(g._key, _chacha._nonce(d), 0)
        for g, d in zip(secure, draws, strict=True)
    ]
    try:
        rows(out, states, 0.5 * std)
    except Exception as exc:  # noqa: BLE001 - failing later: one row at a time
        log.warning(
            "secure noise: the fused Triton kernel of many rows failed (%s: %s); "
            "drawing one row at a time from now on",
            type(exc).__name__,
            str(exc).splitlines()[0] if str(exc) else "",
        )
        with _chacha._FUSED_LOCK:
            entry = _chacha._FUSED.get(out.device)
            if isinstance(entry, _chacha._Fused):
                _chacha._FUSED[out.device] = dataclasses.replace(
                    entry, rows=None, rows_why=f"it failed: {type(exc).__name__}"
                )
        for row, g, d in zip(out, secure, draws, strict=True):
            g.normal_(row, std, draw=d)
    return out
