"""Figures over run results and privacy curves (matplotlib, Agg backend).

- :func:`plot_runs`: test accuracy against rounds and against ε spent, one line
  per run folder (reads ``metrics.jsonl``).
- :func:`plot_epsilon_curves`: ε against δ and/or ε against rounds, one line per
  analysis, from precomputed arrays (the accounting CLI's ``--plot``).

Nothing here computes privacy; the functions only draw what they are given.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpfl.errors import DpflError, InvalidParameterError

__all__ = [
    "DPI",
    "PERSONALISED",
    "axis_label",
    "epsilon_terms",
    "plot_epsilon_curves",
    "plot_runs",
    "plot_sweep",
    "save_figure",
]

#: Resolution of the PNG figures (a PDF and an SVG are written beside each).
DPI = 200

#: The terms that must agree before two runs' ε share an axis.
_TERMS = ("delta", "unit", "neighbouring", "adversary")


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, out_path: str | Path) -> list[Path]:
    """Save ``fig`` to ``out_path``; a ``.png`` also gets a PDF and an SVG beside it.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
        The figure (closed afterwards).
    out_path : str or Path
        The image to write; its suffix picks the format. PNGs are written at
        :data:`DPI` dots per inch, with ``.pdf`` and ``.svg`` (vector, for a
        paper) of the same name beside them. A path without a suffix is a
        PNG (``out`` writes ``out.png``, ``out.pdf`` and ``out.svg``).

    Returns
    -------
    list of Path
        The files written, the main image first.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the suffix names no format matplotlib writes.
    """
    plt = _pyplot()
    out = Path(out_path)
    if not out.suffix:
        out = out.with_name(out.name + ".png")
    kinds = fig.canvas.get_supported_filetypes()
    if out.suffix.lower().lstrip(".") not in kinds:
        plt.close(fig)
        raise InvalidParameterError(
            f"the image's suffix must be one of "
            f"{', '.join('.' + k for k in sorted(kinds))}; got {str(out_path)!r}"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [out]
    if out.suffix.lower() == ".png":
        paths += [out.with_suffix(".pdf"), out.with_suffix(".svg")]
    try:
        for path in paths:
            fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)
    return paths


def _plain_ticks() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:g}")


def _log_ticks(axis: Any) -> None:
    """Plain numbers on a log axis: 1, 2, 5, 10, ... (no 3×10^0 clutter)."""
    from matplotlib.ticker import FuncFormatter

    def minor(v: float, _: Any) -> str:
        lead = f"{v:.0e}"[0]
        return f"{v:g}" if lead in "25" else ""

    axis.set_major_formatter(_plain_ticks())
    axis.set_minor_formatter(FuncFormatter(minor))


def _log_worthy(values: Any) -> bool:
    """Values spanning a factor of 10 or more read better on a log axis.

    Only the positive finite values count (a log axis leaves out an ε of 0).
    """
    arr = np.asarray(np.ravel(values), dtype=float)
    arr = arr[np.isfinite(arr) & (arr > 0)]
    return bool(arr.size >= 2 and arr.max() / arr.min() >= 10)


def axis_label(key: str, terms: str | None = None) -> str:
    """An axis label for a configuration key, with units and the ε terms.

    Parameters
    ----------
    key : str
        A dotted configuration key (``privacy.epsilon``, ``rounds``, ...).
    terms : str, optional
        The terms an ε is meaningful under (δ, unit, analysis), shown on an ε
        axis.

    Returns
    -------
    str
        E.g. ``"privacy budget ε (δ = 1e-05, client-level, sound analysis)"``.
    """
    known = {
        "privacy.epsilon": "privacy budget ε",
        "privacy.delta": "δ of the budget",
        "privacy.noise_multiplier": "noise multiplier σ (noise std / clip)",
        "rounds": "rounds T",
        "algorithm.params.clip": "clip bound S (L2 norm)",
        "algorithm.params.cohort_size": "cohort size m (clients per round)",
        "algorithm.params.learning_rate": "client learning rate η",
        "algorithm.params.local_epochs": "local epochs E",
        "data.num_clients": "clients K",
    }
    label = known.get(key, key)
    if key == "privacy.epsilon" and terms:
        label += f" ({terms})"
    return label


def _run_terms(run_dir: Path) -> dict[str, Any]:
    """The guarantee's terms of a run (``guarantee.json``, else the ledger's)."""
    for name, key in (("guarantee.json", None), ("ledger.json", "summary")):
        path = run_dir / name
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except json.JSONDecodeError:
                continue
            data = data.get(key) if key else data
            if isinstance(data, dict) and "unit" in data:
                return data
    return {}


def _epsilon_label(known: Sequence[Mapping[str, Any]], differ: Sequence[str]) -> str:
    """The ε axis label: the terms the runs share, and a warning for the rest."""
    t = known[0] if known else {}
    unit = t.get("unit") if "unit" not in differ else None
    head = f"ε spent by the worst-off {unit}" if unit else "ε spent"
    detail = []
    if "delta" not in differ and isinstance(t.get("delta"), float):
        detail.append(f"upper bound at δ = {t['delta']:g}")
    else:
        detail.append("upper bound at each run's δ")
    analyses = {k.get("analysis") for k in known}
    if len(analyses) == 1 and None not in analyses:
        detail.append(f"{analyses.pop()} analysis")
    label = f"{head}\n({', '.join(detail)})"
    if differ:
        label += f"\nNOT one scale: the runs differ in {', '.join(differ)}"
    return label


def epsilon_terms(
    run_dirs: Sequence[str | Path],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each run's guarantee terms, and the terms on which the runs differ.

    Parameters
    ----------
    run_dirs : sequence of str or Path
        Run folders.

    Returns
    -------
    (list of dict, list of str)
        Per run its terms (``delta``, ``unit``, ``neighbouring``,
        ``adversary``, ``analysis``, ``status``; empty when unknown), and the
        names among ``delta``, ``unit``, ``neighbouring``, ``adversary`` whose
        values differ between runs (their ε then do not measure one thing).
    """
    terms = [_run_terms(Path(d)) for d in run_dirs]
    known = [t for t in terms if t]
    differ = [k for k in _TERMS if len({str(t.get(k)) for t in known}) > 1]
    return terms, differ


