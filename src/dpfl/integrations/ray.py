"""Run a round's client steps on Ray actors: ``execution: ray``.

:class:`RayExecutor` is an executor (:mod:`dpfl.sim.executors`) whose client
steps run on Ray actors, on this machine or across a cluster, while the
server step, the ledger and the checkpoints stay with the driver (the
:class:`~dpfl.sim.loop.Trainer`). It gives the same run as the in-process
executor for the same seed: the same ledger exactly and the same weights to
float rounding.

How a round runs:

* each worker (a Ray actor) builds a replica of the algorithm from its
  :meth:`~dpfl.sim.algorithms.base.FederatedAlgorithm.blueprint` once, the
  first time it serves that algorithm; the blueprint travels once, through
  the object store (``ray.put``), with the modules of the user's code it
  names (a ``model.factory``'s module, say) and their files' SHA-256: a
  worker imports each from its own environment and refuses one it cannot
  import or whose file differs from the driver's
  (:func:`~dpfl.integrations.ray_worker.check_code`);
* the driver puts the round's weights in the object store once, cuts the
  cohort into consecutive shares (:func:`~dpfl.sim.executors.shares`) and
  sends each worker its share's tasks and the *keys* of its share's random
  streams (:meth:`~dpfl.sim.randomness.CohortStreams.part`; with secure
  noise, its clients' derived keys of the round, never the run's key): every
  client's randomness is keyed by (round, client), so any split, and any
  recomputation, draws the same numbers;
* the driver gathers the shares in task order
  (:meth:`~dpfl.sim.algorithms.base.Messages.concat`) and moves them to the
  algorithm's device; the trainer then runs the server step and charges the
  ledger.

Faults. A worker that dies during a round (its process killed, its node
lost) is restarted by Ray (``max_restarts``) and its share is re-run
(``max_task_retries``) with the same streams; when Ray gives up, the executor
replaces the actor itself and re-runs the share. The ledger is charged only
after the server step, which needs every share, so a recomputed share is
charged once and released once. A lost *driver* is recovered with
``dpfl resume`` from the run's checkpoint and ledger.

Ray is an optional extra (``pip install 'dpfl[ray]'``), imported only when an
executor starts; this module imports without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
import uuid
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dpfl._validate import check_count, check_nonnegative, check_positive
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.integrations.ray_worker import (
    RayWorker,
    WireArray,
    actor_class,
    code_of,
    unwire_messages,
    wire_task,
)
from dpfl.sim.executors import shares

if TYPE_CHECKING:
    import torch

    from dpfl.sim.algorithms.base import FederatedAlgorithm, Messages
    from dpfl.sim.algorithms.tasks import Task
    from dpfl.sim.randomness import Streams

__all__ = [
    "DEFAULT_OBJECT_STORE_MEMORY",
    "INSTALL_HINT",
    "RayExecutor",
    "RayWorkerInfo",
    "import_ray",
    "start_local",
]

log = logging.getLogger("dpfl.integrations.ray")

#: How to install what this module needs.
INSTALL_HINT = "pip install 'dpfl[ray]'"
#: Object store of a local instance (bytes): room for a blueprint (model and
#: data) and a few rounds of weights and messages; Ray spills to disk beyond.
DEFAULT_OBJECT_STORE_MEMORY = 512 * 2**20
# Ray reads this once, when ``ray._private.ray_constants`` is imported: "0"
# keeps a node on the loopback address (see _loopback).
_CLUSTER_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def import_ray() -> Any:
    """Import Ray, or say how to install it.

    Returns
    -------
    module
        The ``ray`` module.

    Raises
    ------
    dpfl.errors.DpflError
        If Ray is not installed (the message names ``pip install 'dpfl[ray]'``).
    """
    try:
        import ray
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        raise DpflError(
            f"execution 'ray' needs Ray, which is not installed: {INSTALL_HINT}"
        ) from None
    return ray


@contextlib.contextmanager
def _loopback() -> Iterator[None]:
    """Keep what ``ray.init`` starts or dials on 127.0.0.1.

    Ray replaces a loopback node address with the machine's routable one (and
    then listens on every interface) unless clusters are switched off
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when Ray is imported).
    Switched off for the ``ray.init`` call only, in this process (the
    constant) and in the processes it starts (the environment they inherit);
    a later connection to another cluster is unaffected.
    """
    try:
        from ray._private import ray_constants
    except ImportError:  # pragma: no cover - another Ray layout: Ray decides
        yield
        return
    saved_flag = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    saved_env = os.environ.get(_CLUSTER_VAR)
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ[_CLUSTER_VAR] = "0"
    try:
        yield
    finally:
        if saved_flag is not None:
            ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(_CLUSTER_VAR, None)
        else:
            os.environ[_CLUSTER_VAR] = saved_env


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail fast when nothing listens at ``host:port`` (Ray would retry for minutes)."""
    import socket

    host, sep, port = address.rpartition(":")
    if (
        not sep
        or not (port.isascii() and port.isdigit())
        or address.startswith("ray://")
    ):
        return  # "auto", or an address Ray parses itself
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise DpflError(
            f"no Ray cluster answers at {address!r} ({exc}); start its head with "
            "`ray start --head --port=PORT`, or check ray.address"
        ) from None


