"""The driver of ``dpfl reproduce PAPER``: a paper's tables, figures and experiments.

A paper module (:mod:`dpfl.papers`) describes its reproduction as a
:class:`Reproduction`: its :class:`Table` and :class:`Figure` builders and its
headline :class:`Experiment` at each scale. :func:`write_report` computes them
and writes one markdown report, ``OUT/PAPER/report.md``, with

1. its accounting tables, every number recomputed by :mod:`dpfl.accounting`,
   side by side with the value the paper printed: the printed value, dpfl's
   recomputation, whether they agree, and where they differ, why (with the
   sound figure beside any printed figure that is not a valid bound);
2. its accounting figures (the paper's privacy curves, drawn from dpfl's
   computations), each written as PNG, PDF and SVG;
3. its headline experiments at a chosen scale, every variant over several
   seeds (:func:`dpfl.experiments.sweep.run_sweep`), with a table (mean ± sd
   of the final accuracy, ε spent, wall time) and a figure with seed bands;
4. the measured accuracy (mean ± sd over seeds) of each variant beside the
   accuracy the paper printed for it (:class:`Printed`, declared by the
   paper's module), with where the paper prints it and why the two differ
   (another dataset, another σ, fewer rounds, an unsound printed ε replaced
   by the proven one). Every report has this table, also when the experiment
   is not run.

Scales: ``smoke`` (seconds per run, on the bundled 8 × 8 digits and the
tabular stand-in: checks that every part runs), ``default`` (the largest scale
a 2-core machine runs in reasonable time, on Fashion-MNIST where a paper used
MNIST or EMNIST) and ``paper`` (the paper's own scale; needs the paper's data
and, for the CNNs, a GPU).

The printed values the papers' tables hold are quotations, kept only to
compare against; nothing dpfl reports is taken from them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpfl.errors import InvalidParameterError

__all__ = [
    "SCALES",
    "Experiment",
    "Figure",
    "Measured",
    "Printed",
    "Reproduction",
    "ResultFigure",
    "Table",
    "agrees",
    "axes",
    "cell",
    "printed_table",
    "run_experiment",
    "write_report",
]

#: The experiment scales of :func:`reproduce`.
SCALES = ("smoke", "default", "paper")

#: Relative difference below which a recomputed value agrees with a printed one
#: printed to three significant figures.
AGREE = 0.01


@dataclasses.dataclass
class Table:
    """A markdown table with a caption and notes."""

    caption: str
    columns: list[str]
    rows: list[list[Any]]
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_markdown(self) -> str:
        """Render as GitHub markdown."""
        out = [f"**{self.caption}**", ""]
        out.append("| " + " | ".join(self.columns) + " |")
        out.append("|" + "|".join("---" for _ in self.columns) + "|")
        for row in self.rows:
            out.append("| " + " | ".join(cell(v) for v in row) + " |")
        out.extend(["", *(f"- {n}" for n in self.notes)] if self.notes else [])
        return "\n".join(out) + "\n"


@dataclasses.dataclass
class Figure:
    """An accounting figure: ``draw(fig)`` fills a matplotlib figure.

    Attributes
    ----------
    stem : str
        File name without suffix (``STEM.png``, ``.pdf`` and ``.svg``).
    caption : str
        What the figure shows and which figure of the paper it regenerates.
    draw : callable
        ``draw(fig) -> None``; computes its curves with :mod:`dpfl.accounting`.
    size : (float, float)
        Figure size in inches.
    """

    stem: str
    caption: str
    draw: Callable[[Any], None]
    size: tuple[float, float] = (11.0, 3.8)

    def write(self, folder: Path) -> Path:
        """Draw and save; return the PNG's path (a PDF and an SVG lie beside it)."""
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        from dpfl.plotting import save_figure

        fig = plt.figure(figsize=self.size, constrained_layout=True)
        self.draw(fig)
        path = folder / f"{self.stem}.png"
        save_figure(fig, path)
        return path


#: The measured final test accuracy of an experiment's variants: label to
#: (mean, sd, seeds), each None where no run reported it.
Measured = dict[str, tuple[Any, Any, Any]]


