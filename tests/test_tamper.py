"""Tampering and corruption of a stopped run: detected and refused, never reset.

A small private run (6 rounds, checkpoint every 2) is stopped in the middle;
then one of its files is cut short, corrupted, deleted or edited, and
``resume`` must refuse with a clear message (the checksums of the ledger's
hash chain, of the checkpoint, of ``run.json``, and the ties between them), or,
for a crash-shaped accident (a torn last journal line), resume exactly.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
yaml = pytest.importorskip("yaml")

from dpfl._files import digest  # noqa: E402
from dpfl.accounting.ledger import LedgerMismatchError, PrivacyLedger  # noqa: E402
from dpfl.errors import DpflError, NonFiniteUpdateError  # noqa: E402
from dpfl.experiments import resume, run  # noqa: E402
from dpfl.experiments.runner import read_metrics  # noqa: E402
from dpfl.sim.callbacks import load_checkpoint  # noqa: E402
from dpfl.sim.loop import Trainer  # noqa: E402
from tiny_runs import SHARED_KEY, run_key, tiny_config  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _one_key() -> Any:
    """One secure key for every run of this module (they are compared)."""
    with run_key(SHARED_KEY):
        yield


def tiny(tmp_path: Path, name: str = "t", **privacy: Any) -> Any:
    # a budget of 50 (the ledger has one to check)
    privacy = {"epsilon": 50.0, **privacy}
    return tiny_config(tmp_path, name, privacy=privacy)


def stop_after(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    """Crash (an exception, as a kill would) in round k + 1."""
    step = Trainer.step

    def crashing(self: Trainer) -> Any:
        if self.round == k:
            raise RuntimeError("killed")
        return step(self)

    monkeypatch.setattr(Trainer, "step", crashing)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A run crashed in round 6 (checkpoint at 4, ledger at 5) and its full twin."""
    tmp = tmp_path_factory.mktemp("tamper")
    full = run(tiny(tmp, "full"), progress=False).run_dir
    mp = pytest.MonkeyPatch()
    stop_after(mp, 5)
    cfg = tiny(tmp, "stopped")
    with pytest.raises(RuntimeError, match="killed"):
        run(cfg, progress=False)
    mp.undo()
    return cfg.run_dir, full


@pytest.fixture
def copy(stopped: tuple[Path, Path], tmp_path: Path) -> Path:
    """A fresh copy of the stopped run to damage."""
    dst = tmp_path / "runs" / "copy"
    shutil.copytree(stopped[0], dst)
    return dst


def _ledger_json(d: Path) -> dict[str, Any]:
    return json.loads((d / "ledger.json").read_text())


def _save_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1))


def _rechain(data: dict[str, Any]) -> None:
    """Recompute the hash chain, as someone who knows dpfl's code would."""
    keys = ("guard", "analysis", "budget", "tolerance", "run", "key")
    chain = digest({k: data[k] for k in keys})
    for entry, model in zip(data["entries"], data["digests"], strict=True):
        body = {k: v for k, v in entry.items() if k != "chain"}
        chain = entry["chain"] = digest([chain, body, model])
    data["head"], data["count"] = chain, len(data["entries"])


def test_the_stopped_run_resumes_exactly(stopped: tuple[Path, Path], copy: Path):
    # The undamaged copy: the baseline every refusal below departs from.
    assert load_checkpoint(copy / "checkpoint.pt")["round"] == 4
    assert PrivacyLedger.load(copy / "ledger.json").released == 5
    resume(copy, progress=False)
    full = stopped[1]
    assert _ledger_json(copy)["entries"] == _ledger_json(full)["entries"]
    assert read_metrics(copy) == read_metrics(full)


def test_truncated_ledger_is_refused(copy: Path):
    path = copy / "ledger.json"
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(DpflError, match="not valid JSON.*never reset"):
        resume(copy, progress=False)


def test_an_edited_entry_fails_its_checksum(copy: Path):
    data = _ledger_json(copy)
    data["entries"][1]["event"]["event"]["event"]["noise_multiplier"] = 50.0
    _save_json(copy / "ledger.json", data)
    with pytest.raises(DpflError, match="entry 2 .*fails its checksum"):
        resume(copy, progress=False)


def test_a_raised_sigma_with_recomputed_hashes_is_refused(copy: Path):
    # Checksums cannot stop someone who recomputes them; the entries must
    # still be what the frozen configuration's algorithm charges.
    data = _ledger_json(copy)
    for e in data["entries"]:
        e["event"]["event"]["event"]["noise_multiplier"] = 50.0
    _rechain(data)
    _save_json(copy / "ledger.json", data)
    (copy / "ledger.json.journal").unlink()  # its chain follows the old one
    with pytest.raises(DpflError, match="not what the run's algorithm charges"):
        resume(copy, progress=False)


