"""The ServerApp side: :class:`DpflStrategy` drives a dpfl trainer round by round.

The trainer is assembled as ``dpfl train`` assembles it
(:func:`build_trainer`, through :mod:`dpfl.experiments.build`); the round
loop and the run folder's files are the runner's
(:func:`dpfl.experiments.runner.fit_run`), with Flower delivering the tasks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result, Strategy

from dpfl._files import atomic_write
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.experiments import build, rundir, runfolder
from dpfl.experiments.config import RunConfig
from dpfl.experiments.privacy import build_ledger
from dpfl.experiments.runner import fit_run
from dpfl.integrations.flower.wire import (
    NUM_PARTITIONS,
    PARTITION_ID,
    ConfigFn,
    array_of,
    config_text,
    decode_messages,
    encode_tasks,
    fingerprint,
    named_arrays,
    reachable,
    superlink_address,
    tensor_array,
)
from dpfl.sim.algorithms.base import Messages
from dpfl.sim.algorithms.tasks import Message as DpflMessage
from dpfl.sim.callbacks import Callback, FitState
from dpfl.sim.loop import Trainer
from dpfl.sim.rounds import RoundPlan, RoundReport

__all__ = [
    "EXIT_SUPERLINK_LOST",
    "SUMMARY",
    "DpflStrategy",
    "build_trainer",
    "server_app",
]

log = logging.getLogger("dpfl.flower")

#: What the run folder gets besides the runner's files: how the run went.
SUMMARY = "flower.json"
#: The ServerApp's exit status when its SuperLink is gone (BSD's EX_TEMPFAIL:
#: try again later, e.g. with ``dpfl resume``).
EXIT_SUPERLINK_LOST = 75


def build_trainer(
    config: RunConfig, *, ledger_path: bool = True, noise_key: bytes | None = None
) -> tuple[RunConfig, Trainer]:
    """The trainer ``dpfl train`` builds for ``config`` (resolved: σ set).

    Assembled as ``dpfl train`` assembles it (:mod:`dpfl.experiments.build`:
    data set, σ calibration and checks, algorithm, ledger), so the Flower
    server holds exactly the simulator's sampler, privatizer and ledger.

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
    prepared = build.prepare(config)
    config = prepared.config
    if ledger_path:
        # a new run: its own key, identity, ledger, config.yaml and run.json
        started = runfolder.start_run(config, config.run_dir, prepared.dataset)
        ledger, noise = started.ledger, started.noise
    else:
        ledger, noise = build_ledger(config), build.RunNoise.of(config, noise_key)
    trainer = build.build_trainer(
        config, prepared.algorithm, ledger, noise, execution=config.execution
    )
    return config, trainer


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
        self.config_text = config_text(self.config)
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
            content = encode_tasks(
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
            got.update(decode_messages(reply.content))
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
        weights = tensor_array(self.trainer.algorithm.weights)
        return ArrayRecord(named_arrays({"weights": weights}))

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
        address = superlink_address(grid)
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
            given = array_of(initial_arrays, "weights")
            if not np.array_equal(given, tensor_array(trainer.algorithm.weights)):
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
        run = fit_run(
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
            if reachable(address):
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
            "config_fingerprint": fingerprint(self.config_text),
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
