"""A sweep's summary: grid-point labels, the table and the figures.

:func:`summary_row` reduces one grid point's runs (one per seed) to a row
(mean and standard deviation of the metric and of ε, the budget, the
analysis and its status); :func:`write_tables` writes the rows as
``table.csv`` and ``table.md``; :func:`draw_figures` draws the metric
against rounds per grid point with seed bands, and against the swept key
(:mod:`dpfl.plotting`). :func:`point_label` and :func:`point_slug` name a
grid point in labels and in folder names.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpfl.experiments.config import RunConfig

__all__ = [
    "METRICS",
    "SYMBOLS",
    "draw_figures",
    "point_label",
    "point_slug",
    "short_key",
    "summary_row",
    "value_text",
    "write_tables",
]

#: Metrics a sweep can summarise (the runner's evaluation columns).
METRICS = {
    "test_accuracy": "test accuracy",
    "test_loss": "test loss",
}


def short_key(key: str) -> str:
    """The last part of a dotted key."""
    return key.rsplit(".", 1)[-1]


#: Symbols for the privacy keys in labels (folder names keep the words).
SYMBOLS = {
    "privacy.epsilon": "ε",
    "privacy.delta": "δ",
    "privacy.noise_multiplier": "σ",
}


def point_label(point: Mapping[str, Any]) -> str:
    """``ε=2, clip=0.5`` (a symbol or the last part of each key); ``all`` if empty."""
    if not point:
        return "all"
    return ", ".join(
        f"{SYMBOLS.get(k, short_key(k))}={value_text(v)}" for k, v in point.items()
    )


def value_text(v: Any) -> str:
    """A value as a label shows it (``%g`` for a float)."""
    return f"{v:g}" if isinstance(v, float) else str(v)


def point_slug(point: Mapping[str, Any]) -> str:
    """A folder-safe name for a grid point: ``epsilon-2_clip-0.5``."""
    if not point:
        return "run"
    text = "_".join(f"{short_key(k)}-{value_text(v)}" for k, v in point.items())
    return "".join(c if c.isalnum() or c in "-_.+" else "-" for c in text)


# -- the table --------------------------------------------------------------------
def _mean_sd(values: Sequence[float]) -> tuple[float | None, float | None]:
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None, None
    mean = sum(vals) / len(vals)
    if len(vals) < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return mean, math.sqrt(var)


def _one(values: Sequence[Any]) -> Any:
    """The common value, or ``"mixed"`` when the runs disagree."""
    distinct = list(dict.fromkeys(str(v) for v in values))
    if not distinct:
        return None
    if len(distinct) > 1:
        return "mixed"
    return values[0]


def summary_row(
    point: Mapping[str, Any],
    outcomes: Sequence[Mapping[str, Any]],
    grid: Mapping[str, Any],
    base: RunConfig,
    metric: str,
) -> dict[str, Any]:
    """One grid point's row: its keys, the metric's and ε's mean and sd over seeds.

    Also the budget, δ, unit, analysis and status, σ, rounds, and how many
    seeds finished or failed; ``metric`` names the summarised column.
    """
    ok = [o for o in outcomes if "error" not in o]
    m_mean, m_sd = _mean_sd([o["metrics"].get(metric) for o in ok])
    private = [o for o in ok if o["private"]]
    e_mean, e_sd = _mean_sd([o["epsilon"] for o in private])
    budget = point.get("privacy.epsilon", base.privacy.epsilon)
    sigmas = [o["noise_multiplier"] for o in ok]
    s_mean, _ = _mean_sd(sigmas)
    row: dict[str, Any] = {"point": point_label(point)}
    row.update({k: point[k] for k in grid})
    row.update(
        {
            "seeds": len(ok),
            f"{metric}_mean": m_mean,
            f"{metric}_sd": m_sd,
            "epsilon_mean": e_mean,
            "epsilon_sd": e_sd,
            "epsilon_budget": budget,
            "delta": _one([o["delta"] for o in ok]),
            "unit": _one([o["unit"] for o in private]) if private else None,
            "analysis": _one([o["analysis"] for o in private]) if private else None,
            "status": _one([o["status"] for o in private])
            if private
            else "not private",
            "noise_multiplier": _one(sigmas) if _one(sigmas) != "mixed" else s_mean,
            "rounds": _one([o["rounds"] for o in ok]),
            "failed": len(outcomes) - len(ok),
        }
    )
    return row


def _num(v: Any, digits: int = 4) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _pm(mean: Any, sd: Any, digits: int = 4) -> str:
    if mean is None:
        return "n/a"
    if sd is None:
        return f"{mean:.{digits}g}"
    return f"{mean:.{digits}g} ± {sd:.2g}"


def write_tables(
    out_dir: Path,
    rows: list[dict[str, Any]],
    grid: Mapping[str, Any],
    seeds: Sequence[int],
    metric: str,
) -> tuple[Path, Path]:
    """Write ``table.csv`` (every column) and ``table.md`` (mean ± sd) to ``out_dir``.

    Returns
    -------
    tuple of Path
        The CSV and Markdown files.
    """
    csv_path = out_dir / "table.csv"
    cols = list(rows[0]) if rows else []
    with csv_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
    name = METRICS[metric]
    head = [
        "point",
        f"final {name} (mean ± sd)",
        "n seeds",
        "ε spent (mean ± sd)",
        "ε budget",
        "δ",
        "unit",
        "analysis (status)",
        "noise multiplier σ",
        "rounds",
    ]
    lines = [
        f"# Sweep: {len(rows)} grid point(s) × seeds {list(seeds)}",
        "",
        f"Final {name}: its value at each run's last evaluation; mean and sample "
        "standard deviation over the seeds that finished. ε spent: the upper "
        "bound for the worst-off privacy unit at δ under the analysis shown.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for r in rows:
        analysis = f"{r['analysis']} ({r['status']})" if r["analysis"] else r["status"]
        seeds_cell = str(r["seeds"]) + (
            f" ({r['failed']} failed)" if r["failed"] else ""
        )
        cells = [
            r["point"],
            _pm(r[f"{metric}_mean"], r[f"{metric}_sd"]),
            seeds_cell,
            _pm(r["epsilon_mean"], r["epsilon_sd"]) if r["analysis"] else "n/a",
            _num(r["epsilon_budget"]),
            _num(r["delta"]),
            _num(r["unit"]),
            analysis,
            _num(r["noise_multiplier"]),
            _num(r["rounds"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Runs: `runs/POINT-sSEED/` beside this file; figure: `sweep.png` "
        "(`sweep.pdf`, `sweep.svg`).",
        "",
    ]
    md_path = out_dir / "table.md"
    md_path.write_text("\n".join(lines))
    return csv_path, md_path


# -- the figure ---------------------------------------------------------------------
def _curve(run_dir: Path, metric: str) -> dict[int, float]:
    from dpfl.experiments.runner import read_metrics

    return {
        int(r["round"]): float(r[metric])
        for r in read_metrics(run_dir)
        if r.get(metric) is not None
    }


def draw_figures(
    out_dir: Path,
    points: list[dict[str, Any]],
    seeds: Sequence[int],
    outcomes: Mapping[tuple[int, int], Mapping[str, Any]],
    rows: list[dict[str, Any]],
    grid: Mapping[str, Sequence[Any]],
    metric: str,
    base: RunConfig,
) -> list[Path]:
    """Draw the metric against rounds (seed bands) and against the swept key.

    Returns
    -------
    list of Path
        The figures written into ``out_dir`` (none when nothing was
        evaluated).
    """
    from dpfl.plotting import PERSONALISED, axis_label, plot_sweep

    curves: dict[str, tuple[list[float], list[float], list[float], int]] = {}
    for i, point in enumerate(points):
        per_seed = [
            _curve(Path(o["run_dir"]), metric)
            for s in seeds
            if "error" not in (o := outcomes[(i, s)])
        ]
        per_seed = [c for c in per_seed if c]
        if not per_seed:
            continue
        common = sorted(set.intersection(*(set(c) for c in per_seed)))
        means, sds = [], []
        for rnd in common:
            m, sd = _mean_sd([c[rnd] for c in per_seed])
            means.append(float(m if m is not None else math.nan))
            sds.append(float(sd or 0.0))
        curves[point_label(point)] = (
            [float(r) for r in common],
            means,
            sds,
            len(per_seed),
        )
    if not curves:
        return []
    terms = next((r for r in rows if r["analysis"]), None)
    terms_text = (
        f"δ = {terms['delta']:g}, {terms['unit']}-level, {terms['analysis']} analysis"
        if terms and isinstance(terms["delta"], float)
        else None
    )
    x_key = next(
        (
            k
            for k, vs in grid.items()
            if all(isinstance(v, int | float) and not isinstance(v, bool) for v in vs)
        ),
        None,
    )
    finals: dict[str, tuple[list[Any], list[float], list[float]]] = {}
    if len(points) > 1:
        for row, point in zip(rows, points):
            mean = row[f"{metric}_mean"]
            if mean is None:
                continue
            rest = {k: v for k, v in point.items() if k != x_key}
            series = point_label(rest) if x_key and rest else ""
            x = point[x_key] if x_key else row["point"]
            xs, ms, ss = finals.setdefault(series, ([], [], []))
            xs.append(x)
            ms.append(mean)
            ss.append(row[f"{metric}_sd"] or 0.0)
    x_label = axis_label(x_key, terms_text) if x_key else "grid point"
    n = len(seeds)
    name = METRICS[metric]
    if base.algorithm.name in PERSONALISED:  # the clients' own models
        name = f"personalised {name}"
    title = f"{base.name}: {name}, mean ± sd over {n} seed{'s' if n > 1 else ''}"
    if terms_text:
        title += f"  ({terms_text})"
    return plot_sweep(
        out_dir / "sweep.png",
        curves=curves,
        finals=finals,
        x_label=x_label,
        metric_label=name,
        title=title,
    )
