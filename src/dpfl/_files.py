"""Small file helpers shared by the run folder's writers (no torch).

:func:`atomic_write` replaces a file in one step (temporary file, fsync,
rename), so a reader never sees half of it; :func:`read_jsonl` reads a JSON
Lines file written one record at a time, skipping a line torn by a crash;
:func:`digest` is the SHA-256 of a JSON value in one canonical spelling (the
checksums of ledgers, checkpoints and run manifests).

:func:`fault` is a fault-injection point for crash tests: with the
environment variable ``DPFL_FAULT=NAME:N`` set, the ``N``-th call of
``fault(NAME)`` in the process kills it with SIGKILL (e.g.
``DPFL_FAULT=ledger-journal:5`` dies half-way through the fifth journal
line). Unset (always, outside tests), it does nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "digest", "fault", "read_jsonl"]

_FAULT_HITS: dict[str, int] = {}


def fault(point: str) -> None:
    """Kill this process (SIGKILL) at the point ``DPFL_FAULT`` names, if any.

    Parameters
    ----------
    point : str
        The point's name (``"ledger-journal"``, ``"ledger-save"``,
        ``"checkpoint"``, ``"round"``).
    """
    spec = os.environ.get("DPFL_FAULT")
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name != point:
        return
    _FAULT_HITS[point] = _FAULT_HITS.get(point, 0) + 1
    if _FAULT_HITS[point] == int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def digest(value: Any) -> str:
    """SHA-256 (hex) of a JSON value, keys sorted, no whitespace.

    Parameters
    ----------
    value : JSON-ready value
        What to hash (floats are spelled by ``repr``, so they round-trip).

    Returns
    -------
    str
        64 hex digits.
    """
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write(
    path: Path,
    write: Callable[[Any], None],
    *,
    binary: bool,
    point: str | None = None,
) -> None:
    """Write ``path`` atomically: ``write(fh)`` to a temporary file, then rename.

    Parameters
    ----------
    path : Path
        The file to (re)place; its folder is created if needed.
    write : callable
        Writes the content to the open file handle it is given.
    binary : bool
        Open the temporary file in binary mode.
    point : str or None
        A :func:`fault` point between writing the temporary file and the
        rename (crash tests).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; use the usual mode
        with os.fdopen(fd, "wb" if binary else "w") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        if point is not None:
            fault(point)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON Lines file, in file order.

    Blank lines and a line that is not valid JSON (a crash mid-write tears at
    most the last one) are skipped.

    Parameters
    ----------
    path : Path
        The file (must exist).

    Returns
    -------
    list of dict
        One dict per line.
    """
    out = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