@dataclasses.dataclass(frozen=True)
class ResultFigure:
    """A figure of an experiment's measured results, in the paper's layout.

    Attributes
    ----------
    stem, caption : str
        As :class:`Figure`'s.
    draw : callable
        ``draw(fig, measured=...)`` fills a matplotlib figure from the
        variants' final accuracies (:data:`Measured`).
    size : (float, float)
        Figure size in inches.
    """

    stem: str
    caption: str
    draw: Callable[..., None]
    size: tuple[float, float] = (11.0, 3.8)


@dataclasses.dataclass(frozen=True)
class Printed:
    """An accuracy a paper printed, quoted to compare against, never used.

    Attributes
    ----------
    accuracy : float or None
        The printed test accuracy as a fraction (0.78 for "78%"); None where
        the paper only draws the curve or its numbers are lost from its text
        (``source`` says which).
    source : str
        Where the paper prints it: its table or figure and the row
        (``"Table 1, K = 100, δ' = 1e-3"``).
    """

    accuracy: float | None
    source: str


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A paper's headline experiment at one scale: variants of one preset.

    Attributes
    ----------
    caption : str
        What it reproduces (the paper's figure or table, and the data).
    preset : str
        The preset every variant starts from.
    overrides : tuple of str
        ``--set`` items of every variant (the scale's rounds, clients, ...).
    variants : tuple of (str, tuple of str)
        Each variant's label and its own ``--set`` items.
    seeds : int
        Seeds per variant (0, 1, ...).
    note : str
        What differs from the paper at this scale.
    target : float or None
        An accuracy whose first round (of the seeds' mean curve) the table
        reports, as the paper's "rounds to reach X%" tables do.
    printed : tuple of (str, Printed, str)
        The paper's accuracies beside the variants: a variant's label, what
        the paper printed for the setting it reproduces, and why the measured
        accuracy differs at this scale. A variant without an entry is listed
        as one the paper prints nothing for.
    tune : (str, tuple of float) or None
        A small grid for one setting, chosen per variant: ``(key, values)``
        (e.g. ``("algorithm.params.learning_rate", (0.005, 0.02))``). Each
        variant first runs every value with seeds ``0 .. tune_seeds - 1`` and
        keeps the one with the highest mean final test accuracy over them
        (the first on a tie); its seeds then run again with that value. The
        report lists every value's mean accuracy and the choice. The choice
        reads the test set, as a paper's hyperparameter search reported on
        the test set does: optimistic alike for every variant.
    tune_seeds : int
        Seeds each value of ``tune`` runs with (one by default). With secure
        noise no two runs draw the same noise, so a choice from one run picks
        among values closer than the spread between runs; more seeds make it
        stable.
    figure : ResultFigure or None
        A figure of the measured results (the paper's own layout, e.g. final
        accuracy against a parameter).
    """

    caption: str
    preset: str
    overrides: tuple[str, ...]
    variants: tuple[tuple[str, tuple[str, ...]], ...]
    seeds: int
    note: str = ""
    target: float | None = None
    printed: tuple[tuple[str, Printed, str], ...] = ()
    tune: tuple[str, tuple[float, ...]] | None = None
    tune_seeds: int = 1
    figure: ResultFigure | None = None

    def __post_init__(self) -> None:
        if self.tune_seeds < 1:
            raise ValueError(f"tune_seeds must be >= 1; got {self.tune_seeds}")


def cell(v: Any) -> str:
    """A value as a table cell: 4 significant figures, ∞, yes/no, — for none."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isinf(v):
            return "∞"
        return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"
    return str(v)


def agrees(printed: float | None, value: Any) -> bool | None:
    """Whether a recomputed number matches a printed one (3 significant figures)."""
    if printed is None or not isinstance(value, int | float):
        return None
    return abs(value - printed) <= AGREE * abs(printed)


def axes(fig: Any, n: int) -> list[Any]:
    """``n`` panels side by side in ``fig``."""
    return list(fig.subplots(1, n, squeeze=False)[0])


# ---------------------------------------------------------------------------
# experiments
# ---------------------------------------------------------------------------
def run_experiment(
    experiment: Experiment,
    folder: Path,
    *,
    seeds: int | None = None,
    jobs: int | None = None,
    name: str = "experiment",
) -> tuple[str, list[Path]]:
    """Run every variant of ``experiment`` over its seeds; return markdown and figures.

    Each variant is a sweep (:func:`dpfl.experiments.sweep.run_sweep`) of the
    preset with the experiment's and the variant's overrides, in
    ``folder/experiment/VARIANT``; the section has one table (final accuracy
    mean ± sd over the seeds, ε spent with its terms, wall time) and one
    figure (accuracy against rounds, a ±1 sd band per variant).

    Parameters
    ----------
    experiment : Experiment
        What to run.
    folder : Path
        The report's folder.
    seeds : int, optional
        Override the experiment's number of seeds.
    jobs : int, optional
        Runs at a time (:func:`~dpfl.experiments.sweep.run_sweep`'s ``jobs``).
    name : str
        The runs' folder and the figure's file name (``folder/NAME/``,
        ``NAME.png``).

    Returns
    -------
    (str, list of Path)
        The markdown section and the figure written (PNG; PDF and SVG beside).
    """
    import shutil

    from dpfl.experiments.presets import find_preset
    from dpfl.experiments.runner import read_metrics
    from dpfl.experiments.sweep import run_sweep
    from dpfl.plotting import plot_sweep

    n = experiment.seeds if seeds is None else seeds
    preset = find_preset(experiment.preset)
    base = folder / name
    if base.exists():  # a fresh run each time the report is written
        shutil.rmtree(base)
    rows = []
    measured: Measured = {}
    curves: dict[str, tuple[list[float], list[float], list[float], int]] = {}
    tuned: list[list[Any]] = []
    for i, (label, overrides) in enumerate(experiment.variants):
        start = time.perf_counter()
        if experiment.tune is not None:
            key, grid = experiment.tune
            scores = []
            for j, value in enumerate(grid):
                trial = run_sweep(
                    preset,
                    list(range(experiment.tune_seeds)),
                    overrides=[*experiment.overrides, *overrides, f"{key}={value}"],
                    out=base / f"v{i}-tune{j}",
                    jobs=jobs,
                )
                acc = trial.rows[0].get("test_accuracy_mean")
                scores.append(acc if isinstance(acc, int | float) else -math.inf)
            best = grid[max(range(len(grid)), key=lambda j: scores[j])]
            overrides = (*overrides, f"{key}={best}")
            tuned.append([label, *scores, best])
        result = run_sweep(
            preset,
            list(range(n)),
            overrides=[*experiment.overrides, *overrides],
            out=base / f"v{i}",
            jobs=jobs,
        )
        seconds = time.perf_counter() - start
        (row,) = result.rows
        measured[label] = (
            row.get("test_accuracy_mean"),
            row.get("test_accuracy_sd"),
            row.get("seeds"),
        )
        per_seed = [
            {
                int(r["round"]): float(r["test_accuracy"])
                for r in read_metrics(result.out_dir / run["run_dir"])
                if r.get("test_accuracy") is not None
            }
            for run in result.runs
            if "run_dir" in run
        ]
        per_seed = [c for c in per_seed if c]
        if per_seed:
            common = sorted(set.intersection(*(set(c) for c in per_seed)))
            means, sds = [], []
            for rnd in common:
                values = [c[rnd] for c in per_seed]
                mean = sum(values) / len(values)
                var = (
                    sum((v - mean) ** 2 for v in values) / (len(values) - 1)
                    if len(values) > 1
                    else 0.0
                )
                means.append(mean)
                sds.append(math.sqrt(var))
            curves[label] = ([float(r) for r in common], means, sds, len(per_seed))
        reached = None
        if experiment.target is not None and label in curves:
            rounds_, means_, _, _ = curves[label]
            reached = next(
                (int(r) for r, m in zip(rounds_, means_) if m >= experiment.target),
                "not reached",
            )
        rows.append(
            [
                label,
                row.get("seeds"),
                row.get("rounds"),
                reached,
                _pm(row.get("test_accuracy_mean"), row.get("test_accuracy_sd")),
                row.get("noise_multiplier"),
                _pm(row.get("epsilon_mean"), row.get("epsilon_sd")),
                _terms(row),
                seconds,
                row.get("failed"),
            ]
        )
    figures: list[Path] = []
    if curves:
        figures = [
            p
            for p in plot_sweep(
                folder / f"{name}.png",
                curves=curves,
                finals={},
                x_label="variant",
                title=experiment.preset,
            )
            if p.suffix == ".png"
        ]
    table = Table(
        experiment.caption,
        [
            "variant",
            "seeds",
            "rounds",
            f"first round at mean accuracy ≥ {experiment.target}"
            if experiment.target is not None
            else "target",
            "final test accuracy (mean ± sd)",
            "σ",
            "ε spent (mean ± sd)",
            "δ, unit, analysis",
            "wall time (s, all seeds)",
            "failed runs",
        ],
        rows,
        [
            f"Preset `{experiment.preset}`, with `--set` "
            + (", ".join(f"`{o}`" for o in experiment.overrides) or "nothing")
            + f"; seeds 0-{n - 1}; each variant's runs are in {name}/v*/.",
            *([experiment.note] if experiment.note else []),
        ],
    )
    text = table.to_markdown() + "".join(f"\n![{name}]({p.name})\n" for p in figures)
    if experiment.tune is not None:
        key, grid = experiment.tune
        short = key.rsplit(".", 1)[-1]
        k = experiment.tune_seeds
        over = "seed 0" if k == 1 else f"the mean over seeds 0-{k - 1}"
        text += (
            "\n"
            + Table(
                f"`{key}` chosen per variant from the grid {list(grid)}: final "
                f"test accuracy at each value, {over}",
                ["variant", *(f"{short} = {v:g}" for v in grid), "chosen"],
                tuned,
                [
                    "Each variant's seeds then ran at the chosen value (the table "
                    "above). The choice reads the test set, alike for every variant."
                ],
            ).to_markdown()
        )
    if experiment.figure is not None:
        own = experiment.figure
        path = Figure(
            own.stem,
            own.caption,
            functools.partial(own.draw, measured=measured),
            own.size,
        ).write(folder)
        figures.append(path)
        text += f"\n![{own.stem}]({path.name})\n\n{own.caption}\n"
    text += "\n" + printed_table(experiment, measured).to_markdown()
    return text, figures


def printed_table(experiment: Experiment, measured: Measured | None) -> Table:
    """The measured accuracy of each variant beside the paper's printed one.

    Parameters
    ----------
    experiment : Experiment
        Its variants and :attr:`Experiment.printed`.
    measured : dict or None
        Variant label to (mean, sd, seeds) of the final test accuracy; None
        when the experiment was not run.

    Returns
    -------
    Table
        One row per variant: measured mean ± sd (seeds), the printed value,
        where the paper prints it, the difference and why they differ.
    """
    printed = {label: (p, why) for label, p, why in experiment.printed}
    unknown = sorted(set(printed) - {label for label, _ in experiment.variants})
    if unknown:
        raise InvalidParameterError(
            f"printed accuracies name variants the experiment lacks: {unknown}"
        )
    rows: list[list[Any]] = []
    for label, _ in experiment.variants:
        mean, sd, n = (None, None, None) if measured is None else measured[label]
        if measured is None:
            got = "not run"
        else:
            got = _pm(mean, sd) + (f" ({n} seeds)" if n else "")
        if label not in printed:
            rows.append(
                [label, got, None, "the paper prints no accuracy for it", None, "—"]
            )
            continue
        p, why = printed[label]
        diff = (
            mean - p.accuracy
            if p.accuracy is not None and isinstance(mean, int | float)
            else None
        )
        rows.append([label, got, p.accuracy, p.source, diff, why])
    return Table(
        "Measured accuracy (mean ± sd over seeds) beside the paper's printed accuracy",
        [
            "variant",
            "measured final test accuracy",
            "paper's printed accuracy",
            "where the paper prints it",
            "measured − printed",
            "why they differ",
        ],
        rows,
        [
            "Printed values are quoted from the paper to compare against; nothing "
            "measured is taken from them. — : the paper prints no number there "
            "(a curve only, or a value lost from its text)."
        ],
    )


def _pm(mean: Any, sd: Any) -> str:
    if not isinstance(mean, int | float):
        return "—"
    return (
        f"{mean:.4g}" if not isinstance(sd, int | float) else f"{mean:.4g} ± {sd:.2g}"
    )


def _terms(row: dict[str, Any]) -> str:
    if not row.get("analysis"):
        return "not private"
    status = f" ({row['status']})" if row.get("status") else ""
    return f"δ = {row.get('delta'):g}, {row.get('unit')}, {row['analysis']}{status}"


@dataclasses.dataclass(frozen=True)
class Reproduction:
    """One paper's reproduction: its tables, its figures and its experiment by scale.

    Attributes
    ----------
    key : str
        Its name for ``dpfl reproduce`` (and its report's folder).
    title : str
        The paper, as the report's heading.
    tables : callable
        ``tables()``: its accounting tables, recomputed.
    figures : callable
        ``figures()``: its accounting figures.
    experiment : callable
        ``experiment(scale)``: its headline experiment at a scale of :data:`SCALES`.
    missing : tuple of str
        What the report does not reproduce, and why.
    aliases : tuple of str
        Other names ``dpfl reproduce`` accepts (the scheme's, the algorithm's).
    more : callable or None
        ``more(scale)``: further experiments at a scale, run after the
        headline one (e.g. a second data set's table), each in its own
        folder ``experiment-2``, ``experiment-3``, ...
    """

    key: str
    title: str
    tables: Callable[[], list[Table]]
    figures: Callable[[], list[Figure]]
    experiment: Callable[[str], Experiment]
    missing: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    more: Callable[[str], tuple[Experiment, ...]] | None = None

    def experiments(self, scale: str) -> tuple[Experiment, ...]:
        """Every experiment at ``scale``: the headline one, then :attr:`more`'s."""
        extra = self.more(scale) if self.more is not None else ()
        return (self.experiment(scale), *extra)


def write_report(
    spec: Reproduction,
    *,
    out_dir: str | Path = Path("runs") / "reports",
    scale: str = "default",
    experiment: bool = True,
    seeds: int | None = None,
    jobs: int | None = None,
) -> Path:
    """Write ``out_dir/KEY/report.md`` (with its figures) and return its path.

    Parameters
    ----------
    spec : Reproduction
        The paper's reproduction (:data:`dpfl.papers.PAPERS` lists them).
    out_dir : str or Path
        Parent folder of the report (default ``runs/reports``).
    scale : str
        The experiment's scale, one of :data:`SCALES`: ``"smoke"`` (seconds,
        bundled data), ``"default"`` (the largest scale a 2-core machine runs
        in reasonable time) or ``"paper"`` (the paper's own).
    experiment : bool
        Run the experiment (``False``: tables and figures only).
    seeds : int, optional
        Seeds per variant (default: the experiment's, 2 at smoke scale, 3 else).
    jobs : int, optional
        Runs at a time (default: one per CPU; at smoke scale 1, in this
        process, since starting worker processes takes longer than the runs).

    Returns
    -------
    Path
        The report.

    Raises
    ------
    InvalidParameterError
        If ``scale`` is not one of :data:`SCALES`.
    """
    if scale not in SCALES:
        raise InvalidParameterError(
            f"scale must be one of {list(SCALES)}; got {scale!r}"
        )
    key = spec.key
    folder = Path(out_dir) / key
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    parts = [f"# {spec.title}: reproduction\n", "## Accounting tables\n"]
    parts.extend(t.to_markdown() for t in spec.tables())
    parts.append("## Accounting figures\n")
    for fig in spec.figures():
        path = fig.write(folder)
        parts.append(
            f"![{fig.stem}]({path.name})\n\n{fig.caption} "
            f"([PDF]({fig.stem}.pdf), [SVG]({fig.stem}.svg))\n"
        )
    parts.append(f"_Accounting recomputed in {time.perf_counter() - t0:.1f} s._\n")
    if jobs is None and scale == "smoke":
        jobs = 1
    for i, exp in enumerate(spec.experiments(scale)):
        heading = f"## Experiment ({scale} scale)" if i == 0 else f"## {exp.caption}"
        if not experiment:
            parts.append(f"{heading}: not run\n")
            parts.append(printed_table(exp, None).to_markdown())
            continue
        t1 = time.perf_counter()
        name = "experiment" if i == 0 else f"experiment-{i + 1}"
        text, _ = run_experiment(exp, folder, seeds=seeds, jobs=jobs, name=name)
        parts.append(f"{heading}\n")
        parts.append(text)
        parts.append(
            f"_Experiment: {time.perf_counter() - t1:.0f} s on this machine. "
            f"Reproduce: `dpfl reproduce {key} --scale {scale}`._\n"
        )
    if spec.missing:
        parts.append("## Not reproduced here\n")
        parts.extend(f"- {m}" for m in spec.missing)
        parts.append("")
    report = folder / "report.md"
    report.write_text("\n".join(parts))
    return report
