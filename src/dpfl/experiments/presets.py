"""The presets: ``dpfl train`` configs for each paper's experiment.

Presets live in the repository's ``presets/`` folder (one YAML per paper and
scale); :func:`find_preset` locates them from the working directory or the
source checkout (``dpfl reproduce`` runs them through ``dpfl sweep``).
"""

from __future__ import annotations

from pathlib import Path

from dpfl.errors import DpflError

__all__ = ["find_preset", "list_presets"]


def _folders() -> list[Path]:
    here = Path(__file__).resolve()
    return [Path.cwd() / "presets", here.parents[3] / "presets"]


def list_presets() -> list[str]:
    """Names of the presets that can be found."""
    names: set[str] = set()
    for folder in _folders():
        if folder.is_dir():
            names.update(p.stem for p in folder.glob("*.yaml"))
    return sorted(names)


def find_preset(name: str) -> Path:
    """Path of preset ``name`` (a file path is returned as is).

    Raises
    ------
    DpflError
        If no such preset exists.
    """
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return Path(name)
    for folder in _folders():
        path = folder / f"{name}.yaml"
        if path.is_file():
            return path
    raise DpflError(
        f"no preset {name!r}; available: {', '.join(list_presets()) or 'none found'}"
    )
