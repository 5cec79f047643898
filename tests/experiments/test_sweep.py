"""dpfl sweep: grid × seeds through the config runner, one table, seed bands."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from dpfl.cli.main import main
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.experiments.config import ConfigError
from dpfl.experiments.presets import PRESET_DIR
from dpfl.experiments.sweep import parse_seeds, run_sweep, split_overrides

PRESET = PRESET_DIR / "dp-fedavg-digits.yaml"

#: The preset shrunk to a few seconds a run: 3 rounds, evaluated at 2 and 3.
TINY = [
    "rounds=3",
    "eval_every=2",
    "data.num_clients=20",
    "algorithm.params.cohort_size=10",
    "algorithm.params.local_epochs=1",
    "privacy.noise_multiplier=2.0",
    "privacy.epsilon=100",
]


def test_parse_seeds() -> None:
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("0,3,7") == [0, 3, 7]
    assert parse_seeds("0-2,10,1") == [0, 1, 2, 10]
    for bad in ("", "a", "3-1", "-1"):
        with pytest.raises(InvalidParameterError, match="seeds"):
            parse_seeds(bad)


def test_split_overrides() -> None:
    fixed, grid = split_overrides(
        ["rounds=3", "privacy.epsilon=[1, 2]", "data.options.x=[[1,2]]", "a=[b, c]"]
    )
    assert fixed == ["rounds=3", "data.options.x=[1, 2]"]
    assert grid == {"privacy.epsilon": [1, 2], "a": ["b", "c"]}
    with pytest.raises(ConfigError, match="needs a value"):
        split_overrides(["privacy.epsilon=[]"])
    with pytest.raises(ConfigError, match="swept twice"):
        split_overrides(["k=[1,2]", "k=[3]"])
    with pytest.raises(ConfigError, match="key.sub=value"):
        split_overrides(["novalue"])


def test_invalid_grid_point_fails_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"grid point clip=-1: .*clip"):
        run_sweep(
            PRESET,
            [0],
            overrides=[*TINY, "algorithm.params.clip=[1.0, -1]"],
            out=tmp_path / "s",
            jobs=1,
        )
    assert not (tmp_path / "s" / "runs").exists()
    with pytest.raises(InvalidParameterError, match="backend"):
        run_sweep(PRESET, [0], out=tmp_path / "s", backend="dask")
    with pytest.raises(InvalidParameterError, match="seeds"):
        run_sweep(PRESET, [], out=tmp_path / "s")


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_sweep_table_and_banded_figure(tmp_path: Path) -> None:
    """2 noise levels × 2 seeds, in one process: table rows equal the runs."""
    lines: list[str] = []
    out = tmp_path / "sweep"
    res = run_sweep(
        PRESET,
        [0, 1],
        overrides=[*TINY, "privacy.noise_multiplier=[1.0, 4.0]"],
        out=out,
        jobs=1,
        progress=lines.append,
    )
    assert len(lines) == 4 and lines[-1].startswith("[4/4] σ=4 seed=1:")
    assert res.failed == 0 and len(res.runs) == 4
    assert (out / "runs" / "noise_multiplier-4-s1" / "ledger.json").exists()
    assert [r["point"] for r in res.rows] == ["σ=1", "σ=4"]
    for row, sigma in zip(res.rows, (1.0, 4.0)):
        runs = [r for r in res.runs if r["point"] == row["point"]]
        accs = [r["metrics"]["test_accuracy"] for r in runs]
        mean = sum(accs) / 2
        sd = math.sqrt(sum((a - mean) ** 2 for a in accs))  # ddof = 1 with n = 2
        assert row["seeds"] == 2
        assert row["test_accuracy_mean"] == pytest.approx(mean, abs=1e-12)
        assert row["test_accuracy_sd"] == pytest.approx(sd, abs=1e-12)
        assert row["noise_multiplier"] == sigma
        assert row["delta"] == 1e-3 and row["unit"] == "client"
        assert row["analysis"] == "sound" and row["status"] == "proven"
        # more noise, less epsilon: the ledger's figure, not the budget
        assert 0 < row["epsilon_mean"] < 100
        for r in runs:
            assert not Path(r["run_dir"]).is_absolute()
            assert (out / r["run_dir"] / "metrics.jsonl").exists()
    assert res.rows[0]["epsilon_mean"] > res.rows[1]["epsilon_mean"]
    # the two seeds are different runs
    first = [r["metrics"]["test_accuracy"] for r in res.runs[:2]]
    assert first[0] != first[1] or res.rows[0]["test_accuracy_sd"] == 0
    with res.table_csv.open() as fh:
        table = list(csv.DictReader(fh))
    assert [t["privacy.noise_multiplier"] for t in table] == ["1.0", "4.0"]
    md = res.table_md.read_text()
    assert "± " in md and "sound (proven)" in md and "| client |" in md
    assert (
        str(tmp_path) not in md
        and str(tmp_path) not in (out / "sweep.json").read_text()
    )
    assert [p.suffix for p in res.figures] == [".png", ".pdf", ".svg"]
    assert all(p.stat().st_size > 1000 for p in res.figures)
    data = json.loads((out / "sweep.json").read_text())
    assert data["grid"] == {"privacy.noise_multiplier": [1.0, 4.0]}
    # a second sweep into the same folder would mix runs: refused
    with pytest.raises(DpflError, match="already holds"):
        run_sweep(
            PRESET,
            [1],
            overrides=[*TINY, "privacy.noise_multiplier=[4.0]"],
            out=out,
            jobs=1,
        )


@pytest.mark.slow
def test_sweep_cli_in_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The acceptance sweep shrunk: 3 seeds × 2 budgets in 2 worker processes."""
    out = tmp_path / "cli"
    args = ["sweep", str(PRESET), "--seeds", "0-2", "--out", str(out), "--jobs", "2"]
    for item in TINY[:-2]:
        args += ["--set", item]
    args += ["--set", "privacy.noise_multiplier=null", "--set", "privacy.epsilon=[4,8]"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert text.count("seed=") == 6 and "table:" in text and "sweep.png" in text
    with (out / "table.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["privacy.epsilon"], r["seeds"]) for r in rows] == [
        ("4", "3"),
        ("8", "3"),
    ]
    for r in rows:  # calibrated to the budget: spent within 2% below it
        assert float(r["epsilon_budget"]) * 0.98 <= float(r["epsilon_mean"])
        assert float(r["epsilon_mean"]) <= float(r["epsilon_budget"])
        assert float(r["test_accuracy_sd"]) >= 0
    assert (out / "sweep.png").exists() and (out / "sweep.pdf").exists()


@pytest.mark.integration
def test_ray_backend_gives_the_in_process_results(tmp_path: Path) -> None:
    """Ray tasks run the same configurations: the same table as one process."""
    pytest.importorskip("ray")
    # seeded noise: with secret noise every run (in any process) draws its own
    over = [*TINY, "privacy.noise_multiplier=[1.0, 4.0]", "privacy.secure_noise=false"]
    local = run_sweep(PRESET, [0, 1], overrides=over, out=tmp_path / "a", jobs=1)
    ray = run_sweep(
        PRESET, [0, 1], overrides=over, out=tmp_path / "b", jobs=2, backend="ray"
    )
    assert ray.failed == 0
    for a, b in zip(local.rows, ray.rows):
        assert a["test_accuracy_mean"] == pytest.approx(b["test_accuracy_mean"])
        assert a["epsilon_mean"] == b["epsilon_mean"]


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--seeds", "2-1"], "seeds: a range A-B needs 0 <= A <= B; got '2-1'"),
        (["--jobs", "0"], "argument --jobs: must be an integer in [1, 1024]; got '0'"),
        (["--set", "privacy.epsilonn=[1,2]"], "did you mean 'privacy.epsilon'"),
    ],
)
def test_sweep_cli_errors_are_one_line(tmp_path, capsys, extra, needle) -> None:
    argv = ["sweep", str(PRESET), "--out", str(tmp_path / "s"), *extra]
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse: a flag outside its domain
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert not (tmp_path / "s").exists()
