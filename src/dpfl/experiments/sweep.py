"""Sweeps: one configuration over a grid of overrides and several seeds.

:func:`run_sweep` runs every grid point (the cartesian product of the swept
keys' values) once per seed, each through :func:`dpfl.experiments.runner.run`
(the same path as ``dpfl train``), in parallel worker processes
(:class:`concurrent.futures.ProcessPoolExecutor`; Ray tasks with
``backend="ray"``), then writes into its output folder

``runs/POINT-sSEED/``
    Each run's folder, as ``dpfl train`` writes it.
``table.csv``, ``table.md``
    One row per grid point: the final metric's mean and sample standard
    deviation over the seeds, the number of seeds, ε spent and the budget,
    with δ, the privacy unit and the analysis (and its status).
``sweep.png`` (``.pdf``, ``.svg``)
    The metric against rounds per grid point (mean line, ±1 sd band over the
    seeds) and the final metric against the swept parameter (mean ± sd).
``sweep.json``
    The same rows, every run's outcome, and the run folders (relative to the
    sweep folder).

Importing this module does not import torch: worker processes do.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.util
import itertools
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dpfl._validate import MAX_SEED, parse_number, shown
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.experiments.config import ConfigError, RunConfig, config_from_dict
from dpfl.experiments.config_yaml import (
    apply_overrides,
    parse_override,
    read_config_file,
    set_dotted,
)
from dpfl.experiments.sweep_report import (
    METRICS,
    draw_figures,
    point_label,
    point_slug,
    summary_row,
    write_tables,
)

__all__ = [
    "BACKENDS",
    "SweepResult",
    "parse_seeds",
    "run_sweep",
    "split_overrides",
]

#: Where the runs execute: worker processes on this machine, or Ray tasks.
BACKENDS = ("process", "ray")

#: The most seeds a sweep runs (each seed is one run per grid point).
MAX_SEEDS = 1_000


# -- the grid -----------------------------------------------------------------
def parse_seeds(text: str) -> list[int]:
    """Read seeds from ``"0-4"``, ``"0,2,7"`` or a mix (``"0-2,10"``).

    Parameters
    ----------
    text : str
        Comma-separated seeds or inclusive ranges ``A-B``.

    Returns
    -------
    list of int
        The seeds in the order given, without repeats.

    Raises
    ------
    InvalidParameterError
        If an item is not a non-negative integer or range, or a range runs
        backwards, or nothing is given.
    """
    seeds: list[int] = []
    for item in str(text).split(","):
        item = item.strip(" ")
        lo, sep, hi = item.partition("-")
        try:  # the one spelling of numbers (ASCII digits)
            a = int(parse_number(lo, integer=True))
            b = int(parse_number(hi, integer=True)) if sep else a
        except ValueError:
            raise InvalidParameterError(
                f"seeds must be integers or ranges A-B separated by commas; "
                f"got {shown(text)}"
            ) from None
        if a < 0 or b < a:
            raise InvalidParameterError(
                f"seeds: a range A-B needs 0 <= A <= B; got {shown(item)}"
            )
        if b > MAX_SEED:
            raise InvalidParameterError(
                f"seeds: a seed is at most {MAX_SEED}; got {shown(item)}"
            )
        if len(seeds) + b - a >= MAX_SEEDS:
            raise InvalidParameterError(
                f"seeds: at most {MAX_SEEDS} seeds (one run each); got {shown(text)}"
            )
        seeds.extend(s for s in range(a, b + 1) if s not in seeds)
    if not seeds:
        raise InvalidParameterError(
            f"seeds must name at least one seed; got {shown(text)}"
        )
    return seeds


def split_overrides(items: Sequence[str]) -> tuple[list[str], dict[str, list[Any]]]:
    """Split ``--set`` items into fixed overrides and swept keys.

    A value that parses (as YAML) to a list is swept: ``privacy.epsilon=[1,2]``
    gives the grid axis ``privacy.epsilon: [1, 2]``. To set a key to one list,
    nest it: ``key=[[1,2]]``.

    Parameters
    ----------
    items : sequence of str
        ``"dotted.key=value"`` items.

    Returns
    -------
    (list of str, dict of str to list)
        The fixed overrides (as given) and the grid, in the order given.

    Raises
    ------
    ConfigError
        If an item is not ``key=value``, its value is not YAML, a swept list
        is empty, or one key is swept twice.
    """
    fixed: list[str] = []
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, value = parse_override(item)
        if not isinstance(value, list):
            fixed.append(item)
        elif not value:
            raise ConfigError(f"--set {key}: a swept list needs a value; got []")
        elif key in grid:
            raise ConfigError(f"--set {key} is swept twice")
        elif len(value) == 1 and isinstance(value[0], list):
            fixed.append(f"{key}={json.dumps(value[0])}")
        else:
            grid[key] = value
    return fixed, grid


def _points(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*grid.values())]


def _base_tree(config: str | Path | RunConfig | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(config, RunConfig):
        return config.to_dict()
    if isinstance(config, Mapping):
        return dict(config)
    path = Path(config)
    data = read_config_file(path)
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{shown(str(path))}: a configuration must be a mapping; got {shown(data)}"
        )
    return dict(data)


# -- one run (in a worker) ------------------------------------------------------
def _run_one(tree: dict[str, Any], threads: int) -> dict[str, Any]:
    """Run one (point, seed) configuration; return its outcome as plain data."""
    import torch

    from dpfl.experiments.runner import run

    if threads > 0:
        torch.set_num_threads(threads)
    start = time.perf_counter()
    try:
        result = run(config_from_dict(tree), progress=False)
    except DpflError as exc:
        return {"error": str(exc), "seconds": time.perf_counter() - start}
    if result.stopped == "interrupted":  # Ctrl-C: stop the sweep, not this run only
        raise KeyboardInterrupt
    g = result.guarantee
    return {
        "run_dir": str(result.run_dir),
        "stopped": result.stopped,
        "rounds": result.rounds_completed,
        "noise_multiplier": result.config.privacy.noise_multiplier,
        "metrics": dict(result.metrics),
        "private": bool(g.get("private", result.epsilon is not None)),
        "epsilon": result.epsilon,
        "delta": g.get("delta", result.config.privacy.delta),
        "unit": g.get("unit"),
        "analysis": g.get("analysis"),
        "status": g.get("status"),
        "seconds": time.perf_counter() - start,
    }


# -- the result -----------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SweepResult:
    """What a sweep wrote.

    Attributes
    ----------
    out_dir : Path
        The sweep folder.
    grid : dict of str to list
        The swept keys and their values.
    seeds : list of int
        The seeds every grid point ran with.
    rows : list of dict
        One per grid point (the table's rows): ``point`` (its label), each
        swept key, ``seeds`` (runs that finished), ``METRIC_mean`` and
        ``METRIC_sd`` (sample sd, ``None`` for fewer than 2 seeds),
        ``epsilon_mean``/``epsilon_sd`` (ε spent), ``epsilon_budget``,
        ``delta``, ``unit``, ``analysis``, ``status``, ``noise_multiplier``,
        ``rounds`` and ``failed`` (runs that raised an error).
    runs : list of dict
        One per (point, seed): its outcome (``error`` for a failed run).
    table_csv, table_md : Path
        The table.
    figures : list of Path
        ``sweep.png`` and its PDF and SVG (empty if no run was evaluated).
    """

    out_dir: Path
    grid: dict[str, list[Any]]
    seeds: list[int]
    rows: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    table_csv: Path
    table_md: Path
    figures: list[Path]

    @property
    def failed(self) -> int:
        """Number of runs that ended in an error."""
        return sum(1 for r in self.runs if "error" in r)


def run_sweep(
    config: str | Path | RunConfig | Mapping[str, Any],
    seeds: Sequence[int],
    *,
    grid: Mapping[str, Sequence[Any]] | None = None,
    overrides: Sequence[str] = (),
    out: str | Path | None = None,
    jobs: int | None = None,
    backend: str = "process",
    metric: str = "test_accuracy",
    progress: Callable[[str], None] | None = None,
) -> SweepResult:
    """Run a configuration over a grid of overrides and seeds; tabulate and plot.

    Parameters
    ----------
    config : str, Path, RunConfig or mapping
        The base configuration (a YAML file, a config, or its plain tree).
    seeds : sequence of int
        Seeds; each grid point runs once per seed (``seed`` is overridden).
    grid : mapping of str to sequence, optional
        Swept keys (dotted, as in ``--set``) and their values; the grid is
        their cartesian product.
    overrides : sequence of str
        ``--set`` items; list-valued ones are swept
        (:func:`split_overrides`) and join ``grid``.
    out : str or Path, optional
        The sweep folder (default ``runs/sweep-NAME`` in the current
        directory). It must not already hold the sweep's runs.
    jobs : int, optional
        Runs at a time (default: the number of CPUs, at most the number of
        runs); each run gets ``CPUs // jobs`` torch threads. 1 runs in this
        process, one after another.
    backend : str
        ``"process"`` (worker processes) or ``"ray"`` (Ray tasks; joins a
        running Ray instance if there is one, else starts a local one;
        ``pip install 'dpfl[ray]'``).
    metric : str
        The summarised metric: ``"test_accuracy"`` or ``"test_loss"`` (its
        value at the last evaluation).
    progress : callable, optional
        Called with one line per finished run.

    Returns
    -------
    SweepResult
        The table's rows, every run's outcome and the files written.

    Raises
    ------
    InvalidParameterError
        On empty seeds, a bad ``jobs``, ``backend`` or ``metric``.
    ConfigError
        If any grid point's configuration is invalid (checked before any
        run starts).
    DpflError
        If the sweep folder already holds one of its runs, or Ray is asked
        for and not installed.
    ModuleNotFoundError
        If PyTorch (the ``train`` extra) is not installed.
    KeyboardInterrupt
        On Ctrl-C: the running runs finish their round and save a checkpoint
        (``dpfl resume`` continues each), and no table is written.
    """
    seeds = [int(s) for s in seeds]
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise InvalidParameterError(
            f"seeds must be distinct non-negative integers, at least one; got {seeds}"
        )
    if backend not in BACKENDS:
        raise InvalidParameterError(
            f"backend must be one of {list(BACKENDS)}; got {backend!r}"
        )
    if metric not in METRICS:
        raise InvalidParameterError(
            f"metric must be one of {list(METRICS)}; got {metric!r}"
        )
    fixed, swept = split_overrides(overrides)
    full_grid: dict[str, list[Any]] = {k: list(v) for k, v in (grid or {}).items()}
    for k, v in swept.items():
        if k in full_grid:
            raise ConfigError(f"{k} is swept twice")
        full_grid[k] = v
    for k, v in full_grid.items():
        if not v:
            raise ConfigError(f"grid key {k}: a swept list needs a value; got []")
    if "seed" in full_grid:
        raise ConfigError("sweep seeds with seeds (--seeds), not a grid key 'seed'")

    if importlib.util.find_spec("torch") is None:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")
    base = apply_overrides(_base_tree(config), fixed)
    base_config = config_from_dict(base)
    out_dir = (
        Path(out) if out is not None else Path("runs") / f"sweep-{base_config.name}"
    )
    points = _points(full_grid)
    tasks: list[tuple[int, int, dict[str, Any]]] = []
    for i, point in enumerate(points):
        for seed in seeds:
            tree = apply_overrides(base, [])
            for key, value in point.items():
                set_dotted(tree, key, value)
            tree["seed"] = seed
            tree["name"] = f"{point_slug(point)}-s{seed}"
            tree["output_dir"] = str(out_dir / "runs")
            try:
                cfg = config_from_dict(tree)
            except ConfigError as exc:
                raise ConfigError(f"grid point {point_label(point)}: {exc}") from None
            for name in ("checkpoint.pt", "ledger.json"):
                if (cfg.run_dir / name).exists():
                    raise DpflError(
                        f"{out_dir} already holds this sweep's run {cfg.run_dir}; "
                        "choose another folder (--out)"
                    )
            tasks.append((i, seed, tree))

    cpus = os.cpu_count() or 1
    if jobs is None:
        jobs = min(cpus, len(tasks))
    if not isinstance(jobs, int) or jobs < 1:
        raise InvalidParameterError(f"jobs must be an integer >= 1; got {jobs!r}")
    threads = max(1, cpus // jobs) if jobs > 1 else 0
    out_dir.mkdir(parents=True, exist_ok=True)

    outcomes: dict[tuple[int, int], dict[str, Any]] = {}
    done = 0

    def finished(i: int, seed: int, outcome: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        outcomes[(i, seed)] = outcome
        if progress is not None:
            progress(
                f"[{done}/{len(tasks)}] {point_label(points[i])} seed={seed}: "
                f"{_outcome_text(outcome, metric)} ({outcome['seconds']:.0f} s)"
            )

    if jobs == 1:
        for i, seed, tree in tasks:
            finished(i, seed, _run_one(tree, threads))
    elif backend == "process":
        _run_processes(tasks, jobs, threads, finished)
    else:
        _run_ray(tasks, jobs, threads, finished)

    runs = []
    for i, seed, _ in tasks:
        outcome = dict(outcomes[(i, seed)])
        if "run_dir" in outcome:
            outcome["run_dir"] = os.path.relpath(outcome["run_dir"], out_dir)
        runs.append({"point": point_label(points[i]), "seed": seed, **outcome})
    rows = [
        summary_row(
            point, [outcomes[(i, s)] for s in seeds], full_grid, base_config, metric
        )
        for i, point in enumerate(points)
    ]
    table_csv, table_md = write_tables(out_dir, rows, full_grid, seeds, metric)
    figures = draw_figures(
        out_dir, points, seeds, outcomes, rows, full_grid, metric, base_config
    )
    (out_dir / "sweep.json").write_text(
        json.dumps(
            {
                "config": base,
                "grid": full_grid,
                "seeds": seeds,
                "metric": metric,
                "rows": rows,
                "runs": runs,
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    return SweepResult(
        out_dir=out_dir,
        grid=full_grid,
        seeds=seeds,
        rows=rows,
        runs=runs,
        table_csv=table_csv,
        table_md=table_md,
        figures=figures,
    )


def _run_processes(
    tasks: list[tuple[int, int, dict[str, Any]]],
    jobs: int,
    threads: int,
    finished: Callable[[int, int, dict[str, Any]], None],
) -> None:
    """Run the tasks in ``jobs`` spawned processes, at most ``jobs`` at a time.

    A run starts only when a process is free, so that on Ctrl-C (which
    reaches the workers too: each finishes its round and saves a checkpoint)
    no queued run starts afterwards; the runs under way are waited for, then
    the interrupt is raised.
    """
    ctx = multiprocessing.get_context("spawn")
    queue = list(tasks)
    running: dict[concurrent.futures.Future[dict[str, Any]], tuple[int, int]] = {}
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        try:
            while queue or running:
                while queue and len(running) < jobs:
                    i, seed, tree = queue.pop(0)
                    running[pool.submit(_run_one, tree, threads)] = (i, seed)
                done, _ = concurrent.futures.wait(
                    running, return_when=concurrent.futures.FIRST_COMPLETED
                )
                for fut in done:
                    finished(*running.pop(fut), fut.result())
        except KeyboardInterrupt:
            queue.clear()
            concurrent.futures.wait(running)  # each saves its checkpoint
            raise


def _run_ray(
    tasks: list[tuple[int, int, dict[str, Any]]],
    jobs: int,
    threads: int,
    finished: Callable[[int, int, dict[str, Any]], None],
) -> None:
    try:
        import ray
    except ModuleNotFoundError:
        raise DpflError("backend 'ray' needs Ray: pip install 'dpfl[ray]'") from None
    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1)(_run_one)
        refs = {remote.remote(tree, threads): (i, seed) for i, seed, tree in tasks}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            finished(*refs[ready[0]], ray.get(ready[0]))
    finally:
        if started:
            ray.shutdown()


def _outcome_text(outcome: Mapping[str, Any], metric: str) -> str:
    if "error" in outcome:
        return f"FAILED: {outcome['error']}"
    value = outcome["metrics"].get(metric)
    parts = [f"{METRICS[metric]} {value:.4g}" if value is not None else "no eval"]
    if outcome["epsilon"] is not None:
        parts.append(f"epsilon {outcome['epsilon']:.4g} at delta {outcome['delta']:g}")
    else:
        parts.append("not private")
    if outcome["stopped"] != "completed":
        parts.append(f"stopped ({outcome['stopped']}) after {outcome['rounds']} rounds")
    return ", ".join(parts)
