"""What travels between a dpfl Flower server and its clients.

Node mapping (:func:`hosts`: node ``j`` of ``num_partitions`` hosts the dpfl
clients ``k`` with ``k % num_partitions == j``), the fingerprint of what a
client step reads (:func:`client_fingerprint`), and the wire format: a round's
tasks (:func:`encode_tasks`, :func:`decode_tasks`: weights, round, seed, the
resolved configuration, each task's client, rows, options and state, and with
secure noise each task's client's derived key of the round) and the clients'
messages (:func:`encode_messages`, :func:`decode_messages`); and where the
server's SuperLink listens (:func:`superlink_address`, :func:`reachable`).
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import yaml
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    MetricRecord,
    RecordDict,
)

from dpfl.experiments.config import RunConfig
from dpfl.sim.algorithms.tasks import Message as DpflMessage
from dpfl.sim.algorithms.tasks import Task
from dpfl.sim.secure_noise import STREAM_VERSION

__all__ = [
    "NUM_PARTITIONS",
    "PARTITION_ID",
    "REFUSED",
    "ConfigFn",
    "array_of",
    "client_fingerprint",
    "config_text",
    "decode_messages",
    "decode_tasks",
    "encode_messages",
    "encode_tasks",
    "fingerprint",
    "hosts",
    "named_arrays",
    "reachable",
    "superlink_address",
    "tensor_array",
]

PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
#: The ClientApp's error code when it refuses a task (Flower's own codes are < 100).
REFUSED = 100
#: ``Context -> RunConfig``: how an app finds its run configuration.
ConfigFn = Callable[[Context], RunConfig]


def hosts(client: int, partition_id: int, num_partitions: int) -> bool:
    """Whether the node of partition ``partition_id`` hosts dpfl client ``client``."""
    return int(client) % int(num_partitions) == int(partition_id)


def config_text(config: RunConfig) -> str:
    """The resolved configuration as the server sends it (YAML, sorted keys)."""
    return yaml.safe_dump(config.to_dict(), sort_keys=True)


def client_fingerprint(config: RunConfig) -> str:
    """What a client step depends on: seed, data, model, algorithm, σ."""
    tree = config.to_dict()
    keep = {k: tree[k] for k in ("seed", "data", "model", "algorithm")}
    keep["noise_multiplier"] = tree["privacy"]["noise_multiplier"]
    return fingerprint(json.dumps(keep, sort_keys=True, default=str))


def fingerprint(text: str) -> str:
    """A short SHA-256 fingerprint of ``text``."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- the wire format ----------------------------------------------------------------
def tensor_array(t: torch.Tensor) -> Any:
    """A tensor as a contiguous CPU NumPy array."""
    return t.detach().cpu().contiguous().numpy()


def encode_tasks(
    weights: torch.Tensor,
    round_index: int,
    seed: int,
    config_text: str,
    positions: list[int],
    tasks: list[Task],
    keys: list[bytes] | None = None,
    stream_version: str = STREAM_VERSION,
) -> RecordDict:
    """A train message's content: the weights and the tasks at ``positions``."""
    arrays: dict[str, Any] = {}
    for j, task in zip(positions, tasks):
        if task.rows is not None:
            arrays[f"{j}/rows"] = np.asarray(task.rows, dtype=np.int64)
        for name, value in task.state.items():
            arrays[f"{j}/state/{name}"] = tensor_array(value)
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
            "weights": ArrayRecord(named_arrays({"weights": tensor_array(weights)})),
            "tasks": ArrayRecord(named_arrays(arrays)),
            "dpfl": ConfigRecord({"meta": json.dumps(meta), "config": config_text}),
        }
    )


def named_arrays(named: Mapping[str, Any]) -> Any:
    """Flower ``Array`` objects of NumPy arrays, by name."""
    from flwr.app import Array

    return {k: Array(v) for k, v in named.items()}


def array_of(record: Any, key: str) -> np.ndarray:
    """The NumPy array stored under ``key`` of an ArrayRecord."""
    return np.asarray(record[key].numpy())


def decode_tasks(
    content: RecordDict,
) -> tuple[torch.Tensor, dict[str, Any], list[Task]]:
    """A train message's weights, meta data (round, seed, keys, ...) and tasks."""
    meta = json.loads(str(content["dpfl"]["meta"]))
    arrays = content["tasks"]
    weights = torch.from_numpy(array_of(content["weights"], "weights").copy())
    tasks = []
    for j, client, options, names in zip(
        meta["positions"], meta["clients"], meta["options"], meta["state"]
    ):
        key = f"{j}/rows"
        rows = array_of(arrays, key) if key in arrays else None
        state = {
            n: torch.from_numpy(array_of(arrays, f"{j}/state/{n}").copy())
            for n in names
        }
        tasks.append(Task(int(client), rows, options, state))
    return weights, meta, tasks


def encode_messages(positions: list[int], messages: list[DpflMessage]) -> RecordDict:
    """The clients' messages at task ``positions`` as a reply's content."""
    arrays: dict[str, Any] = {}
    for j, m in zip(positions, messages):
        arrays[f"{j}/vector"] = tensor_array(m.vector)
        for name, value in m.state.items():
            arrays[f"{j}/state/{name}"] = tensor_array(value)
    meta = {
        "positions": positions,
        "scalars": [{k: float(v) for k, v in m.scalars.items()} for m in messages],
        "state": [sorted(m.state) for m in messages],
    }
    return RecordDict(
        {
            "messages": ArrayRecord(named_arrays(arrays)),
            "dpfl": ConfigRecord({"meta": json.dumps(meta)}),
            "metrics": MetricRecord({"num-tasks": len(messages)}),
        }
    )


def decode_messages(content: RecordDict) -> dict[int, DpflMessage]:
    """A reply's messages by task position."""
    meta = json.loads(str(content["dpfl"]["meta"]))
    arrays = content["messages"]
    out = {}
    for j, scalars, names in zip(meta["positions"], meta["scalars"], meta["state"]):
        out[int(j)] = DpflMessage(
            torch.from_numpy(array_of(arrays, f"{j}/vector").copy()),
            {k: float(v) for k, v in scalars.items()},
            {
                n: torch.from_numpy(array_of(arrays, f"{j}/state/{n}").copy())
                for n in names
            },
        )
    return out


# -- the network ------------------------------------------------------------------
def superlink_address(grid: Any) -> tuple[str, int] | None:
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


def reachable(address: tuple[str, int]) -> bool:
    """Whether something accepts a TCP connection at ``address``."""
    try:
        with socket.create_connection(address, timeout=2.0):
            return True
    except OSError:
        return False
