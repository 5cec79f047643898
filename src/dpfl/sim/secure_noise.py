"""Secret, cryptographically secure Gaussian noise, keyed so that it can be replayed.

Why: a run's seed is written to its ``config.yaml``. Noise drawn from seeded
simulator generators (PCG64, torch's Philox/Mersenne) can be drawn again by
anyone who reads the config and runs dpfl's code, and subtracted from a
released model: the noise then protects nothing. By default a run therefore
draws its noise from a stream that only the holder of a secret key can
compute.

**The key.** A run has one secret 256-bit key (:func:`new_key`, from the
operating system's CSPRNG). It is never written to ``config.yaml`` or the
checkpoint (the key and a released model together would let anyone subtract
the last round's noise); a run folder keeps it in its own file,
:data:`KEY_FILE`, readable by its owner only (:func:`load_or_create_key`).

**Derivation.** Every party of every round gets its own key,
``HMAC-SHA256(key, label ‖ round ‖ client)`` (:func:`derive_key`); from a
party's key come its index generator (participants, batches: a numpy PCG64
seeded with 256 bits of ``HMAC(party key, "index")``) and its noise stream
(:class:`SecureGenerator`, keyed by ``HMAC(party key, "noise")``). A worker
that runs a client is sent that client's derived key of that round, never
the run's key: it can compute that client's noise in that round and nothing
else (HMAC is a pseudo-random function, so one derived key says nothing about
another).

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
integer operations (32-bit words held in int64), compiled with
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
import hmac
import logging
import math
import os
import secrets
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from dpfl.errors import DpflError, InvalidParameterError

try:  # OpenSSL's ChaCha20 for the CPU (the `train` extra installs it)
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    _OPENSSL = sys.byteorder == "little"  # its bytes are read as native int64
except ImportError:  # pragma: no cover - exercised where cryptography is absent
    _OPENSSL = False

__all__ = [
    "CHACHA_VERSIONS",
    "GROUP",
    "GUARD_SAMPLES",
    "KEY_BYTES",
    "KEYED_ORDER_VERSIONS",
    "KEY_FILE",
    "MAX_DRAW",
    "STREAM_VERSION",
    "STREAM_VERSIONS",
    "NoiseGenerator",
    "SecureGenerator",
    "chacha20_keystream",
    "check_stream_version",
    "derive_key",
    "fill_normal_",
    "fill_normal_rows_",
    "index_rng",
    "keyed_orders",
    "load_or_create_key",
    "new_key",
    "noise_kernel",
    "noise_label",
    "read_key_file",
    "secure_standard_normal",
    "write_key_file",
]

log = logging.getLogger(__name__)

#: Length of a run key and of every derived key, in bytes (256 bits).
KEY_BYTES = 32
#: The file of a run folder that holds the run's key (hex, mode 0600).
KEY_FILE = "secret.key"
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

#: Outputs per group of the ChaCha20 stream (32 KiB of keystream, 512 blocks).
GROUP = 1024
_GROUP_BLOCKS = GROUP * 32 // 64
#: Most outputs of one ChaCha20 draw (its 32-bit block counter, 2 outputs a block).
MAX_DRAW = 2**33
#: Groups per piece on the CPU (8,192 outputs: the piece's buffers, 704 KiB,
#: stay in cache).
_CPU_GROUPS = 8
#: Groups per piece elsewhere (a million outputs: 32 MiB of keystream words).
_DEVICE_GROUPS = 1024

# shake256-v1
_DOMAIN = b"dpfl/secure-normal/v1"
_CHUNK = 1 << 13  # outputs per SHAKE-256 call (256 KiB of stream: stays in cache)
_TWO_PI = 2.0 * np.pi
_U53 = 2.0**-53

# chacha20-v2: u = (s + 2^52 + 1)·2^-53 and θ = s·π/2^52
_U_OFFSET = 0.5 + _U53
_ANGLE = math.pi * 2.0**-52
#: Those two as float64 scalar tensors, per device (an int64 tensor and a
#: float64 scalar tensor give float64; a Python float would give float32).
_SCALARS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
_SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
_M32 = 0xFFFFFFFF


#: How a run report labels the two noise modes.
NOISE_SECURE = "secure"
NOISE_REPRODUCIBLE = (
    "reproducible (seeded: anyone with the config can regenerate the noise; "
    "not for release)"
)


def noise_label(secure: bool) -> str:
    """The run report's label of the noise mode (``"noise"`` in guarantee.json)."""
    return NOISE_SECURE if secure else NOISE_REPRODUCIBLE


