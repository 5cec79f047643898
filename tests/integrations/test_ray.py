"""The Ray executor gives the in-process run: on 1 and 2 workers, through a killed
worker, through a lost driver, and (integration) across two Ray nodes.

The default run shares one local Ray instance (2 CPUs, on 127.0.0.1) for the
module; the workers reserve fractions of a CPU so that the module's executors
fit it at once. The multi-node test (``-m integration``) starts a head node
and a second node as separate processes and drives them from separate
processes, so it never meets the module's instance.

Every algorithm of the contract (``contract_cases.SPECS``) is checked: the
same ledger exactly, the same weights to the tolerance SPECS states.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")

from contract_cases import (  # noqa: E402
    KEY,
    NAMES,
    ROUNDS,
    SPECS,
    contract_algorithm,
    contract_trainer,
    ledger_json,
)
from dpfl.accounting.ledger import PrivacyLedger  # noqa: E402
from dpfl.errors import DpflError, InvalidParameterError  # noqa: E402
from dpfl.experiments import config_from_dict, resume, run  # noqa: E402
from dpfl.integrations.ray import (  # noqa: E402
    RayExecutor,
    RayWorker,
    import_ray,
    start_local,
)
from dpfl.sim.loop import Trainer  # noqa: E402
from tiny_runs import run_key, user_code  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
TESTS = ROOT / "tests"


def key_hex(run_dir: Path) -> str:
    """The secret noise key of ``run_dir``, in hex (for a driver process).

    Two runs are the same run only under the same key (secure noise).
    """
    from dpfl.sim.keys import KEY_FILE, read_key_file

    return read_key_file(run_dir / KEY_FILE).hex()


def _env(**extra: str) -> dict[str, str]:
    """This process's environment, with this checkout's dpfl first on the path."""
    path = os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), path) if p)
    return env


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (2 CPUs, 127.0.0.1); its GCS address."""
    temp = tempfile.mkdtemp(prefix="dpfl-ray-")  # short: Ray's socket paths
    start_local(num_cpus=2, object_store_memory=200 * 2**20, temp_dir=temp)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def executors(local_ray):
    """Executors of 1 and 2 workers, reused by every algorithm (1.5 CPUs)."""
    made = {n: RayExecutor(num_workers=n, num_cpus_per_worker=0.5) for n in (1, 2)}
    try:
        yield made
    finally:
        for ex in made.values():
            ex.close()


def _same_run(remote, local, name):
    torch.testing.assert_close(
        remote.algorithm.weights, local.algorithm.weights, atol=SPECS[name][3], rtol=0
    )
    assert ledger_json(remote) == ledger_json(local)


# -- the in-process run -------------------------------------------------------------
@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", NAMES)
def test_ray_gives_the_in_process_run(name, workers, executors):
    executor = executors[workers]
    local = contract_trainer(name)
    remote = Trainer(
        contract_algorithm(name),
        ledger=PrivacyLedger(None),
        seed=7,
        execution=executor,
        noise_key=KEY,
    )
    local.run(ROUNDS)
    remote.run(ROUNDS)
    _same_run(remote, local, name)
    assert len(executor.node_ids()) == workers
    assert {w.node_ip for w in executor.workers()} == {"127.0.0.1"}


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_workers_rebuild_their_replica_for_another_algorithm(executors):
    # Two runs of one algorithm that differ only in sigma (a blueprint fact,
    # not a task fact), interleaved round by round on the same workers: each
    # equals its own in-process run only if the workers switch replicas.
    name = "dp-fedavg"
    ex = executors[2]
    runs = {
        sigma: (
            contract_trainer(name, sigma=sigma),
            Trainer(
                contract_algorithm(name, sigma),
                ledger=PrivacyLedger(None),
                seed=7,
                execution=ex,
                noise_key=KEY,
            ),
        )
        for sigma in (1.0, 3.0)
    }
    for _ in range(ROUNDS):
        for local, remote in runs.values():
            local.step()
            remote.step()
    for local, remote in runs.values():
        _same_run(remote, local, name)


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_the_local_instance_listens_on_loopback_only(local_ray):
    assert local_ray.startswith("127.0.0.1:")
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}


