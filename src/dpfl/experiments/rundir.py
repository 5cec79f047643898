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
``run.json`` (:func:`write_manifest`, :func:`check_frozen`)
    Written when a run starts: the run's *frozen* definition (the ``data``,
    ``model``, ``algorithm`` and ``privacy`` sections with σ as calibrated,
    ``seed`` and ``rounds``: :data:`FROZEN_KEYS`) and its digest, the run
    digest. The ledger's header and every checkpoint carry the run digest;
    the checkpoint also carries the ledger's entry count and chain hash at
    the time it was taken. ``dpfl resume`` refuses a ``config.yaml`` whose
    frozen keys differ from ``run.json`` (naming them), a ledger or checkpoint
    of another run, and a missing ledger beside a run that started.

What the checksums defend against: accidents (a truncated or corrupted file,
a file from another run copied in, a half-finished write) and careless edits
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
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dpfl._files import atomic_write, digest
from dpfl.errors import DpflError

__all__ = [
    "FROZEN_KEYS",
    "LOCK",
    "MANIFEST",
    "RunFolderBusyError",
    "RunLock",
    "check_frozen",
    "clean_orphans",
    "frozen",
    "read_manifest",
    "run_lock",
    "write_manifest",
]

LOCK = ".lock"
MANIFEST = "run.json"
_MANIFEST_FORMAT = 1

#: Top-level config keys fixed when a run starts. The others (``name``,
#: ``output_dir``, ``execution``, ``ray``, ``device``, ``max_clients``,
#: ``eval_every``, ``checkpoint_every``) say where and how the run is
#: computed, not what it releases.
FROZEN_KEYS = ("data", "model", "algorithm", "privacy", "seed", "rounds")

#: Files of a run folder written through a temporary file and a rename.
_ATOMIC = (
    "config.yaml",
    "metrics.jsonl",
    "ledger.json",
    "checkpoint.pt",
    "guarantee.json",
    "secret.key",  # dpfl.sim.secure_noise.KEY_FILE (linked, never renamed over)
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


def frozen(tree: dict[str, Any]) -> dict[str, Any]:
    """The frozen part of a config's :meth:`~dpfl.experiments.config.RunConfig.to_dict`.

    Normalised through JSON (tuples become lists), as it is written.
    """
    out: dict[str, Any] = json.loads(
        json.dumps({k: tree.get(k) for k in FROZEN_KEYS}, allow_nan=True)
    )
    return out


def write_manifest(
    run_dir: str | Path,
    tree: dict[str, Any],
    *,
    torch_threads: int | None = None,
    stream_version: str | None = None,
) -> str:
    """Write ``run.json`` for a starting run; returns the run digest.

    Parameters
    ----------
    run_dir : str or Path
        The run folder.
    tree : dict
        The resolved configuration (``RunConfig.to_dict()``, σ filled in).
    torch_threads : int or None
        The torch thread count the run computes with (outside the frozen
        part: it does not define the run, but a resumed run replays its
        rounds bit for bit only with it, since matrix products sum in an
        order that depends on it).
    stream_version : str or None
        The secure noise stream the run draws from
        (:data:`dpfl.sim.secure_noise.STREAM_VERSION`; outside the frozen
        part too: a resumed run draws from it).
    """
    fixed = frozen(tree)
    run = digest(fixed)
    manifest: dict[str, Any] = {"format": _MANIFEST_FORMAT, "run": run, "frozen": fixed}
    if torch_threads is not None:
        manifest["torch_threads"] = int(torch_threads)
    if stream_version is not None:
        manifest["stream_version"] = str(stream_version)
    text = json.dumps(manifest, indent=1)
    atomic_write(Path(run_dir) / MANIFEST, lambda fh: fh.write(text), binary=False)
    return run


def read_manifest(run_dir: str | Path) -> dict[str, Any] | None:
    """Read and check ``run.json`` (``None`` if the folder has none).

    Raises
    ------
    DpflError
        If it is not valid JSON or fails its checksum.
    """
    path = Path(run_dir) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DpflError(f"{path} is corrupted ({exc}); refusing the run") from None
    if (
        not isinstance(data, dict)
        or data.get("format") != _MANIFEST_FORMAT
        or not isinstance(data.get("frozen"), dict)
    ):
        raise DpflError(f"{path} is not a dpfl run manifest")
    if digest(data["frozen"]) != data.get("run"):
        raise DpflError(
            f"{path} fails its checksum: the run's frozen definition was altered; "
            "refusing the run"
        )
    return data


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
