"""dpfl in a Flower federation: the simulator's sampler, noise and ledger, deployed.

What was simulated is what is deployed. The ServerApp side drives the same
:class:`~dpfl.sim.loop.Trainer` that ``dpfl train`` drives, built by the same
builders from the same :class:`~dpfl.experiments.config.RunConfig`; the
ClientApp side runs the same :meth:`FederatedAlgorithm.client_step` with the
same per-client generators (:mod:`dpfl.sim.randomness`; with secure noise the
server sends each node the derived keys of its tasks' clients for the round,
never the run's key). A
Flower run therefore charges the ledger ``dpfl train`` charges, entry by
entry, and ends with its model up to float32 summation order.

Who runs what
-------------
Server (:class:`DpflStrategy`, in the ServerApp)
    per round: :meth:`Trainer.begin_round` (the budget guard, *before* anything
    is sent; then the server's sampler picks the cohort with the round's server
    generators), one train message per node hosting a task, the replies
    stacked in task order (:meth:`Messages.stack`), :meth:`Trainer.finish_round`
    (aggregation, dpfl's privatizer, the server update, the ledger charge);
    then the ledger and a checkpoint are written to the run folder.
Clients (:func:`client_app`, in each SuperNode's ClientApp)
    per task: the algorithm's ``client_step(weights, task,
    client_streams(seed, round, client))`` on a replica built from the run
    configuration the server sends: record-level per-sample clipping for
    DP-DSGD and PriFedSync, client-side noise for LOCKS and MS-PAFL and
    PriFedSync, the clipped local update for DP-FedAvg.

Node and client mapping
-----------------------
Each SuperNode declares ``partition-id`` and ``num-partitions`` in its node
configuration (``flower-supernode --node-config "partition-id=0
num-partitions=3"``; the simulation engine sets them itself). Node ``j`` hosts
the dpfl clients ``k`` with ``k % num_partitions == j``. At start the
strategy sends every connected node a ``query`` message; each replies with its
two values, and the strategy waits until every partition has a node. A node
refuses a task for a client it does not host.

Faults
------
A round whose replies are incomplete (a node did not reply within
``round_timeout``, or replied with an error, or a partition has no live node)
is abandoned *before the server step* (:meth:`Trainer.abandon_round`): the
server releases nothing and the model is unchanged. It is charged nothing
when the server privatizes (central noise: the messages it received are not
releases) and its checked event, marked ``{"abandoned": true}``, when each
client message is itself a release (client-side noise: LOCKS, MS-PAFL,
PriFedSync), so a release is never left uncharged. The federation then goes
on with its next round.

Not supported: DP-DSGD with ``server: untrusted``. In the simulator its server
draws every message's noise at once (:class:`dpfl.sim.privatize.NoiseOnlyMessages`);
deployed, each client would draw its own noise and non-participants would send
noise only. That client step does not exist yet, so the strategy refuses the
configuration rather than run a deployment whose server holds the noise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, cast

try:
    from flwr.app import (
        ArrayRecord,
        ConfigRecord,
        Context,
        Error,
        Message,
        MessageType,
        MetricRecord,
        RecordDict,
    )
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import Result, Strategy
except ImportError as exc:  # pragma: no cover - exercised without flwr only
    raise ImportError(
        "dpfl.integrations.flower needs Flower; install it with "
        "pip install 'dpfl[flower]'"
    ) from exc

import numpy as np
import torch
import yaml

from dpfl._files import atomic_write
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.experiments import rundir, runner
from dpfl.experiments.config import RunConfig, config_from_dict
from dpfl.sim.algorithms.base import FederatedAlgorithm, Messages
from dpfl.sim.algorithms.tasks import Message as DpflMessage
from dpfl.sim.algorithms.tasks import Task
from dpfl.sim.callbacks import Callback, FitState
from dpfl.sim.loop import Trainer
from dpfl.sim.randomness import Streams, client_streams
from dpfl.sim.rounds import RoundPlan, RoundReport
from dpfl.sim.secure_noise import STREAM_VERSION

__all__ = [
    "EXIT_SUPERLINK_LOST",
    "DpflStrategy",
    "build_trainer",
    "client_app",
    "client_step_message",
    "hosts",
    "partition_reply",
    "server_app",
]

log = logging.getLogger("dpfl.flower")

#: What the run folder gets besides the runner's files: how the run went.
SUMMARY = "flower.json"
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
#: The ClientApp's error code when it refuses a task (Flower's own codes are < 100).
REFUSED = 100
#: The ServerApp's exit status when its SuperLink is gone (BSD's EX_TEMPFAIL:
#: try again later, e.g. with ``dpfl resume``).
EXIT_SUPERLINK_LOST = 75

ConfigFn = Callable[[Context], RunConfig]


def hosts(client: int, partition_id: int, num_partitions: int) -> bool:
    """Whether the node of partition ``partition_id`` hosts dpfl client ``client``."""
    return int(client) % int(num_partitions) == int(partition_id)


def _config_text(config: RunConfig) -> str:
    return yaml.safe_dump(config.to_dict(), sort_keys=True)


def _client_fingerprint(config: RunConfig) -> str:
    """What a client step depends on: seed, data, model, algorithm, σ."""
    tree = config.to_dict()
    keep = {k: tree[k] for k in ("seed", "data", "model", "algorithm")}
    keep["noise_multiplier"] = tree["privacy"]["noise_multiplier"]
    return _fingerprint(json.dumps(keep, sort_keys=True, default=str))


def _fingerprint(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_trainer(
    config: RunConfig, *, ledger_path: bool = True, noise_key: bytes | None = None
) -> tuple[RunConfig, Trainer]:
    """The trainer ``dpfl train`` builds for ``config`` (resolved: σ set).

    Uses the runner's own builders (data set, σ calibration and checks,
    algorithm, ledger), so the Flower server holds exactly the simulator's
    sampler, privatizer and ledger.

    Parameters
    ----------
    config : RunConfig
        The run; σ is calibrated if it is ``None``.
    ledger_path : bool
        Start the run in its folder (which must hold no run): its own secret
        key, ``config.yaml``, the ledger (``ledger.json``) and ``run.json``,
        as ``dpfl train`` does.
    noise_key : bytes or None
        Without ``ledger_path`` only: the secret noise key of an in-memory
        trainer (``privacy.secure_noise``; ``None``: a fresh one).

    Returns
    -------
    tuple of RunConfig and Trainer
        The resolved configuration (σ filled in) and the trainer.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the algorithm is DP-DSGD with an untrusted server (not deployable
        yet: see the module docstring), or on a configuration the runner
        refuses.
    """
    if config.algorithm.name == "dsgd-rp" and config.algorithm.params.server != (
        "trusted"
    ):
        raise InvalidParameterError(
            "algorithm.params.server 'untrusted' is not supported through Flower "
            "yet (its clients would draw their own noise; the simulator's server "
            "draws it); use server: trusted"
        )
    if ledger_path and noise_key is not None:
        raise InvalidParameterError(
            "noise_key is for a trainer without a run folder (ledger_path=False): "
            "a run folder's run makes its own key; got a key with ledger_path=True"
        )
    # the checks and builders of `dpfl train` (dpfl.experiments.runner.prepare)
    prepared = runner.prepare(config)
    config, algorithm = prepared.config, prepared.algorithm
    noise: dict[str, Any]
    if ledger_path:
        # a new run: its own key, identity, ledger, config.yaml and run.json
        _, ledger, noise = runner._start(config, config.run_dir, prepared.dataset)
    else:
        ledger = runner._ledger(config, Path("."))
        ledger.path = None
        noise = (
            {"secure_noise": False}
            if not config.privacy.secure_noise
            else {}
            if noise_key is None
            else {"noise_key": noise_key}
        )
    trainer = Trainer(
        algorithm,
        ledger=ledger,
        seed=config.seed,
        execution=config.execution,
        **noise,
    )
    return config, trainer


# -- the wire format ----------------------------------------------------------------
def _tensor_array(t: torch.Tensor) -> Any:
    return t.detach().cpu().contiguous().numpy()


def _encode_tasks(
    weights: torch.Tensor,
    round_index: int,
    seed: int,
    config_text: str,
    positions: list[int],
    tasks: list[Task],
    keys: list[bytes] | None = None,
    stream_version: str = STREAM_VERSION,
) -> RecordDict:
    arrays: dict[str, Any] = {}
    for j, task in zip(positions, tasks):
        if task.rows is not None:
            arrays[f"{j}/rows"] = np.asarray(task.rows, dtype=np.int64)
        for name, value in task.state.items():
            arrays[f"{j}/state/{name}"] = _tensor_array(value)
    meta = {
        "round": round_index,
        "seed": seed,
        "positions": positions,
        "clients": [int(t.client) for t in tasks],
        "options": [
            json.loads(json.dumps(dict(t.options), default=float)) for t in tasks
        ],
        "state": [sorted(t.state) for t in tasks],
        # secure noise: each task's client's derived key of this round only
        "keys": None if keys is None else [k.hex() for k in keys],
        "stream": stream_version,  # the run's secure noise stream
    }
    return RecordDict(
        {
            "weights": ArrayRecord(_arrays({"weights": _tensor_array(weights)})),
            "tasks": ArrayRecord(_arrays(arrays)),
            "dpfl": ConfigRecord({"meta": json.dumps(meta), "config": config_text}),
        }
    )


def _arrays(named: Mapping[str, Any]) -> Any:
    from flwr.app import Array

    return {k: Array(v) for k, v in named.items()}


def _np(record: Any, key: str) -> np.ndarray:
    """The NumPy array stored under ``key`` of an ArrayRecord."""
    return np.asarray(record[key].numpy())


def _decode_tasks(
    content: RecordDict,
) -> tuple[torch.Tensor, dict[str, Any], list[Task]]:
    meta = json.loads(str(content["dpfl"]["meta"]))
    arrays = content["tasks"]
    weights = torch.from_numpy(_np(content["weights"], "weights").copy())
    tasks = []
    for j, client, options, names in zip(
        meta["positions"], meta["clients"], meta["options"], meta["state"]
    ):
        key = f"{j}/rows"
        rows = _np(arrays, key) if key in arrays else None
        state = {
            n: torch.from_numpy(_np(arrays, f"{j}/state/{n}").copy()) for n in names
        }
        tasks.append(Task(int(client), rows, options, state))
    return weights, meta, tasks


def _encode_messages(positions: list[int], messages: list[DpflMessage]) -> RecordDict:
    arrays: dict[str, Any] = {}
    for j, m in zip(positions, messages):
        arrays[f"{j}/vector"] = _tensor_array(m.vector)
        for name, value in m.state.items():
            arrays[f"{j}/state/{name}"] = _tensor_array(value)
    meta = {
        "positions": positions,
        "scalars": [{k: float(v) for k, v in m.scalars.items()} for m in messages],
        "state": [sorted(m.state) for m in messages],
    }
    return RecordDict(
        {
            "messages": ArrayRecord(_arrays(arrays)),
            "dpfl": ConfigRecord({"meta": json.dumps(meta)}),
            "metrics": MetricRecord({"num-tasks": len(messages)}),
        }
    )


def _decode_messages(content: RecordDict) -> dict[int, DpflMessage]:
    meta = json.loads(str(content["dpfl"]["meta"]))
    arrays = content["messages"]
    out = {}
    for j, scalars, names in zip(meta["positions"], meta["scalars"], meta["state"]):
        out[int(j)] = DpflMessage(
            torch.from_numpy(_np(arrays, f"{j}/vector").copy()),
            {k: float(v) for k, v in scalars.items()},
            {n: torch.from_numpy(_np(arrays, f"{j}/state/{n}").copy()) for n in names},
        )
    return out


# -- the server -------------------------------------------------------------------
class _FlowerResult(Callback):
    """Fill Flower's :class:`Result` from the round loop's records."""

    def __init__(
        self,
        result: Result,
        arrays: Callable[[], ArrayRecord],
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
    ) -> None:
        self.result = result
        self.arrays = arrays
        self.evaluate_fn = evaluate_fn

    def on_round_end(self, state: FitState, record: dict[str, Any]) -> None:
        server_round = int(record["round"])
        arrays = self.arrays()
        self.result.arrays = arrays
        if state.evaluated_round == server_round:
            values = {**state.evaluation, "epsilon": record.get("epsilon")}
            self.result.evaluate_metrics_serverapp[server_round] = MetricRecord(
                {k: float(v) for k, v in values.items() if v is not None}
            )
        if self.evaluate_fn is not None:
            extra = self.evaluate_fn(server_round, arrays)
            if extra is not None:
                self.result.evaluate_metrics_serverapp[server_round] = extra


class DpflStrategy(Strategy):
    """A Flower strategy that runs a dpfl :class:`Trainer` round by round.

    A subclass of the Message API's :class:`flwr.serverapp.strategy.Strategy`:
    :meth:`configure_train` is :meth:`Trainer.begin_round` plus the tasks'
    messages, :meth:`aggregate_train` rebuilds the :class:`Messages` and calls
    :meth:`Trainer.finish_round` (or :meth:`Trainer.abandon_round`). It
    overrides :meth:`start`, because Flower's loop can neither stop early (the
    ledger's guard refuses a round: the run must end *before* that round's
    messages go out) nor discover which node hosts which partition; the loop
    keeps Flower's shape (configure, ``grid.send_and_receive``, aggregate,
    evaluate) and returns a Flower :class:`Result`. There is no federated
    evaluation: as in the simulator, the server evaluates on the test set.

    Parameters
    ----------
    config : RunConfig
        The run (σ calibrated here when ``None``); it writes to
        ``config.run_dir``: ``config.yaml``, ``ledger.json`` (after every
        charged round), ``checkpoint.pt`` (the trainer's state, every round),
        ``metrics.jsonl`` and ``flower.json`` (how the run ended, which rounds
        were abandoned, the node of each partition).
    round_timeout : float
        Seconds to wait for a round's replies; a missing reply abandons the
        round.
    discovery_timeout : float
        Seconds to wait at start for a node of every partition.
    superlink_timeout : float
        Seconds the SuperLink may stay unreachable before the ServerApp
        leaves (see :meth:`start`).

    Raises
    ------
    dpfl.errors.DpflError
        If another process holds the run folder (its lock, as ``dpfl train``
        takes it), or the folder already holds a run (a ledger, checkpoint,
        ``run.json`` or secret key).
    """

    def __init__(
        self,
        config: RunConfig,
        *,
        round_timeout: float = 600.0,
        discovery_timeout: float = 120.0,
        superlink_timeout: float = 20.0,
    ) -> None:
        run_dir = config.run_dir
        # the folder's lock, held until the run ends (start) or close()
        self._lock = rundir.RunLock(run_dir)
        self._lock.acquire()
        try:
            rundir.clean_orphans(run_dir)
            rundir.check_new_folder(run_dir)
            # key, config, empty ledger and run.json: `dpfl resume` can continue
            self.config, self.trainer = build_trainer(config)
        except BaseException:
            self._lock.release()
            raise
        self.config_text = _config_text(self.config)
        self.run_dir = run_dir
        self.round_timeout = float(round_timeout)
        self.discovery_timeout = float(discovery_timeout)
        self.superlink_timeout = float(superlink_timeout)
        self.nodes: dict[int, int] = {}  # partition id -> node id
        self.num_partitions = 0
        self.abandoned: list[int] = []
        self.stopped = "completed"
        self._plan: RoundPlan | None = None
        self._sent: dict[int, list[int]] = {}  # node id -> task positions
        self._missing: list[int] = []
        # held by the main thread except while it waits on the network: the
        # SuperLink watch leaves only between two writes of the run's files
        self._local = threading.Lock()
        self._holding = False  # whether start's thread holds _local
        self._done = threading.Event()

    def close(self) -> None:
        """Release the run folder's lock (:meth:`start` does when it ends)."""
        self._lock.release()

    def _network(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``: a grid call, during which the watch may act."""
        held = self._holding
        if held:
            self._holding = False
            self._local.release()
        try:
            return call(*args, **kwargs)
        finally:
            if held:
                self._local.acquire()
                self._holding = True

    # -- nodes --------------------------------------------------------------------
    def discover(self, grid: Grid) -> dict[int, int]:
        """Ask every connected node for its partition until each partition has one.

        Returns
        -------
        dict of int to int
            Partition id to node id.

        Raises
        ------
        dpfl.errors.DpflError
            If two nodes claim one partition, nodes disagree on
            ``num-partitions``, or some partition has no node after
            ``discovery_timeout`` seconds.
        """
        deadline = time.monotonic() + self.discovery_timeout
        asked: dict[int, tuple[int, int]] = {}
        while True:
            live = set(self._network(grid.get_node_ids))
            new = [n for n in live if n not in asked]
            if new:
                queries = [
                    Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY)
                    for n in new
                ]
                for reply in self._network(
                    grid.send_and_receive,
                    queries,
                    timeout=max(1.0, deadline - time.monotonic()),
                ):
                    if reply.has_error():
                        continue
                    info = reply.content["partition"]
                    asked[reply.metadata.src_node_id] = (
                        int(cast(int, info[PARTITION_ID])),
                        int(cast(int, info[NUM_PARTITIONS])),
                    )
            counts = {n for _, n in asked.values()}
            if len(counts) > 1:
                raise DpflError(f"nodes disagree on num-partitions: {sorted(counts)}")
            nodes: dict[int, int] = {}
            for node, (pid, _) in asked.items():
                if node not in live:
                    continue
                if pid in nodes and nodes[pid] != node:
                    raise DpflError(
                        f"nodes {nodes[pid]} and {node} both claim partition {pid}"
                    )
                nodes[pid] = node
            if counts:
                (total,) = counts
                if set(nodes) >= set(range(total)):
                    self.nodes, self.num_partitions = nodes, total
                    log.info("partitions -> nodes: %s", nodes)
                    return nodes
            if time.monotonic() > deadline:
                raise DpflError(
                    f"after {self.discovery_timeout:g} s the nodes cover partitions "
                    f"{sorted(nodes)} of {sorted(counts) or '?'}; start a SuperNode "
                    "with --node-config 'partition-id=J num-partitions=N' for each"
                )
            time.sleep(0.5)

    def node_of(self, client: int) -> int:
        """The partition whose node hosts dpfl client ``client``."""
        return int(client) % self.num_partitions

    # -- Strategy ----------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Check the round against the budget, select the cohort, build its messages.

        Raises :class:`~dpfl.errors.BudgetExceededError` (from
        :meth:`Trainer.begin_round`) before any message exists when the
        round would pass the budget.
        """
        trainer = self.trainer
        plan = trainer.begin_round()
        self._plan = plan
        live = set(self._network(grid.get_node_ids))
        by_partition: dict[int, list[int]] = {}
        for j, task in enumerate(plan.cohort.tasks):
            by_partition.setdefault(self.node_of(task.client), []).append(j)
        self._missing = [p for p in by_partition if self.nodes.get(p) not in live]
        if self._missing:
            self._rediscover(grid, live)
            self._missing = [p for p in by_partition if self.nodes.get(p) not in live]
        self._sent = {}
        if self._missing:
            log.warning(
                "round %d: no live node for partitions %s; nothing is sent",
                plan.round,
                self._missing,
            )
            return []
        out = []
        for partition, positions in sorted(by_partition.items()):
            node = self.nodes[partition]
            content = _encode_tasks(
                trainer.algorithm.weights,
                plan.round,
                trainer.seed,
                self.config_text,
                positions,
                [plan.cohort.tasks[j] for j in positions],
                None
                if plan.streams.client_keys is None
                else [plan.streams.client_keys[j] for j in positions],
                plan.streams.stream_version,
            )
            out.append(
                Message(
                    content,
                    dst_node_id=node,
                    message_type=MessageType.TRAIN,
                    group_id=str(server_round),
                )
            )
            self._sent[node] = positions
        return out

    def _rediscover(self, grid: Grid, live: set[int]) -> None:
        """Ask live nodes not yet mapped for their partition (a restarted node)."""
        known = set(self.nodes.values())
        fresh = [n for n in live if n not in known]
        if not fresh:
            return
        queries = [
            Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY)
            for n in fresh
        ]
        replies = self._network(
            grid.send_and_receive, queries, timeout=self.round_timeout
        )
        for reply in replies:
            if not reply.has_error():
                info = reply.content["partition"]
                pid = int(cast(int, info[PARTITION_ID]))
                self.nodes[pid] = reply.metadata.src_node_id

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Stack the replies in task order and run the server step (or abandon).

        Every sent message must come back without error; otherwise the round
        is abandoned (:meth:`Trainer.abandon_round`: charged only when the
        clients' messages are releases).
        """
        plan = self._plan
        if plan is None:
            raise DpflError("aggregate_train without configure_train")
        self._plan = None
        trainer = self.trainer
        got: dict[int, DpflMessage] = {}
        failed = list(self._missing)
        answered = set()
        for reply in replies:
            node = reply.metadata.src_node_id
            answered.add(node)
            if reply.has_error():
                log.warning(
                    "round %d: node %d replied with an error: %s",
                    plan.round,
                    node,
                    reply.error.reason,
                )
                failed.append(node)
                continue
            got.update(_decode_messages(reply.content))
        failed += [n for n in self._sent if n not in answered]
        tasks = plan.cohort.tasks
        if failed or set(got) != set(range(len(tasks))):
            report = trainer.abandon_round(plan, sent=bool(self._sent))
            self.abandoned.append(plan.round)
            log.warning(
                "round %d abandoned (nodes/partitions %s failed); charged: %s",
                plan.round,
                failed,
                report.event is not None,
            )
        else:
            messages = Messages.stack(
                [got[j] for j in range(len(tasks))], like=trainer.algorithm.weights
            )
            report = trainer.finish_round(plan, messages)
        self._last_report = report
        metrics = MetricRecord(
            {k: float(v) for k, v in report.metrics.items() if np.isfinite(v)}
        )
        return self._arrays(), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No federated evaluation (the server evaluates on the test set)."""
        return []

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """No federated evaluation."""
        return None

    def summary(self) -> None:
        """Log the run: algorithm, σ, rounds, budget, run folder."""
        c = self.config
        log.info(
            "dpfl %s: sigma=%s, %d rounds, budget eps=%g delta=%g, run folder %s",
            c.algorithm.name,
            c.privacy.noise_multiplier,
            c.rounds,
            c.privacy.epsilon,
            c.privacy.delta,
            self.run_dir,
        )

    def _arrays(self) -> ArrayRecord:
        weights = _tensor_array(self.trainer.algorithm.weights)
        return ArrayRecord(_arrays({"weights": weights}))

    # -- the loop -------------------------------------------------------------------
    def start(  # type: ignore[override]
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Discover the nodes, then run rounds until ``num_rounds`` or the budget.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid.
        initial_arrays : ArrayRecord or None
            Ignored when ``None``; otherwise must hold the trainer's initial
            weights (the model is the configuration's, built from its seed).
        num_rounds : int or None
            Rounds to run (default: the configuration's ``rounds``).
        timeout : float or None
            Overrides ``round_timeout``.
        train_config, evaluate_config : ConfigRecord or None
            Unused (the tasks carry what clients need).
        evaluate_fn : callable or None
            Extra server-side evaluation, called with the round and weights.

        Returns
        -------
        Result
            Final weights (key ``"weights"``), each round's metrics, and the
            server-side evaluations.

        Notes
        -----
        The run folder's lock is held until this returns. When the grid
        talks to a SuperLink over the network (a deployment), a watch probes
        the SuperLink's address every second; once it has been unreachable
        for ``superlink_timeout`` seconds, the process leaves with exit
        status :data:`EXIT_SUPERLINK_LOST` (75), at a moment when no file of
        the run is being written: ``flower.json`` says ``"stopped":
        "superlink-lost"``, the ledger holds every round charged so far
        (written after each), and ``dpfl resume`` continues the run in the
        simulator. Without the watch, a ServerApp whose SuperLink died would
        wait on it forever, its run folder open.
        """
        try:
            return self._start(
                grid,
                initial_arrays,
                num_rounds,
                timeout,
                train_config,
                evaluate_fn,
            )
        finally:
            self._done.set()
            if self._holding:
                self._holding = False
                self._local.release()
            self.close()

    def _start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None,
        num_rounds: int | None,
        timeout: float | None,
        train_config: ConfigRecord | None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
    ) -> Result:
        self._local.acquire()
        self._holding = True
        address = _superlink_address(grid)
        if address is not None:
            watch = threading.Thread(
                target=self._watch,
                args=(address,),
                name="dpfl-superlink-watch",
                daemon=True,
            )
            watch.start()
        trainer = self.trainer
        if initial_arrays is not None:
            given = _np(initial_arrays, "weights")
            if not np.array_equal(given, _tensor_array(trainer.algorithm.weights)):
                raise DpflError("initial_arrays are not the configuration's model")
        rounds = self.config.rounds if num_rounds is None else int(num_rounds)
        if timeout is not None:
            self.round_timeout = float(timeout)
        self.summary()
        if not self.nodes:
            self.discover(grid)
        result = Result()
        config = train_config if train_config is not None else ConfigRecord()

        def flower_round() -> RoundReport:
            # One round through the grid; the budget guard in configure_train
            # raises BudgetExceededError before anything is sent.
            server_round = trainer.round + 1
            messages = list(
                self.configure_train(server_round, self._arrays(), config, grid)
            )
            replies = (
                list(
                    self._network(
                        grid.send_and_receive, messages, timeout=self.round_timeout
                    )
                )
                if messages
                else []
            )
            _, metrics = self.aggregate_train(server_round, replies)
            if metrics is not None:
                result.train_metrics_clientapp[server_round] = metrics
            return self._last_report

        # The runner's round loop and run-folder callbacks (metrics.jsonl,
        # checkpoint, guarantee.json), with Flower delivering the tasks.
        run = runner._loop(
            dataclasses.replace(self.config, rounds=rounds),
            self.run_dir,
            trainer,
            progress=False,
            callbacks=[_FlowerResult(result, self._arrays, evaluate_fn)],
            step=flower_round,
            run=self.trainer.ledger.run,
        )
        self.stopped = run.stopped
        if not result.arrays:
            result.arrays = self._arrays()
        self.write_summary()
        return result

    def _watch(self, address: tuple[str, int]) -> None:
        """Leave the process once the SuperLink has been unreachable too long."""
        lost: float | None = None
        while not self._done.wait(1.0):
            if _reachable(address):
                lost = None
                continue
            now = time.monotonic()
            lost = now if lost is None else lost
            if now - lost < self.superlink_timeout:
                continue
            with self._local:  # not while the run's files are being written
                if self._done.is_set():
                    return
                self.stopped = "superlink-lost"
                log.error(
                    "the SuperLink at %s:%d has been unreachable for %.0f s: "
                    "leaving (exit status %d) with the ledger as it stands after "
                    "round %d; continue the run with `dpfl resume %s`",
                    *address,
                    now - lost,
                    EXIT_SUPERLINK_LOST,
                    self.trainer.ledger.released,
                    self.run_dir,
                )
                self.write_summary()
                for handler in logging.getLogger().handlers + log.handlers:
                    handler.flush()
                os._exit(EXIT_SUPERLINK_LOST)

    def write_summary(self) -> None:
        """Write ``flower.json``: how the run ended."""
        summary = {
            "stopped": self.stopped,
            "rounds": self.trainer.round,
            "charged_rounds": self.trainer.ledger.rounds,
            "abandoned": self.abandoned,
            "partitions": {str(p): n for p, n in sorted(self.nodes.items())},
            "config_fingerprint": _fingerprint(self.config_text),
        }
        text = json.dumps(summary, indent=1)
        atomic_write(self.run_dir / SUMMARY, lambda fh: fh.write(text), binary=False)


def server_app(
    config_fn: ConfigFn,
    *,
    round_timeout: float | Callable[[Context], float] = 600.0,
    discovery_timeout: float = 120.0,
    superlink_timeout: float = 20.0,
) -> ServerApp:
    """A Flower ServerApp that runs ``config_fn(context)`` with :class:`DpflStrategy`.

    Parameters
    ----------
    config_fn : callable
        ``Context -> RunConfig`` (e.g. from the app's run config).
    round_timeout : float or callable
        Seconds to wait for a round's replies (or ``Context -> float``).
    discovery_timeout : float
        Seconds to wait at start for a node of every partition.
    superlink_timeout : float
        Seconds the SuperLink may stay unreachable before the ServerApp
        leaves with exit status :data:`EXIT_SUPERLINK_LOST`.

    Returns
    -------
    ServerApp
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        timeout = round_timeout(context) if callable(round_timeout) else round_timeout
        strategy = DpflStrategy(
            config_fn(context),
            round_timeout=timeout,
            discovery_timeout=discovery_timeout,
            superlink_timeout=superlink_timeout,
        )
        strategy.start(grid)

    return app


def _superlink_address(grid: Any) -> tuple[str, int] | None:
    """The SuperLink address a deployment's grid talks to (None: in process).

    Flower's network grid keeps the address of the SuperLink's API it
    connects to as ``host:port``; in-process grids (the simulation engine's,
    a test's) have none.
    """
    addr = getattr(grid, "_addr", None)
    if not isinstance(addr, str):
        return None
    host, _, port = addr.rpartition(":")
    if not (port.isascii() and port.isdigit()):
        return None
    host = host.strip("[]") or "127.0.0.1"
    return ("127.0.0.1" if host in ("0.0.0.0", "::") else host), int(port)


def _reachable(address: tuple[str, int]) -> bool:
    """Whether something accepts a TCP connection at ``address``."""
    try:
        with socket.create_connection(address, timeout=2.0):
            return True
    except OSError:
        return False


# -- the clients ------------------------------------------------------------------
#: One replica per process, keyed by the fingerprint of what client steps read.
_REPLICAS: dict[str, FederatedAlgorithm] = {}


def _replica(config: RunConfig) -> FederatedAlgorithm:
    """The algorithm built once per process from the server's resolved config."""
    key = _client_fingerprint(config)
    if key not in _REPLICAS:
        _REPLICAS.clear()
        _REPLICAS[key] = runner._build_algorithm(config, runner._build_dataset(config))
    return _REPLICAS[key]


def client_step_message(
    message: Message, context: Context, *, pinned: str | None = None
) -> Message:
    """Run the tasks of a train message on this node; reply with their messages.

    Parameters
    ----------
    message : Message
        From :class:`DpflStrategy`.
    context : Context
        The node's context (``partition-id``, ``num-partitions``).
    pinned : str or None
        The fingerprint of what client steps read (seed, data, model,
        algorithm, σ) that this node accepts (``None``: whatever the server
        sends).

    Returns
    -------
    Message
        The reply (or an error reply naming why a task was refused).
    """
    pid = int(context.node_config.get(PARTITION_ID, 0))
    num = int(context.node_config.get(NUM_PARTITIONS, 1))
    config = config_from_dict(yaml.safe_load(str(message.content["dpfl"]["config"])))
    if pinned is not None and _client_fingerprint(config) != pinned:
        return Message(
            Error(REFUSED, "the server's run configuration is not this node's"),
            reply_to=message,
        )
    weights, meta, tasks = _decode_tasks(message.content)
    foreign = [t.client for t in tasks if not hosts(t.client, pid, num)]
    if foreign:
        return Message(
            Error(REFUSED, f"partition {pid}/{num} does not host clients {foreign}"),
            reply_to=message,
        )
    algorithm = _replica(config)
    with torch.no_grad():
        algorithm.weights.copy_(weights)
    seed, round_index = int(meta["seed"]), int(meta["round"])
    keys = meta.get("keys")
    if keys is not None:  # secure noise: the clients' derived keys
        version = meta.get("stream", STREAM_VERSION)
        streams = [
            Streams.from_key(bytes.fromhex(k), algorithm.device, stream_version=version)
            for k in keys
        ]
    else:
        streams = [
            client_streams(seed, round_index, t.client, algorithm.device) for t in tasks
        ]
    out = [
        algorithm.client_step(weights.to(algorithm.device), task, s)
        for task, s in zip(tasks, streams, strict=True)
    ]
    return Message(_encode_messages(list(meta["positions"]), out), reply_to=message)


def partition_reply(message: Message, context: Context) -> Message:
    """Answer the strategy's discovery query with this node's partition.

    Parameters
    ----------
    message : Message
        The ``query`` message.
    context : Context
        The node's context (``partition-id``, ``num-partitions`` in its node
        config; 0 of 1 when absent).

    Returns
    -------
    Message
        A reply holding the ConfigRecord ``"partition"``.
    """
    record = ConfigRecord(
        {
            PARTITION_ID: int(context.node_config.get(PARTITION_ID, 0)),
            NUM_PARTITIONS: int(context.node_config.get(NUM_PARTITIONS, 1)),
        }
    )
    return Message(RecordDict({"partition": record}), reply_to=message)


def client_app(config_fn: ConfigFn | None = None) -> ClientApp:
    """A Flower ClientApp running dpfl client steps for the clients this node hosts.

    Parameters
    ----------
    config_fn : callable or None
        ``Context -> RunConfig``: the node's own configuration. When given,
        the node resolves it (as the server does) and refuses tasks whose
        configuration differs, so a client never runs with another σ or
        clip than it agreed to. ``None``: trust the server's configuration.

    Returns
    -------
    ClientApp
    """
    app = ClientApp()
    pinned: dict[str, str | None] = {}

    def _pinned(context: Context) -> str | None:
        if config_fn is None:
            return None
        if "key" not in pinned:
            config = config_fn(context)
            resolved = runner._resolve(config, runner._build_dataset(config))
            pinned["key"] = _client_fingerprint(resolved)
        return pinned["key"]

    app.query()(partition_reply)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return client_step_message(message, context, pinned=_pinned(context))

    return app
