"""The tiny run configuration the run-folder tests share.

DP-DSGD with random participation on 20 clients x 10 embedded digits, an
8-unit MLP: a few rounds take about a second, enough to test what a run
folder holds, how it resumes and what it refuses.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

#: One secret noise key for every run of a test that compares runs: two runs
#: with secure noise (the default) draw the same noise only with one key.
SHARED_KEY = bytes(range(32))


def tiny_config(
    tmp_path: Path,
    name: str = "tiny",
    *,
    privacy: dict[str, Any] | None = None,
    algorithm: dict[str, Any] | None = None,
    records_per_client: int = 10,
    key: bytes | None = None,
    **top: Any,
) -> Any:
    """A :class:`~dpfl.experiments.config.RunConfig` of the tiny run.

    Parameters
    ----------
    tmp_path : Path
        Runs go to ``tmp_path / "runs" / name``.
    name : str
        The run's name.
    privacy, algorithm : dict or None
        Keys that replace the defaults (σ 1, no budget; p = q = 0.5).
    records_per_client : int
        Records of each of the 20 clients.
    key : bytes or None
        A secret noise key written into the run folder before the run (so
        that runs given the same key draw the same secure noise).
    **top
        Top-level keys that replace the defaults (rounds 6, seed 3, ...).
    """
    from dpfl.experiments import config_from_dict

    tree: dict[str, Any] = {
        "name": name,
        "seed": 3,
        "rounds": 6,
        "output_dir": str(tmp_path / "runs"),
        "eval_every": 3,
        "checkpoint_every": 2,
        "data": {"num_clients": 20, "records_per_client": records_per_client},
        "model": {"options": {"hidden": 8}},
        "algorithm": {
            "participation_probability": 0.5,
            "record_probability": 0.5,
            "learning_rate": 0.5,
            "momentum": 0.5,
            **(algorithm or {}),
        },
        "privacy": {
            "epsilon": math.inf,
            "delta": 1e-5,
            "noise_multiplier": 1.0,
            **(privacy or {}),
        },
    }
    tree.update(top)
    cfg = config_from_dict(tree)
    if key is not None:
        from dpfl.sim.secure_noise import KEY_FILE, write_key_file

        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        write_key_file(cfg.run_dir / KEY_FILE, key)
    return cfg