def _is_loopback(address: str) -> bool:
    """Whether ``address`` (``host:port``) names this machine's loopback."""
    host = address.rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def start_local(
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    object_store_memory: int = DEFAULT_OBJECT_STORE_MEMORY,
    temp_dir: str | os.PathLike[str] | None = None,
    **init_options: Any,
) -> None:
    """Start a private Ray instance in this process, on 127.0.0.1 only.

    No dashboard, usage statistics off (unless ``RAY_USAGE_STATS_ENABLED`` is
    set), a modest object store. :class:`RayExecutor` calls it when it has no
    ``address``; call it yourself to share one instance between executors.
    Stop it with ``ray.shutdown()``.

    Parameters
    ----------
    num_cpus, num_gpus : int or None
        Resources of the instance (``None``: what Ray detects).
    object_store_memory : int
        Object store size in bytes (>= 80 MiB).
    temp_dir : path or None
        Ray's session folder (default: Ray's, ``/tmp/ray``).
    **init_options
        Further keyword arguments of ``ray.init``.

    Raises
    ------
    dpfl.errors.DpflError
        If Ray is not installed or is already initialised in this process.
    dpfl.errors.InvalidParameterError
        On a bad argument.
    """
    ray = import_ray()
    if num_cpus is not None:
        num_cpus = check_count("num_cpus", num_cpus, minimum=1)
    if num_gpus is not None:
        num_gpus = check_count("num_gpus", num_gpus, minimum=0)
    object_store_memory = check_count(
        "object_store_memory", object_store_memory, minimum=80 * 2**20
    )
    if ray.is_initialized():
        raise DpflError("Ray is already initialised in this process")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, Any] = {
        "address": "local",
        "num_cpus": num_cpus,
        "num_gpus": num_gpus,
        "object_store_memory": object_store_memory,
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "_node_ip_address": "127.0.0.1",
    }
    if temp_dir is not None:
        kwargs["_temp_dir"] = os.fspath(temp_dir)
    kwargs.update(init_options)
    with _loopback(), warnings.catch_warnings():
        # Ray 2.x announces a future change of how zero-GPU workers see GPUs.
        warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
        ray.init(**kwargs)


@dataclasses.dataclass(frozen=True)
class RayWorkerInfo:
    """Where one worker runs and what it has used.

    Attributes
    ----------
    index : int
        The worker's place (share ``index`` of every round goes to it).
    node_id : str
        The Ray node it runs on.
    node_ip : str
        That node's address.
    pid : int
        Its process id on that node.
    device : str
        The torch device of its replica.
    peak_rss_bytes : int
        Peak resident memory of its process so far.
    """

    index: int
    node_id: str
    node_ip: str
    pid: int
    device: str
    peak_rss_bytes: int


