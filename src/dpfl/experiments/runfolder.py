"""A run folder's life: starting a run in one, reopening a started one.

:func:`start_run` starts a run in an empty folder: its own secret key, then
``config.yaml``, the empty ledger and ``run.json`` (in that order: a folder
with ``run.json`` has the others). :func:`reopen_run` reopens a started run
for :func:`dpfl.experiments.runner.resume`: the key against ``run.json``'s
fingerprint, the data's fingerprint, the ledger's run identity, budget,
analysis and guard, and each of its entries against what the frozen
configuration's algorithm charges. :func:`check_unstarted` clears a folder
whose run was killed before ``run.json`` was written, and refuses anything
more. :func:`replay_threads` computes replayed rounds with the torch thread
count the run started with.

Any failure is a :class:`~dpfl.errors.DpflError` naming the file; nothing is
ever reset to zero spend.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpfl.accounting import events as ev
from dpfl.accounting import guards
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.errors import DpflError
from dpfl.experiments import rundir
from dpfl.experiments.build import RunNoise
from dpfl.experiments.config import RunConfig
from dpfl.experiments.privacy import build_ledger

if TYPE_CHECKING:
    from dpfl.data.dataset import FederatedDataset
    from dpfl.sim.algorithms.base import FederatedAlgorithm

__all__ = [
    "StartedRun",
    "check_unstarted",
    "reopen_run",
    "replay_threads",
    "start_run",
]

log = logging.getLogger("dpfl.experiments")


@dataclasses.dataclass(frozen=True)
class StartedRun:
    """A run folder's run: its digest, its ledger and where its noise comes from.

    Attributes
    ----------
    run : str
        The run digest (``run.json``'s ``run``).
    ledger : PrivacyLedger
        The run's ledger, saving itself to ``ledger.json``.
    noise : RunNoise
        The run's key and noise stream.
    """

    run: str
    ledger: PrivacyLedger
    noise: RunNoise


def _stream(config: RunConfig) -> str | None:
    """The secure noise stream a new run draws from (``None``: seeded noise)."""
    if not config.privacy.secure_noise:
        return None
    from dpfl.sim.secure_noise import STREAM_VERSION

    return STREAM_VERSION


def start_run(
    config: RunConfig, run_dir: Path, dataset: FederatedDataset
) -> StartedRun:
    """Start a run in an empty folder: its key, identity, ledger and files.

    The run makes its own secret key (never one found in the folder), then
    writes ``config.yaml``, the empty ledger and ``run.json`` (in that order:
    a folder with ``run.json`` has the others).

    Parameters
    ----------
    config : RunConfig
        The run, resolved (:func:`dpfl.experiments.build.prepare`).
    run_dir : Path
        The folder (it must hold no run).
    dataset : FederatedDataset
        The run's data (its fingerprint goes into ``run.json``).

    Returns
    -------
    StartedRun

    Raises
    ------
    DpflError
        If the folder already holds a run.
    """
    import torch

    rundir.check_new_folder(run_dir)
    stream = _stream(config)
    if stream is not None:
        key_bytes = rundir.create_run_key(run_dir)
        noise = RunNoise(True, key_bytes, stream)
        key: str | None = rundir.key_fingerprint(key_bytes)
    else:
        noise, key = RunNoise(False), None
    identity: dict[str, Any] = {
        "key": key,
        "data": rundir.data_fingerprint(dataset),
        "stream_version": stream,
    }
    run_id = rundir.run_digest(config.to_dict(), **identity)
    ledger = build_ledger(config, run_dir / rundir.LEDGER, run=run_id, key=key)
    # run.json comes last: a folder that has it has the other two, so a
    # missing ledger beside it was deleted (see check_unstarted)
    rundir.write_config(run_dir, config.to_dict())
    ledger.save()
    rundir.write_manifest(
        run_dir, config.to_dict(), torch_threads=torch.get_num_threads(), **identity
    )
    return StartedRun(run_id, ledger, noise)


def _started_noise(
    config: RunConfig, run_dir: Path, manifest: dict[str, Any]
) -> tuple[RunNoise, str | None]:
    """A started run's noise and key fingerprint.

    The key from its key file (:func:`~dpfl.experiments.rundir.read_run_key`),
    the stream it recorded when it started
    (:func:`~dpfl.experiments.rundir.recorded_stream`: an older stream
    included, so that it draws what the uninterrupted run drew).
    """
    if not config.privacy.secure_noise:
        return RunNoise(False), None
    from dpfl.sim.secure_noise import STREAM_VERSIONS

    stream = rundir.recorded_stream(manifest, run_dir, STREAM_VERSIONS)
    key = rundir.read_run_key(run_dir)
    return RunNoise(True, key, stream), rundir.key_fingerprint(key)


def reopen_run(
    config: RunConfig,
    run_dir: Path,
    manifest: dict[str, Any],
    dataset: FederatedDataset,
    algorithm: FederatedAlgorithm,
) -> StartedRun:
    """Reopen a started run: its key, identity and ledger, each checked.

    Parameters
    ----------
    config : RunConfig
        The run's configuration, resolved (σ as it started).
    run_dir : Path
        The folder.
    manifest : dict
        Its ``run.json`` (:func:`~dpfl.experiments.rundir.read_manifest`).
    dataset : FederatedDataset
        The data as read now (its fingerprint must be the run's).
    algorithm : FederatedAlgorithm
        The frozen configuration's algorithm (each ledger entry must be what
        it charges).

    Returns
    -------
    StartedRun

    Raises
    ------
    DpflError
        Naming the file: a key or data other than the run's, a missing
        ledger, a ledger of another run or configuration, or an entry the
        algorithm does not charge.
    """
    noise, key = _started_noise(config, run_dir, manifest)
    rundir.check_identity(
        manifest, run_dir, key=key, data=rundir.data_fingerprint(dataset)
    )
    run_id = str(manifest["run"])
    ledger_path = run_dir / rundir.LEDGER
    if not ledger_path.exists():
        raise DpflError(
            f"{ledger_path} is missing but {rundir.MANIFEST} says the run "
            "started: refusing to resume without its ledger (the spend is "
            "never reset)"
        )
    ledger = PrivacyLedger.load(ledger_path)
    if ledger.run != run_id or ledger.key != key:
        raise DpflError(
            f"{ledger_path} belongs to another run (its run digest or key "
            f"fingerprint differs from {rundir.MANIFEST}'s)"
        )
    _check_ledger(ledger, config)
    _check_entries(ledger, algorithm)
    return StartedRun(run_id, ledger, noise)


def replay_threads(manifest: dict[str, Any], config: RunConfig) -> int | None:
    """Compute with the torch thread count the run started with; the old count.

    A replayed round must reproduce the model it released bit for bit, and a
    matrix product's sum order depends on the thread count; a resume under
    another count (``OMP_NUM_THREADS``, another machine of the same kind)
    would stop at the first replayed round. In-process executions only (a
    distributed executor's workers set their own).

    Returns
    -------
    int or None
        The count before (to restore when the run ends); ``None`` when
        nothing was changed.
    """
    import torch

    threads = manifest.get("torch_threads")
    if config.execution == "ray" or not isinstance(threads, int) or threads < 1:
        return None
    before = torch.get_num_threads()
    if before != threads:
        log.info(
            "replaying with %d torch thread(s), as the run started (this process "
            "had %d)",
            threads,
            before,
        )
        torch.set_num_threads(threads)
    return before


def check_unstarted(run_dir: Path) -> None:
    """Resuming a folder without ``run.json``: only a run that never began.

    A run writes its key, ``config.yaml``, then an empty ledger, then
    ``run.json`` before its first round; a kill between them leaves at most a
    key and an empty ledger, which nothing was released with: both are
    removed and the run starts afresh, with a new key. Anything more without
    ``run.json`` is refused.

    Raises
    ------
    DpflError
        If the folder holds a checkpoint, or a ledger with charged rounds.
    """
    if (run_dir / rundir.CHECKPOINT).exists():
        raise DpflError(
            f"{run_dir} has a checkpoint but no {rundir.MANIFEST}: it was deleted "
            "or the run was written by an older dpfl; refusing to resume it"
        )
    if (run_dir / rundir.LEDGER).exists():
        ledger = PrivacyLedger.load(run_dir / rundir.LEDGER)
        if ledger.released:
            raise DpflError(
                f"{run_dir} has a ledger with {ledger.released} charged rounds but "
                f"no {rundir.MANIFEST}: it was deleted or the run was written by "
                "an older dpfl; refusing to resume it"
            )
        (run_dir / rundir.LEDGER).unlink()
    (run_dir / rundir.KEY_FILE).unlink(missing_ok=True)


def _check_entries(ledger: PrivacyLedger, algorithm: FederatedAlgorithm) -> None:
    """Each entry must be what the frozen configuration's algorithm charges.

    An entry whose event differs (e.g. a raised σ) is refused. Where the
    algorithm realises its event during the round (LOCKS), the noise
    multipliers must match.
    """
    from dpfl.sim.algorithms.base import FederatedAlgorithm

    realised = type(algorithm).realised_event is not FederatedAlgorithm.realised_event
    entries = ledger.released_ledger().entries
    for i, entry in enumerate(entries):
        want = algorithm.event(entry.round)
        have, expect = (
            ev.event_to_dict(entry.event),
            (None if want is None else ev.event_to_dict(want)),
        )
        same = (
            _noise_levels(have) == _noise_levels(expect)
            if realised and expect is not None
            else have == expect
        )
        if not same:
            raise DpflError(
                f"ledger entry {i + 1} (round {entry.round + 1}) charges {have}, "
                f"not what the run's algorithm charges ({expect}): the ledger was "
                "altered or belongs to another configuration; refusing it"
            )


def _noise_levels(tree: Any) -> list[float]:
    """Every noise multiplier in an event's dict form."""
    if isinstance(tree, dict):
        out = [float(v) for k, v in tree.items() if k == "noise_multiplier"]
        for v in tree.values():
            out += _noise_levels(v)
        return sorted(out)
    return []


def _check_ledger(ledger: PrivacyLedger, config: RunConfig) -> None:
    priv = config.privacy
    budget = ledger.budget
    analysis = priv.analysis or guards.guard(priv.guard).analysis
    unbudgeted = math.isinf(priv.epsilon) or not priv.noise_multiplier
    same_budget = (budget is None and unbudgeted) or (
        budget is not None
        and budget.epsilon == priv.epsilon
        and budget.delta == priv.delta
    )
    if ledger.analysis != analysis or ledger.guard != priv.guard or not same_budget:
        raise DpflError(
            f"the saved ledger (analysis {ledger.analysis!r}, guard "
            f"{ledger.guard!r}, budget {budget}) does not match the configuration "
            f"(analysis {analysis!r}, guard {priv.guard!r}, epsilon="
            f"{priv.epsilon}, delta={priv.delta})"
        )
