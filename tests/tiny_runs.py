"""The tiny run configuration the run-folder tests share.

DP-DSGD with random participation on 20 clients x 10 embedded digits, an
8-unit MLP: a few rounds take about a second, enough to test what a run
folder holds, how it resumes and what it refuses.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: One secret noise key for every run of a test that compares runs: two runs
#: with secure noise (the default) draw the same noise only with one key.
SHARED_KEY = bytes(range(32))


@contextlib.contextmanager
def run_key(key: bytes | Path) -> Iterator[bytes]:
    """Runs started inside the block make ``key`` their secret noise key.

    A run makes its own key and refuses a folder that holds one (two runs
    with one key draw the same noise, which is what a test comparing two
    runs draw for draw wants, and what a user must never get). Tests get it
    by patching the key maker, ``dpfl.sim.keys.new_key``.

    Parameters
    ----------
    key : bytes or Path
        The key, or a run folder whose key to take.
    """
    from dpfl.sim import keys

    if isinstance(key, Path):
        key = keys.read_key_file(key / keys.KEY_FILE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(keys, "new_key", lambda: key)
        yield key


def tiny_config(
    tmp_path: Path,
    name: str = "tiny",
    *,
    privacy: dict[str, Any] | None = None,
    algorithm: dict[str, Any] | None = None,
    records_per_client: int = 10,
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
    return config_from_dict(tree)


#: A module of a user's own model and loss, as a user writes it (no dpfl
#: import): the factories a configuration names as ``MODULE:make_model``.
USER_CODE = """
import math

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(features, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.out(torch.tanh(self.hidden(x.flatten(1))))


def make_model(input_shape, num_classes, hidden: int = 8):
    return Net(math.prod(input_shape), hidden, num_classes)


def three_outputs(input_shape):
    return Net(math.prod(input_shape), 4, 3)


class SmoothedLoss:
    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing

    def __call__(self, output, target):
        return F.cross_entropy(output, target, label_smoothing=self.smoothing)


def make_loss(smoothing: float = 0.0):
    return SmoothedLoss(smoothing)


def mse():
    return lambda output, target: F.mse_loss(output, target)
"""


def user_code(folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Write :data:`USER_CODE` as a fresh module in ``folder``; its name.

    The folder goes on ``sys.path`` (for this process) and ``PYTHONPATH`` (for
    the processes a test starts), as a user's own code would be; the name is
    new for every call, since Python imports a module name once per process
    (and keeps it: a test that changes the file imports it only once).
    """
    import os
    import uuid

    name = f"user_models_{uuid.uuid4().hex[:10]}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(USER_CODE)
    monkeypatch.syspath_prepend(str(folder))
    src = str(Path(__file__).resolve().parents[1] / "src")
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([src, str(folder), *rest]))
    return name