def new_key() -> bytes:
    """A fresh secret run key: 32 bytes from the operating system's CSPRNG."""
    return secrets.token_bytes(KEY_BYTES)


def check_key(name: str, key: object) -> bytes:
    """Return ``key`` if it is a 32-byte ``bytes``, else raise naming ``name``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``key`` is not 32 bytes.
    """
    if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        what = f"{len(key)} bytes" if isinstance(key, bytes) else type(key).__name__
        raise InvalidParameterError(
            f"{name} must be {KEY_BYTES} bytes (a key from dpfl.sim.secure_noise."
            f"new_key()); got {what}"
        )
    return key


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


def derive_key(key: bytes, label: str, *indices: int) -> bytes:
    """``HMAC-SHA256(key, "dpfl/" ‖ label ‖ indices)``: a key for one purpose.

    Parameters
    ----------
    key : bytes
        A 32-byte key (the run's, or one derived from it).
    label : str
        What the derived key is for (e.g. ``"server"``, ``"client"``).
    *indices : int
        Non-negative integers (round, client), each as 8 little-endian bytes.

    Returns
    -------
    bytes
        32 bytes, pseudo-random and independent for each distinct
        ``(label, indices)``.
    """
    check_key("key", key)
    msg = b"dpfl/" + label.encode() + b"\x00"
    msg += b"".join(int(i).to_bytes(8, "little") for i in indices)
    return hmac.digest(key, msg, "sha256")  # one-shot HMAC (same bytes as hmac.new)


def index_rng(key: bytes) -> np.random.Generator:
    """The numpy generator of a party's index draws (participants, batches).

    A PCG64 seeded with the 256 bits of ``HMAC(key, "index")``: without the
    key, its draws cannot be computed from the run's configuration.
    """
    entropy = int.from_bytes(derive_key(key, "index"), "little")
    return np.random.default_rng(np.random.SeedSequence(entropy))


def keyed_orders(key: bytes, num_records: int, epochs: int) -> np.ndarray:
    """A party's visiting orders of its records, one per epoch (``chacha20-v3``).

    Epoch ``e``'s order is the stable ``argsort`` of ``n`` little-endian
    64-bit words of ``SHAKE-128("dpfl/order" ‖ 0 ‖ key ‖ e)`` (``e`` as 8
    little-endian bytes): a uniformly random permutation (up to ties among
    64-bit words, probability below ``n²/2⁶⁵``, broken by position), which
    nobody without the party's key can compute. It costs one hash and one
    sort, where a seeded numpy generator costs a seed expansion first.

    Parameters
    ----------
    key : bytes
        The party's derived key (:func:`dpfl.sim.randomness.client_key`).
    num_records : int
        n >= 0.
    epochs : int
        E >= 1.

    Returns
    -------
    numpy.ndarray
        ``[E, n]`` int64; row ``e`` is a permutation of ``0 .. n-1``.
    """
    key = check_key("key", key)
    n = int(num_records)
    out = np.empty((int(epochs), n), dtype=np.int64)
    for e in range(int(epochs)):
        words = np.frombuffer(
            hashlib.shake_128(b"dpfl/order\x00" + key + e.to_bytes(8, "little")).digest(
                8 * n
            ),
            dtype="<u8",
        )
        out[e] = np.argsort(words, kind="stable")
    return out


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
    if _fused_kernel(device) is not None:
        return "triton"
    return "torch" if _words_kernel(device) is _words else "torch.compile"


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
            fused = _fused_kernel(target.device)
            if fused is not None:
                try:
                    fused(target, _initial_state(key, _nonce(draw), 0), scale)
                    return
                except Exception as exc:  # noqa: BLE001 - failing later: torch ops
                    log.warning(
                        "secure noise: the fused Triton kernel failed (%s: %s); "
                        "using torch operations from now on",
                        type(exc).__name__,
                        str(exc).splitlines()[0] if str(exc) else "",
                    )
                    with _FUSED_LOCK:
                        _FUSED[target.device] = f"it failed: {type(exc).__name__}"
        _fill_torch(key, draw, target, scale, compiled)
        return
    with _one_thread():
        if _OPENSSL if openssl is None else openssl:
            _fill_openssl(key, draw, target, scale)
        else:
            _fill_torch(key, draw, target, scale, compiled)