def test_dropped_entries_are_refused(copy: Path):
    data = _ledger_json(copy)
    data["entries"] = data["entries"][:2]
    data["digests"] = data["digests"][:2]
    _save_json(copy / "ledger.json", data)
    with pytest.raises(DpflError, match="count or head"):
        resume(copy, progress=False)
    _rechain(data)  # even with the chain closed again: below the checkpoint
    _save_json(copy / "ledger.json", data)
    (copy / "ledger.json.journal").unlink()
    with pytest.raises(DpflError, match="holds 2 charged rounds but the checkpoint"):
        resume(copy, progress=False)


def test_an_older_snapshot_than_the_checkpoint_is_refused(
    stopped: tuple[Path, Path], tmp_path: Path
):
    # A ledger saved at round 2 beside the checkpoint of round 4.
    cfg = tiny(tmp_path, "old")
    mp = pytest.MonkeyPatch()
    stop_after(mp, 2)
    with pytest.raises(RuntimeError):
        run(cfg, progress=False)
    mp.undo()
    old = (cfg.run_dir / "ledger.json").read_bytes()
    resume(cfg.run_dir, progress=False)
    (cfg.run_dir / "ledger.json").write_bytes(old)
    with pytest.raises(DpflError, match="holds 2 charged rounds but the checkpoint"):
        resume(cfg.run_dir, progress=False)


def test_a_deleted_ledger_is_refused(copy: Path):
    (copy / "ledger.json").unlink()
    with pytest.raises(DpflError, match="ledger.json is missing.*never reset"):
        resume(copy, progress=False)
    (copy / "checkpoint.pt").unlink()  # also without its checkpoint
    with pytest.raises(DpflError, match="ledger.json is missing"):
        resume(copy, progress=False)


def test_a_deleted_manifest_is_refused(copy: Path):
    (copy / "run.json").unlink()
    with pytest.raises(DpflError, match="no run.json"):
        resume(copy, progress=False)


def test_an_edited_manifest_is_refused(copy: Path):
    data = json.loads((copy / "run.json").read_text())
    data["frozen"]["privacy"]["noise_multiplier"] = 0.0
    _save_json(copy / "run.json", data)
    with pytest.raises(DpflError, match="run.json fails its checksum"):
        resume(copy, progress=False)


def test_a_ledger_of_another_run_is_refused(copy: Path, tmp_path: Path):
    other = run(tiny(tmp_path, "other", epsilon=60.0), progress=False).run_dir
    shutil.copy(other / "ledger.json", copy / "ledger.json")
    (copy / "ledger.json.journal").unlink()
    with pytest.raises(DpflError, match="belongs to another run"):
        resume(copy, progress=False)


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("noise_multiplier", 0, "privacy.noise_multiplier"),
        ("noise_multiplier", None, "privacy.noise_multiplier"),
        ("epsilon", 80.0, "privacy.epsilon"),
        ("participation_probability", 0.25, "algorithm.params.participation_prob"),
    ],
)
def test_a_changed_config_is_refused(copy: Path, key: str, value: Any, named: str):
    # The bypass: noise_multiplier 0 written into a stopped run's
    # config.yaml let resume run on without noise.
    tree = yaml.safe_load((copy / "config.yaml").read_text())
    section = tree["privacy"] if key in tree["privacy"] else tree["algorithm"]["params"]
    section[key] = value
    (copy / "config.yaml").write_text(yaml.safe_dump(tree))
    # (σ = 0 under a finite budget is refused by the configuration itself)
    refused = rf"no longer matches.*{named}|{named} 0 adds no noise"
    with pytest.raises(DpflError, match=refused):
        resume(copy, progress=False)
    assert PrivacyLedger.load(copy / "ledger.json").released == 5


def test_journal_damage(copy: Path, stopped: tuple[Path, Path]):
    journal = copy / "ledger.json.journal"
    assert journal.exists()  # round 5 was flushed to the journal only
    lines = journal.read_text().splitlines()
    # a torn last line (a kill mid-append): that round is simply run again
    journal.write_text(lines[0][:20])
    assert PrivacyLedger.load(copy / "ledger.json").released == 4
    # a corrupted line followed by others
    journal.write_text("garbage\n" + "\n".join(lines) + "\n")
    with pytest.raises(DpflError, match="corrupted .*with lines after it"):
        PrivacyLedger.load(copy / "ledger.json")
    # an edited line
    item = json.loads(lines[0])
    item["event"]["event"]["event"]["noise_multiplier"] = 50.0
    journal.write_text(json.dumps(item) + "\n")
    with pytest.raises(DpflError, match="fails its checksum"):
        PrivacyLedger.load(copy / "ledger.json")
    # a gap: the line of entry 6 without that of entry 5
    item = json.loads(lines[0])
    item["seq"] += 1
    journal.write_text(json.dumps(item) + "\n")
    with pytest.raises(DpflError, match="has a gap"):
        PrivacyLedger.load(copy / "ledger.json")


