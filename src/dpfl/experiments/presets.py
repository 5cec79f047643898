"""The presets: ``dpfl train`` configs for each paper's experiment.

Presets live in the repository's ``presets/`` folder (one YAML per paper and
scale); :func:`find_preset` locates them from the working directory or the
source checkout, and :func:`run_preset_for_report` runs one for
``dpfl reproduce`` and returns a markdown section with its figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpfl.errors import DpflError

__all__ = ["find_preset", "list_presets", "run_preset_for_report"]


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


def run_preset_for_report(
    preset: str, folder: Path, rounds: int | None
) -> tuple[str, list[str]]:
    """Run a preset under ``folder/runs`` and describe it in markdown.

    Parameters
    ----------
    preset : str
        Preset name (``presets/NAME.yaml``).
    folder : Path
        The report's folder; the run and its figure go inside it.
    rounds : int or None
        Override the preset's number of rounds.

    Returns
    -------
    (str, list of str)
        The markdown section and the figure paths (relative to ``folder``).
    """
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import run
    from dpfl.plotting import plot_runs

    overrides = [f"output_dir={folder / 'runs'}", f"name={preset}"]
    if rounds is not None:
        overrides.append(f"rounds={rounds}")
    config = load_config(find_preset(preset), overrides)
    existing = config.run_dir
    if existing.exists():  # a fresh run each time the report is written
        import shutil

        shutil.rmtree(existing)
    result = run(config, progress=False)
    figure = folder / "accuracy.png"
    plot_runs([result.run_dir], figure, title=f"{preset}")
    lines = [
        f"Preset `{preset}` ({config.data.name}, {config.data.num_clients} clients, "
        f"model {config.model.name}, algorithm {config.algorithm.name}): "
        f"{result.rounds_completed} rounds, {result.stopped}.",
        "",
        "| metric | value |",
        "|---|---|",
    ]
    shown: dict[str, Any] = dict(result.metrics)
    if result.epsilon is not None:
        shown[
            f"epsilon spent at delta={config.privacy.delta:g} "
            f"({config.privacy.analysis})"
        ] = result.epsilon
    for key, value in shown.items():
        v = f"{value:.4g}" if isinstance(value, float) else str(value)
        lines.append(f"| {key} | {v} |")
    lines += ["", f"![accuracy]({figure.name})", ""]
    lines.append(
        f"Reproduce: `dpfl train {find_preset(preset)} --set rounds={config.rounds}`."
    )
    return "\n".join(lines) + "\n", [figure.name]
