"""One run at a time per run folder; a killed holder leaves nothing stuck."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpfl.experiments.rundir import (
    LOCK,
    RunFolderBusyError,
    RunLock,
    clean_orphans,
)

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DPFL_FAULT", None)
    return env


def test_a_second_holder_is_refused_in_one_line(tmp_path):
    with RunLock(tmp_path / "run"):
        with pytest.raises(RunFolderBusyError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path / "run").acquire()
    with RunLock(tmp_path / "run"):  # released: free again
        pass


def test_a_killed_holder_leaves_no_stuck_lock(tmp_path):
    run_dir = tmp_path / "run"
    code = (
        "import sys, time\n"
        "from dpfl.experiments.rundir import RunLock\n"
        f"RunLock({str(run_dir)!r}).acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(RunFolderBusyError, match=f"pid {holder.pid}"):
            RunLock(run_dir).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with RunLock(run_dir):  # the OS released it with the process
        assert (run_dir / LOCK).exists()


def test_orphaned_temporary_files_are_removed(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    orphans = [".ledger.json.abc123", ".checkpoint.pt.x_9", ".metrics.jsonl.q"]
    for name in [*orphans, "notes.txt", ".ledger.json", "ledger.json"]:
        (d / name).write_text("x")
    removed = clean_orphans(d)
    assert sorted(p.name for p in removed) == sorted(orphans)
    assert sorted(p.name for p in d.iterdir()) == [
        ".ledger.json",
        "ledger.json",
        "notes.txt",
    ]


@pytest.mark.slow  # two real training processes (.ci/run runs it)
def test_two_trainings_into_one_folder(tmp_path):
    # The issue: two `dpfl train` with different sigma into one folder both
    # exited 0, leaving one run's config with the other's model and ledger.
    out = tmp_path / "runs"
    configs = []
    for sigma in (1.0, 2.0):
        path = tmp_path / f"s{sigma}.yaml"
        path.write_text(
            "name: same\nseed: 1\nrounds: 400\neval_every: 100\ncheckpoint_every: 1\n"
            f"output_dir: {out}\n"
            "data: {num_clients: 20, records_per_client: 10}\n"
            "model: {options: {hidden: 8}}\n"
            f"privacy: {{epsilon: .inf, noise_multiplier: {sigma}}}\n"
        )
        configs.append(path)

    def train(cfg: Path, command: str = "train") -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "dpfl.cli", command, str(cfg), "--no-progress"],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    first = train(configs[0])
    run_dir = out / "same"
    deadline = time.monotonic() + 120
    while not (run_dir / "run.json").exists():  # the first holds the folder
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = train(configs[1])
    again = train(run_dir, "resume")  # a resume is refused the same way
    for other in (second, again):
        _, err = other.communicate(timeout=120)
        assert other.returncode == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "in use by another dpfl process" in lines[0], err
    assert first.poll() is None  # still running: the refusals were the lock's
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    assert "noise_multiplier: 1.0" in (run_dir / "config.yaml").read_text()