# -- faults ---------------------------------------------------------------------------
SLOW = 1.0  # seconds a share of rounds 1 and 2 takes, so that a kill lands inside it


def _slow_executor(*, suicide=False, **options):
    """2 workers that take SLOW seconds over their shares of rounds 1 and 2.

    ``suicide``: instead, each kills its own process (SIGKILL) in round 1.
    Classes made here are pickled by value, so the workers need not import
    this test module.
    """

    class SlowWorker(RayWorker):
        def client_steps(self, key, blueprint, weights, tasks, streams):
            if suicide and streams.round_index == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if streams.round_index in (1, 2):
                time.sleep(SLOW)
            return super().client_steps(key, blueprint, weights, tasks, streams)

    class SlowExecutor(RayExecutor):
        worker_class = SlowWorker

    return SlowExecutor(num_workers=2, num_cpus_per_worker=0.25, **options)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.slow  # .ci/run runs it (-m slow)
def test_a_worker_killed_mid_round_is_replaced_and_nothing_is_charged_twice(
    local_ray,
):
    # Worker 1's process is killed inside its share in round 1 (Ray restarts
    # it and re-runs the call: max_restarts=1) and again in round 2 (Ray has
    # no restart left: the executor starts a fresh worker and re-runs the
    # share). Either way the share draws the same streams again, and the
    # trainer charges each round once, after its server step.
    name = "prifedsync"  # client state travels, noise is drawn per client
    local = contract_trainer(name)
    local.run(ROUNDS + 1)
    records = _Records()
    logger = logging.getLogger("dpfl.integrations.ray")
    logger.addHandler(records)
    try:
        with _slow_executor(max_restarts=1, max_replacements=1) as ex:
            remote = Trainer(
                contract_algorithm(name),
                ledger=PrivacyLedger(None),
                seed=7,
                execution=ex,
                noise_key=KEY,
            )
            remote.step()
            pids = [ex.workers()[1].pid]
            for r in (1, 2):
                killer = threading.Timer(0.3, os.kill, (pids[-1], signal.SIGKILL))
                t0 = time.monotonic()
                killer.start()
                remote.step()
                took = time.monotonic() - t0
                killer.join()
                assert took >= 0.3 + SLOW  # the share ran again after the kill
                pids.append(ex.workers()[1].pid)
                replaced = [m for m in records.messages if "replacing it" in m]
                assert len(replaced) == r - 1, records.messages  # round 2 only
            remote.step()
            actors = list(ex._actors)
    finally:
        logger.removeHandler(records)
    assert len(set(pids)) == 3  # two new processes
    assert "worker 1 died in round 2" in replaced[0]
    assert remote.round == remote.ledger.rounds == ROUNDS + 1
    _same_run(remote, local, name)
    for actor in actors:  # close() killed them
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.info.remote(), timeout=30)


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_a_share_that_keeps_failing_raises_a_clear_error(local_ray):
    with _slow_executor(suicide=True, max_restarts=0, max_replacements=0) as ex:
        remote = Trainer(
            contract_algorithm("prifedsync"),
            ledger=PrivacyLedger(None),
            seed=7,
            execution=ex,
            noise_key=KEY,
        )
        remote.step()
        before = remote.algorithm.weights.clone()
        with pytest.raises(
            DpflError, match=r"round 1: Ray worker \d \(tasks \d+:\d+\)"
        ):
            remote.step()
    # the round was not applied, nor charged
    assert remote.round == remote.ledger.rounds == 1
    assert torch.equal(remote.algorithm.weights, before)


# -- a lost driver ---------------------------------------------------------------------
def _run_tree(tmp_path, name, execution, **ray_section):
    params, sigma, model, _ = SPECS["prifedsync"]
    return {
        "name": name,
        "seed": 3,
        "rounds": 5,
        "output_dir": str(tmp_path / "runs"),
        "eval_every": 5,
        "checkpoint_every": 1,
        "data": {"num_clients": 12, "records_per_client": 20},
        "model": {"name": model},
        "algorithm": {"name": "prifedsync", "params": params},
        "privacy": {"epsilon": 50.0, "delta": 1e-5, "noise_multiplier": sigma},
        "execution": execution,
        "ray": ray_section,
    }


