"""dpfl through Flower: the deployed run charges the simulator's ledger.

Default run (in process, no Ray, no sockets): :class:`DpflStrategy` and the
ClientApp exchange real Flower messages through a grid that calls the
ClientApp directly; ledger and model are checked against ``dpfl train``
(:func:`dpfl.experiments.runner.run`, same config and seed), and the budget
guard and the fault rule are checked.

``integration`` (real processes): the same through Flower's simulation engine
(``flwr.simulation.run_simulation``, Ray) and through a real SuperLink with
three SuperNodes and ``flwr run`` of ``examples/flower``, including a
SuperNode killed mid-round.

Model tolerance: float32. The simulator's batched executor computes the
cohort in one kernel (DP-DSGD: one clipped-gradient sum over every sampled
record), the federation one client at a time; sums taken in another order
differ by ~1e-7 relative per step, so 1e-5 after a few rounds (the contract's
loop-vs-batched tolerance). The ledger is compared exactly, entry by entry.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

import torch  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from dpfl.accounting.ledger import PrivacyLedger  # noqa: E402
from dpfl.experiments import runner  # noqa: E402
from dpfl.experiments.config import config_from_dict  # noqa: E402
from dpfl.integrations import flower as fl  # noqa: E402
from dpfl.sim.keys import KEY_FILE, read_key_file  # noqa: E402
from dpfl.sim.randomness import client_key  # noqa: E402
from tiny_runs import run_key, user_code  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
APP = ROOT / "examples" / "flower"
ATOL = 1e-5

PARAMS = {
    "dp-fedavg": dict(
        cohort_size=4, local_epochs=1, batch_size=8, learning_rate=0.1, clip=1.0
    ),
    "dsgd-rp": dict(
        participation_probability=0.5, record_probability=0.5, learning_rate=0.5
    ),
    "locks": dict(
        first_stage_probability=0.5,
        second_stage_size=3,
        norm_noise_ratio=4.0,
        local_steps=2,
        batch_size=8,
    ),
    "ms-pafl": dict(checkin_probability=0.5, local_steps=2, batch_size=8),
    "prifedsync": dict(
        sync_probability=0.5,
        batch_size=8,
        local_steps=2,
        learning_rate=0.01,
        optimizer="adam",
    ),
}
MODEL = {"locks": "logistic_regression", "ms-pafl": "logistic_regression"}
# client-level schemes: delta < 1/12 clients; record-level: < 1/records
DELTA = {"dp-fedavg": 1e-3, "locks": 1e-3}


def _config(
    out: Path,
    algorithm: str,
    *,
    rounds: int = 3,
    epsilon: float = 50.0,
    code: dict | None = None,
):
    """The run; ``code``: ``model`` and ``loss`` sections of the user's code."""
    return config_from_dict(
        {
            "name": algorithm,
            "seed": 0,
            "rounds": rounds,
            "output_dir": str(out),
            "eval_every": rounds,
            "data": {
                "name": "digits",
                "num_clients": 12,
                "partition": "iid",
                "options": {"flatten": True},
            },
            "model": {"name": MODEL.get(algorithm, "mlp")},
            "algorithm": {"name": algorithm, "params": PARAMS[algorithm]},
            "privacy": {
                "noise_multiplier": 1.0,
                "epsilon": epsilon,
                "delta": DELTA.get(algorithm, 1e-5),
            },
            **(code or {}),
        }
    )


def simulate(flower_dir: Path, config):
    """``dpfl train`` of ``config`` under the Flower run's secret noise key.

    The two runs are the same run only under the same key (secure noise).
    """
    with run_key(flower_dir):
        return runner.run(config, progress=False)


def _key(flower_dir: Path) -> bytes:
    return read_key_file(flower_dir / KEY_FILE)


def _simulated(tmp: Path, algorithm: str, **kw) -> Path:
    """``dpfl train``'s run folder for the same configuration (and key)."""
    config = _config(tmp / "sim", algorithm, **kw)
    return simulate(tmp / "flower" / algorithm, config).run_dir


