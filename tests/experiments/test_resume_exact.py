"""Resume that reconciles: replayed rounds confirm their ledger entries.

The ledger level (rewind, confirm, mismatch, what is on disk meanwhile) and
the runner level: a crash before the first checkpoint, and a calibrated σ
(the issue's case: extra charges exhausted the budget early and the model
differed), both resume to the uninterrupted run, σ never calibrated again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dpfl.accounting import events as ev
from dpfl.accounting.chain import LedgerMismatchError
from dpfl.accounting.ledger import Budget, PrivacyLedger
from tiny_runs import SHARED_KEY, run_key, tiny_config

EVENT = ev.PoissonSampled(0.1, ev.Gaussian(1.0))


def _ledger(path: Path, n: int = 5) -> PrivacyLedger:
    ledger = PrivacyLedger(Budget(20.0, 1e-5), path=path, run="r")
    for r in range(n):
        ledger.record(EVENT, round=r, digest=f"d{r}")
        ledger.flush()
    return ledger


def test_rewind_keeps_every_entry_on_disk_and_confirms_replays(tmp_path):
    path = tmp_path / "ledger.json"
    full = _ledger(path).to_json()
    ledger = PrivacyLedger.load(path)
    ledger.rewind(2)
    assert (ledger.rounds, ledger.released, ledger.replaying) == (2, 5, True)
    # the spend reported is the uninterrupted run's at round 2 ...
    two = PrivacyLedger(Budget(20.0, 1e-5))
    for r in range(2):
        two.record(EVENT, round=r)
    assert ledger.epsilon() == two.epsilon()
    assert ledger.epsilon().upper < ledger.released_ledger().epsilon().upper
    # ... while every file written keeps all five entries
    ledger.save()
    assert json.loads(path.read_text())["count"] == 5
    assert ledger.released_ledger().rounds == 5
    ledger.record(EVENT, round=2, digest="d2")  # confirmed, not charged again
    ledger.flush()
    assert (ledger.rounds, ledger.released) == (3, 5)
    assert PrivacyLedger.load(path).released == 5
    for r in (3, 4):
        ledger.record(EVENT, round=r, digest=f"d{r}")
    assert not ledger.replaying
    ledger.record(EVENT, round=5, digest="d5")  # a new round: charged
    assert ledger.rounds == 6
    assert ledger.to_json()["entries"][:5] == full["entries"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"digest": "other"}, "digest"),
        ({"round": 7}, "round"),
        ({"participants": [1, 2]}, "participants"),
        ({"extra": {"abandoned": True}}, "extra"),
        ({"event": ev.PoissonSampled(0.1, ev.Gaussian(2.0))}, "event"),
    ],
)
def test_a_replay_that_differs_is_refused(tmp_path, change: dict[str, Any], field):
    path = tmp_path / "ledger.json"
    _ledger(path)
    ledger = PrivacyLedger.load(path)
    ledger.rewind(2)
    kwargs: dict[str, Any] = {"round": 2, "digest": "d2", **change}
    event = kwargs.pop("event", EVENT)
    with pytest.raises(
        LedgerMismatchError, match=f"round {kwargs['round'] + 1} .*{field}"
    ):
        ledger.record(event, **kwargs)
    assert (ledger.rounds, ledger.released) == (2, 5)
    assert PrivacyLedger.load(path).released == 5


def test_rewind_past_the_ledger_is_refused(tmp_path):
    _ledger(tmp_path / "ledger.json", 3)
    ledger = PrivacyLedger.load(tmp_path / "ledger.json")
    with pytest.raises(Exception, match="holds 3 charged rounds but the checkpoint"):
        ledger.rewind(4)


# -- through the runner ---------------------------------------------------------
torch = pytest.importorskip("torch")

from dpfl.experiments import resume, run  # noqa: E402
from dpfl.experiments.runner import read_metrics  # noqa: E402
from dpfl.sim.callbacks import load_checkpoint  # noqa: E402
from dpfl.sim.loop import Trainer  # noqa: E402


@pytest.fixture(autouse=True)
def _one_key() -> Any:
    """Secure noise with one key for every run of a test: the runs compared
    draw the same noise, replays use the sampler."""
    with run_key(SHARED_KEY):
        yield


def tiny(tmp_path: Path, name: str, **top: Any) -> Any:
    # 8 rounds, checkpoint every 3
    return tiny_config(
        tmp_path, name, rounds=8, eval_every=2, checkpoint_every=3, **top
    )


def crash_in(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    step = Trainer.step

    def crashing(self: Trainer) -> Any:
        if self.round == k - 1:
            raise RuntimeError("killed")
        return step(self)

    monkeypatch.setattr(Trainer, "step", crashing)


def _same(a: Path, b: Path) -> None:
    sa, sb = load_checkpoint(a / "checkpoint.pt"), load_checkpoint(b / "checkpoint.pt")
    assert sa["round"] == sb["round"]
    ma, mb = sa["trainer"]["algorithm"]["model"], sb["trainer"]["algorithm"]["model"]
    assert all(torch.equal(ma[k], mb[k]) for k in mb)
    la = PrivacyLedger.load(a / "ledger.json").to_json()
    lb = PrivacyLedger.load(b / "ledger.json").to_json()
    assert (la["entries"], la["digests"]) == (lb["entries"], lb["digests"])
    assert read_metrics(a) == read_metrics(b)


def test_a_crash_before_the_first_checkpoint_replays_from_round_zero(
    tmp_path, monkeypatch
):
    full = run(tiny(tmp_path, "full"), progress=False)
    cfg = tiny(tmp_path, "early")
    crash_in(monkeypatch, 3)  # rounds 1-2 charged, no checkpoint yet
    with pytest.raises(RuntimeError):
        run(cfg, progress=False)
    monkeypatch.undo()
    assert not (cfg.run_dir / "checkpoint.pt").exists()
    assert PrivacyLedger.load(cfg.run_dir / "ledger.json").released == 2
    resume(cfg.run_dir, progress=False)
    _same(cfg.run_dir, full.run_dir)


def test_a_calibrated_run_resumes_exactly_without_calibrating_again(
    tmp_path, monkeypatch
):
    # The issue: extra charges exhausted a calibrated budget early (round 36
    # of 40) and the model differed. Crash in round 6 (checkpoint at 3).
    privacy = {"epsilon": 3.0, "noise_multiplier": None}
    full = run(tiny(tmp_path, "full", privacy=privacy), progress=False)
    assert full.stopped == "completed" and full.rounds_completed == 8
    cfg = tiny(tmp_path, "cal", privacy=privacy)
    crash_in(monkeypatch, 6)
    with pytest.raises(RuntimeError):
        run(cfg, progress=False)
    monkeypatch.undo()
    from dpfl.sim import plan

    def no_calibration(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("resume calibrated sigma again")

    monkeypatch.setattr(plan, "calibrate_noise_multiplier", no_calibration)
    done = resume(cfg.run_dir, progress=False)
    assert done.stopped == "completed" and done.rounds_completed == 8
    assert done.epsilon == full.epsilon
    _same(cfg.run_dir, full.run_dir)


@pytest.mark.slow  # a wider model (6 s); .ci/run runs it
def test_a_replay_uses_the_thread_count_the_run_started_with(tmp_path, monkeypatch):
    # Matrix products sum in an order that depends on torch's thread count,
    # so a replay under another count (OMP_NUM_THREADS, a job scheduler) could
    # miss its digests; run.json records the count and the replay uses it,
    # then the process's own count comes back.
    started_with = torch.get_num_threads()
    other = 2 if started_with == 1 else 1
    # wide enough for torch to split its products across threads (with the
    # 8-unit model a replay under another count happens to match anyway)
    wide = {
        "model": {"options": {"hidden": 256}},
        "data": {"num_clients": 20, "records_per_client": 40},
    }
    full = run(tiny(tmp_path, "full", **wide), progress=False)
    cfg = tiny(tmp_path, "threads", **wide)
    crash_in(monkeypatch, 6)  # checkpoint at 3, rounds 4-5 in the journal
    with pytest.raises(RuntimeError):
        run(cfg, progress=False)
    monkeypatch.undo()
    manifest = json.loads((cfg.run_dir / "run.json").read_text())
    assert manifest["torch_threads"] == started_with
    try:
        torch.set_num_threads(other)
        resume(cfg.run_dir, progress=False)  # stops at round 4 without the fix
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(started_with)
    _same(cfg.run_dir, full.run_dir)