# The driver: the runner on the module's Ray instance, stalled in round STALL
# once its shares are in flight (then the test kills it).
_DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from dpfl.experiments import config_from_dict, run
    from dpfl.integrations import ray as dray

    tree, stall, flag = json.loads(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    # the uninterrupted run's key (a test's comparison; a run makes its own)
    from dpfl.sim import secure_noise
    from dpfl.sim import keys
    keys.new_key = lambda: bytes.fromhex(sys.argv[4])
    gather = dray.RayExecutor._gather

    def stalled(self, ray, jobs, weights_ref, round_index, *rest):
        if round_index == stall:
            refs = [self._submit(i, job, weights_ref) for i, job in enumerate(jobs)]
            flag.write_text(str(len(refs)))
            time.sleep(600)
        return gather(self, ray, jobs, weights_ref, round_index, *rest)

    dray.RayExecutor._gather = stalled
    run(config_from_dict(tree), progress=False)
    """
)


@pytest.mark.slow  # .ci/run runs it (-m slow)
def test_a_lost_driver_resumes_to_the_uninterrupted_run(local_ray, tmp_path):
    stall = 3
    whole = run(
        config_from_dict(_run_tree(tmp_path, "whole", "batched")), progress=False
    )
    tree = _run_tree(
        tmp_path,
        "lost",
        "ray",
        address=local_ray,
        num_workers=2,
        num_cpus_per_worker=0.25,
    )
    flag = tmp_path / "in-round"
    key = key_hex(whole.run_dir)
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, json.dumps(tree), str(stall), str(flag), key],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not flag.exists() and driver.poll() is None:
            assert time.monotonic() < deadline, "the driver never reached its stall"
            time.sleep(0.1)
    finally:
        driver.kill()  # SIGKILL: no handler, no checkpoint on the way out
        out = driver.communicate(timeout=30)[0]
    assert flag.exists(), out
    run_dir = tmp_path / "runs" / "lost"
    assert PrivacyLedger.load(run_dir / "ledger.json").rounds == stall
    # Resume in this process, on the module's instance, with one worker.
    done = resume(run_dir, progress=False, overrides=["ray.num_workers=1"])
    assert done.stopped == "completed" and done.rounds_completed == 5
    mine = PrivacyLedger.load(run_dir / "ledger.json").to_json()["entries"]
    want = PrivacyLedger.load(whole.run_dir / "ledger.json").to_json()["entries"]
    assert mine == want
    got = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    ref = torch.load(whole.run_dir / "checkpoint.pt", weights_only=True)
    for k, v in ref["trainer"]["algorithm"]["model"].items():
        torch.testing.assert_close(
            got["trainer"]["algorithm"]["model"][k],
            v,
            atol=SPECS["prifedsync"][3],
            rtol=0,
        )


# -- errors and boundaries -------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_workers": 0}, "num_workers must be >= 1; got 0"),
        ({"num_cpus_per_worker": 0}, "num_cpus_per_worker must be > 0"),
        ({"num_gpus_per_worker": -1}, "num_gpus_per_worker must be >= 0"),
        ({"address": ""}, "address must be None"),
        ({"timeout": 0}, "timeout must be > 0"),
        ({"max_restarts": -1}, "max_restarts must be >= 0"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(InvalidParameterError, match=message):
        RayExecutor(**kwargs)


def test_missing_ray_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(DpflError, match=r"pip install 'dpfl\[ray\]'"):
        import_ray()


def test_simulation_and_accounting_never_import_ray():
    code = (
        "import sys\n"
        "import dpfl.accounting, dpfl.sim.loop, dpfl.experiments.config\n"
        "import dpfl.experiments.runner, dpfl.integrations.ray\n"
        "from dpfl.sim.executors import executor\n"
        "executor('ray')\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], env=_env(), check=True, timeout=120)


def test_no_tasks_and_foreign_streams_start_nothing():
    ex = RayExecutor()
    alg = contract_algorithm("fedavg")
    out = ex.run(alg, alg.weights, [], [])
    assert out.vectors.shape[0] == 0
    with pytest.raises(InvalidParameterError, match="CohortStreams"):
        ex.run(alg, alg.weights, [object()], [object()])
    assert ex.workers() == []


def test_an_address_where_nothing_listens_fails_at_once(monkeypatch):
    # (Ray itself would retry for minutes.) As if Ray were not yet initialised
    # here, so that the executor connects.
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    t0 = time.monotonic()
    with pytest.raises(DpflError, match="no Ray cluster answers at '127.0.0.1:"):
        RayExecutor(f"127.0.0.1:{_free_port()}").start(contract_algorithm("fedavg"))
    assert time.monotonic() - t0 < 30


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_workers_that_cannot_be_placed_fail_clearly(local_ray):
    ex = RayExecutor(num_workers=1, num_cpus_per_worker=64, startup_timeout=2)
    with pytest.raises(DpflError, match="did not start within 2 s"):
        ex.start(contract_algorithm("fedavg"))
    ex.close()


# -- two nodes -------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# `ray start`, keeping the node on 127.0.0.1: Ray swaps a loopback node address
# for the machine's routable one (and then listens on every interface) unless
# told otherwise; a worker node cannot be told through the environment.
_RAY_START = textwrap.dedent(
    """
    import sys
    from ray._private import services
    services.resolve_ip_for_localhost = lambda host: host
    from ray.scripts.scripts import main
    sys.argv = ["ray", *sys.argv[1:]]
    main()
    """
)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _stop(proc: subprocess.Popen, wait: float = 20.0) -> None:
    """SIGTERM the process group of ``proc``; SIGKILL what is left after ``wait``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not _group_alive(proc.pid):
            break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent
        pass


# A driver in its own process: every contract algorithm over the cluster, and
# where the workers ran.
_CLUSTER_DRIVER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[3])
    import ray
    import contract_cases as tc
    from dpfl.accounting.ledger import PrivacyLedger
    from dpfl.integrations.ray import RayExecutor
    from dpfl.sim.loop import Trainer

    address, out = sys.argv[1], sys.argv[2]
    result = {}
    with RayExecutor(address, num_workers=2, startup_timeout=60) as ex:
        for name in tc.NAMES:
            trainer = Trainer(
                tc.contract_algorithm(name),
                ledger=PrivacyLedger(None),
                seed=7,
                execution=ex,
                noise_key=tc.KEY,
            )
            trainer.run(tc.ROUNDS)
            result[name] = {
                "weights": trainer.algorithm.weights.tolist(),
                "ledger": tc.ledger_json(trainer),
            }
        result["_workers"] = ex.node_ids()
        alive = [n for n in ray.nodes() if n["Alive"]]
        result["_nodes"] = [n["NodeID"] for n in alive]
        result["_ips"] = [n["NodeManagerAddress"] for n in alive]
    with open(out, "w") as fh:
        json.dump(result, fh)
    """
)


@pytest.mark.integration
def test_a_run_over_two_ray_nodes_equals_the_in_process_run(tmp_path):
    temp = tempfile.mkdtemp(prefix="dpfl-rn-")  # short: Ray's socket paths
    port = _free_port()
    address = f"127.0.0.1:{port}"
    common = ["--block", "--node-ip-address=127.0.0.1", "--num-cpus=1"]
    common += ["--disable-usage-stats", f"--temp-dir={temp}"]
    nodes: list[subprocess.Popen] = []
    logs = [open(tmp_path / f"node{i}.log", "w") for i in range(2)]
    try:
        for i, role in enumerate(
            [
                [
                    "--head",
                    f"--port={port}",
                    "--include-dashboard=false",
                    f"--ray-client-server-port={_free_port()}",
                ],
                [f"--address={address}"],
            ]
        ):
            argv = ["start", *role, *common]
            argv.append(f"--dashboard-agent-listen-port={_free_port()}")
            nodes.append(
                subprocess.Popen(
                    [sys.executable, "-c", _RAY_START, *argv],
                    env=_env(),
                    stdout=logs[i],
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            if i == 0:
                time.sleep(3)  # the head's GCS first
        # A driver script: every algorithm, and where its workers ran.
        out = tmp_path / "cluster.json"
        subprocess.run(
            [sys.executable, "-c", _CLUSTER_DRIVER, address, str(out), str(TESTS)],
            env=_env(),
            check=True,
            timeout=150,
        )
        result = json.loads(out.read_text())
        assert len(set(result["_nodes"])) == 2
        assert result["_ips"] == ["127.0.0.1", "127.0.0.1"]  # loopback only
        assert sorted(result["_workers"]) == sorted(result["_nodes"])  # one each
        for name in NAMES:
            local = contract_trainer(name)
            local.run(ROUNDS)
            torch.testing.assert_close(
                torch.tensor(result[name]["weights"]),
                local.algorithm.weights,
                atol=SPECS[name][3],
                rtol=0,
            )
            want = json.loads(json.dumps(ledger_json(local)))
            assert result[name]["ledger"] == want, name
        # The command line on the same cluster gives the in-process run.
        runs = tmp_path / "runs"
        tree = _run_tree(tmp_path, "cli", "batched")
        config = tmp_path / "run.yaml"
        config.write_text(json.dumps(tree))  # JSON is YAML
        cli = subprocess.run(
            [sys.executable, "-m", "dpfl.cli", "train", str(config), "--no-progress"]
            + ["--set", "execution=ray", "--set", f"ray.address={address}"]
            + ["--set", "ray.num_workers=2"],
            env=_env(),
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert cli.returncode == 0, cli.stderr
        assert "2 workers ready on 2 node(s)" in cli.stderr
        with run_key(runs / "cli"):
            whole = run(
                config_from_dict(_run_tree(tmp_path, "whole", "batched")),
                progress=False,
            )
        mine = PrivacyLedger.load(runs / "cli" / "ledger.json").to_json()["entries"]
        want = PrivacyLedger.load(whole.run_dir / "ledger.json").to_json()["entries"]
        assert mine == want
    finally:
        for proc in reversed(nodes):
            _stop(proc)
        for fh in logs:
            fh.close()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.integration
def test_a_model_and_loss_of_the_users_code_run_on_ray_workers(tmp_path, monkeypatch):
    # `dpfl train` with execution: ray, its model and loss from a module of the
    # user's (on PYTHONPATH, which the local instance's workers inherit): the
    # workers import it, check its file against the driver's, and the run is
    # the in-process run
    mod = user_code(tmp_path / "code", monkeypatch)
    tree = _run_tree(tmp_path, "ray", "batched")
    tree.update(
        rounds=2,
        eval_every=2,
        model={"factory": f"{mod}:make_model", "options": {"hidden": 6}},
        loss={"factory": f"{mod}:make_loss", "options": {"smoothing": 0.1}},
        algorithm={
            "name": "dsgd-rp",
            "params": {
                "participation_probability": 0.5,
                "record_probability": 0.5,
                "learning_rate": 0.5,
            },
        },
    )
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps(tree))  # JSON is YAML
    cli = subprocess.run(
        [sys.executable, "-m", "dpfl.cli", "train", str(config), "--no-progress"]
        + ["--set", "execution=ray", "--set", "ray.num_workers=2"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert cli.returncode == 0, cli.stderr
    assert "2 workers ready" in cli.stderr
    runs = tmp_path / "runs"
    with run_key(runs / "ray"):
        whole = run(config_from_dict({**tree, "name": "whole"}), progress=False)
    # the same rounds charged, entry by entry, but for the hash chain, which
    # covers each round's model digest: two shares sum the cohort's updates
    # in another order than one batch, so the models agree to float rounding
    mine, want = (
        [
            {k: v for k, v in e.items() if k != "chain"}
            for e in PrivacyLedger.load(d / "ledger.json").to_json()["entries"]
        ]
        for d in (runs / "ray", whole.run_dir)
    )
    assert mine == want and len(mine) == 2
    a = torch.load(runs / "ray" / "checkpoint.pt", weights_only=True)
    b = torch.load(whole.run_dir / "checkpoint.pt", weights_only=True)
    for k, v in b["trainer"]["algorithm"]["model"].items():
        torch.testing.assert_close(
            a["trainer"]["algorithm"]["model"][k], v, atol=1e-5, rtol=0
        )