def _entries(run_dir: Path) -> list[dict]:
    return [e.to_json() for e in PrivacyLedger.load(run_dir / "ledger.json").entries]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    return state["trainer"]["algorithm"]["model"]


def _assert_same_run(flower_dir: Path, sim_dir: Path) -> None:
    assert _entries(flower_dir) == _entries(sim_dir)
    a, b = _weights(flower_dir), _weights(sim_dir)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=ATOL, rtol=0)


# -- in process: a grid that hands messages to the ClientApp directly -------------
class LocalGrid(Grid):
    """Three nodes in this process; ``fail`` maps (round, partition) to a fault."""

    def __init__(self, app, num=3, fail=None):
        self.app = app
        self.nodes = {100 + j: j for j in range(num)}
        self.num = num
        self.fail = fail or {}
        self.train_rounds: list[int] = []
        self.train_meta: list[dict] = []

    def set_run(self, run):
        pass

    @property
    def run(self):
        return None

    def create_message(self, *args, **kwargs):
        raise NotImplementedError

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for m in messages:
            node = m.metadata.dst_node_id
            pid = self.nodes[node]
            context = Context(
                run_id=1,
                node_id=node,
                node_config={"partition-id": pid, "num-partitions": self.num},
                state=RecordDict(),
                run_config={},
            )
            if m.metadata.message_type == "train":
                meta = json.loads(str(m.content["dpfl"]["meta"]))
                self.train_rounds.append(meta["round"])
                self.train_meta.append(meta)
                fault = self.fail.get((meta["round"], pid))
                if fault == "silent":  # no reply within the timeout
                    continue
                if fault == "error":
                    from flwr.app import Error, Message

                    out.append(Message(Error(0, "boom"), reply_to=m))
                    continue
            out.append(self.app(m, context))
        return out


