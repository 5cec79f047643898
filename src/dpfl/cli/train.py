"""Subcommands ``train``, ``sweep``, ``reproduce``, ``resume``, ``plot``, ``demo``.

:func:`add_subcommands` registers them on the top-level parser's subparsers;
each handler is stored as the ``handler`` default and returns an exit status.
torch (and the simulator) is imported inside the handlers only, so that
``dpfl account`` works without torch installed. Errors derived from
:class:`~dpfl.errors.DpflError` are left to the top-level ``main``, which prints
them as one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from dpfl.cli.flags import EXIT_INTERRUPTED, narrow

__all__ = ["add_subcommands"]


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A handler writing to ``sys.stderr`` as it is when a record comes.

    (``logging.StreamHandler(sys.stderr)`` keeps the stream it was made with:
    a command run in-process with stderr redirected, then closed, would leave
    it writing to a closed stream.)
    """

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _logging() -> None:
    """Show the runner's messages (calibration, budget stop, resume) on stderr.

    And those of the integrations (Ray: workers started, a worker replaced).

    The top-level ``main`` silences logging below ERROR to keep library chatter
    off the terminal; the runner's own messages are meant for the user, so
    logging is re-enabled here (dp_accounting calls silence themselves).
    """
    logging.disable(logging.NOTSET)
    for name in ("dpfl.experiments", "dpfl.integrations"):
        logger = logging.getLogger(name)
        if not logger.handlers:
            handler = _Stderr()
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False


def _summary(result: Any) -> str:
    """The run's outcome: why it stopped, σ, accuracy, and its guarantee in full."""
    acc = result.metrics.get("test_accuracy")
    why = {
        "completed": "completed",
        "budget": "budget reached, stopped",
        "interrupted": "interrupted",
    }[result.stopped]
    head = [f"{result.run_dir}: {why} after {result.rounds_completed} rounds"]
    sigma = result.config.privacy.noise_multiplier
    if isinstance(sigma, int | float) and sigma:
        head.append(f"noise multiplier {sigma:.4g}")
    if acc is not None:
        head.append(f"test accuracy {acc:.3f}")
    lines = ["; ".join(head)]
    g = result.guarantee
    if not g.get("private", result.epsilon is not None):
        lines.append("  NOT PRIVATE: no noise was added; the run has no guarantee")
        return "\n".join(lines)
    if "noise" in g:
        lines.append(f"  noise: {g['noise']}")
    if "epsilon" not in g:
        return "\n".join(lines)
    label = "" if g["status"] == "proven" else f" -- NOT A PROVEN BOUND ({g['status']})"
    lines.append(
        f"  epsilon {g['epsilon']:.4g} at delta {g['delta']:g} for the worst-off "
        f"{g['unit']} ({g['analysis']} analysis){label}"
    )
    lines.append(f"  neighbouring: {g['neighbouring']}")
    lines.append(f"  adversary:    {g['adversary']}")
    if "proven" in g:
        p = g["proven"]
        lines.append(
            f"  proven: epsilon {p['epsilon']:.4g} ({p['analysis']} analysis; "
            f"adversary: {p['adversary']})"
        )
    for name, row in g.get("analyses", {}).items():
        if name in (g["analysis"], g.get("proven", {}).get("analysis")):
            continue
        lines.append(
            f"  also: {name} ({row['status']}): epsilon {row['epsilon']:.4g}; "
            f"adversary: {row['adversary']}"
        )
    return "\n".join(lines)


