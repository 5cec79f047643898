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

**The sampler.** Draw ``i`` of a stream is SHAKE-256 in counter mode over
``(domain, key, i, chunk)`` (FIPS 202), read as little-endian 64-bit words,
each cut to its top 53 bits: the first half of a chunk's words give the
uniforms ``u₁ ∈ (0, 1]``, the second half the ``u₂ ∈ [0, 1)``, and the
Box–Muller transform in float64 turns each pair into two standard normals.

**The guard against floating-point attacks.** Mironov (2012, "On
significance of the least significant bits for differential privacy", ACM
CCS) showed that a textbook floating-point Laplace sampler leaves gaps whose
pattern reveals the unnoised value; Holohan & Braghin (2021, "Secure random
sampling in differential privacy", ESORICS) showed the same for Gaussian
samplers (Box–Muller and the polar method) and that summing several
independent normal samples closes the gaps. Each output here is, as in
Opacus's ``secure_mode``, the sum of four independent Box–Muller normals
divided by 2 (exactly ``N(0, 1)`` in distribution; the division by a power
of two is exact in floating point), then scaled by the noise std.

Cost: four normals and 32 bytes of SHAKE-256 output per released normal
(``benchmarks/secure_noise.py`` prints the time per million and the
overhead per round of typical runs).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
from pathlib import Path

import numpy as np
import torch

from dpfl.errors import DpflError, InvalidParameterError

__all__ = [
    "GUARD_SAMPLES",
    "KEY_BYTES",
    "KEY_FILE",
    "NoiseGenerator",
    "SecureGenerator",
    "derive_key",
    "fill_normal_",
    "index_rng",
    "load_or_create_key",
    "new_key",
    "noise_label",
    "read_key_file",
    "secure_standard_normal",
    "write_key_file",
]

#: Length of a run key and of every derived key, in bytes (256 bits).
KEY_BYTES = 32
#: The file of a run folder that holds the run's key (hex, mode 0600).
KEY_FILE = "secret.key"
#: Box–Muller normals summed (then divided by the square root, 2) per output.
GUARD_SAMPLES = 4
#: The keystream this module draws (a run records it in ``run.json``; a run
#: resumes only with the stream it started with).
STREAM_VERSION = "shake256-v1"

_DOMAIN = b"dpfl/secure-normal/v1"
_CHUNK = 1 << 13  # outputs per SHAKE-256 call (256 KiB of stream: stays in cache)
_TWO_PI = 2.0 * np.pi
_U53 = 2.0**-53


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
    return hmac.new(key, msg, hashlib.sha256).digest()


def index_rng(key: bytes) -> np.random.Generator:
    """The numpy generator of a party's index draws (participants, batches).

    A PCG64 seeded with the 256 bits of ``HMAC(key, "index")``: without the
    key, its draws cannot be computed from the run's configuration.
    """
    entropy = int.from_bytes(derive_key(key, "index"), "little")
    return np.random.default_rng(np.random.SeedSequence(entropy))


def _chunk(key: bytes, draw: int, chunk: int, n: int) -> np.ndarray:
    """Outputs ``chunk·8192 …`` of draw ``draw``: ``n`` guarded standard normals.

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


def secure_standard_normal(key: bytes, draw: int, n: int) -> np.ndarray:
    """``n`` standard normals of draw ``draw`` of the stream keyed by ``key``.

    A pure function of ``(key, draw, n)``. Outputs come in chunks of 8,192,
    each from its own SHAKE-256 call, so the memory used is bounded and whole
    chunks do not depend on ``n``.

    Parameters
    ----------
    key : bytes
        32-byte stream key.
    draw : int
        Index of the draw in the stream (>= 0).
    n : int
        How many normals (>= 0).

    Returns
    -------
    numpy.ndarray
        float64 array of shape ``(n,)``.
    """
    check_key("key", key)
    out = np.empty(n, dtype=np.float64)
    for c, start in enumerate(range(0, n, _CHUNK)):
        stop = min(n, start + _CHUNK)
        out[start:stop] = _chunk(key, draw, c, stop - start)
    return out


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
        Where the noise tensors go (they are computed on the CPU).

    Attributes
    ----------
    device : torch.device
        As given.
    draws : int
        Draws made so far.
    """

    __slots__ = ("_key", "device", "draws")

    def __init__(self, key: bytes, device: str | torch.device = "cpu") -> None:
        self._key = derive_key(check_key("key", key), "noise")
        self.device = torch.device(device)
        self.draws = 0

    def __repr__(self) -> str:  # never show the key
        return f"SecureGenerator(device={self.device}, draws={self.draws})"

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
            Floating tensor, any device.
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
        n = out.numel()
        flat = out.view(-1) if out.is_contiguous() else None
        target = flat if flat is not None else torch.empty(n, dtype=out.dtype)
        for c, start in enumerate(range(0, n, _CHUNK)):
            stop = min(n, start + _CHUNK)
            z = _chunk(self._key, index, c, stop - start)
            if std != 1.0:
                z *= std
            target[start:stop].copy_(torch.from_numpy(z))
        if flat is None:
            out.copy_(target.view(out.shape))
        return out


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
