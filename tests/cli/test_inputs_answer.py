"""Every input answers within a minute: a result, or one line naming what to change.

Held-out cases that once hung, raised a traceback or were accepted silently
(each is named below with what it did), and the parity of ``dpfl train
--check`` with ``dpfl train``: both run one validation path
(:func:`dpfl.experiments.build.prepare`), so ``--check`` refuses exactly what
``train`` refuses before its first round, with the same line.

Commands run in this process through :func:`test_fuzz_cli.run_cli` (exit
status, stdout, stderr; an alarm fails a command that runs past 60 s).
"""

from __future__ import annotations

import math
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_fuzz_cli import _inside, check_outcome, run_cli

pytest.importorskip("torch")

#: A tiny digits run (DP-DSGD with random participation, 20 x 5 records).
TINY: dict[str, Any] = {
    "name": "t",
    "seed": 0,
    "rounds": 1,
    "data": {"num_clients": 20, "records_per_client": 5},
    "model": {"options": {"hidden": 8}},
    "algorithm": {
        "name": "dsgd-rp",
        "params": {"participation_probability": 0.5, "record_probability": 0.5},
    },
    "privacy": {"epsilon": 8.0, "delta": 1e-5, "noise_multiplier": 1.0},
    "eval_every": 1,
}


#: A change's mapping marked so replaces the base's section (else: merged).
REPLACE = "__replace__"


def _merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in change.items():
        if isinstance(v, dict) and v.get(REPLACE):
            out[k] = {key: x for key, x in v.items() if key != REPLACE}
        elif isinstance(v, dict) and isinstance(base.get(k), dict):
            out[k] = _merge(base[k], v)
        else:
            out[k] = v
    return out


def config_file(tmp: Path, change: dict[str, Any] | None = None) -> Path:
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(_merge(TINY, change or {}), allow_unicode=True))
    return path


def refused(tmp: Path, argv: list[str], named: str) -> str:
    """Run ``dpfl argv`` in ``tmp``: exit 2, one line naming ``named``."""
    start = time.monotonic()
    with _inside(tmp):
        status, out, err = run_cli(argv)
    check_outcome(argv, status, out, err, invalid=[named])
    assert status == 2, (argv, out)
    assert time.monotonic() - start < 60
    return err.strip()


def check_refuses(tmp: Path, change: dict[str, Any], named: str) -> str:
    return refused(tmp, ["train", str(config_file(tmp, change)), "--check"], named)


# -- hangs --------------------------------------------------------------------------
RP = ["calibrate", "random-participation", "--p", "0.1", "--q", "0.5"]
RP += ["--records-per-client", "3", "--rounds", "2", "--epsilon", "4"]
PFS = ["account", "prifedsync", "--noise-multiplier", "2", "--batch-size", "8"]
PFS += ["--records-per-client", "100", "--local-steps", "2", "--rounds", "2"]


@pytest.mark.parametrize(
    "argv",
    [
        [*RP, "--delta", "5e-324"],  # hung more than 60 s
        [*RP, "--delta", "1e-6_0"],  # read as 1e-60, then hung
        [*RP, "--delta=1e-16"],
        [*PFS, "--delta", "5e-324"],  # hung more than 60 s
    ],
)
def test_an_extreme_delta_is_refused_at_once(tmp_path: Path, argv: list[str]) -> None:
    start = time.monotonic()
    line = refused(tmp_path, argv, "--delta")
    assert time.monotonic() - start < 10, line


def test_a_tiny_delta_in_a_config_is_refused(tmp_path: Path) -> None:
    line = check_refuses(tmp_path, {"privacy": {"delta": 5e-324}}, "privacy.delta")
    assert "[1e-15, 1)" in line