#: Algorithms whose ``test_accuracy`` is the clients' personalised models'
#: mean accuracy (their papers' metric), not a global model's.
PERSONALISED = frozenset({"prifedsync", "ms-pafl"})


def _algorithm(run_dir: Path) -> str | None:
    """The run's algorithm name from its ``config.yaml`` (None if unreadable)."""
    import yaml

    try:
        data = yaml.safe_load((run_dir / "config.yaml").read_text())
        name = data["algorithm"]["name"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return str(name)


def _read_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise DpflError(f"{run_dir} has no metrics.jsonl")
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def plot_runs(
    run_dirs: Sequence[str | Path],
    out_path: str | Path,
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Plot test accuracy against rounds and against ε spent, one line per run.

    Parameters
    ----------
    run_dirs : sequence of str or Path
        Run folders (each with a ``metrics.jsonl``).
    out_path : str or Path
        Image to write (format from the suffix, e.g. ``.png``, ``.pdf``).
    labels : sequence of str, optional
        Legend entries (default: the folder names).
    title : str, optional
        Figure title (default, for one run: its name and its guarantee's
        terms).

    Returns
    -------
    Path
        ``out_path`` (a ``.png`` also gets a ``.pdf`` and a ``.svg`` beside
        it). Runs without noise have no ε: with no private run the ε panel is
        left out, beside private runs they are a dotted level line.

    Raises
    ------
    DpflError
        If a folder has no metrics or no run has an evaluated round.
    InvalidParameterError
        If ``labels`` does not have one entry per run.
    """
    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise InvalidParameterError("run_dirs must name at least one run; got []")
    if labels is not None and len(labels) != len(dirs):
        raise InvalidParameterError(
            f"labels must have one entry per run ({len(dirs)}); got {len(labels)}"
        )
    plt = _pyplot()
    terms, differ = epsilon_terms(dirs)
    evaluated = {
        i: [r for r in _read_rows(d) if r.get("test_accuracy") is not None]
        for i, d in enumerate(dirs)
    }
    private = any(
        r.get("epsilon") is not None for rows in evaluated.values() for r in rows
    )
    fig, axes = plt.subplots(
        1,
        2 if private else 1,
        figsize=(11 if private else 6, 4.6),
        constrained_layout=True,
        squeeze=False,
    )
    ax_r = axes[0][0]
    ax_e = axes[0][1] if private else None
    drawn = 0
    personalised = 0
    eps_values: list[float] = []
    for i, d in enumerate(dirs):
        rows = evaluated[i]
        if not rows:
            continue
        label = labels[i] if labels is not None else d.name
        if differ and terms[i]:
            label += " [" + ", ".join(f"{k}: {terms[i].get(k)}" for k in differ) + "]"
        status = terms[i].get("status", "proven")
        if status != "proven" and "not a proven bound" not in label:
            label += f" ({status}: not a proven bound)"
        if _algorithm(d) in PERSONALISED and "personalised" not in label:
            label += " (personalised accuracy)"
            personalised += 1
        rounds = [r["round"] for r in rows]
        acc = [r["test_accuracy"] for r in rows]
        (line,) = ax_r.plot(rounds, acc, marker=".", label=label)
        drawn += 1
        eps_rows = [r for r in rows if r.get("epsilon") is not None]
        if ax_e is None:
            continue
        if eps_rows:
            eps_values += [float(r["epsilon"]) for r in eps_rows]
            ax_e.plot(
                [r["epsilon"] for r in eps_rows],
                [r["test_accuracy"] for r in eps_rows],
                marker=".",
                color=line.get_color(),
                label=label,
            )
        else:  # non-private: no finite epsilon; a horizontal reference line
            ax_e.axhline(acc[-1], color=line.get_color(), ls=":", label=f"{label}")
    if drawn == 0:
        plt.close(fig)
        raise DpflError(f"no evaluated rounds in {[str(d) for d in dirs]}")
    ax_r.set_xlabel("round")
    ax_r.xaxis.get_major_locator().set_params(integer=True)
    what = "personalised test accuracy" if personalised == drawn else "test accuracy"
    ax_r.set_ylabel(f"{what} (fraction of the test set)")
    ax_r.set_title("test accuracy against rounds")
    ax_r.grid(alpha=0.3)
    known = [t for t in terms if t]
    if ax_e is not None:
        ax_e.set_xlabel(_epsilon_label(known, differ))
        if _log_worthy(eps_values):
            ax_e.set_xscale("log")
            _log_ticks(ax_e.xaxis)
        ax_e.set_ylabel(f"{what} (fraction of the test set)")
        ax_e.set_title("test accuracy against privacy spent")
        ax_e.grid(alpha=0.3)
    # one legend for both panels, below them: long labels carry the terms
    handles, names = ax_r.get_legend_handles_labels()
    wide = max(len(n) for n in names) > 55
    names = [textwrap.fill(n, 110 if wide else 55) for n in names]
    fig.legend(
        handles,
        names,
        loc="outside lower center",
        ncols=1 if wide else 2,
        fontsize="small",
    )
    if title is None:
        title = dirs[0].name if len(dirs) == 1 else f"{len(dirs)} runs"
        t = known[0] if known and not differ else {}
        if t and isinstance(t.get("delta"), float):
            title += (
                f": {t.get('unit')}-level, δ = {t.get('delta'):g}, "
                f"{t.get('analysis')} analysis"
            )
        elif not private:
            title += ": not private (no noise, no guarantee)"
    if title:
        fig.suptitle(title)
    return save_figure(fig, out_path)[0]


def _curves(
    name: str, x: Any, curves: Mapping[str, Any]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    xs = np.asarray(x, dtype=float)
    if xs.ndim != 1 or xs.size == 0:
        raise InvalidParameterError(
            f"{name} must be a non-empty 1-D array; got shape {xs.shape}"
        )
    if not curves:
        raise InvalidParameterError(f"{name}: no curves given")
    out = {}
    for label, ys in curves.items():
        arr = np.asarray(ys, dtype=float)
        if arr.shape != xs.shape:
            raise InvalidParameterError(
                f"curve {label!r} must have the shape of {name} {xs.shape}; "
                f"got {arr.shape}"
            )
        out[str(label)] = arr
    return xs, out


def plot_epsilon_curves(
    out_path: str | Path,
    *,
    deltas: Sequence[float] | None = None,
    epsilon_by_delta: Mapping[str, Sequence[float]] | None = None,
    rounds: Sequence[int] | None = None,
    epsilon_by_rounds: Mapping[str, Sequence[float]] | None = None,
    title: str | None = None,
    delta_title: str | None = None,
    rounds_title: str | None = None,
    epsilon_label: str = "ε (upper bound)",
    dashed: Collection[str] = (),
) -> Path:
    """Plot precomputed ε–δ and/or ε–rounds curves, one line per analysis.

    The ε axis is logarithmic where the values span a factor of 10 or more
    (so that a loose analysis does not flatten the tight ones), as is the
    rounds axis. A ``.png`` also gets a ``.pdf`` and a ``.svg`` beside it.

    Parameters
    ----------
    out_path : str or Path
        Image to write.
    deltas : sequence of float, optional
        δ values (x axis of the left panel, log scale).
    epsilon_by_delta : mapping of str to sequence of float, optional
        Analysis name to ε at each δ (``inf`` or NaN points are left out).
    rounds : sequence of int, optional
        Round counts (x axis of the right panel).
    epsilon_by_rounds : mapping of str to sequence of float, optional
        Analysis name to ε after each number of rounds.
    title : str, optional
        Figure title.
    delta_title, rounds_title : str, optional
        Panel titles: what the other variable is fixed at (e.g. "after 100
        rounds", "at δ = 1e-05").
    epsilon_label : str
        The ε axis label (say the unit and that it is an upper bound).
    dashed : collection of str
        Curves drawn dashed (analyses that are not proven bounds).

    Returns
    -------
    Path
        ``out_path``.

    Raises
    ------
    InvalidParameterError
        If neither panel is given, a panel has x values without curves (or
        the reverse), or a curve's length differs from its x values.
    """
    panels = []
    if (deltas is None) != (epsilon_by_delta is None):
        raise InvalidParameterError("deltas and epsilon_by_delta go together")
    if (rounds is None) != (epsilon_by_rounds is None):
        raise InvalidParameterError("rounds and epsilon_by_rounds go together")
    if deltas is not None and epsilon_by_delta is not None:
        xs, cs = _curves("deltas", deltas, epsilon_by_delta)
        panels.append(("δ", xs, cs, delta_title))
    if rounds is not None and epsilon_by_rounds is not None:
        xs, cs = _curves("rounds", rounds, epsilon_by_rounds)
        panels.append(("rounds T", xs, cs, rounds_title))
    if not panels:
        raise InvalidParameterError(
            "give deltas with epsilon_by_delta, rounds with epsilon_by_rounds, or both"
        )
    plt = _pyplot()
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.6 * len(panels), 4.4), constrained_layout=True
    )
    axes = np.atleast_1d(axes)
    for ax, (xlabel, xs, curves, panel_title) in zip(axes, panels):
        finite = []
        for label, ys in curves.items():
            ok = np.isfinite(ys)
            finite.extend(ys[ok])
            ax.plot(
                xs[ok],
                ys[ok],
                marker=".",
                ls="--" if label in dashed else "-",
                label=label,
            )
        if xlabel == "δ" or _log_worthy(xs):
            ax.set_xscale("log")
        if _log_worthy(finite):
            ax.set_yscale("log")
            _log_ticks(ax.yaxis)
        ax.set_xlabel(xlabel + (" (log scale)" if ax.get_xscale() == "log" else ""))
        ax.set_ylabel(epsilon_label)
        if panel_title:
            ax.set_title(panel_title)
        if xlabel.startswith("rounds"):
            ax.xaxis.set_major_formatter(_plain_ticks())
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return save_figure(fig, out_path)[0]


def plot_sweep(
    out_path: str | Path,
    *,
    curves: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float], int]],
    finals: Mapping[str, tuple[Sequence[Any], Sequence[float], Sequence[float]]],
    x_label: str,
    metric_label: str = "test accuracy",
    title: str | None = None,
) -> list[Path]:
    """Plot a sweep: metric against rounds with seed bands, and final metric.

    Parameters
    ----------
    out_path : str or Path
        Image to write (a ``.png`` also gets a ``.pdf`` and a ``.svg``).
    curves : mapping of str to (rounds, mean, sd, n)
        Per grid point: the evaluated rounds, the metric's mean and sample
        standard deviation over the ``n`` seeds at each (drawn as the mean
        line and a ±1 sd band).
    finals : mapping of str to (x, mean, sd)
        Series of the final metric against the swept parameter (drawn with
        ±1 sd error bars); x values that are not all numbers are drawn as
        categories. Empty: the right panel is left out.
    x_label : str
        Label of the swept parameter's axis (with its unit and, for ε, the
        terms).
    metric_label : str
        Name of the metric (the y axes).
    title : str, optional
        Figure title.

    Returns
    -------
    list of Path
        The files written.

    Raises
    ------
    InvalidParameterError
        If ``curves`` is empty or a curve's arrays differ in length.
    """
    if not curves:
        raise InvalidParameterError("curves: no grid point to draw")
    plt = _pyplot()
    ncols = 2 if finals else 1
    fig, axes = plt.subplots(
        1, ncols, figsize=(6.2 * ncols, 4.6), constrained_layout=True, squeeze=False
    )
    ax_r = axes[0][0]
    for label, (rounds, mean, sd, n) in curves.items():
        x = np.asarray(rounds, dtype=float)
        m = np.asarray(mean, dtype=float)
        s = np.asarray(sd, dtype=float)
        if not (x.shape == m.shape == s.shape):
            raise InvalidParameterError(
                f"curve {label!r}: rounds, mean and sd must have one length; got "
                f"{x.shape}, {m.shape}, {s.shape}"
            )
        (line,) = ax_r.plot(x, m, marker=".", label=f"{label} (n={n})")
        if n > 1:
            ax_r.fill_between(x, m - s, m + s, color=line.get_color(), alpha=0.2)
    ax_r.set_xlabel("round")
    ax_r.xaxis.get_major_locator().set_params(integer=True)
    ax_r.set_ylabel(f"{metric_label} (mean, band ±1 sd)")
    ax_r.set_title(f"{metric_label} against rounds")
    ax_r.grid(alpha=0.3)
    ax_r.legend(fontsize="small")
    if finals:
        ax_f = axes[0][1]
        numeric = all(
            isinstance(v, int | float) and not isinstance(v, bool)
            for xs, _, _ in finals.values()
            for v in xs
        )
        categories: list[str] = []
        if not numeric:
            for xs, _, _ in finals.values():
                categories += [str(v) for v in xs if str(v) not in categories]
        for label, (xs, mean, sd) in finals.items():
            xv = (
                np.asarray(xs, dtype=float)
                if numeric
                else np.asarray([categories.index(str(v)) for v in xs], dtype=float)
            )
            order = np.argsort(xv)
            ax_f.errorbar(
                xv[order],
                np.asarray(mean, dtype=float)[order],
                yerr=np.asarray(sd, dtype=float)[order],
                marker="o",
                capsize=4,
                label=label or None,
            )
        if numeric:
            all_x = [float(v) for xs, _, _ in finals.values() for v in xs]
            if _log_worthy(all_x):
                ax_f.set_xscale("log")
            ticks = sorted(set(all_x))
            if len(ticks) <= 8:
                ax_f.set_xticks(ticks, [f"{t:g}" for t in ticks])
                ax_f.minorticks_off()
        else:
            ax_f.set_xticks(range(len(categories)), categories, rotation=20)
        ax_f.set_xlabel(x_label)
        ax_f.set_ylabel(f"final {metric_label} (mean ± sd)")
        ax_f.set_title(f"final {metric_label} against the swept parameter")
        ax_f.grid(alpha=0.3)
        if any(finals):
            ax_f.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return save_figure(fig, out_path)