@pytest.fixture
def task_identity():
    """A ServerApp process has a run id; give this one too."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def _flower_in_process(tmp: Path, algorithm: str, fail=None, **kw):
    strategy = fl.DpflStrategy(_config(tmp / "flower", algorithm, **kw))
    grid = LocalGrid(fl.client_app(), fail=fail)
    strategy.start(grid)
    return strategy, grid


# DP-FedAvg's fixed-cohort ledger is slow to price (seconds a round), so its
# in-process runs join the integration run; DP-DSGD's stays in the default run.
SLOW = pytest.mark.integration


@pytest.mark.parametrize(
    "algorithm", [pytest.param("dp-fedavg", marks=SLOW), "dsgd-rp"]
)
def test_in_process_federation_equals_the_simulator(algorithm, tmp_path, task_identity):
    strategy, grid = _flower_in_process(tmp_path, algorithm)
    _assert_same_run(strategy.run_dir, _simulated(tmp_path, algorithm))
    # secure noise: a node is sent its tasks' clients' derived keys of the
    # round, never the run key
    key = _key(strategy.run_dir)
    for meta in grid.train_meta:
        assert meta["keys"] == [
            client_key(key, meta["round"], k).hex() for k in meta["clients"]
        ]
        assert key.hex() not in json.dumps(meta)
    summary = json.loads((strategy.run_dir / "flower.json").read_text())
    assert summary["stopped"] == "completed" and summary["abandoned"] == []
    assert summary["partitions"] == {"0": 100, "1": 101, "2": 102}


@pytest.mark.parametrize(
    "algorithm", ["locks", "ms-pafl", pytest.param("prifedsync", marks=SLOW)]
)
def test_client_noise_algorithms_charge_the_simulators_ledger(
    algorithm, tmp_path, task_identity
):
    strategy, _ = _flower_in_process(tmp_path, algorithm, rounds=2)
    sim = _simulated(tmp_path, algorithm, rounds=2)
    # the client state (helper models, optimiser moments, private parts) travels
    # in Task.state and back in the messages: the model matches too
    _assert_same_run(strategy.run_dir, sim)


def test_budget_guard_stops_before_sending_the_refused_round(tmp_path, task_identity):
    # DP-DSGD at sigma = 1, p = q = 0.5: eps 3.37 after one round, 4.40 after
    # two, 5.10 after three; a budget of 5 admits 2 of the 4 rounds asked
    strategy, grid = _flower_in_process(tmp_path, "dsgd-rp", rounds=4, epsilon=5.0)
    summary = json.loads((strategy.run_dir / "flower.json").read_text())
    assert summary["stopped"] == "budget"
    assert summary["rounds"] == summary["charged_rounds"] == 2
    assert sorted(set(grid.train_rounds)) == [0, 1]  # round 2 was never sent
    config = _config(tmp_path / "sim", "dsgd-rp", rounds=4, epsilon=5.0)
    sim = simulate(strategy.run_dir, config)
    assert sim.stopped == "budget" and sim.rounds_completed == 2
    _assert_same_run(strategy.run_dir, sim.run_dir)


def _replay(config, abandoned, rounds, key, sent=True):
    """The simulator with the same rounds abandoned (Trainer.abandon_round)."""
    _, trainer = fl.build_trainer(config, ledger_path=False, noise_key=key)
    for t in range(rounds):
        if t in abandoned:
            trainer.abandon_round(trainer.begin_round(), sent=sent)
        else:
            trainer.step()
    return trainer


@pytest.mark.parametrize(
    ("algorithm", "fault"),
    [
        pytest.param("dp-fedavg", "silent", marks=SLOW),
        ("dsgd-rp", "error"),
        ("dsgd-rp", "silent"),
        ("locks", "error"),
        ("locks", "silent"),
    ],
)
def test_a_failed_node_abandons_the_round_per_the_rule(
    algorithm, fault, tmp_path, task_identity
):
    # every node fails in round 1 (so the round has participants on a failed
    # node whatever the secret sampling drew); rounds 0 and 2 complete
    fail = {(1, partition): fault for partition in range(3)}
    strategy, _ = _flower_in_process(tmp_path, algorithm, fail=fail)
    summary = json.loads((strategy.run_dir / "flower.json").read_text())
    assert summary["abandoned"] == [1] and summary["rounds"] == 3
    entries = _entries(strategy.run_dir)
    if algorithm == "locks":  # client-side noise: the received messages are releases
        assert [e["round"] for e in entries] == [0, 1, 2]
        assert entries[1]["extra"] == {"abandoned": True}
    else:  # central noise: the server released nothing in round 1
        assert [e["round"] for e in entries] == [0, 2]
    replay = _replay(
        _config(tmp_path / "replay", algorithm), {1}, 3, _key(strategy.run_dir)
    )
    assert entries == [e.to_json() for e in replay.ledger.entries]
    for k, v in _weights(strategy.run_dir).items():
        torch.testing.assert_close(
            v, replay.algorithm.model.state_dict()[k], atol=ATOL, rtol=0
        )


def test_a_partition_without_a_node_sends_nothing_and_charges_nothing(
    tmp_path, task_identity
):
    strategy = fl.DpflStrategy(_config(tmp_path / "flower", "locks", rounds=2))
    grid = LocalGrid(fl.client_app())
    strategy.discover(grid)
    del grid.nodes[101]  # partition 1's node is gone before round 0
    strategy.start(grid)
    summary = json.loads((strategy.run_dir / "flower.json").read_text())
    # every round of LOCKS at q1 = 0.5 over 12 clients needs partition 1 here
    assert summary["abandoned"] == [0, 1]
    assert _entries(strategy.run_dir) == []
    assert grid.train_rounds == []


def test_a_node_refuses_clients_it_does_not_host(tmp_path, task_identity):
    strategy = fl.DpflStrategy(_config(tmp_path / "flower", "dp-fedavg", rounds=1))
    grid = LocalGrid(fl.client_app())
    strategy.discover(grid)
    grid.nodes = {100: 0, 101: 2, 102: 1}  # nodes 101 and 102 swapped partitions
    strategy.nodes = {0: 100, 1: 101, 2: 102}
    strategy.start(grid)
    assert _entries(strategy.run_dir) == []  # refused (error replies): abandoned


def _user_code(tmp: Path, monkeypatch) -> tuple[dict, Path]:
    """``model`` and ``loss`` sections of a fresh module of the user's; its file."""
    mod = user_code(tmp / "code", monkeypatch)
    sections = {
        "model": {"factory": f"{mod}:make_model", "options": {"hidden": 6}},
        "loss": {"factory": f"{mod}:make_loss", "options": {"smoothing": 0.1}},
    }
    return sections, tmp / "code" / f"{mod}.py"