@pytest.mark.parametrize("algorithm", ["dp-fedavg", "prifedsync", "dsgd-rp"])
def test_calibrating_to_an_epsilon_of_500_is_refused_at_once(
    tmp_path: Path, algorithm: str
) -> None:
    # σ calibrated to ε = 500 searched for minutes (DP-FedAvg, PriFedSync) or
    # stopped with the accounting's internal message (DP-DSGD: "tail too
    # heavy ... eps = 420"); past ε = 100 no guarantee is left to calibrate to
    params = {
        "dp-fedavg": {REPLACE: True, "cohort_size": 4, "batch_size": 8},
        "prifedsync": {REPLACE: True, "batch_size": 8, "local_steps": 2},
        "dsgd-rp": {},
    }[algorithm]
    change = {
        "algorithm": {"name": algorithm, "params": params},
        "privacy": {"epsilon": 500.0, "delta": 1e-4, "noise_multiplier": None},
    }
    tree = _merge(TINY, change)
    if algorithm != "dsgd-rp":
        tree["data"] = {"num_clients": 20, "partition": "iid"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    start = time.monotonic()
    line = refused(tmp_path, ["train", str(path), "--check"], "privacy.epsilon")
    assert "must be <= 100 when the noise multiplier is calibrated" in line
    assert time.monotonic() - start < 15
    # a given σ may still be guarded by such a budget
    tree["privacy"]["noise_multiplier"] = 1.0
    path.write_text(yaml.safe_dump(tree))
    with _inside(tmp_path):
        status, out, err = run_cli(["train", str(path), "--check"])
    assert status == 0, err


def test_calibrate_refuses_an_epsilon_of_500_at_once(tmp_path: Path) -> None:
    argv = ["calibrate", "dp-fedavg", "--clients", "100", "--cohort", "10"]
    argv += ["--rounds", "5", "--epsilon", "500", "--delta", "1e-5"]
    start = time.monotonic()
    assert "(0, 100]" in refused(tmp_path, argv, "--epsilon")
    assert time.monotonic() - start < 10


def test_an_accounting_command_answers_within_its_time_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever the input, `account` and `calibrate` answer within the limit
    # (50 s) or refuse naming their inputs. Here the limit is set to 1 ms, far
    # below what this calibration takes on any machine (a 1 s limit was met by
    # a fast CI machine, and the command answered instead of refusing).
    import dpfl._deadline

    monkeypatch.setattr(dpfl._deadline, "ANSWER_SECONDS", 0.001)
    argv = ["calibrate", "prifedsync", "--batch-size", "8", "--records-per-client"]
    argv += ["100", "--local-steps", "2", "--rounds", "2", "--num-clients", "10"]
    argv += ["--epsilon", "20", "--delta", "1e-5"]
    start = time.monotonic()
    line = refused(tmp_path, argv, "--epsilon 20")
    assert "no answer within 0.001 s" in line and "--delta 1e-05" in line
    assert time.monotonic() - start < 10


def test_a_noise_the_accounting_cannot_price_is_named(tmp_path: Path) -> None:
    # σ = 0.001 under a budget stopped round 1 with the accounting's internal
    # message ("privacy loss tail too heavy ..."); now refused before any
    # work, naming the keys
    change = {"privacy": {"epsilon": 50.0, "noise_multiplier": 0.001}}
    line = check_refuses(tmp_path, change, "privacy.noise_multiplier")
    assert "tail" not in line and "use a larger privacy.noise_multiplier" in line


def test_check_on_a_fifo_does_not_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `dpfl train FIFO --check` blocked forever (open waited for a writer);
    # a relative name, since a long path is shortened in the one-line error
    monkeypatch.chdir(tmp_path)
    os.mkfifo("config.fifo")
    line = refused(tmp_path, ["train", "config.fifo", "--check"], "not a regular file")
    assert "config.fifo" in line
    for other in (tmp_path, Path("/dev/zero")):
        refused(tmp_path, ["train", str(other), "--check"], "not a regular file")


def test_a_fifo_as_the_data_file_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "data.csv"
    os.mkfifo(fifo)
    change = {"data": {"name": "csv", "path": str(fifo), "partition": "iid"}}
    line = check_refuses(tmp_path, change, "data.path")
    assert "FIFO" in line


# -- tracebacks ----------------------------------------------------------------------
SYNTHETIC = {
    "data": {
        "name": "synthetic",
        "partition": None,
        "records_per_client": None,
        "options": {"alpha": 0.5, "beta": 0.5, "records_per_client": 10},
    },
    "model": {REPLACE: True, "name": "logistic_regression"},
}


def _synthetic(options: dict[str, Any]) -> dict[str, Any]:
    out = _merge(SYNTHETIC, {})
    out["data"] = dict(SYNTHETIC["data"], options=options)
    return out


def test_synthetic_data_without_alpha_and_beta_is_refused(tmp_path: Path) -> None:
    # a TypeError traceback, after --check had said "valid"
    line = check_refuses(
        tmp_path, _synthetic({"records_per_client": 10}), "data.options.alpha"
    )
    assert "required" in line
    with _inside(tmp_path):
        status, _, err = run_cli(["train", "run.yaml", "--no-progress"])
    assert status == 2 and err.strip() == line  # train: the same line


@pytest.mark.parametrize(
    ("options", "named"),
    [
        # an OverflowError
        ({"alpha": 0, "beta": 0, "records_per_client": 1e308}, "records_per_client"),
        # numpy MemoryErrors
        ({"alpha": 0, "beta": 0, "records_per_client": 10, "dim": 10**7}, "GB"),
        ({"alpha": 0, "beta": 0, "records_per_client": 10**9}, "GB"),
    ],
)
def test_synthetic_sizes_are_refused_before_generating(
    tmp_path: Path, options: dict[str, Any], named: str
) -> None:
    start = time.monotonic()
    change = _synthetic(options)
    change["privacy"] = {"allow_large_delta": True}
    check_refuses(tmp_path, change, named)
    assert time.monotonic() - start < 10


def test_an_mlp_too_large_for_memory_is_refused_before_any_work(
    tmp_path: Path,
) -> None:
    # a torch out-of-memory error 66 s in: now refused from the parameter
    # count (counted on the meta device) before the model exists
    start = time.monotonic()
    change = {"model": {"options": {"hidden": [200_000, 200_000]}}}
    line = check_refuses(tmp_path, change, "model")
    assert "parameters" in line and "available" in line
    assert time.monotonic() - start < 15


def test_a_model_whose_noise_takes_minutes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A 3.4e8-weight model did not finish one round in 180 s. The checks are
    # lower bounds measured on this machine; here its memory and sampler are
    # set (16 GB, 1 µs per normal: the secure noise alone is 340 s a round)
    from dpfl.experiments import checks

    monkeypatch.setattr(checks, "_seconds_per_normal", lambda: 1e-6)
    monkeypatch.setattr(checks, "available_memory", lambda device="cpu": 1e12)
    change = {"model": {"options": {"hidden": [18_000, 18_000]}}}  # 3.3e8
    line = check_refuses(tmp_path, change, "model")
    assert "secure noise alone would take about 3" in line
    monkeypatch.setattr(checks, "available_memory", lambda device="cpu": 16e9)
    line = check_refuses(tmp_path, change, "model")
    assert "16 GB available" in line


@pytest.mark.parametrize("hidden", [4.394177470235309e16, [786287122087998592]])
def test_a_model_whose_size_overflows_is_refused(tmp_path: Path, hidden: Any) -> None:
    # found by benchmarks/fuzz.py (--seed 1): torch's "Storage size
    # calculation overflowed" traceback while the model was counted
    change = {"model": {"options": {"hidden": hidden}}}
    line = check_refuses(tmp_path, change, "model")
    assert "too large to exist" in line


def test_a_participation_probability_of_5e_324_is_refused(tmp_path: Path) -> None:
    # found by benchmarks/fuzz.py (--seed 1): p q n underflowed to 0 and the
    # round's scale 1 / (p q n) raised ZeroDivisionError (under the ols
    # analysis, which prices such a round at once)
    change = {
        "algorithm": {"params": {"participation_probability": 5e-324}},
        "privacy": {"analysis": "ols"},
    }
    line = check_refuses(tmp_path, change, "participation_probability")
    assert "too small" in line


@pytest.mark.parametrize(("sigma", "named"), [(1.0, "1"), (None, "null")])
def test_a_round_that_cannot_be_priced_in_time_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sigma: Any, named: str
) -> None:
    # One round is priced before the run, as `dpfl account` prices it: within
    # its time limit (50 s), at the given sigma or, before a calibration, at
    # sigma = 1. Under the sound analysis, p = 1e-30 once took minutes for one
    # round (the run would price every round so) and its calibration ran into
    # the 10-minute limit. The accounting now prices it in about a second, so
    # here the pricing is made slow (10 s) and the limit short (0.2 s): what is
    # tested is that a round not priced in time is refused, naming the keys.
    import dpfl._deadline
    from dpfl.experiments import privacy

    price = privacy.price_one_round

    def slow_price(*args: Any, **kwargs: Any) -> Any:
        time.sleep(10)
        return price(*args, **kwargs)

    monkeypatch.setattr(privacy, "price_one_round", slow_price)
    monkeypatch.setattr(dpfl._deadline, "ANSWER_SECONDS", 0.2)
    start = time.monotonic()
    change = {
        "algorithm": {"params": {"participation_probability": 1e-30}},
        "privacy": {"noise_multiplier": sigma},
    }
    line = check_refuses(tmp_path, change, f"privacy.noise_multiplier {named}")
    assert "was not priced within 0.2 s" in line and "privacy.analysis sound" in line
    assert time.monotonic() - start < 30


