"""The presets: ``dpfl train`` configs for each paper's experiment.

Presets ship inside the package (``dpfl/presets/*.yaml``, package data in the
wheel), one YAML per paper and scale. :func:`find_preset` locates one by
name, :func:`resolve_config` turns a command's configuration argument (a file
or a preset name) into a file, and ``dpfl presets list|show|copy`` shows them
(``dpfl reproduce`` runs them through ``dpfl sweep``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dpfl.errors import DpflError

__all__ = [
    "PRESET_DIR",
    "find_preset",
    "list_presets",
    "preset_changes",
    "resolve_config",
]

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


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_leaves(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out


def _yaml_scalar(value: Any) -> str:
    # JSON is YAML, except for the non-finite floats
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return json.dumps(value)


def preset_changes(
    base: str, target: str, *, keep: tuple[str, ...] = ("name",)
) -> tuple[str, ...]:
    """The ``--set`` items that turn preset ``base`` into preset ``target``.

    Every setting (a leaf of the YAML tree) that ``target`` holds with another
    value than ``base``, or that only ``target`` holds, as ``key.sub=value``
    (the value written as YAML). Applied to
    ``base`` they give ``target``'s configuration; applied to another preset
    they carry ``target``'s changes over (a paper's baseline at a smaller
    scale). One source of truth: the two preset files.

    Parameters
    ----------
    base, target : str
        Preset names (or YAML files, as :func:`find_preset` takes them).
    keep : tuple of str
        Dotted keys left as ``base`` has them (default: the run's name).

    Returns
    -------
    tuple of str
        The items, in ``target``'s key order.

    Raises
    ------
    DpflError
        If a preset is unknown, or ``base`` holds a setting ``target`` does
        not (an override cannot remove a key, so the two would differ).
    """
    from dpfl.experiments.config_yaml import read_config_file

    old = _leaves(read_config_file(find_preset(base)))
    new = _leaves(read_config_file(find_preset(target)))
    missing = sorted(k for k in old if k not in new and k not in keep)
    if missing:
        raise DpflError(
            f"preset {target!r} lacks {missing} that preset {base!r} sets; "
            "--set items cannot remove a setting"
        )
    return tuple(
        f"{key}={_yaml_scalar(value)}"
        for key, value in new.items()
        if key not in keep and (key not in old or old[key] != value)
    )
