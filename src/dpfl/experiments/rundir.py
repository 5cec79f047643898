"""A run folder's integrity: one process at a time, a frozen definition, checksums.

:class:`RunLock`
    An exclusive ``flock`` on ``RUN_DIR/.lock``, held for the whole of
    ``dpfl train`` or ``dpfl resume``. A second process on the same folder
    refuses at once (:class:`RunFolderBusyError`, one line, exit status 2). The
    operating system releases the lock when the holder dies, ``kill -9``
    included, so nothing is left stuck; the empty ``.lock`` file stays.
:func:`clean_orphans`
    Removes the temporary files an atomic write leaves when it is killed
    between creating and renaming them (``.ledger.json.XXXX``,
    ``.checkpoint.pt.XXXX``, ...); called once the lock is held, so no live
    writer owns them.
``run.json`` (:func:`write_manifest`, :func:`check_frozen`, :func:`check_identity`)
    Written when a run starts: the run's *identity*. Its *frozen* definition
    (the ``data``, ``model``, ``loss``, ``algorithm`` and ``privacy``
    sections with σ as calibrated, a model's or loss's factory with the
    SHA-256 of its file, ``seed`` and ``rounds``: :data:`FROZEN_KEYS`); the
    fingerprint of its secret key (:func:`key_fingerprint`, an HMAC of a
    fixed label under the key: it names the key without revealing it); the
    fingerprint of its data (:func:`data_fingerprint`: every training and
    test record, label and client's record list, as read and partitioned);
    and the secure noise stream it draws from
    (:data:`dpfl.sim.secure_noise.STREAM_VERSION` when it starts; a resumed
    run draws from the stream it recorded, :func:`recorded_stream`). Their
    digest is the run digest. The ledger's header carries the run digest and
    the key fingerprint, its hash chain every round's model digest; every
    checkpoint carries the run digest, the ledger's entry count and chain
    hash when it was taken. ``dpfl resume`` refuses, in one line naming the
    file: a ``config.yaml`` whose frozen keys differ from ``run.json``
    (naming them); a factory whose file changed (naming the file, as the
    configuration is read); a key or data other than the run's; a noise
    stream this dpfl lacks; a ledger or checkpoint of another run; a checkpoint whose
    model is not the one the ledger recorded for its round; and a missing
    ledger beside a run that started.
``secret.key`` (:func:`create_run_key`, :func:`read_run_key`)
    The run's secret noise key, made when the run starts, readable by its
    owner only. A new run refuses a folder that already holds a key (or a
    ledger, checkpoint or ``run.json``): two runs with one key draw the same
    noise, and the difference of their releases cancels it. A key file that
    its group or others may read or write is refused, with the ``chmod`` to
    run.

What the checksums defend against: accidents (a truncated or corrupted file,
a file from another run copied in, two runs' files swapped, a half-finished
write) and careless edits
(``noise_multiplier: 0`` written into a stopped run's ``config.yaml``, an
entry's σ raised, entries or the ledger deleted, a checkpoint's round count
zeroed). They are plain SHA-256 digests without a secret: someone with write
access to the folder who recomputes them (with dpfl's own code) is not
stopped. A guarantee against such an operator needs the ledger kept where
they cannot write (an append-only store, a signing service).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import hmac
import json
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpfl._files import atomic_write, digest
from dpfl.data.dataset import ClientIndices
from dpfl.errors import DpflError

__all__ = [
    "CHECKPOINT",
    "CONFIG",
    "FROZEN_KEYS",
    "GUARANTEE",
    "KEY_FILE",
    "LEDGER",
    "LOCK",
    "MANIFEST",
    "METRICS",
    "RUN_FILES",
    "RunFolderBusyError",
    "RunLock",
    "check_frozen",
    "check_identity",
    "check_new_folder",
    "clean_orphans",
    "create_run_key",
    "data_fingerprint",
    "frozen",
    "key_fingerprint",
    "read_manifest",
    "read_run_key",
    "recorded_stream",
    "run_lock",
    "write_config",
    "write_manifest",
]

LOCK = ".lock"
MANIFEST = "run.json"
#: The run's secret key file (:data:`dpfl.sim.keys.KEY_FILE`).
KEY_FILE = "secret.key"
#: The resolved configuration (σ as calibrated).
CONFIG = "config.yaml"
#: One JSON line per completed round.
METRICS = "metrics.jsonl"
#: The privacy ledger (and its journal, ``ledger.json.journal``).
LEDGER = "ledger.json"
#: The trainer's state.
CHECKPOINT = "checkpoint.pt"
#: What the run's privacy amounts to, written when the run ends.
GUARANTEE = "guarantee.json"
_MANIFEST_FORMAT = 2
#: The files whose presence means a folder holds (or held) a run: a new run
#: refuses such a folder.
RUN_FILES = (LEDGER, CHECKPOINT, MANIFEST, KEY_FILE)

#: Top-level config keys fixed when a run starts. The others (``name``,
#: ``output_dir``, ``execution``, ``ray``, ``device``, ``max_clients``,
#: ``eval_every``, ``checkpoint_every``) say where and how the run is
#: computed, not what it releases. A model or loss of the user's code is
#: recorded with the SHA-256 of the file that defines it (``factory_sha256``).
FROZEN_KEYS = ("data", "model", "loss", "algorithm", "privacy", "seed", "rounds")
#: Frozen keys recorded only when set: a run without them has the identity
#: (and run digest) it had before they existed.
_FROZEN_WHEN_SET = ("loss",)

#: Files of a run folder written through a temporary file and a rename.
_ATOMIC = (
    CONFIG,
    METRICS,
    LEDGER,
    CHECKPOINT,
    GUARANTEE,
    KEY_FILE,  # linked, never renamed over
    MANIFEST,
)


class RunFolderBusyError(DpflError):
    """Another process holds the run folder's lock."""