def test_an_idx_header_of_2_to_the_64_is_refused(tmp_path: Path) -> None:
    # the size wrapped around to 0 (a ValueError traceback)
    folder = tmp_path / "idx"
    folder.mkdir()
    images = bytes([0, 0, 8, 4]) + struct.pack(">4I", *[65536] * 4) + bytes(16)
    (folder / "train-images-idx3-ubyte").write_bytes(images)
    labels = bytes([0, 0, 8, 1]) + struct.pack(">I", 1) + bytes(1)
    (folder / "train-labels-idx1-ubyte").write_bytes(labels)
    change = {"data": {"name": "idx", "path": str(folder), "partition": "iid"}}
    line = check_refuses(tmp_path, change, "IDX header promises")
    assert "18446744073709551616 bytes" in line


def test_client_test_records_beyond_memory_are_refused(tmp_path: Path) -> None:
    # found by benchmarks/fuzz.py (--seed 2): client_test_records 3.4e16
    # (drawn with replacement, so no test set bounds it) raised numpy's
    # MemoryError; now the size is checked from the configuration first
    change = {
        "data": {"partition": "iid", "records_per_client": None},
        "algorithm": {
            "name": "prifedsync",
            "params": {REPLACE: True, "batch_size": 8, "local_steps": 2},
        },
    }
    tree = _merge(TINY, change)
    tree["data"].pop("records_per_client")
    tree["data"]["options"] = {"client_test_records": 3.396447569848432e16}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    line = refused(
        tmp_path, ["train", str(path), "--check"], "data.options.client_test_records"
    )
    assert "GB" in line
    tree["data"]["options"] = {"client_test_records": 3}
    path.write_text(yaml.safe_dump(tree))
    with _inside(tmp_path):
        status, _, err = run_cli(["train", str(path), "--check"])
    assert status == 0, err


