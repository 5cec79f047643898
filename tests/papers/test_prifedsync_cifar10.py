"""PriFedSync on CIFAR-10 (Zheng et al. 2021, Table 3), on files in its format.

CIFAR-10 is not on this machine and nothing is downloaded: the test writes
the python version's six pickled batches (``data_batch_1..5``, ``test_batch``:
a dict with ``b"data"``, uint8 N x 3072 in R, G, B planes, and ``b"labels"``)
to a temporary folder and points ``$DPFL_DATA`` at it. The paper's scale
(100 clients x 500 images) needs all 50,000 images, so the data-reading
checks run the preset with fewer clients and records; its configuration at
the paper's scale is checked as ``dpfl reproduce --check`` checks it.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from dpfl.cli.main import main
from dpfl.experiments.config import load_config
from dpfl.experiments.presets import find_preset

pytest.importorskip("torch")

#: Few clients and records, so that 600 written images suffice.
SMALL = (
    "data.num_clients=4",
    "data.records_per_client=20",
    "data.options.client_test_records=10",
    "algorithm.params.batch_size=4",
    "algorithm.params.local_steps=3",
    "algorithm.params.lr_decay_steps=2",
    "device=cpu",
)


@pytest.fixture
def cifar_folder(tmp_path, monkeypatch):
    folder = tmp_path / "data" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = [int(v) for v in rng.permutation(np.arange(100) % 10)]
        data = rng.integers(0, 256, (100, 3072), dtype=np.uint8)
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": b"x", b"data": data, b"labels": labels}, f)
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return folder


def test_cifar10_preset_has_the_papers_schedule_and_rows():
    # Zheng et al. §4.2: noisy Adam 0.005, weight decay 5e-4, lr x0.99 every 10
    # epochs (10 x 500 / 16 = 312 local steps), B = 16, K = 32, p = 0.5, σ = 1
    config = load_config(find_preset("prifedsync-cifar10"), [])
    p = config.algorithm.params
    assert (p.learning_rate, p.weight_decay, p.optimizer) == (0.005, 0.0005, "adam")
    assert (p.lr_decay, p.lr_decay_steps) == (0.99, 312)
    assert (p.batch_size, p.local_steps, p.sync_probability) == (16, 32, 0.5)
    assert config.rounds == 904 and config.privacy.noise_multiplier == 1.0
    # every Table 3 row (p in {1, 0.5} x σ in {1, 0.75, 0.5}) at the paper's
    # scale validates, without the data
    assert main(["reproduce", "federated-f-dp", "--scale", "paper", "--check"]) == 0


def test_cifar10_preset_passes_train_check_on_the_written_batches(
    cifar_folder, tmp_path, capsys
):
    args = ["train", "prifedsync-cifar10", "--check", "--out", str(tmp_path / "runs")]
    for item in SMALL:
        args += ["--set", item]
    assert main(args) == 0
    assert "valid" in capsys.readouterr().out


@pytest.mark.slow  # one round of the CIFAR CNN on a CPU: about 10 s
def test_cifar10_preset_trains_one_round_on_the_written_batches(cifar_folder, tmp_path):
    from dpfl.experiments.runner import run

    config = load_config(
        find_preset("prifedsync-cifar10"),
        [*SMALL, f"output_dir={tmp_path}", "rounds=1", "eval_every=1"],
    )
    result = run(config, progress=False)
    assert result.rounds_completed == 1
    assert 0.0 <= result.metrics["test_accuracy"] <= 1.0
