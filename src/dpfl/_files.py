"""Small file helpers shared by the run folder's writers (no torch).

:func:`atomic_write` replaces a file in one step (temporary file, fsync,
rename), so a reader never sees half of it; :func:`read_jsonl` reads a JSON
Lines file written one record at a time, skipping a line torn by a crash.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "read_jsonl"]

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write(path: Path, write: Callable[[Any], None], *, binary: bool) -> None:
    """Write ``path`` atomically: ``write(fh)`` to a temporary file, then rename.

    Parameters
    ----------
    path : Path
        The file to (re)place; its folder is created if needed.
    write : callable
        Writes the content to the open file handle it is given.
    binary : bool
        Open the temporary file in binary mode.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; use the usual mode
        with os.fdopen(fd, "wb" if binary else "w") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
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