def test_a_norm_noise_the_accounting_cannot_hold_is_refused(tmp_path: Path) -> None:
    # found by benchmarks/fuzz.py (--seed 3): LOCKS's norm noise, the ratio
    # times sigma, of 1.4e-233 raised an OverflowError (its mu^2 is past a
    # double), in `dpfl account locks` and in a run alike
    argv = ["account", "locks", "--q1", "0.1", "--max-p2", "1", "--rounds", "3"]
    argv += ["--noise-multiplier", "2", "--norm-noise-ratio", "6.94e-234"]
    argv += ["--delta", "1e-5", "--json"]
    line = refused(tmp_path, argv, "--norm-noise-ratio")
    assert "6.94e-234 x 2" in line
    change = {
        "data": {"partition": "iid", "records_per_client": None},
        "algorithm": {
            "name": "locks",
            "params": {REPLACE: True, "norm_noise_ratio": 1e-234},
        },
        "privacy": {"delta": 1e-3},
    }
    for sigma in (1.5, None):  # given, or calibrated
        change["privacy"]["noise_multiplier"] = sigma
        tree = _merge(TINY, change)
        tree["data"].pop("records_per_client")
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(tree))
        named = "algorithm.params.norm_noise_ratio"
        line = refused(tmp_path, ["train", str(path), "--check"], named)
        assert "below which the privacy loss overflows" in line