class RunLock:
    """An exclusive, non-blocking ``flock`` on ``RUN_DIR/.lock``.

    Parameters
    ----------
    run_dir : str or Path
        The run folder (created if missing).

    Examples
    --------
    >>> # with RunLock(run_dir): ...  # a second process refuses meanwhile
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or refuse at once.

        Raises
        ------
        RunFolderBusyError
            If another process holds it (the message names its pid).
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(fd)
                raise
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise RunFolderBusyError(
                f"{self.run_dir} is in use by another dpfl process{who}: one run "
                "at a time per folder; wait for it to end or choose another name"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Release the lock (the file stays: removing it would race)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def run_lock(run_dir: str | Path) -> Iterator[list[Path]]:
    """Hold the folder's :class:`RunLock` and clean its orphans; yields them.

    Raises
    ------
    RunFolderBusyError
        If another process holds the folder.
    """
    with RunLock(run_dir):
        yield clean_orphans(run_dir)


def clean_orphans(run_dir: str | Path) -> list[Path]:
    """Remove temporary files left by killed atomic writes; returns them.

    Only names of the form ``.NAME.XXXX`` for the run folder's own files
    (``config.yaml``, ``metrics.jsonl``, ``ledger.json``, ``checkpoint.pt``,
    ``guarantee.json``, ``run.json``) are touched. Call it with the folder's
    lock held.
    """
    d = Path(run_dir)
    removed: list[Path] = []
    if not d.is_dir():
        return removed
    for item in d.iterdir():
        if item.is_file() and any(
            item.name.startswith(f".{name}.") for name in _ATOMIC
        ):
            item.unlink(missing_ok=True)
            removed.append(item)
    return sorted(removed)


def write_config(run_dir: str | Path, tree: dict[str, Any]) -> None:
    """Write a run's resolved configuration (plain data) to ``config.yaml``.

    Atomically (a temporary file and a rename), in the key order given.
    """
    import yaml

    text = yaml.safe_dump(tree, sort_keys=False)
    atomic_write(Path(run_dir) / CONFIG, lambda fh: fh.write(text), binary=False)


def frozen(tree: dict[str, Any]) -> dict[str, Any]:
    """The frozen part of a config's :meth:`~dpfl.experiments.config.RunConfig.to_dict`.

    Normalised through JSON (tuples become lists), as it is written.
    """
    kept = {
        k: tree.get(k)
        for k in FROZEN_KEYS
        if k not in _FROZEN_WHEN_SET or tree.get(k) is not None
    }
    out: dict[str, Any] = json.loads(json.dumps(kept, allow_nan=True))
    return out


def check_new_folder(run_dir: str | Path) -> None:
    """Refuse to start a run in a folder that holds (or held) one.

    Raises
    ------
    DpflError
        Naming the first of :data:`RUN_FILES` found: a key (two runs with
        one key draw the same noise), a ledger, a checkpoint or ``run.json``.
    """
    d = Path(run_dir)
    for name in RUN_FILES:
        path = d / name
        if path.exists() or path.is_symlink():
            what = (
                "a secret key (a new run makes its own: two runs with one key "
                "draw the same noise)"
                if name == KEY_FILE
                else "a run"
            )
            raise DpflError(
                f"{path} exists: {d} already holds {what}; continue it with "
                f"`dpfl resume {d}` or choose another name (--set name=...)"
            )


# -- the secret key --------------------------------------------------------------
_FINGERPRINT_LABEL = b"dpfl/run-key-fingerprint/v1"


def key_fingerprint(key: bytes) -> str:
    """``HMAC-SHA256(key, "dpfl/run-key-fingerprint/v1")``, hex: names a key.

    Equal keys give equal fingerprints; without the key, the fingerprint
    says nothing about it (HMAC is a pseudo-random function) and no noise
    can be computed from it.
    """
    return hmac.new(key, _FINGERPRINT_LABEL, hashlib.sha256).hexdigest()


def create_run_key(run_dir: str | Path) -> bytes:
    """Make a new run's secret key and write it to ``run_dir/secret.key`` (0600).

    Raises
    ------
    DpflError
        If the folder already holds a key file (never replaced or adopted).
    """
    from dpfl.sim import keys

    path = Path(run_dir) / KEY_FILE
    if path.exists() or path.is_symlink():
        raise DpflError(
            f"{path} exists: a new run makes its own key and never adopts one "
            "(two runs with one key draw the same noise); choose another name"
        )
    key = keys.new_key()
    keys.write_key_file(path, key)
    return key


def read_run_key(run_dir: str | Path) -> bytes:
    """Read a started run's secret key, refusing a file others may read.

    Raises
    ------
    DpflError
        If the file is missing, is not a regular file of its own (a link
        to another run's key), may be read or written by its group or others
        (the message gives the ``chmod 600`` to run), or does not hold a key.
    """
    from dpfl.sim import keys

    path = Path(run_dir) / KEY_FILE
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise DpflError(
            f"{path} is missing: this run draws secret noise (privacy.secure_noise) "
            "and cannot be resumed without its key; start a new run"
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise DpflError(
            f"{path} is not a regular file (a link or a device): a run's key is "
            "its own file; refusing it"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise DpflError(
            f"{path} may be read or written by its group or others (mode "
            f"{mode:04o}): a secret key is its owner's only; run `chmod 600 "
            f"{path}` and resume"
        )
    return keys.read_key_file(path)


# -- the data ----------------------------------------------------------------------
_ROWS_PER_CHUNK = 1 << 14
_CLIENTS_PER_CHUNK = 1 << 14


def _feed(h: Any, label: str, value: Any) -> None:
    """Hash a labelled array (or lazy feature source, or None) into ``h``."""
    if value is None:
        h.update(f"{label}:none;".encode())
        return
    data = getattr(value, "data", None)
    if isinstance(data, np.ndarray) and not isinstance(value, np.ndarray):
        value = data  # a ScaledUint8Features: its stored bytes
    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        h.update(f"{label}:{arr.dtype.str}:{arr.shape};".encode())
        h.update(arr.reshape(-1).data.cast("B"))
        return
    shape = tuple(int(n) for n in value.shape)  # a lazy source: record by record
    h.update(f"{label}:lazy:{shape};".encode())
    for start in range(0, shape[0], _ROWS_PER_CHUNK):
        part = np.ascontiguousarray(value[start : start + _ROWS_PER_CHUNK])
        h.update(part.reshape(-1).data.cast("B"))


def _feed_clients(h: Any, label: str, table: Sequence[np.ndarray]) -> None:
    """``_feed(h, label, rows)`` for each client's rows in turn, a chunk at a time.

    The same bytes as that loop (each client's header, naming its number of
    rows, then its rows as int64), fed in one update per chunk of clients:
    fingerprints stay those of run folders written before, at a few
    hundred nanoseconds a client.
    """
    flat = ClientIndices.of(table)
    rows = np.ascontiguousarray(flat.rows, dtype=np.int64)
    data = rows.data.cast("B")
    width, tag = rows.itemsize, rows.dtype.str
    heads: dict[int, bytes] = {}
    for start in range(0, len(flat), _CLIENTS_PER_CHUNK):
        bounds = flat.offsets[start : start + _CLIENTS_PER_CHUNK + 1].tolist()
        parts: list[bytes | memoryview] = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            head = heads.get(hi - lo)
            if head is None:
                head = heads[hi - lo] = f"{label}:{tag}:({hi - lo},);".encode()
            parts.append(head)
            parts.append(data[lo * width : hi * width])
        h.update(b"".join(parts))


def data_fingerprint(dataset: Any) -> str:
    """SHA-256 of a federated data set as a run reads it: records and partition.

    Covers every training record (features, labels), each client's record
    indices, the test set and each client's test rows, the number of classes
    and the input shape: the data's files as read and the partition as drawn.
    Changed data (a file edited, a record moved from one client to another)
    changes it.

    Parameters
    ----------
    dataset : FederatedDataset
        The data.

    Returns
    -------
    str
        64 hex digits.
    """
    h = hashlib.sha256()
    h.update(
        f"classes:{dataset.num_classes};shape:{tuple(dataset.input_shape)};".encode()
    )
    _feed(h, "features", dataset.features)
    _feed(h, "labels", np.asarray(dataset.labels))
    h.update(f"clients:{len(dataset.client_indices)};".encode())
    _feed_clients(h, "c", dataset.client_indices)
    _feed(h, "test_features", dataset.test_features)
    _feed(
        h,
        "test_labels",
        None if dataset.test_labels is None else np.asarray(dataset.test_labels),
    )
    tests = dataset.client_test_indices
    h.update(f"client_tests:{'none' if tests is None else len(tests)};".encode())
    if tests is not None:
        _feed_clients(h, "t", tests)
    return h.hexdigest()


# -- run.json ----------------------------------------------------------------------
def _identity(
    fixed: dict[str, Any], key: str | None, data: str | None, stream: str | None
) -> dict[str, Any]:
    return {"frozen": fixed, "key": key, "data": data, "stream_version": stream}


def run_digest(
    tree: dict[str, Any],
    *,
    key: str | None,
    data: str | None,
    stream_version: str | None,
) -> str:
    """The run digest of a resolved configuration and its fingerprints.

    Parameters
    ----------
    tree : dict
        ``RunConfig.to_dict()`` (σ filled in).
    key : str or None
        :func:`key_fingerprint` of the run's key (``None``: no secure noise).
    data : str or None
        :func:`data_fingerprint` of its data.
    stream_version : str or None
        The secure noise stream the run draws from
        (:data:`dpfl.sim.secure_noise.STREAM_VERSION` when it starts;
        ``None``: no secure noise).
    """
    return digest(_identity(frozen(tree), key, data, stream_version))


def write_manifest(
    run_dir: str | Path,
    tree: dict[str, Any],
    *,
    key: str | None,
    data: str | None,
    stream_version: str | None,
    torch_threads: int | None = None,
) -> str:
    """Write ``run.json`` for a starting run; returns the run digest.

    Parameters
    ----------
    run_dir : str or Path
        The run folder.
    tree : dict
        The resolved configuration (``RunConfig.to_dict()``, σ filled in).
    key, data, stream_version : str or None
        As :func:`run_digest`.
    torch_threads : int or None
        The torch thread count the run computes with (outside the identity:
        it does not define the run, but a resumed run replays its rounds bit
        for bit only with it, since matrix products sum in an order that
        depends on it).
    """
    fixed = frozen(tree)
    run = digest(_identity(fixed, key, data, stream_version))
    manifest: dict[str, Any] = {
        "format": _MANIFEST_FORMAT,
        "run": run,
        **_identity(fixed, key, data, stream_version),
    }
    if torch_threads is not None:
        manifest["torch_threads"] = int(torch_threads)
    text = json.dumps(manifest, indent=1)
    atomic_write(Path(run_dir) / MANIFEST, lambda fh: fh.write(text), binary=False)
    return run


def read_manifest(run_dir: str | Path) -> dict[str, Any] | None:
    """Read and check ``run.json`` (``None`` if the folder has none).

    Raises
    ------
    DpflError
        If it is not valid JSON, was written by an older dpfl (without the
        key and data fingerprints), or fails its checksum.
    """
    path = Path(run_dir) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DpflError(f"{path} is corrupted ({exc}); refusing the run") from None
    if isinstance(data, dict) and data.get("format") == 1:
        raise DpflError(
            f"{path} was written by an older dpfl (run.json format 1, without the "
            "key and data fingerprints): finish the run with that version, or "
            "start a new one"
        )
    if (
        not isinstance(data, dict)
        or data.get("format") != _MANIFEST_FORMAT
        or not isinstance(data.get("frozen"), dict)
        or not all(k in data for k in ("key", "data", "stream_version"))
    ):
        raise DpflError(f"{path} is not a dpfl run manifest")
    identity = _identity(
        data["frozen"], data["key"], data["data"], data["stream_version"]
    )
    if digest(identity) != data.get("run"):
        raise DpflError(
            f"{path} fails its checksum: the run's frozen definition or "
            "fingerprints were altered; refusing the run"
        )
    return data


def recorded_stream(
    manifest: dict[str, Any], run_dir: str | Path, available: tuple[str, ...]
) -> str | None:
    """The secure noise stream a resumed run draws from: the one it started with.

    The one place where ``run.json``'s ``"stream_version"`` is read. A run
    continues with the stream it recorded (an older stream included, so that
    it draws what the uninterrupted run drew), if this dpfl has it.

    Parameters
    ----------
    manifest : dict
        :func:`read_manifest`'s result.
    run_dir : str or Path
        The run folder (named in the message).
    available : tuple of str
        The streams this dpfl draws (:data:`dpfl.sim.secure_noise.STREAM_VERSIONS`).

    Returns
    -------
    str or None
        The stream (``None``: the run draws no secure noise).

    Raises
    ------
    DpflError
        One line naming ``run.json``, if this dpfl does not have the stream.
    """
    stream = manifest["stream_version"]
    if stream is None:
        return None
    if stream not in available:
        raise DpflError(
            f"{Path(run_dir) / MANIFEST} says the run draws secure noise from stream "
            f"{stream!r}, which this dpfl does not have (it has "
            f"{', '.join(available)}): resume it with the dpfl that started it"
        )
    return str(stream)


def check_identity(
    manifest: dict[str, Any],
    run_dir: str | Path,
    *,
    key: str | None,
    data: str,
) -> None:
    """Refuse a key or data other than those the run started with.

    Parameters
    ----------
    manifest : dict
        :func:`read_manifest`'s result.
    run_dir : str or Path
        The run folder (named in the messages).
    key : str or None
        :func:`key_fingerprint` of the key file now in the folder (``None``:
        no secure noise).
    data : str
        :func:`data_fingerprint` of the data as read now.

    Raises
    ------
    DpflError
        One line naming the file: ``secret.key`` (another run's key) or the
        data (changed since the run started).
    """
    d = Path(run_dir)
    if manifest["key"] != key:
        raise DpflError(
            f"{d / KEY_FILE} is not this run's key (its fingerprint differs from "
            f"the one {MANIFEST} recorded): a key copied or swapped in from another "
            "run would draw that run's noise; restore the run's own key file"
        )
    if manifest["data"] != data:
        raise DpflError(
            f"the data of {d} changed since the run started (its fingerprint "
            f"differs from the one {MANIFEST} recorded): a record moved, added or "
            "edited changes what the ledger covers; restore the data or start a "
            "new run"
        )


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted({*a, *b}):
            out += _differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def check_frozen(manifest: dict[str, Any], tree: dict[str, Any]) -> None:
    """Refuse a configuration whose frozen keys differ from the manifest's.

    Parameters
    ----------
    manifest : dict
        :func:`read_manifest`'s result.
    tree : dict
        The configuration as loaded from ``config.yaml`` (before any
        calibration).

    Raises
    ------
    DpflError
        Naming each changed key with the frozen and the current value.
    """
    fixed, now = manifest["frozen"], frozen(tree)
    changed = _differences(fixed, now)
    if changed:

        def value(t: Any, key: str) -> Any:
            for part in key.split("."):
                t = t.get(part) if isinstance(t, dict) else None
            return t

        items = "; ".join(
            f"{k}: {value(fixed, k)!r} when the run started, now {value(now, k)!r}"
            for k in changed[:5]
        )
        raise DpflError(
            f"config.yaml no longer matches the run it belongs to ({items}): "
            "the privacy settings, data, model and algorithm are frozen when a "
            "run starts; restore them or start a new run"
        )
