"""The presets: ``dpfl train`` configs for each paper's experiment.

Presets ship inside the package (``dpfl/presets/*.yaml``, package data in the
wheel), one YAML per paper and scale. :func:`find_preset` locates one by
name, :func:`resolve_config` turns a command's configuration argument (a file
or a preset name) into a file, and ``dpfl presets list|show|copy`` shows them
(``dpfl reproduce`` runs them through ``dpfl sweep``).
"""

from __future__ import annotations

from pathlib import Path

from dpfl.errors import DpflError

__all__ = ["PRESET_DIR", "find_preset", "list_presets", "resolve_config"]

#: The folder the presets ship in (inside the installed package).
PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"


def list_presets() -> list[str]:
    """Names of the presets, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _unknown(name: str) -> DpflError:
    from difflib import get_close_matches

    names = list_presets()
    close = get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return DpflError(
        f"no configuration file or preset {name!r}; {hint}dpfl presets list shows "
        f"the {len(names)} presets"
    )


def find_preset(name: str) -> Path:
    """Path of preset ``name`` (a YAML file path that exists is returned as is).

    Parameters
    ----------
    name : str
        A preset's name (``"dp-fedavg-digits"``) or a YAML file.

    Returns
    -------
    Path
        The preset's file.

    Raises
    ------
    DpflError
        If no such preset exists (the message lists them).
    """
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return Path(name)
    path = PRESET_DIR / f"{name}.yaml"
    if "/" not in name and "\\" not in name and path.is_file():
        return path
    raise _unknown(name)


def resolve_config(config: str | Path) -> Path:
    """The file a command's configuration argument names: a file, else a preset.

    A path that exists is returned as is; a bare name (no folder, no
    ``.yaml``) that is a preset gives the preset's file; any other path is
    returned as is, so that reading it reports the missing file.

    Parameters
    ----------
    config : str or Path
        What the user passed (``runs/my.yaml`` or ``dp-fedavg-digits``).

    Returns
    -------
    Path
        The configuration file.

    Raises
    ------
    DpflError
        If ``config`` is a bare name that is neither a file nor a preset.
    """
    path = Path(config)
    if path.exists():
        return path
    text = str(config)
    if "/" in text or "\\" in text or text.endswith((".yaml", ".yml")):
        return path
    if (PRESET_DIR / f"{text}.yaml").is_file():
        return PRESET_DIR / f"{text}.yaml"
    raise _unknown(text)