# -- the executor ------------------------------------------------------------------
class RayExecutor:
    """Client steps on Ray actors; the server step stays with the driver.

    Parameters
    ----------
    address : str or None
        ``None`` (default): start a private local instance on 127.0.0.1
        (:func:`start_local`; stopped by :meth:`close`). ``"auto"``: the
        cluster this machine belongs to (``ray start`` ran here).
        ``"host:port"``: the cluster whose head listens there. When Ray is
        already initialised in this process, that instance is used.
    num_workers : int
        Actors, each serving one consecutive share of every cohort (>= 1).
    num_cpus_per_worker : float
        CPUs each actor reserves (> 0); its torch uses as many threads (at
        least one).
    num_gpus_per_worker : float
        GPUs each actor reserves (>= 0); above 0 its replica runs on CUDA.
    max_restarts : int
        How often Ray restarts a dead worker over its life and re-runs its
        call (>= 0; Ray's ``max_restarts`` and ``max_task_retries``).
    max_replacements : int
        When Ray gives up on a worker (restarts spent, or 0), how often per
        round the executor starts a fresh one in its place and re-runs the
        share (>= 0) before it raises.
    timeout : float or None
        Seconds a round's shares may take (``None``: no limit).
    startup_timeout : float
        Seconds to wait for the actors to start (they wait for resources).
    object_store_memory : int
        Object store of a local instance (bytes; ignored when connecting).
    init_options : mapping or None
        Further keyword arguments of ``ray.init`` (e.g. ``runtime_env``).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a bad argument (the message names it, its constraint and value).

    Examples
    --------
    >>> # with RayExecutor(num_workers=2) as ex:
    >>> #     Trainer(algorithm, ledger=ledger, seed=0, execution=ex).run(100)
    """

    name = "ray"
    #: The actors' class (a subclass may instrument ``client_steps``).
    worker_class: type = RayWorker

    def __init__(
        self,
        address: str | None = None,
        num_workers: int = 1,
        num_cpus_per_worker: float = 1.0,
        num_gpus_per_worker: float = 0.0,
        *,
        max_restarts: int = 3,
        max_replacements: int = 3,
        timeout: float | None = None,
        startup_timeout: float = 300.0,
        object_store_memory: int = DEFAULT_OBJECT_STORE_MEMORY,
        init_options: Mapping[str, Any] | None = None,
    ) -> None:
        if address is not None and (not isinstance(address, str) or not address):
            raise InvalidParameterError(
                "address must be None (a local instance), 'auto' or 'host:port'; "
                f"got {address!r}"
            )
        self.address = address
        self.num_workers = check_count("num_workers", num_workers, minimum=1)
        self.num_cpus_per_worker = check_positive(
            "num_cpus_per_worker", num_cpus_per_worker
        )
        self.num_gpus_per_worker = check_nonnegative(
            "num_gpus_per_worker", num_gpus_per_worker
        )
        self.max_restarts = check_count("max_restarts", max_restarts, minimum=0)
        self.max_replacements = check_count(
            "max_replacements", max_replacements, minimum=0
        )
        self.timeout = None if timeout is None else check_positive("timeout", timeout)
        self.startup_timeout = check_positive("startup_timeout", startup_timeout)
        self.object_store_memory = check_count(
            "object_store_memory", object_store_memory, minimum=80 * 2**20
        )
        if init_options is not None and not isinstance(init_options, Mapping):
            raise InvalidParameterError(
                f"init_options must be a mapping; got {init_options!r}"
            )
        self.init_options = dict(init_options or {})
        self.device = "cuda" if self.num_gpus_per_worker > 0 else "cpu"
        self._owns_ray = False
        self._actors: list[Any] = []
        self._algorithm: weakref.ref[FederatedAlgorithm] | None = None
        self._key = ""
        self._blueprint: list[Any] = []
        #: Seconds the last :meth:`run` spent on each phase, for monitoring:
        #: ``put`` (the weights into the object store), ``submit`` (tasks made
        #: portable and sent), ``wait`` (until the last share was ready: the
        #: workers' compute and transfers), ``get`` (results fetched and
        #: unpickled), ``join`` (shares joined, moved to the device), ``total``.
        self.last_timings: dict[str, float] = {}

    # -- life cycle ----------------------------------------------------------------
    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        """Return the settings."""
        return (
            f"RayExecutor(address={self.address!r}, num_workers={self.num_workers}, "
            f"num_cpus_per_worker={self.num_cpus_per_worker:g}, "
            f"num_gpus_per_worker={self.num_gpus_per_worker:g})"
        )

    def _connect(self) -> Any:
        ray = import_ray()
        if ray.is_initialized():
            if not self._actors:
                log.info("Ray: using the instance already running in this process")
            return ray
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if self.address is None:
            need = math.ceil(self.num_workers * self.num_cpus_per_worker)
            cpus = max(os.cpu_count() or 1, need)
            log.info("Ray: starting a local instance on 127.0.0.1 (%d CPUs)", cpus)
            start_local(
                num_cpus=cpus,
                object_store_memory=self.object_store_memory,
                **self.init_options,
            )
        else:
            log.info("Ray: connecting to the cluster at %s", self.address)
            _check_reachable(self.address)
            # A loopback address is taken as given (Ray would swap in the
            # routable address, where a loopback-bound cluster does not listen).
            here = (
                _loopback() if _is_loopback(self.address) else contextlib.nullcontext()
            )
            try:
                with here, warnings.catch_warnings():
                    warnings.filterwarnings(
                        "ignore", category=FutureWarning, module="ray"
                    )
                    ray.init(
                        address=self.address,
                        logging_level=logging.WARNING,
                        **self.init_options,
                    )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise DpflError(
                    f"could not connect to the Ray cluster at {self.address!r}: {exc}"
                ) from None
        self._owns_ray = True
        return ray

    def _new_actor(self, ray: Any) -> Any:
        return (
            actor_class(ray, self.worker_class)
            .options(
                num_cpus=self.num_cpus_per_worker,
                num_gpus=self.num_gpus_per_worker,
                max_restarts=self.max_restarts,
                max_task_retries=self.max_restarts,
                scheduling_strategy="SPREAD",
            )
            .remote(self.device, max(1, int(self.num_cpus_per_worker)))
        )

    def _start_actors(self, ray: Any) -> None:
        need = {
            "CPU": self.num_workers * self.num_cpus_per_worker,
            "GPU": self.num_workers * self.num_gpus_per_worker,
        }
        have = ray.cluster_resources()
        short = {k: v for k, v in need.items() if v > have.get(k, 0.0)}
        if short:
            log.warning(
                "Ray: %d workers need %s but the cluster has %s; waiting up to "
                "%.0f s for it to grow",
                self.num_workers,
                need,
                {k: have.get(k, 0.0) for k in need},
                self.startup_timeout,
            )
        t0 = time.monotonic()
        self._actors = [self._new_actor(ray) for _ in range(self.num_workers)]
        try:
            infos = ray.get(
                [a.info.remote() for a in self._actors], timeout=self.startup_timeout
            )
        except ray.exceptions.GetTimeoutError:
            self._kill_actors(ray)
            raise DpflError(
                f"{self.num_workers} Ray workers ({self.num_cpus_per_worker:g} CPU, "
                f"{self.num_gpus_per_worker:g} GPU each) did not start within "
                f"{self.startup_timeout:g} s; the cluster has "
                f"{ray.available_resources()} available: lower ray.num_workers or "
                "the resources per worker, or add nodes"
            ) from None
        except ray.exceptions.RayError as exc:
            self._kill_actors(ray)
            raise DpflError(
                f"Ray workers could not start: {exc}; every node needs dpfl and "
                f"torch installed ({INSTALL_HINT})"
            ) from None
        nodes = {i["node_id"] for i in infos}
        log.info(
            "Ray: %d worker%s ready on %d node(s) in %.1f s",
            len(infos),
            "" if len(infos) == 1 else "s",
            len(nodes),
            time.monotonic() - t0,
        )

    def _kill_actors(self, ray: Any) -> None:
        for actor in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self._actors = []

    def start(self, algorithm: FederatedAlgorithm) -> None:
        """Start Ray and the workers (if not yet), and hand them ``algorithm``.

        :meth:`run` does this itself; call it to pay the start-up before the
        first round. Workers build their replica of a new algorithm on the
        first call that names it; the blueprint is put in the object store
        once per algorithm.

        Raises
        ------
        dpfl.errors.DpflError
            If Ray is missing, the cluster cannot be reached, or the workers
            do not start.
        """
        ray = self._connect()
        if not self._actors:
            self._start_actors(ray)
        if self._algorithm is None or self._algorithm() is not algorithm:
            # the blueprint, and the user's modules it names (a worker imports
            # and checks them before unpickling it)
            self._blueprint = [ray.put(algorithm.blueprint()), code_of(algorithm)]
            self._key = uuid.uuid4().hex
            self._algorithm = weakref.ref(algorithm)
            log.info("Ray: the workers will build a replica of %s", algorithm.name)

    def close(self) -> None:
        """Kill the workers; stop Ray if this executor started or joined it."""
        ray = import_ray() if self._actors or self._owns_ray else None
        if ray is not None and ray.is_initialized():
            self._kill_actors(ray)
            self._blueprint = []
            if self._owns_ray:
                ray.shutdown()
        self._actors = []
        self._blueprint = []
        self._algorithm = None
        self._owns_ray = False

    # -- where the workers are -------------------------------------------------------
    def workers(self) -> list[RayWorkerInfo]:
        """Each worker's node, process, device and peak memory (``[]``: none yet)."""
        if not self._actors:
            return []
        ray = import_ray()
        infos = ray.get([a.info.remote() for a in self._actors], timeout=60)
        return [RayWorkerInfo(index=i, **info) for i, info in enumerate(infos)]

    def node_ids(self) -> list[str]:
        """The Ray node of each worker, in worker order."""
        return [w.node_id for w in self.workers()]

    # -- the round -------------------------------------------------------------------
    def run(
        self,
        algorithm: FederatedAlgorithm,
        weights: torch.Tensor,
        tasks: Sequence[Task],
        streams: Sequence[Streams],
    ) -> Messages:
        """The messages of ``tasks``, in task order, computed on the workers.

        Parameters
        ----------
        algorithm : FederatedAlgorithm
            The driver's algorithm (its replicas do the work).
        weights : torch.Tensor
            The global weights ``[d]``.
        tasks : sequence of Task
            The round's tasks.
        streams : CohortStreams
            The tasks' streams (:class:`~dpfl.sim.randomness.CohortStreams`:
            its keys travel, never generators).

        Returns
        -------
        Messages
            As :meth:`~dpfl.sim.algorithms.base.FederatedAlgorithm.client_steps`
            would return them, on the algorithm's device.

        Raises
        ------
        dpfl.errors.DpflError
            If a share fails after every restart and replacement, or the round
            passes ``timeout``; an error of a client step itself propagates
            (as Ray raises it: an instance of the original error class).
        """
        from dpfl.sim.algorithms.base import Messages

        if len(tasks) == 0:
            return algorithm.client_steps(weights, tasks, streams)
        if not all(hasattr(streams, a) for a in ("part", "seed", "round_index")):
            raise InvalidParameterError(
                "streams must be the round's CohortStreams (the workers remake "
                f"each client's generators from its keys); got {type(streams).__name__}"
            )
        self.start(algorithm)
        ray = import_ray()
        clock = {"start": time.perf_counter()}
        weights_ref = ray.put(WireArray(weights))
        clock["put"] = time.perf_counter()
        jobs = [
            (a, b, [wire_task(t) for t in tasks[a:b]], streams.part(a, b))  # type: ignore[attr-defined]
            for a, b in shares(len(tasks), len(self._actors))
        ]
        parts = self._gather(ray, jobs, weights_ref, streams.round_index, clock)  # type: ignore[attr-defined]
        device = algorithm.device
        out = Messages.concat([unwire_messages(p, device) for p in parts])
        clock["join"] = time.perf_counter()
        stamps = list(clock.items())
        self.last_timings = {k: t - stamps[i][1] for i, (k, t) in enumerate(stamps[1:])}
        self.last_timings["total"] = clock["join"] - clock["start"]
        return out

    def _submit(self, index: int, job: tuple[Any, ...], weights_ref: Any) -> Any:
        _, _, tasks, streams = job
        return self._actors[index].client_steps.remote(
            self._key, self._blueprint, weights_ref, tasks, streams
        )

    def _gather(
        self,
        ray: Any,
        jobs: list[tuple[Any, ...]],
        weights_ref: Any,
        round_index: int,
        clock: dict[str, float] | None = None,
    ) -> list[dict[str, Any]]:
        """Submit every share, then collect them as they finish (in task order).

        A share whose worker died is re-run on a fresh worker (see
        ``max_replacements``). ``clock`` gets the time stamps of the end of
        ``submit``, ``wait`` and ``get``, as if the driver had waited for every
        share and then unpickled them (it interleaves the two).
        """
        clock = {} if clock is None else clock
        lost = (
            ray.exceptions.RayActorError,
            ray.exceptions.WorkerCrashedError,
            ray.exceptions.ObjectLostError,
        )
        pending = {self._submit(i, job, weights_ref): i for i, job in enumerate(jobs)}
        clock["submit"] = time.perf_counter()
        fetching = 0.0  # time in ray.get: the driver unpickling the shares
        parts: list[Any] = [None] * len(jobs)
        replaced = 0
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=left)
            if not ready:
                late = sorted(pending.values())
                raise DpflError(
                    f"round {round_index}: shares {late} of {len(jobs)} did not "
                    f"finish within timeout={self.timeout:g} s (workers {late})"
                )
            i = pending.pop(ready[0])
            t0 = time.perf_counter()
            try:
                parts[i] = ray.get(ready[0])
                fetching += time.perf_counter() - t0
            except lost as exc:
                a, b = jobs[i][:2]
                if replaced >= self.max_replacements:
                    raise DpflError(
                        f"round {round_index}: Ray worker {i} (tasks {a}:{b}) failed "
                        f"after {self.max_restarts} restarts and {replaced} "
                        f"replacements this round: {type(exc).__name__}: {exc}"
                    ) from None
                replaced += 1
                log.warning(
                    "Ray: worker %d died in round %d (%s); replacing it and "
                    "recomputing tasks %d:%d with the same random streams",
                    i,
                    round_index,
                    type(exc).__name__,
                    a,
                    b,
                )
                with contextlib.suppress(Exception):
                    ray.kill(self._actors[i], no_restart=True)
                self._actors[i] = self._new_actor(ray)
                pending[self._submit(i, jobs[i], weights_ref)] = i
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, DpflError):  # a worker's refusal: its line
                    raise DpflError(str(cause)) from None
                raise
        clock["wait"] = time.perf_counter() - fetching
        clock["get"] = clock["wait"] + fetching
        return parts