def _fill_openssl(key: bytes, draw: int, target: torch.Tensor, scale: float) -> None:
    """Draw ``draw`` on the CPU from OpenSSL's keystream, in reused buffers."""
    n = target.numel()
    groups = -(-n // GROUP)
    buf = _CPU
    cipher = Cipher(algorithms.ChaCha20(key, bytes(4) + _nonce(draw)), mode=None)
    stream = cipher.encryptor()
    for g0 in range(0, groups, _CPU_GROUPS):
        k = min(_CPU_GROUPS, groups - g0)
        size = 32 * GROUP * k
        stream.update_into(buf.zeros[:size], buf.raw[:size])
        s = buf.words[:k].bitwise_right_shift_(11)
        _transform(s, buf.r[:k], buf.t[:k], buf.c[:k], buf.o[:k])
        start = g0 * GROUP
        m = min(k * GROUP, n - start)
        torch.mul(buf.o[:k].view(-1)[:m], scale, out=target[start : start + m])


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
        _fused_rows(out.device)  # None except on CUDA
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
        _initial_state(g._key, _nonce(d), 0) for g, d in zip(secure, draws, strict=True)
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
        with _FUSED_LOCK:
            entry = _FUSED.get(out.device)
            if isinstance(entry, _Fused):
                _FUSED[out.device] = dataclasses.replace(
                    entry, rows=None, rows_why=f"it failed: {type(exc).__name__}"
                )
        for row, g, d in zip(out, secure, draws, strict=True):
            g.normal_(row, std, draw=d)
    return out


# -- the key file of a run folder ---------------------------------------------------
def write_key_file(path: str | Path, key: bytes) -> None:
    """Write ``key`` (hex) to ``path`` once, atomically, readable by its owner only.

    The key goes to a temporary file created with mode 0600, is synced, and is
    linked to ``path``, which must not exist: a key is never overwritten.

    Raises
    ------
    dpfl.errors.DpflError
        If ``path`` already exists.
    """
    path = Path(path)
    check_key("key", key)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(key.hex() + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise DpflError(
                f"{path} already exists; a run key is never replaced"
            ) from None
    finally:
        tmp.unlink(missing_ok=True)


def read_key_file(path: str | Path) -> bytes:
    """The key of :func:`write_key_file`.

    Raises
    ------
    dpfl.errors.DpflError
        If the file is missing or does not hold a 32-byte hex key.
    """
    path = Path(path)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise DpflError(f"{path} is missing") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise DpflError(f"{path} does not hold a {KEY_BYTES}-byte hex key")
    return key


def load_or_create_key(run_dir: str | Path, *, started: bool) -> bytes:
    """The secret key of the run in ``run_dir``: read it, or make it if the run is new.

    Parameters
    ----------
    run_dir : str or Path
        The run folder.
    started : bool
        Whether the run has released something already (a checkpoint or a
        ledger exists). A started run without its key file cannot continue
        with the same noise streams, so that is an error.

    Returns
    -------
    bytes
        The 32-byte key.

    Raises
    ------
    dpfl.errors.DpflError
        If ``started`` and the key file is missing, or the file is not a key.
    """
    path = Path(run_dir) / KEY_FILE
    if path.exists():
        return read_key_file(path)
    if started:
        raise DpflError(
            f"{path} is missing: this run draws secret noise (privacy.secure_noise) "
            "and cannot be resumed without its key; start a new run"
        )
    key = new_key()
    write_key_file(path, key)
    return key