def test_a_torn_journal_line_resumes_exactly(copy: Path, stopped: tuple[Path, Path]):
    journal = copy / "ledger.json.journal"
    journal.write_text(journal.read_text()[:-30])
    resume(copy, progress=False)
    assert _ledger_json(copy)["entries"] == _ledger_json(stopped[1])["entries"]


def test_a_flipped_checkpoint_byte_is_refused(copy: Path):
    path = copy / "checkpoint.pt"
    raw = path.read_bytes()
    # every byte: tensor data, pickle, zip headers and padding, the checksum
    for offset in range(0, len(raw), 7):
        damaged = bytearray(raw)
        damaged[offset] ^= 0x01
        path.write_bytes(bytes(damaged))
        with pytest.raises(DpflError, match="fails its checksum"):
            load_checkpoint(path)
    with pytest.raises(DpflError, match="fails its checksum"):
        resume(copy, progress=False)


def test_a_truncated_checkpoint_is_refused(copy: Path):
    path = copy / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DpflError, match="fails its checksum"):
        resume(copy, progress=False)


def _resave(path: Path, state: dict[str, Any]) -> None:
    """Write a checkpoint with a recomputed checksum, as dpfl's code would."""
    import hashlib
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    raw = buffer.getvalue()
    path.write_bytes(
        raw + b"\ndpfl-sha256:" + hashlib.sha256(raw).hexdigest().encode() + b"\n"
    )


def test_a_zeroed_round_count_is_refused(copy: Path):
    path = copy / "checkpoint.pt"
    state = load_checkpoint(path)
    state["round"] = state["trainer"]["round"] = 0
    state["trainer"]["ledger_rounds"] = 0
    torch.save(state, path)  # without the checksum line
    with pytest.raises(DpflError, match="fails its checksum"):
        resume(copy, progress=False)
    # checksum recomputed but the chain position left: not the ledger's
    _resave(path, state)
    with pytest.raises(DpflError, match="chain hash differs"):
        resume(copy, progress=False)
    # and with the chain position made consistent: the model is not round
    # 0's, so the first replayed round does not confirm its entry
    state["trainer"]["ledger_chain"] = PrivacyLedger.load(
        copy / "ledger.json"
    ).chain_at(0)
    _resave(path, state)
    with pytest.raises(LedgerMismatchError, match="round 1 replayed differently"):
        resume(copy, progress=False)
    assert PrivacyLedger.load(copy / "ledger.json").released == 5


def test_a_replay_that_differs_stops_naming_the_round(copy: Path, monkeypatch):
    # Another seed's noise in round 5 (the round past the checkpoint).
    from dpfl.sim import loop

    real, load = loop.weights_digest, loop.Trainer.load_state_dict

    def loaded(self: Trainer, state: Any) -> None:
        load(self, state)  # the checkpoint's model checks out; then it differs
        monkeypatch.setattr(loop, "weights_digest", lambda w: real(w + 1.0))

    monkeypatch.setattr(loop.Trainer, "load_state_dict", loaded)
    with pytest.raises(LedgerMismatchError, match="round 5 replayed differently"):
        resume(copy, progress=False)
    assert PrivacyLedger.load(copy / "ledger.json").released == 5


# -- NaN and Inf ------------------------------------------------------------------
def test_nan_metrics_stop_the_run_before_the_checkpoint(tmp_path, monkeypatch):
    from dpfl.sim.algorithms.base import FederatedAlgorithm

    real = FederatedAlgorithm.evaluate
    calls = {"n": 0}

    def evaluate(self):
        out = real(self)
        calls["n"] += 1
        if calls["n"] == 2:  # the evaluation of round 6
            out["test_loss"] = math.nan
        return out

    monkeypatch.setattr(FederatedAlgorithm, "evaluate", evaluate)
    cfg = tiny(tmp_path, "nan")
    with pytest.raises(NonFiniteUpdateError, match="round 6: test_loss is nan"):
        run(cfg, progress=False)
    assert load_checkpoint(cfg.run_dir / "checkpoint.pt")["round"] == 4
    assert [r["round"] for r in read_metrics(cfg.run_dir)] == [1, 2, 3, 4, 5]


def test_an_overflowing_model_is_never_charged_or_checkpointed(tmp_path, monkeypatch):
    from dpfl.sim.algorithms.dsgd_rp import DsgdRandomParticipation as Rp

    real = Rp.server_step
    calls = {"n": 0}

    def server_step(self, cohort, messages, streams):
        out = real(self, cohort, messages, streams)
        calls["n"] += 1
        if calls["n"] == 3:
            self.weights[0] = math.inf  # a finite update that overflowed
        return out

    monkeypatch.setattr(Rp, "server_step", server_step)
    cfg = tiny(tmp_path, "inf")
    with pytest.raises(NonFiniteUpdateError, match="round 3: the model holds NaN"):
        run(cfg, progress=False)
    assert load_checkpoint(cfg.run_dir / "checkpoint.pt")["round"] == 2
    assert PrivacyLedger.load(cfg.run_dir / "ledger.json").released == 2
