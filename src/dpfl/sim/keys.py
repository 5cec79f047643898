"""The run's secret key, the keys derived from it, and what they key.

Why a key: a run's seed is written to its ``config.yaml``, so noise drawn
from seeded generators can be drawn again by anyone who reads it and
subtracted from a released model. A run therefore draws its secret
randomness from keys only its owner holds (:mod:`dpfl.sim.secure_noise`).

**The key.** A run has one secret 256-bit key (:func:`new_key`, from the
operating system's CSPRNG). It is never written to ``config.yaml`` or the
checkpoint (the key and a released model together would let anyone subtract
the last round's noise); a run folder keeps it in its own file,
:data:`KEY_FILE`, readable by its owner only (:func:`load_or_create_key`).

**Derivation.** Every party of every round gets its own key,
``HMAC-SHA256(key, label ‖ round ‖ client)`` (:func:`derive_key`); from a
party's key come its index generator (participants, batches: a numpy PCG64
seeded with 256 bits of ``HMAC(party key, "index")``, :func:`index_rng`),
a client's visiting orders of its records (:func:`keyed_orders`, stream
``chacha20-v3``) and its noise stream
(:class:`~dpfl.sim.secure_noise.SecureGenerator`, keyed by ``HMAC(party key,
"noise")``). A worker that runs a client is sent that client's derived key
of that round, never the run's key: it can compute that client's draws in
that round and nothing else (HMAC is a pseudo-random function, so one
derived key says nothing about another).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dpfl.errors import DpflError, InvalidParameterError

__all__ = [
    "KEY_BYTES",
    "KEY_FILE",
    "NOISE_REPRODUCIBLE",
    "NOISE_SECURE",
    "check_key",
    "derive_key",
    "derive_keys",
    "index_rng",
    "keyed_orders",
    "keyed_orders_many",
    "load_or_create_key",
    "new_key",
    "noise_label",
    "read_key_file",
    "write_key_file",
]


#: Length of a run key and of every derived key, in bytes (256 bits).
KEY_BYTES = 32


#: The file of a run folder that holds the run's key (hex, mode 0600).
KEY_FILE = "secret.key"


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
    return keyed_orders_many([key], [num_records], epochs)[0]


def keyed_orders_many(
    keys: Sequence[bytes], counts: Sequence[int], epochs: int
) -> list[np.ndarray]:
    """:func:`keyed_orders` of many parties at once (one sort when sizes agree).

    Parameters
    ----------
    keys : sequence of bytes
        The parties' derived keys.
    counts : sequence of int
        Each party's records.
    epochs : int
        E >= 1.

    Returns
    -------
    list of numpy.ndarray
        ``keyed_orders(keys[j], counts[j], epochs)`` for each ``j``.
    """
    e_count = int(epochs)
    sizes = [int(n) for n in counts]
    words = [
        np.frombuffer(
            hashlib.shake_128(
                b"dpfl/order\x00" + check_key("key", key) + e.to_bytes(8, "little")
            ).digest(8 * n),
            dtype="<u8",
        )
        for key, n in zip(keys, sizes, strict=True)
        for e in range(e_count)
    ]
    if sizes and len(set(sizes)) == 1:  # one stable sort of [parties, E, n]
        table = np.stack(words).reshape(len(sizes), e_count, sizes[0])
        return list(np.argsort(table, axis=-1, kind="stable").astype(np.int64))
    sorts = [np.argsort(w, kind="stable").astype(np.int64) for w in words]
    return [
        np.stack(sorts[j * e_count : (j + 1) * e_count]).reshape(e_count, n)
        for j, n in enumerate(sizes)
    ]


def derive_keys(
    key: bytes, label: str, prefix: Sequence[int], last: Sequence[int]
) -> list[bytes]:
    """``derive_key(key, label, *prefix, i)`` for each ``i`` of ``last``.

    The same bytes as one :func:`derive_key` call each, with ``key`` checked
    once.
    """
    check_key("key", key)
    head = b"dpfl/" + label.encode() + b"\x00"
    head += b"".join(int(i).to_bytes(8, "little") for i in prefix)
    return [
        hmac.digest(key, head + int(i).to_bytes(8, "little"), "sha256") for i in last
    ]


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