def test_a_model_and_loss_of_the_users_code_through_flower(
    tmp_path, monkeypatch, task_identity
):
    # the ClientApp builds its replica from the configuration the server
    # sends: it imports the user's module itself, and the run is the simulator's
    code, path = _user_code(tmp_path, monkeypatch)
    strategy, _ = _flower_in_process(tmp_path, "dsgd-rp", rounds=2, code=code)
    _assert_same_run(
        strategy.run_dir, _simulated(tmp_path, "dsgd-rp", rounds=2, code=code)
    )
    assert "hidden.weight" in _weights(strategy.run_dir)  # the factory's model
    # a node holding another version of the file refuses its tasks (the
    # configuration carries the server's SHA-256): every round is abandoned
    # before the server step, and nothing is charged (central noise)
    strategy = fl.DpflStrategy(
        _config(tmp_path / "other", "dsgd-rp", rounds=2, code=code)
    )
    path.write_text(path.read_text() + "\n# another version on the nodes\n")
    strategy.start(LocalGrid(fl.client_app()))
    summary = json.loads((strategy.run_dir / "flower.json").read_text())
    assert summary["abandoned"] == [0, 1]
    assert _entries(strategy.run_dir) == []


def test_untrusted_dsgd_is_refused_not_silently_centralised(tmp_path):
    tree = _config(tmp_path, "dsgd-rp").to_dict()
    tree["algorithm"]["params"]["server"] = "untrusted"
    with pytest.raises(Exception, match="untrusted"):
        fl.build_trainer(config_from_dict(tree), ledger_path=False)


def test_a_flower_run_holds_the_run_folders_lock(tmp_path, task_identity):
    # A Flower server run took no lock: `dpfl train` or `dpfl resume` could
    # write the same folder meanwhile.
    from dpfl.experiments.rundir import RunFolderBusyError, RunLock

    config = _config(tmp_path / "flower", "dsgd-rp", rounds=2)
    with RunLock(config.run_dir), pytest.raises(RunFolderBusyError, match="in use"):
        fl.DpflStrategy(config)
    assert not (config.run_dir / "run.json").exists()  # nothing written
    strategy = fl.DpflStrategy(config)
    with pytest.raises(RunFolderBusyError, match="in use"):
        runner.run(config, progress=False)
    with pytest.raises(RunFolderBusyError, match="in use"):
        fl.DpflStrategy(config)
    strategy.start(LocalGrid(fl.client_app()))
    with RunLock(config.run_dir):  # released when the run ends
        pass
    with pytest.raises(Exception, match="already holds a run"):
        fl.DpflStrategy(config)  # and a finished run is never started over


_LOSING_SUPERLINK = """
import socket, sys, threading, time
from pathlib import Path
sys.path[:0] = [{tests!r}, str(Path({tests!r}).parent)]  # test_flower, tiny_runs
import test_flower as t
from flwr.supercore.task_identity import TaskIdentity
from dpfl.integrations import flower as fl

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
link = socket.socket()
link.bind(("127.0.0.1", 0))
link.listen(16)

def serve():
    while True:
        try:
            link.accept()[0].close()
        except OSError:
            return

threading.Thread(target=serve, daemon=True).start()

class LosingGrid(t.LocalGrid):
    # the SuperLink's address, as Flower's network grid keeps it
    _addr = "127.0.0.1:%d" % link.getsockname()[1]

    def send_and_receive(self, messages, *, timeout=None):
        if self.train_rounds and max(self.train_rounds) >= 1:
            link.close()  # the SuperLink dies; the grid waits on it forever
            while True:
                time.sleep(1)
        return super().send_and_receive(messages, timeout=timeout)

config = t._config(Path({out!r}), "dsgd-rp", rounds=6)
strategy = fl.DpflStrategy(config, superlink_timeout=3)
strategy.start(LosingGrid(fl.client_app()))
"""