# -- silent accepts ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"data": {"options": {"flatten": "yes"}}}, "data.options.flatten"),
        (
            {"model": {"name": "logistic_regression", "options": {"bias": "no"}}},
            "model.options.bias",
        ),
        ({"privacy": {"allow_unproven": "yes"}}, "privacy.allow_unproven"),
        ({"privacy": {"secure_noise": "false"}}, "privacy.secure_noise"),
    ],
)
def test_strings_are_never_read_as_booleans(
    tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    # "yes" and "no" both read as true
    check_refuses(tmp_path, change, named)


def test_unquoted_yes_and_no_are_not_booleans(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    text = yaml.safe_dump(TINY) + "\n"
    path.write_text(text.replace("eval_every: 1", "eval_every: 1\nallow: yes"))
    tree = yaml.safe_load(path.read_text())
    assert tree["allow"] is True  # YAML 1.1 would
    path.write_text(
        yaml.safe_dump(_merge(TINY, {"data": {"options": {}}})).replace(
            "options: {}", "options: {flatten: yes}"
        )
    )
    refused(tmp_path, ["train", str(path), "--check"], "data.options.flatten")


def test_an_empty_test_set_reports_no_accuracy(tmp_path: Path) -> None:
    # test_fraction -0.0 left an empty test set, reported as "test accuracy
    # 0.000": an accuracy over nothing is not reported
    path = config_file(tmp_path, {"data": {"options": {"test_fraction": -0.0}}})
    argv = ["train", str(path), "--no-progress", "--out", str(tmp_path / "runs")]
    with _inside(tmp_path):
        status, out, err = run_cli(argv)
    check_outcome(argv, status, out, err, invalid=[])
    assert "test accuracy" not in out
    import json

    metrics = (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()
    assert all("test_accuracy" not in json.loads(line) for line in metrics)


def test_a_second_stage_larger_than_the_clients_is_refused(tmp_path: Path) -> None:
    change = {
        "data": {"partition": "iid", "records_per_client": None},
        "model": {REPLACE: True, "name": "logistic_regression"},
        "algorithm": {
            "name": "locks",
            "params": {
                REPLACE: True,
                "first_stage_probability": 0.5,
                "second_stage_size": 21,
            },
        },
        "privacy": {"delta": 1e-3},
    }
    tree = _merge(TINY, change)
    tree["data"].pop("records_per_client")
    tree["data"]["options"] = {"flatten": True}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    line = refused(
        tmp_path, ["train", str(path), "--check"], "algorithm.params.second_stage_size"
    )
    assert "number of clients (20); got 21" in line


def test_a_key_given_beside_the_name_and_under_params_is_refused(
    tmp_path: Path,
) -> None:
    # the flat algorithm.clip silently overrode algorithm.params.clip
    change = {"algorithm": {"clip": 5.0, "params": {"clip": 1.0}}}
    line = check_refuses(tmp_path, change, "algorithm.clip")
    assert "twice" in line


@pytest.mark.parametrize(
    "spelling",
    ["\uff11", "\u0661", "1\u00a0", "\u00a01", "1_0", "1e-6_0", "0x1", "1:0"],
)
def test_one_spelling_of_numbers_in_every_field_and_flag(
    tmp_path: Path, spelling: str
) -> None:
    # full-width and Arabic-Indic digits, NBSP and "_" were accepted in
    # float fields and flags and refused in integer fields
    float_change = {"privacy": {"epsilon": spelling}}
    check_refuses(tmp_path, float_change, "privacy.epsilon")
    check_refuses(tmp_path, {"rounds": spelling}, "rounds")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(TINY))
    argv = ["train", "run.yaml", "--check", "--set", f"privacy.epsilon={spelling}"]
    refused(tmp_path, argv, "privacy.epsilon")
    for flag in ("--epsilon", "--rounds"):
        refused(tmp_path, [*RP, "--delta", "1e-5", f"{flag}={spelling}"], flag)


def test_numbers_in_ascii_digits_are_read_alike_everywhere(tmp_path: Path) -> None:
    from dpfl._validate import parse_number
    from dpfl.experiments.config import config_from_dict

    for text, value in [("1e-5", 1e-5), (".5", 0.5), ("2.", 2.0), ("-0.0", 0.0)]:
        assert parse_number(text) == value
    cfg = config_from_dict({"privacy": {"delta": "1e-5"}, "rounds": "1e3"})
    assert cfg.privacy.delta == 1e-5 and cfg.rounds == 1000
    cfg = config_from_dict({"privacy": {"epsilon": "inf", "noise_multiplier": 1}})
    assert math.isinf(cfg.privacy.epsilon)


# -- sizes -------------------------------------------------------------------------
def test_delta_against_n_is_refused_before_generating(tmp_path: Path) -> None:
    # 10^7 synthetic clients took 160 s to generate before δ >= 1/n was
    # refused, though n is known from the configuration
    start = time.monotonic()
    change = _synthetic({"alpha": 0, "beta": 0, "records_per_client": 1, "dim": 2})
    change["data"]["num_clients"] = 10**7
    change["privacy"] = {"delta": 1e-5}
    line = check_refuses(tmp_path, change, "privacy.delta")
    assert "at most 10000000 records" in line
    assert time.monotonic() - start < 10


# -- --check runs what train runs before its first round --------------------------
def _csv(tmp: Path) -> Path:
    path = tmp / "data.csv"
    rows = ["a,b,label"] + [f"{i % 7},{i % 5},{i % 2}" for i in range(60)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize(
    ("case", "named"),
    [
        ("unproven analysis", "allow_unproven"),
        ("missing csv", "nothing.csv"),
        ("wrong label column", "nope"),
        ("delta against n", "privacy.delta"),
        ("no alpha", "data.options.alpha"),
    ],
)
def test_check_refuses_what_train_refuses_with_the_same_line(
    tmp_path: Path, case: str, named: str
) -> None:
    csv = {"name": "csv", "path": str(_csv(tmp_path)), "partition": "iid"}
    change = {
        "unproven analysis": {"privacy": {"analysis": "paper"}},
        "missing csv": {"data": {**csv, "path": str(tmp_path / "nothing.csv")}},
        "wrong label column": {"data": {**csv, "options": {"label_column": "nope"}}},
        "delta against n": {"privacy": {"delta": 0.02}},
        "no alpha": _synthetic({"beta": 0.5}),
    }[case]
    tree = _merge(TINY, change)
    if tree["data"].get("name") == "csv":
        tree["data"].pop("records_per_client")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    line = refused(tmp_path, ["train", str(path), "--check"], named)
    argv = ["train", str(path), "--no-progress", "--out", str(tmp_path / "runs")]
    with _inside(tmp_path):
        status, out, err = run_cli(argv)
    assert status == 2 and err.strip() == line, (line, err)
    assert not (tmp_path / "runs" / "t" / "run.json").exists()


def test_check_reports_what_it_resolved(tmp_path: Path) -> None:
    path = config_file(tmp_path, {"privacy": {"noise_multiplier": None}})
    with _inside(tmp_path):
        status, out, err = run_cli(["train", str(path), "--check"])
    assert status == 0, err
    assert "valid" in out and "(calibrated)" in out and "model parameters" in out
    assert not (tmp_path / "runs").exists()  # nothing written
