"""The ClientApp side: dpfl client steps for the clients a node hosts."""

from __future__ import annotations

import torch
import yaml
from flwr.app import (
    ConfigRecord,
    Context,
    Error,
    Message,
    RecordDict,
)
from flwr.clientapp import ClientApp

from dpfl.errors import DpflError
from dpfl.experiments import build
from dpfl.experiments.config import RunConfig, config_from_dict
from dpfl.experiments.privacy import resolve_privacy
from dpfl.integrations.flower.wire import (
    NUM_PARTITIONS,
    PARTITION_ID,
    REFUSED,
    ConfigFn,
    client_fingerprint,
    decode_tasks,
    encode_messages,
    hosts,
)
from dpfl.sim.algorithms.base import FederatedAlgorithm
from dpfl.sim.randomness import Streams, client_streams
from dpfl.sim.secure_noise import STREAM_VERSION

__all__ = ["client_app", "client_step_message", "partition_reply"]

# -- the clients ------------------------------------------------------------------
#: One replica per process, keyed by the fingerprint of what client steps read.
_REPLICAS: dict[str, FederatedAlgorithm] = {}


def _replica(config: RunConfig) -> FederatedAlgorithm:
    """The algorithm built once per process from the server's resolved config."""
    key = client_fingerprint(config)
    if key not in _REPLICAS:
        _REPLICAS.clear()
        _REPLICAS[key] = build.build_algorithm(config, build.build_dataset(config))
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
        The reply (or an error reply naming why a task was refused: a node
        that cannot import the configuration's ``model.factory`` or
        ``loss.factory``, or whose file of it differs from the server's,
        refuses every task).
    """
    pid = int(context.node_config.get(PARTITION_ID, 0))
    num = int(context.node_config.get(NUM_PARTITIONS, 1))
    try:
        # a model or loss of the user's code is imported here, and its file
        # must be the server's (the configuration carries its SHA-256)
        config = config_from_dict(
            yaml.safe_load(str(message.content["dpfl"]["config"]))
        )
    except DpflError as exc:
        return Message(
            Error(REFUSED, f"the server's run configuration is refused here: {exc}"),
            reply_to=message,
        )
    if pinned is not None and client_fingerprint(config) != pinned:
        return Message(
            Error(REFUSED, "the server's run configuration is not this node's"),
            reply_to=message,
        )
    weights, meta, tasks = decode_tasks(message.content)
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
    return Message(encode_messages(list(meta["positions"]), out), reply_to=message)


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
            resolved = resolve_privacy(config, build.build_dataset(config))
            pinned["key"] = client_fingerprint(resolved)
        return pinned["key"]

    app.query()(partition_reply)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return client_step_message(message, context, pinned=_pinned(context))

    return app
