"""The dpfl run configuration of this app, from Flower's run config.

Both algorithms train on scikit-learn's digits (embedded in dpfl: no
download) split over 12 clients; each SuperNode ``j`` of ``num-partitions``
hosts the clients ``k`` with ``k % num-partitions == j``.
"""

from __future__ import annotations

from typing import Any

from flwr.app import Context

from dpfl.experiments.config import RunConfig, config_from_dict

#: The dpfl configurations this app can run (``algorithm`` in the run config).
CONFIGS: dict[str, dict[str, Any]] = {
    # Client-level DP-FedAvg: a fixed cohort of 4 of 12 clients per round,
    # each update clipped to 1 at the client, Gaussian noise (sigma = 1) added
    # to the sum by the (trusted) server.
    "dp-fedavg": {
        "data": {
            "name": "digits",
            "num_clients": 12,
            "partition": "iid",
            "options": {"flatten": True},
        },
        "model": {"name": "mlp"},
        "algorithm": {
            "name": "dp-fedavg",
            "params": {
                "cohort_size": 4,
                "local_epochs": 1,
                "batch_size": 8,
                "learning_rate": 0.1,
                "clip": 1.0,
            },
        },
        "privacy": {"noise_multiplier": 1.0, "epsilon": 50.0, "delta": 1e-3},
    },
    # DP-DSGD with random participation: each client joins w.p. 0.5 and
    # samples each record w.p. 0.5; per-record clipping at the client, the
    # trusted server adds the noise (record-level privacy).
    "dsgd-rp": {
        "data": {
            "name": "digits",
            "num_clients": 12,
            "partition": "iid",
            "options": {"flatten": True},
        },
        "model": {"name": "mlp"},
        "algorithm": {
            "name": "dsgd-rp",
            "params": {
                "participation_probability": 0.5,
                "record_probability": 0.5,
                "learning_rate": 0.5,
            },
        },
        "privacy": {"noise_multiplier": 1.0, "epsilon": 50.0, "delta": 1e-5},
    },
}


def load_config(context: Context) -> RunConfig:
    """The dpfl :class:`RunConfig` selected by the app's run config."""
    rc = context.run_config
    algorithm = str(rc.get("algorithm", "dp-fedavg"))
    if algorithm not in CONFIGS:
        raise ValueError(
            f"algorithm must be one of {sorted(CONFIGS)}; got {algorithm!r}"
        )
    tree = {
        "name": f"{algorithm}-seed{int(rc.get('seed', 0))}",
        "seed": int(rc.get("seed", 0)),
        "rounds": int(rc.get("num-server-rounds", 3)),
        "output_dir": str(rc.get("output-dir", "runs/flower")),
        "eval_every": 1,
        **CONFIGS[algorithm],
    }
    overrides = str(rc.get("set", "")).split()
    return config_from_dict(tree, overrides=overrides)