def test_the_server_leaves_when_its_superlink_is_gone(tmp_path):
    # A ServerApp kept running (metrics.jsonl open) for minutes after its
    # SuperLink died; now it leaves within superlink_timeout (3 s here) with
    # exit status 75, between two writes, the ledger as it was.
    script = _LOSING_SUPERLINK.format(
        tests=str(Path(__file__).parent), out=str(tmp_path / "flower")
    )
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == fl.EXIT_SUPERLINK_LOST, done.stderr[-3000:]
    assert time.monotonic() - start < 90
    assert "unreachable" in done.stderr and "dpfl resume" in done.stderr
    run_dir = tmp_path / "flower" / "dsgd-rp"
    summary = json.loads((run_dir / "flower.json").read_text())
    assert summary["stopped"] == "superlink-lost"
    # rounds 0 and 1 ran and were charged; round 2's messages never came back
    ledger = PrivacyLedger.load(run_dir / "ledger.json")
    assert [e.round for e in ledger.entries] == [0, 1]
    assert summary["charged_rounds"] == 2
    from dpfl.experiments.rundir import RunLock

    with RunLock(run_dir):  # the process is gone: so is its lock
        pass


# -- real processes ---------------------------------------------------------------
def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    env["FLWR_HOME"] = str(home)
    env.pop("RAY_ADDRESS", None)
    return env


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each process group, wait a little, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_SIMULATION = """
import json
import sys
from pathlib import Path
from flwr.simulation import run_simulation
sys.path[:0] = [{tests!r}, str(Path({tests!r}).parent)]  # test_flower, tiny_runs
import test_flower as t
from dpfl.integrations import flower as fl
config = t._config(Path({out!r}), {algorithm!r}, code=json.loads({code!r}))
run_simulation(
    server_app=fl.server_app(lambda context: config, round_timeout=120),
    client_app=fl.client_app(),
    num_supernodes=3,
    backend_config={{
        "client_resources": {{"num_cpus": 1, "num_gpus": 0.0}},
        "init_args": {{"num_cpus": 2, "include_dashboard": False}},
    }},
)
"""


