"""A run folder cannot be mixed with another: key, checkpoint and data are bound.

Two real tiny runs, each stopped after round 4 with its checkpoint at round 4
(nothing left to replay, so no replayed round can catch a mix-up), then their
files copied, swapped, or copied with every checksum recomputed by dpfl's own
code, as someone mixing two honest runs would. ``resume`` must refuse in one
line naming the file. Before this, each mix below resumed: the two runs then
drew one noise stream (their difference cancels it), or a σ = 0.3 model sat
in a σ = 1 run whose ``guarantee.json`` reported σ = 1's ε.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from dpfl._files import digest  # noqa: E402
from dpfl.accounting.ledger import PrivacyLedger  # noqa: E402
from dpfl.errors import DpflError  # noqa: E402
from dpfl.experiments import config_from_dict, resume, run, rundir  # noqa: E402
from dpfl.sim import keys, secure_noise  # noqa: E402
from dpfl.sim.callbacks import load_checkpoint  # noqa: E402
from dpfl.sim.callbacks.checkpoint import _TRAILER  # noqa: E402
from dpfl.sim.loop import Trainer  # noqa: E402
from tiny_runs import tiny_config  # noqa: E402


def stop_after(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    """Crash at the start of round k + 1 (as a kill would, before any work)."""
    step = Trainer.step

    def crashing(self: Trainer) -> Any:
        if self.round == k:
            raise RuntimeError("killed")
        return step(self)

    monkeypatch.setattr(Trainer, "step", crashing)


def stopped_run(tmp: Path, name: str, sigma: float = 1.0) -> Path:
    """A tiny private run (budget ε = 50) killed after round 4 (checkpoint: 4)."""
    cfg = tiny_config(
        tmp,
        name,
        rounds=6,
        checkpoint_every=2,
        privacy={"epsilon": 50.0, "noise_multiplier": sigma},
    )
    with pytest.MonkeyPatch.context() as mp:
        stop_after(mp, 4)
        with pytest.raises(RuntimeError, match="killed"):
            run(cfg, progress=False)
    assert load_checkpoint(cfg.run_dir / "checkpoint.pt")["round"] == 4
    assert PrivacyLedger.load(cfg.run_dir / "ledger.json").released == 4
    return cfg.run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Runs A and B (one configuration, their own keys) and C (σ = 0.3)."""
    tmp = tmp_path_factory.mktemp("identity")
    return {
        "a": stopped_run(tmp, "a"),
        "b": stopped_run(tmp, "b"),
        "c": stopped_run(tmp, "c", sigma=0.3),
    }


