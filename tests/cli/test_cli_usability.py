"""The command line's small things: help and shown defaults for every option,
one default δ, --version, --plot only where it draws, outputs under runs/,
a one-line message for a missing extra, exit 130 on Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dpfl
from dpfl.cli.main import build_parser, main
from dpfl.experiments import runner
from dpfl.experiments.config import load_config
from dpfl.experiments.presets import PRESET_DIR
from dpfl.papers import audits
from dpfl.papers.base import DEFAULT_DELTA

PRESET = PRESET_DIR / "dp-fedavg-digits.yaml"


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parsers(sub, (*path, name))
    return out


PARSERS = _parsers(build_parser())
LEAVES = [
    (path, p)
    for path, p in PARSERS
    if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"dpfl {dpfl.__version__}"


@pytest.mark.parametrize("path,parser", PARSERS, ids=[" ".join(p) for p, _ in PARSERS])
def test_every_option_has_help_and_shows_its_default(path, parser) -> None:
    parser.format_help()  # formats without error
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                assert choice.help, f"dpfl {' '.join(path)} {choice.dest}: no help"
            continue
        assert action.help, f"dpfl {' '.join(path)}: {action.dest} has no help"
        if action.option_strings and action.default not in (None, False):
            shown = parser._get_formatter()._get_help_string(action)
            assert "default" in shown, (
                f"dpfl {' '.join(path)} {action.option_strings[0]}: default "
                f"{action.default} not shown"
            )


def test_one_default_delta() -> None:
    seen = set()
    for _, parser in LEAVES:
        for action in parser._actions:
            if "--delta" in action.option_strings and action.default is not None:
                seen.add(action.default)
        if parser.get_default("default_delta") is not None:
            seen.add(parser.get_default("default_delta"))
    assert seen == {DEFAULT_DELTA} == {1e-5}
    # the training configuration's default is the same
    from dpfl.experiments.config import PrivacyConfig

    assert PrivacyConfig().delta == DEFAULT_DELTA


def test_plot_offered_only_where_it_draws() -> None:
    for path, parser in LEAVES:
        has_plot = any("--plot" in a.option_strings for a in parser._actions)
        if path[0] == "account" or tuple(path[:2]) in {
            ("audit", a.name) for a in audits() if a.figure
        }:
            assert has_plot, path  # curves, or the training audits' trade-off figure
        elif path[0] in ("calibrate", "audit"):
            assert not has_plot, path
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(
            [
                "calibrate",
                "gaussian",
                "--epsilon",
                "1",
                "--delta",
                "1e-5",
                "--plot",
                "x",
            ]
        )
    assert exc.value.code == 2


def test_account_gaussian_plot(tmp_path: Path, capsys) -> None:
    out = tmp_path / "g.png"
    argv = ["account", "gaussian", "--noise-multiplier", "2", "--plot", str(out)]
    assert main(argv) == 0
    assert out.stat().st_size > 10_000
    assert (tmp_path / "g.pdf").exists() and (tmp_path / "g.svg").exists()
    assert f"wrote {out}" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["account", "locks", "--q1", "0.1", "--max-p2", "0.5",
         "--noise-multiplier", "5", "--rounds", "20"],
        ["account", "ms-pafl", "--rounds", "10"],
        ["account", "prifedsync", "--noise-multiplier", "1", "--batch-size", "16",
         "--records-per-client", "600", "--local-steps", "4", "--rounds", "5"],
        ["account", "random-participation", "--p", "0.01", "--q", "0.2",
         "--records-per-client", "50", "--noise-multiplier", "1", "--rounds", "20"],
    ],
    ids=lambda a: a[1],
)  # fmt: skip
def test_every_account_subcommand_plots(tmp_path: Path, argv: list[str]) -> None:
    out = tmp_path / "c.png"
    assert main([*argv, "--plot", str(out)]) == 0
    assert out.stat().st_size > 10_000 and (tmp_path / "c.pdf").exists()


def test_outputs_default_under_runs_in_the_current_directory() -> None:
    parser = build_parser()
    assert Path(parser.parse_args(["demo"]).out) == Path("runs/demo")
    assert Path(parser.parse_args(["reproduce", "locks"]).out) == Path("runs/reports")
    assert parser.parse_args(["sweep", "c.yaml"]).out is None  # runs/sweep-NAME
    assert load_config(PRESET).output_dir == "runs"


def _fake_run(stopped: str, seen: dict[str, Any]) -> Any:
    def run(
        config: Any,
        *,
        progress: bool = True,
        resume: bool = False,
        callbacks: Any = None,
    ) -> Any:
        seen["config"] = config
        config.run_dir.mkdir(parents=True, exist_ok=True)
        return runner.RunResult(
            run_dir=config.run_dir,
            config=config,
            rounds_completed=3,
            stopped=stopped,
            epsilon=1.0,
            metrics={"test_accuracy": 0.5},
            guarantee={"private": True},
        )

    return run


def test_train_out_and_ctrl_c_exit_130(tmp_path, monkeypatch, capsys) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(runner, "run", _fake_run("completed", seen))
    assert main(["train", str(PRESET), "--out", str(tmp_path / "o")]) == 0
    assert seen["config"].run_dir == tmp_path / "o" / "dp-fedavg-digits"
    # Ctrl-C: the runner finished the round and saved; the command exits 130
    monkeypatch.setattr(runner, "run", _fake_run("interrupted", seen))
    assert main(["train", str(PRESET), "--out", str(tmp_path / "o")]) == 130
    err = capsys.readouterr().err
    assert "dpfl resume " in err and "interrupted after round 3" in err

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run", interrupted)
    assert main(["train", str(PRESET)]) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("dpfl: interrupted;") and err.endswith(
        "continue or finish the run with: dpfl resume runs/dp-fedavg-digits"
    )


#: dpfl's own source first on the path, wherever the test runs from.
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(
        [str(Path(dpfl.__file__).resolve().parent.parent)]
        + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    ),
}

BLOCK_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "ray"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Block())
from dpfl.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", str(PRESET)], "dpfl train needs PyTorch: pip install 'dpfl[train]'"),
        (["sweep", str(PRESET)], "dpfl sweep needs PyTorch: pip install 'dpfl[train]'"),
    ],
)
def test_missing_extra_is_one_line(tmp_path: Path, argv, message) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=ENV,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == f"dpfl: error: {message}"


def test_accounting_commands_run_without_torch(tmp_path: Path) -> None:
    argv = ["account", "gaussian", "--noise-multiplier", "2"]
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH, *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=ENV,
    )
    assert proc.returncode == 0 and "Gaussian mechanism" in proc.stdout


@pytest.mark.parametrize(
    "argv,line",
    [
        (
            ["account", "random-participation", "--p", "1.5", "--q", "0.1",
             "--records-per-client", "30", "--noise-multiplier", "1"],
            "dpfl account random-participation: error: argument --p: must be a "
            "number in (0, 1]; got '1.5'",
        ),
        (
            ["account", "gaussian", "--noise-multiplier", "-1"],
            "dpfl account gaussian: error: argument --noise-multiplier: must be a "
            "number in [0.001, 1e+06] (below, the privacy loss overflows; above, "
            "every epsilon is 0); got '-1'",
        ),
        (  # a constraint between flags: the library's check, the flag named
            ["account", "dp-fedavg", "--clients", "10", "--cohort", "20",
             "--rounds", "3", "--noise-multiplier", "1"],
            "dpfl: error: --cohort: cohort_size",
        ),
    ],
)  # fmt: skip
def test_errors_name_the_flag(capsys, argv, line) -> None:
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse: a flag outside its domain
        status = exc.code
    assert status == 2
    assert capsys.readouterr().err.strip().startswith(line)


def test_json_echoes_the_inputs(capsys) -> None:
    argv = ["account", "gaussian", "--noise-multiplier", "2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["inputs"] == {
        "scheme": "gaussian",
        "sensitivity": 1.0,
        "noise_multiplier": 2.0,
        "analysis": "exact",
        "delta": DEFAULT_DELTA,
        "epsilon": None,
    }


def test_analysis_help_gives_each_status() -> None:
    """The statuses come from the scheme registry (the tables' own labels)."""
    from dpfl.accounting import events as ev
    from dpfl.accounting import schemes

    parser = dict(PARSERS)[("account", "random-participation")]
    text = " ".join(parser.format_help().split())
    event = ev.ClientPoisson(0.5, ev.RecordPoisson(0.5, 2, ev.Gaussian(1.0)))
    for a in schemes.scheme_of(event).analyses:
        assert f"{a.name} ({a.status})" in text
    assert "sound (proven)" in text and "wcs (proven)" in text


def test_a_new_command_is_one_module(tmp_path, monkeypatch, capsys) -> None:
    # One file on the package's path with add_subcommands, and nothing else:
    # dpfl --help lists it and dpfl runs it.
    import dpfl.cli
    from dpfl.cli.main import command_modules

    (tmp_path / "hello.py").write_text(
        "def add_subcommands(subparsers):\n"
        "    p = subparsers.add_parser('hello', help='say hello')\n"
        "    p.add_argument('--name', default='world', help='who')\n"
        "    p.set_defaults(handler=lambda a: print(f'hello {a.name}'))\n"
    )
    monkeypatch.setattr(dpfl.cli, "__path__", [*dpfl.cli.__path__, str(tmp_path)])
    try:
        names = [m.__name__.rpartition(".")[2] for m in command_modules()]
        assert names == ["account", "audit", "data", "hello", "presets", "train"]
        assert "hello" in build_parser().format_help()
        assert main(["hello", "--name", "dpfl"]) == 0
        assert capsys.readouterr().out == "hello dpfl\n"
    finally:
        sys.modules.pop("dpfl.cli.hello", None)
        if hasattr(dpfl.cli, "hello"):
            delattr(dpfl.cli, "hello")