def _simulation_engine(tmp_path: Path, algorithm: str, code: dict | None) -> Path:
    """The run folder of a Flower simulation (its engine on Ray) of the run."""
    script = _SIMULATION.format(
        tests=str(Path(__file__).parent),
        out=str(tmp_path / "flower"),
        algorithm=algorithm,
        code=json.dumps(code),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        env=_env(tmp_path / "home"),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        _stop([proc])
    run_dir = tmp_path / "flower" / algorithm
    assert (run_dir / "flower.json").exists(), out[-4000:]
    return run_dir


@pytest.mark.integration
@pytest.mark.parametrize("algorithm", ["dp-fedavg", "dsgd-rp"])
def test_simulation_engine_equals_the_simulator(algorithm, tmp_path):
    run_dir = _simulation_engine(tmp_path, algorithm, None)
    _assert_same_run(run_dir, _simulated(tmp_path, algorithm))


@pytest.mark.integration
def test_simulation_engine_with_the_users_model_and_loss(tmp_path, monkeypatch):
    # the ClientApps run in the engine's Ray workers, which import the user's
    # module from PYTHONPATH (inherited from the process that starts Ray)
    code, _ = _user_code(tmp_path, monkeypatch)
    run_dir = _simulation_engine(tmp_path, "dsgd-rp", code)
    assert "hidden.weight" in _weights(run_dir)
    _assert_same_run(run_dir, _simulated(tmp_path, "dsgd-rp", code=code))


class Federation:
    """A SuperLink and three SuperNodes on 127.0.0.1, state in ``root``."""

    def __init__(self, root: Path, num: int = 3):
        self.root = root
        self.home = root / "flwr-home"
        self.home.mkdir(parents=True)
        self.env = _env(self.home)
        self.port = _free_port()
        self.procs: list[subprocess.Popen] = []
        self.nodes: dict[int, subprocess.Popen] = {}
        self.logs: list[Path] = []
        self._spawn(
            "superlink",
            [
                "flower-superlink",
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--database",
                str(root / "state.db"),
                "--disable-runtime-dependency-installation",
            ],
        )
        _wait_port(self.port, 60)
        for j in range(num):
            self.nodes[j] = self._spawn(
                f"supernode{j}",
                [
                    "flower-supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(_free_port()),
                    "--node-config",
                    f"partition-id={j} num-partitions={num}",
                ],
            )

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = self.root / f"{name}.log"
        self.logs.append(log)
        with log.open("w") as fh:
            proc = subprocess.Popen(
                cmd,
                env=self.env,
                cwd=self.root,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def app(self, client_app: str | None = None) -> Path:
        """A copy of the example app pointing at this SuperLink."""
        app = self.root / f"app{len(list(self.root.glob('app*')))}"
        shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
        toml = app / "pyproject.toml"
        toml.write_text(
            toml.read_text().replace("127.0.0.1:9093", f"127.0.0.1:{self.port}")
        )
        if client_app is not None:
            (app / "dpfl_flower_app" / "client_app.py").write_text(client_app)
        return app

    def run(self, app: Path, run_config: str) -> None:
        done = subprocess.run(
            ["flwr", "run", str(app), "local-deployment", "--run-config", run_config],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def wait(self, run_dir: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (run_dir / "flower.json").exists():
                return
            if any(p.poll() is not None for p in self.procs[:1]):
                break
            time.sleep(1)
        tails = "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in self.logs)
        raise AssertionError(f"run did not finish in {timeout:g} s\n{tails}")

    def close(self) -> None:
        _stop(self.procs)


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@pytest.mark.integration
def test_superlink_three_supernodes_and_flwr_run_equal_the_simulator(tmp_path):
    fed = Federation(tmp_path / "fed")
    try:
        app = fed.app()
        for algorithm in ["dp-fedavg", "dsgd-rp"]:
            out = tmp_path / "flower" / algorithm
            fed.run(
                app, f"algorithm='{algorithm}' num-server-rounds=2 output-dir='{out}'"
            )
            run_dir = out / f"{algorithm}-seed0"
            fed.wait(run_dir, timeout=240)
            summary = json.loads((run_dir / "flower.json").read_text())
            assert summary["stopped"] == "completed" and summary["abandoned"] == []
            assert sorted(summary["partitions"]) == ["0", "1", "2"]
            # the simulator (dpfl train) with the example app's configuration
            config = config_from_dict(
                {**_app_config(algorithm, 2), "output_dir": str(tmp_path / "sim")}
            )
            sim = simulate(run_dir, config)
            _assert_same_run(run_dir, sim.run_dir)
    finally:
        fed.close()


def _app_config(algorithm: str, rounds: int) -> dict:
    sys.path.insert(0, str(APP))
    try:
        from dpfl_flower_app.task import CONFIGS
    finally:
        sys.path.remove(str(APP))
    return {
        "name": f"{algorithm}-seed0",
        "seed": 0,
        "rounds": rounds,
        "eval_every": 1,
        **CONFIGS[algorithm],
    }


def _descendants(pid: int) -> dict[int, bytes]:
    """The processes below ``pid`` and their command lines (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    out: dict[int, bytes] = {}
    frontier = [pid]
    while frontier:
        here = frontier.pop()
        for child, parent in parents.items():
            if parent == here and child not in out:
                try:
                    out[child] = Path(f"/proc/{child}/cmdline").read_bytes()
                except OSError:
                    out[child] = b""
                frontier.append(child)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.integration
def test_a_serverapp_whose_superlink_dies_leaves_in_bounded_time(tmp_path):
    fed = Federation(tmp_path / "fed")
    try:
        app = fed.app()
        out = tmp_path / "flower"
        fed.run(
            app,
            f"algorithm='dsgd-rp' num-server-rounds=500 output-dir='{out}' "
            "set='privacy.epsilon=.inf'",
        )
        run_dir = out / "dsgd-rp-seed0"
        deadline = time.monotonic() + 180
        while True:  # a round or two charged: the federation is running
            assert time.monotonic() < deadline, "no round was charged"
            if (run_dir / "metrics.jsonl").exists():
                rows = (run_dir / "metrics.jsonl").read_text().splitlines()
                if len(rows) >= 2:
                    break
            time.sleep(0.5)
        superlink = fed.procs[0]
        # the ServerApp process (under Flower's SuperExec, under the SuperLink)
        below = _descendants(superlink.pid)
        apps = [p for p, cmd in below.items() if b"serverapp" in cmd and _alive(p)]
        assert apps, f"no ServerApp process under the SuperLink: {below}"
        os.kill(superlink.pid, signal.SIGKILL)  # the SuperLink alone dies
        killed = time.monotonic()
        while any(_alive(p) for p in apps):
            # superlink_timeout (20 s) after its SuperLink stopped answering
            assert time.monotonic() - killed < 120, "the ServerApp is still running"
            time.sleep(0.5)
        summary = json.loads((run_dir / "flower.json").read_text())
        assert summary["stopped"] == "superlink-lost"
        ledger = PrivacyLedger.load(run_dir / "ledger.json")
        assert ledger.rounds == summary["charged_rounds"] >= 2
    finally:
        fed.close()


_STALLING_CLIENT = """
import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from dpfl.integrations.flower import client_step_message, partition_reply

app = ClientApp()
app.query()(partition_reply)


@app.train()
def train(message: Message, context: Context) -> Message:
    import json

    meta = json.loads(str(message.content["dpfl"]["meta"]))
    if meta["round"] == {round} and context.node_config["partition-id"] == 0:
        Path({marker!r}).write_text("stalled")
        time.sleep(600)
    return client_step_message(message, context)
"""


@pytest.mark.integration
def test_a_supernode_killed_mid_round_abandons_the_round(tmp_path):
    marker = tmp_path / "stalled"
    fed = Federation(tmp_path / "fed")
    try:
        app = fed.app(
            textwrap.dedent(_STALLING_CLIENT.format(round=1, marker=str(marker)))
        )
        out = tmp_path / "flower"
        fed.run(
            app,
            f"algorithm='dp-fedavg' num-server-rounds=3 output-dir='{out}' "
            "round-timeout=20.0",
        )
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert time.monotonic() < deadline, "round 1 never reached node 0"
            time.sleep(0.5)
        os.killpg(fed.nodes[0].pid, signal.SIGKILL)  # the node dies mid-round
        run_dir = out / "dp-fedavg-seed0"
        fed.wait(run_dir, timeout=240)
        summary = json.loads((run_dir / "flower.json").read_text())
        assert 1 in summary["abandoned"] and summary["rounds"] == 3
        # central noise: abandoned rounds released nothing and are not charged;
        # the completed ones are charged exactly as the simulator charges them
        entries = _entries(run_dir)
        assert [e["round"] for e in entries] == [
            t for t in range(3) if t not in summary["abandoned"]
        ]
        config = config_from_dict(
            {**_app_config("dp-fedavg", 3), "output_dir": str(tmp_path / "replay")}
        )
        replay = _replay(config, set(summary["abandoned"]), 3, _key(run_dir))
        assert entries == [e.to_json() for e in replay.ledger.entries]
        for k, v in _weights(run_dir).items():
            torch.testing.assert_close(
                v, replay.algorithm.model.state_dict()[k], atol=ATOL, rtol=0
            )
    finally:
        fed.close()