@pytest.fixture
def copies(runs: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    """Fresh copies of the stopped runs to mix."""
    out = {}
    for name, src in runs.items():
        out[name] = tmp_path / "runs" / name
        shutil.copytree(src, out[name])
    return out


def _recompute_run_json(run_dir: Path, **changes: Any) -> str:
    """Edit run.json and recompute its run digest as dpfl's code does."""
    manifest = json.loads((run_dir / "run.json").read_text())
    manifest.update(changes)
    identity = {k: manifest[k] for k in ("frozen", "key", "data", "stream_version")}
    manifest["run"] = digest(identity)
    (run_dir / "run.json").write_text(json.dumps(manifest))
    rundir.read_manifest(run_dir)  # its checksum holds
    return str(manifest["run"])


def test_the_runs_resume_as_they_are(copies: dict[str, Path]) -> None:
    # The baseline every refusal below departs from; A and B share a
    # configuration (their frozen definitions are equal), not a key.
    a, b = copies["a"], copies["b"]
    ma, mb = (json.loads((d / "run.json").read_text()) for d in (a, b))
    assert ma["frozen"] == mb["frozen"] and ma["key"] != mb["key"]
    assert ma["run"] != mb["run"]
    for d in (a, b):
        assert resume(d, progress=False).rounds_completed == 6


# -- the key -----------------------------------------------------------------------
def test_a_copied_key_is_refused(copies: dict[str, Path]) -> None:
    shutil.copy(copies["a"] / "secret.key", copies["b"] / "secret.key")
    with pytest.raises(DpflError, match=r"b/secret.key is not this run's key"):
        resume(copies["b"], progress=False)
    assert PrivacyLedger.load(copies["b"] / "ledger.json").released == 4


def test_swapped_keys_are_refused(copies: dict[str, Path]) -> None:
    a, b = copies["a"] / "secret.key", copies["b"] / "secret.key"
    ka, kb = a.read_bytes(), b.read_bytes()
    a.write_bytes(kb)
    b.write_bytes(ka)
    for d in (copies["a"], copies["b"]):
        with pytest.raises(DpflError, match="is not this run's key"):
            resume(d, progress=False)


def test_a_copied_key_with_run_json_recomputed_is_refused(
    copies: dict[str, Path],
) -> None:
    # B's run.json rewritten for A's key, its checksum recomputed with dpfl's
    # own code: the ledger and checkpoint still name B's identity and key.
    a, b = copies["a"], copies["b"]
    shutil.copy(a / "secret.key", b / "secret.key")
    _recompute_run_json(b, key=json.loads((a / "run.json").read_text())["key"])
    with pytest.raises(DpflError, match="ledger.json belongs to another run"):
        resume(b, progress=False)


def test_a_new_run_never_adopts_a_key_found_in_its_folder(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    cfg = tiny_config(tmp_path, "fresh", rounds=2)
    cfg.run_dir.mkdir(parents=True)
    shutil.copy(runs["a"] / "secret.key", cfg.run_dir / "secret.key")
    with pytest.raises(DpflError, match=r"secret.key exists: .* holds a secret key"):
        run(cfg, progress=False)
    (cfg.run_dir / "secret.key").unlink()
    shutil.copy(runs["a"] / "ledger.json", cfg.run_dir / "ledger.json")
    with pytest.raises(DpflError, match=r"ledger.json exists: .* already holds a run"):
        run(cfg, progress=False)


def test_a_key_others_may_read_is_refused_with_the_chmod(
    copies: dict[str, Path],
) -> None:
    key = copies["a"] / "secret.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600  # as the run wrote it
    key.chmod(0o644)
    with pytest.raises(DpflError) as err:
        resume(copies["a"], progress=False)
    assert f"run `chmod 600 {key}`" in str(err.value) and "0644" in str(err.value)
    key.chmod(0o600)
    assert resume(copies["a"], progress=False).rounds_completed == 6


def test_a_key_linked_from_another_run_is_refused(copies: dict[str, Path]) -> None:
    key = copies["b"] / "secret.key"
    key.unlink()
    os.symlink(copies["a"] / "secret.key", key)
    with pytest.raises(DpflError, match="not a regular file"):
        resume(copies["b"], progress=False)


def test_run_json_names_the_key_without_holding_it(runs: dict[str, Path]) -> None:
    key = keys.read_key_file(runs["a"] / "secret.key")
    text = (runs["a"] / "run.json").read_text()
    assert key.hex() not in text
    manifest = json.loads(text)
    assert manifest["key"] == rundir.key_fingerprint(key)
    assert manifest["stream_version"] == secure_noise.STREAM_VERSION
    ledger = PrivacyLedger.load(runs["a"] / "ledger.json")
    assert ledger.key == manifest["key"] and ledger.run == manifest["run"]


# -- run.json and the ledger ------------------------------------------------------
def test_a_copied_run_json_is_refused(copies: dict[str, Path]) -> None:
    # A and B share a configuration: their frozen definitions alone cannot
    # tell the two run.json files apart; their key fingerprints do.
    shutil.copy(copies["b"] / "run.json", copies["a"] / "run.json")
    with pytest.raises(DpflError, match=r"a/secret.key is not this run's key"):
        resume(copies["a"], progress=False)


def test_swapped_run_json_files_are_refused(copies: dict[str, Path]) -> None:
    a, b = copies["a"] / "run.json", copies["b"] / "run.json"
    ma, mb = a.read_bytes(), b.read_bytes()
    a.write_bytes(mb)
    b.write_bytes(ma)
    for d in (copies["a"], copies["b"]):
        with pytest.raises(DpflError, match="is not this run's key"):
            resume(d, progress=False)


def test_a_copied_ledger_is_refused(copies: dict[str, Path]) -> None:
    # Same configuration, same rounds, same events: before, the two ledgers
    # differed in nothing their checks read, and B's went on in A's folder.
    shutil.copy(copies["b"] / "ledger.json", copies["a"] / "ledger.json")
    with pytest.raises(DpflError, match=r"a/ledger.json belongs to another run"):
        resume(copies["a"], progress=False)


def test_swapped_ledgers_are_refused(copies: dict[str, Path]) -> None:
    a, b = copies["a"] / "ledger.json", copies["b"] / "ledger.json"
    la, lb = a.read_bytes(), b.read_bytes()
    a.write_bytes(lb)
    b.write_bytes(la)
    for d in (copies["a"], copies["b"]):
        with pytest.raises(DpflError, match="ledger.json belongs to another run"):
            resume(d, progress=False)


def test_another_runs_ledger_with_recomputed_chain_is_refused(
    copies: dict[str, Path],
) -> None:
    # B's ledger given A's header (run digest, key fingerprint), its chain
    # recomputed by dpfl's own code: it loads, and names A; but its chain
    # covers B's models, not the one A's checkpoint was taken at.
    a, b = copies["a"], copies["b"]
    ours = PrivacyLedger.load(a / "ledger.json")
    theirs = PrivacyLedger.load(b / "ledger.json")
    forged = type(theirs)(
        theirs.budget,
        analysis=theirs.analysis,
        tolerance=theirs.tolerance,
        run=ours.run,
        key=ours.key,
    )
    for entry in theirs.entries:
        forged._append(entry)  # each link recomputed, as the ledger does
    forged.save(a / "ledger.json")
    reread = PrivacyLedger.load(a / "ledger.json")  # its checksums hold
    assert (reread.run, reread.key) == (ours.run, ours.key)
    assert [e.digest for e in reread.entries] != [e.digest for e in ours.entries]
    with pytest.raises(DpflError, match=r"a/checkpoint.pt"):
        resume(a, progress=False)
    assert PrivacyLedger.load(a / "ledger.json").released == 4
    assert not (a / "guarantee.json").exists()


# -- the checkpoint --------------------------------------------------------------
def test_a_copied_checkpoint_is_refused(copies: dict[str, Path]) -> None:
    # Same configuration, same round, same ledger shape: only the identity
    # (key) and the chain (model digests) tell the two checkpoints apart.
    shutil.copy(copies["b"] / "checkpoint.pt", copies["a"] / "checkpoint.pt")
    with pytest.raises(DpflError, match="checkpoint.pt belongs to another run"):
        resume(copies["a"], progress=False)


def test_swapped_checkpoints_are_refused(copies: dict[str, Path]) -> None:
    a, b = copies["a"] / "checkpoint.pt", copies["b"] / "checkpoint.pt"
    ca, cb = a.read_bytes(), b.read_bytes()
    a.write_bytes(cb)
    b.write_bytes(ca)
    for d in (copies["a"], copies["b"]):
        with pytest.raises(DpflError, match="belongs to another run"):
            resume(d, progress=False)


def _resave(path: Path, state: dict[str, Any]) -> None:
    """Write a checkpoint with its checksum recomputed, as dpfl's code does."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    raw = buffer.getvalue()
    path.write_bytes(raw + _TRAILER + hashlib.sha256(raw).hexdigest().encode() + b"\n")


def test_another_runs_model_with_recomputed_checksums_is_refused(
    copies: dict[str, Path],
) -> None:
    # The issue: a σ = 0.3 model placed in a σ = 1 run resumed, and
    # guarantee.json reported σ = 1's ε for it. A's own checkpoint (its run
    # digest, round, ledger position and chain hash) with C's model in it.
    a, c = copies["a"], copies["c"]
    state = load_checkpoint(a / "checkpoint.pt")
    theirs = load_checkpoint(c / "checkpoint.pt")["trainer"]["algorithm"]
    state["trainer"]["algorithm"]["model"] = theirs["model"]
    state["trainer"]["algorithm"]["extra"] = theirs["extra"]
    _resave(a / "checkpoint.pt", state)
    load_checkpoint(a / "checkpoint.pt")  # its checksum holds
    with pytest.raises(DpflError, match="model is not the model the ledger recorded"):
        resume(a, progress=False)
    assert not (a / "guarantee.json").exists()


def test_the_chain_covers_every_model_digest(copies: dict[str, Path]) -> None:
    # The ledger's digests, replaced by another run's: the chain breaks.
    a, b = copies["a"], copies["b"]
    ours = json.loads((a / "ledger.json").read_text())
    theirs = json.loads((b / "ledger.json").read_text())
    assert ours["entries"][0]["event"] == theirs["entries"][0]["event"]
    ours["digests"] = theirs["digests"]
    (a / "ledger.json").write_text(json.dumps(ours))
    with pytest.raises(DpflError, match="entry 1 .*fails its checksum"):
        resume(a, progress=False)


# -- the noise stream -------------------------------------------------------------
def test_the_recorded_stream_is_part_of_the_identity(
    copies: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A resumed run draws from the stream it recorded; run.json edited to
    # another stream fails its checksum, and a stream this dpfl lacks is
    # refused in one line naming run.json.
    path = copies["a"] / "run.json"
    manifest = json.loads(path.read_text())
    recorded = manifest["stream_version"]
    # a dpfl that draws only another stream
    other = next(v for v in secure_noise.STREAM_VERSIONS if v != recorded)
    monkeypatch.setattr(secure_noise, "STREAM_VERSIONS", (other,))
    monkeypatch.setattr(secure_noise, "STREAM_VERSION", other)
    with pytest.raises(DpflError) as err:
        resume(copies["a"], progress=False)
    line = str(err.value)
    assert f"run.json says the run draws secure noise from stream {recorded!r}" in line
    assert "\n" not in line
    monkeypatch.undo()
    manifest["stream_version"] = other
    path.write_text(json.dumps(manifest))
    with pytest.raises(DpflError, match="run.json fails its checksum"):
        resume(copies["a"], progress=False)


# -- the data ----------------------------------------------------------------------
def _write_csv(path: Path, clients: list[int]) -> None:
    lines = ["f0,f1,f2,label,client"]
    for i, client in enumerate(clients):
        x = [math.sin(i + j) for j in range(3)]
        lines.append(f"{x[0]:.4f},{x[1]:.4f},{x[2]:.4f},{i % 2},{client}")
    path.write_text("\n".join(lines) + "\n")


def _csv_config(tmp_path: Path, csv: Path) -> Any:
    """The tiny run on a CSV file whose client column partitions it."""
    tree = tiny_config(tmp_path, "csv").to_dict()
    tree["data"] = {
        "name": "csv",
        "path": str(csv),
        "partition": "natural",
        "num_clients": None,
        "options": {"client_column": "client", "test_fraction": 0.2},
    }
    tree["model"] = {"name": "mlp", "options": {"hidden": 4}}
    return config_from_dict(tree)


def test_changed_data_is_refused_without_a_round_to_replay(tmp_path: Path) -> None:
    # The issue: a record moved from one client to another between a kill
    # and the resume went unseen when no round was replayed.
    csv = tmp_path / "data.csv"
    clients = [i % 10 for i in range(120)]
    _write_csv(csv, clients)
    cfg = _csv_config(tmp_path, csv)
    with pytest.MonkeyPatch.context() as mp:
        stop_after(mp, 4)
        with pytest.raises(RuntimeError, match="killed"):
            run(cfg, progress=False)
    moved = list(clients)
    moved[7] = (moved[7] + 1) % 10  # one record now belongs to another client
    _write_csv(csv, moved)
    with pytest.raises(DpflError, match=r"the data of .*csv changed since the run"):
        resume(cfg.run_dir, progress=False)
    _write_csv(csv, clients)  # the data restored: the run continues
    assert resume(cfg.run_dir, progress=False).rounds_completed == 6


def test_changed_data_with_run_json_recomputed_is_refused(tmp_path: Path) -> None:
    # The fingerprint of the changed data computed by dpfl's own code, written
    # into run.json with its checksum recomputed: the run's identity is then
    # another, and the ledger (whose chain starts from it) is refused.
    from dpfl.experiments.build import prepare

    csv = tmp_path / "data.csv"
    clients = [i % 10 for i in range(120)]
    _write_csv(csv, clients)
    cfg = _csv_config(tmp_path, csv)
    with pytest.MonkeyPatch.context() as mp:
        stop_after(mp, 4)
        with pytest.raises(RuntimeError, match="killed"):
            run(cfg, progress=False)
    moved = list(clients)
    moved[7] = (moved[7] + 1) % 10
    _write_csv(csv, moved)
    data = rundir.data_fingerprint(prepare(cfg, started=True).dataset)
    assert data != json.loads((cfg.run_dir / "run.json").read_text())["data"]
    _recompute_run_json(cfg.run_dir, data=data)
    with pytest.raises(DpflError, match="ledger.json belongs to another run"):
        resume(cfg.run_dir, progress=False)


def test_the_data_fingerprint_covers_records_and_partition() -> None:
    from dpfl.data import get_dataset

    base = get_dataset("digits", num_clients=10, partition="iid", seed=0)
    same = get_dataset("digits", num_clients=10, partition="iid", seed=0)
    other = get_dataset("digits", num_clients=10, partition="iid", seed=1)
    assert rundir.data_fingerprint(base) == rundir.data_fingerprint(same)
    assert rundir.data_fingerprint(base) != rundir.data_fingerprint(other)
    base.features[0, 0, 0, 0] += 1.0  # one pixel of one record
    assert rundir.data_fingerprint(base) != rundir.data_fingerprint(same)


def test_the_data_fingerprint_hashes_each_client_as_before() -> None:
    # Run folders written while each client had its own index array carry a
    # fingerprint hashed client by client; fed in bulk from the one flat array
    # the bytes must be the same, or those runs would be refused on resume.
    import hashlib

    import numpy as np

    from dpfl.data import FederatedDataset

    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3)).astype(np.float32)
    y = rng.integers(0, 4, 60)
    # 40,000 clients of 0 to 8 rows (past one chunk of the bulk hashing)
    parts = [rng.permutation(60)[: int(k)] for k in rng.integers(0, 9, 40_000)]
    data = FederatedDataset(
        x, y, parts, num_classes=4, test_features=x[:6], test_labels=y[:6],
        client_test_indices=list(rng.integers(0, 6, size=(40_000, 2))),
    )  # fmt: skip
    h = hashlib.sha256()  # the per-client definition, written out
    h.update(f"classes:4;shape:{(3,)};".encode())
    for label, value in (("features", x), ("labels", y)):
        h.update(f"{label}:{value.dtype.str}:{value.shape};".encode() + value.tobytes())
    h.update(f"clients:{len(parts)};".encode())
    for rows in parts:
        h.update(f"c:<i8:{rows.shape};".encode() + rows.astype(np.int64).tobytes())
    for label, value in (("test_features", x[:6]), ("test_labels", y[:6])):
        h.update(f"{label}:{value.dtype.str}:{value.shape};".encode() + value.tobytes())
    tests = data.client_test_indices
    assert tests is not None
    h.update(f"client_tests:{len(tests)};".encode())
    for rows in tests:
        h.update(f"t:<i8:{rows.shape};".encode() + np.asarray(rows).tobytes())
    assert rundir.data_fingerprint(data) == h.hexdigest()


# -- a run killed before it started -----------------------------------------------
def test_a_run_killed_before_run_json_starts_afresh_with_a_new_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dpfl.experiments import runner

    cfg = tiny_config(tmp_path, "early", rounds=2)

    def killed(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed")

    with monkeypatch.context() as m:
        m.setattr(runner.rundir, "write_manifest", killed)
        with pytest.raises(RuntimeError):
            run(cfg, progress=False)
    first = (cfg.run_dir / "secret.key").read_bytes()
    assert not (cfg.run_dir / "run.json").exists()
    assert resume(cfg.run_dir, progress=False).rounds_completed == 2
    assert (cfg.run_dir / "secret.key").read_bytes() != first


def test_the_key_file_names_agree() -> None:
    assert rundir.KEY_FILE == keys.KEY_FILE