def _finish(result: Any) -> int:
    """Print the run's summary; 130 if Ctrl-C stopped it."""
    print(_summary(result))
    if result.stopped == "interrupted":
        print(
            f"interrupted after round {result.rounds_completed}; continue with: "
            f"dpfl resume {result.run_dir}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    return 0


def _train(args: argparse.Namespace) -> int:
    from dpfl.experiments.config import load_config
    from dpfl.experiments.figures import AccuracyFigure
    from dpfl.experiments.presets import resolve_config
    from dpfl.experiments.runner import run

    if not args.check:  # --check prints its verdict only, one line
        _logging()
    overrides = list(args.set or [])
    if args.out is not None:
        overrides.append(f"output_dir={json.dumps(str(args.out))}")
    config = load_config(resolve_config(args.config), overrides)
    args.run_dir_hint = config.run_dir  # for Ctrl-C outside the rounds (main)
    if args.check:
        # every check `train` makes before its first round, nothing written
        from dpfl.experiments import rundir
        from dpfl.experiments.build import prepare

        rundir.check_new_folder(config.run_dir)
        prepared = prepare(config)
        sigma = prepared.config.privacy.noise_multiplier
        noise = (
            "no noise (NOT PRIVATE)"
            if not sigma
            else f"noise multiplier {sigma:.4g}"
            + (" (calibrated)" if config.privacy.noise_multiplier is None else "")
        )
        print(
            f"{args.config}: valid; the run would write {config.run_dir} "
            f"({prepared.dataset.num_clients} clients, {prepared.parameters} model "
            f"parameters, {noise})"
        )
        return 0
    return _finish(
        run(config, progress=not args.no_progress, callbacks=[AccuracyFigure()])
    )


def _resume(args: argparse.Namespace) -> int:
    from dpfl.experiments.figures import AccuracyFigure
    from dpfl.experiments.runner import resume

    _logging()
    result = resume(
        args.run_dir,
        progress=not args.no_progress,
        overrides=args.set or [],
        callbacks=[AccuracyFigure()],
    )
    return _finish(result)


def _plot(args: argparse.Namespace) -> int:
    from dpfl.plotting import epsilon_terms, plot_runs

    out = args.out or (
        Path(args.run_dirs[0]) / "accuracy.png"
        if len(args.run_dirs) == 1
        else Path("runs.png")
    )
    print(plot_runs(args.run_dirs, out))
    _, differ = epsilon_terms(args.run_dirs)
    if differ:
        print(
            f"note: the runs' epsilons differ in {', '.join(differ)}; they are not "
            "on one scale (the legend gives each run's terms)",
            file=sys.stderr,
        )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from dpfl.experiments.demo import demo, pm

    _logging()
    res = demo(
        args.out,
        rounds=args.rounds,
        progress=not args.no_progress,
        seeds=args.seeds,
        reproducible=args.reproducible,
    )
    n = len(res.seeds)
    what = "mean ± sd over" if n > 1 else "one"
    print(f"test accuracy, {what} {n} seed{'s' if n > 1 else ''}:")
    print(f"{'run':<11} {'sigma':>8} {'epsilon':>8} {'accuracy':>15} {'late acc':>15}")
    acc_sd, late_sd = res.accuracy_sd, res.late_accuracy_sd
    for name, sigma in res.noise_multipliers.items():
        eps = res.epsilon[name]
        print(
            f"{name:<11} {sigma:>8.4f} {'n/a' if eps is None else f'{eps:.3f}':>8} "
            f"{pm(res.accuracy[name], acc_sd[name], n):>15} "
            f"{pm(res.late_accuracy[name], late_sd[name], n):>15}"
        )
    print(
        "The default (sound) beats OLS at the same budget: "
        f"{'yes' if res.default_beats_ols else 'NO'} (on average; in "
        f"{res.beats_ols_seeds} of {n} seeds)"
    )
    if res.reproducible:
        print(
            "reproducible noise (derived from the seeds): NOT private against "
            "anyone who knows them"
        )
    print(f"report: {res.out_dir / 'report.md'} ({res.seconds:.0f} s)")
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from dpfl.papers import REPRODUCTIONS, check_reproduction, reproduce

    papers = sorted(REPRODUCTIONS) if args.paper == "all" else [args.paper]
    if args.check:
        for paper in papers:
            print(f"{paper}: {check_reproduction(paper, args.scale)}")
        return 0
    _logging()
    for paper in papers:
        path = reproduce(
            paper,
            out_dir=args.out,
            scale=args.scale,
            experiment=not args.no_experiment,
            seeds=args.seeds,
            jobs=args.jobs,
        )
        print(f"{paper}: {path}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from dpfl.experiments.presets import resolve_config
    from dpfl.experiments.sweep import parse_seeds, run_sweep

    _logging()
    result = run_sweep(
        resolve_config(args.config),
        parse_seeds(args.seeds),
        overrides=args.set or [],
        out=args.out,
        jobs=args.jobs,
        backend=args.backend,
        metric=args.metric,
        progress=lambda line: print(line, flush=True),
    )
    print(f"table: {result.table_md} ({result.table_csv.name})")
    if result.figures:
        print(f"figure: {', '.join(str(f) for f in result.figures)}")
    if result.failed:
        print(
            f"dpfl: {result.failed} of {len(result.runs)} runs failed; see the lines "
            "above",
            file=sys.stderr,
        )
        return 1
    return 0


def add_subcommands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Register ``train``, ``sweep``, ``reproduce``, ``resume``, ``plot`` and ``demo``.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        From ``parser.add_subparsers()``. Each new parser gets a ``handler``
        default: ``handler(args) -> int`` (the exit status).
    """
    p = subparsers.add_parser(
        "train",
        help="train a run from a YAML config",
        description="Train a run; writes OUT/NAME/ (config.yaml, metrics.jsonl, "
        "ledger.json, guarantee.json, checkpoint.pt, accuracy.png/.pdf/.svg), OUT "
        "being the config's output_dir (runs, relative to the current directory) "
        "or --out. Ctrl-C finishes the round, saves a checkpoint and exits 130.",
    )
    p.add_argument(
        "config",
        help="the run's YAML configuration, or a preset's name (dpfl presets list)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a key, e.g. --set privacy.epsilon=2 (value parsed as YAML; "
        "repeatable)",
    )
    p.add_argument(
        "--out",
        help="parent folder of the run folder (default: the config's output_dir, "
        "runs in the current directory)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--check",
        action="store_true",
        help="run every check train makes before its first round and exit: keys, "
        "types and ranges, the data read and partitioned, the privacy settings "
        "against the algorithm and the data (sigma calibrated), sizes against "
        "memory and time; nothing is written",
    )
    p.set_defaults(handler=_train)

    p = subparsers.add_parser(
        "sweep",
        help="run a config over a grid of --set values and several seeds",
        description="Run CONFIG once per grid point and seed in parallel processes, "
        "then write OUT/table.csv, OUT/table.md (final metric mean ± sd over the "
        "seeds, with epsilon, delta, unit and analysis) and OUT/sweep.png/.pdf/.svg "
        "(seed bands). The grid is the cartesian product of the list-valued --set "
        "items, e.g. --set privacy.epsilon=[2,8] --set algorithm.params.clip=[0.5,1].",
    )
    p.add_argument(
        "config",
        help="the base run's YAML configuration, or a preset's name "
        "(dpfl presets list)",
    )
    p.add_argument(
        "--seeds",
        default="0-2",
        help="seeds, as ranges and lists: 0-4, 0,3,7 or 0-2,10",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a key (value parsed as YAML; repeatable); a list value, "
        "e.g. privacy.epsilon=[1,2,4,8], is swept (a literal list: [[1,2]])",
    )
    p.add_argument(
        "--out",
        help="the sweep folder (default: runs/sweep-NAME in the current directory)",
    )
    p.add_argument(
        "--jobs",
        type=int,
        help="runs at a time (default: the number of CPUs, at most the number of "
        "runs; 1: one after another in this process)",
    )
    p.add_argument(
        "--backend",
        choices=("process", "ray"),
        default="process",
        help="worker processes on this machine, or Ray tasks (pip install "
        "'dpfl[ray]'; joins a running Ray instance)",
    )
    p.add_argument(
        "--metric",
        choices=("test_accuracy", "test_loss"),
        default="test_accuracy",
        help="the metric summarised (its value at each run's last evaluation)",
    )
    p.set_defaults(handler=_sweep)

    p = subparsers.add_parser(
        "reproduce",
        help="regenerate a paper's tables, figures and experiments",
        description="Write OUT/PAPER/report.md: the paper's accounting tables "
        "recomputed side by side with its printed values (and why they differ), "
        "its privacy figures (PNG, PDF, SVG), and its headline experiments over "
        "several seeds with bands, at --scale smoke (seconds, bundled data), "
        "default (the largest scale a 2-core machine runs in reasonable time) or "
        "paper (the paper's own; its data and often a GPU).",
    )
    p.add_argument(
        "paper",
        help="random-participation, federated-f-dp (prifedsync), "
        "client-level-dp-fedavg (dp-fedavg), ms-pafl, locks, or all",
    )
    p.add_argument(
        "--out",
        default=str(Path("runs") / "reports"),
        help="parent folder of the reports (default runs/reports)",
    )
    p.add_argument(
        "--scale",
        choices=("smoke", "default", "paper"),
        default="default",
        help="the experiments' scale (default: default)",
    )
    p.add_argument("--seeds", type=int, help="seeds per variant (default 2 or 3)")
    p.add_argument("--jobs", type=int, help="runs at a time (default: one per CPU)")
    p.add_argument(
        "--no-experiment", action="store_true", help="tables and figures only"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="find the preset and validate every variant's configuration at "
        "--scale, then exit; nothing is run or written",
    )
    p.set_defaults(handler=_reproduce)

    p = subparsers.add_parser(
        "resume",
        help="continue a stopped run",
        description="Continue a run from its checkpoint and ledger.",
    )
    p.add_argument("run_dir", help="the run folder, e.g. runs/NAME")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="change where the client steps run (execution, ray.*), e.g. --set "
        "ray.address=auto; other keys would change the run and are refused",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_resume)

    p = subparsers.add_parser(
        "plot",
        help="plot accuracy against rounds and against epsilon",
        description="Plot test accuracy against rounds and against epsilon spent, "
        "one line per run.",
    )
    p.add_argument("run_dirs", nargs="+", help="run folders")
    p.add_argument(
        "--out",
        help="image to write; a .png also gets a .pdf and a .svg (default: "
        "RUN_DIR/accuracy.png for one run, runs.png for several)",
    )
    p.set_defaults(handler=_plot)

    p = subparsers.add_parser(
        "demo",
        help="one budget, noise calibrated by three analyses, on embedded digits",
        description="Train DP-DSGD with random participation on the embedded "
        "digits with noise calibrated by the sound (default), WCS and OLS "
        "analyses (all proven) to one budget, and without noise, each over "
        "--seeds seeds; writes OUT/report.md (mean ± sd) and OUT/accuracy.png.",
    )
    p.add_argument(
        "--out",
        default=str(Path("runs") / "demo"),
        help="output folder (relative to the current directory)",
    )
    p.add_argument("--rounds", type=int, help="number of rounds (default 100)")
    narrow(p, "rounds", high=10_000, why="")  # four runs of --rounds rounds each
    p.add_argument(
        "--seeds",
        type=int,
        default=3,
        help="seeds per analysis (0, 1, ...); the report and figure give the "
        "mean ± sd over them",
    )
    narrow(p, "seeds", high=20, why=" (each seed is four runs)")
    p.add_argument(
        "--reproducible",
        action="store_true",
        help="derive the noise from the seeds (privacy.secure_noise: false) so "
        "that the same command gives the same numbers; NOT private against "
        "anyone who knows the seeds",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(handler=_demo)
