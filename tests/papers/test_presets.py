"""Every preset loads, builds its model on its data's shape, and states its results.

The presets whose data is on every machine (the bundled digits, the generated
tabular data) run two rounds here; the Adult preset runs on small files in
Adult's real format, which checks that it is accepted (it used to be refused for
``client_test_records: 0``) and that MS-PAFL's binary model evaluates.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import dpfl
from dpfl.experiments.config import load_config
from dpfl.experiments.presets import PRESET_DIR, list_presets

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted(PRESET_DIR.glob("*.yaml"))


def test_presets_live_in_one_folder_inside_the_package():
    assert not list((ROOT / "configs").glob("*.yaml"))
    assert not (ROOT / "presets").exists()  # moved into the package (wheel data)
    assert PRESET_DIR.parent == Path(dpfl.__file__).parent
    assert {p.stem for p in PRESETS} <= set(list_presets())
    assert "digits-dsgd-rp" in {p.stem for p in PRESETS}


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_preset_loads_and_its_header_says_what_it_reproduces(path):
    config = load_config(path, [])
    assert config.name == path.stem
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    text = " ".join(header)
    assert len(header) >= 3, f"{path.name} has no header"
    # A preset either reports what it measured or says why it was not run here.
    assert "Measured" in text or "NOT RUN HERE" in text or "measured" in text, path


@pytest.mark.parametrize(
    ("name", "shape", "classes"),
    [
        ("dp-fedavg-mnist", (1, 28, 28), 10),
        ("dp-fedavg-fmnist", (1, 28, 28), 10),
        ("prifedsync-cifar10", (3, 32, 32), 10),
        ("rp-fmnist-scenario1", (1, 28, 28), 10),
        ("prifedsync-fmnist-shards", (1, 28, 28), 10),
    ],
)
def test_image_presets_build_their_model_at_the_datas_shape(name, shape, classes):
    import torch

    from dpfl.models import build_model

    config = load_config(PRESET_DIR / f"{name}.yaml", [])
    model = build_model(
        config.model.name,
        input_shape=shape,
        num_classes=classes,
        **config.model.options,
    )
    assert model(torch.zeros(2, *shape)).shape == (2, classes)


@pytest.mark.slow  # every preset's data read and sigma calibrated: about 2 minutes
@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_every_preset_passes_trains_checks(path):
    # What `dpfl train PRESET` (and --check) checks before its first round,
    # through the same code: a rule that a shipped preset breaks is caught
    # here (LOCKS's second stage <= K once met a preset that wrote m2 = 1e12).
    # A preset whose data set is not on this machine stops at the data, saying
    # how to get it: all its other checks need the data.
    from dpfl.data.loaders import DatasetNotFoundError
    from dpfl.experiments.build import prepare

    config = load_config(path, [])
    try:
        prepared = prepare(config)
    except DatasetNotFoundError as exc:
        assert "dpfl data fetch" in str(exc)
        pytest.skip(f"{config.data.name} is not on this machine")
    assert prepared.config.privacy.noise_multiplier is not None
    assert prepared.parameters > 0


def _train(path: Path, tmp_path: Path, *extra: str):
    from dpfl.experiments.runner import run

    config = load_config(
        path,
        [f"output_dir={tmp_path}", "rounds=2", "eval_every=1", *extra],
    )
    return run(config, progress=False)


@pytest.mark.parametrize(
    "name", ["ms-pafl-tabular", "ms-pafl-tabular-dp-fedavg", "locks-digits"]
)
def test_small_presets_run(name, tmp_path):
    result = _train(PRESET_DIR / f"{name}.yaml", tmp_path)
    assert result.rounds_completed == 2
    assert 0.0 <= result.metrics["test_accuracy"] <= 1.0


ADULT_ROW = (
    "{age}, Private, 77516, Bachelors, 13, Never-married, Adm-clerical,"
    " Not-in-family, White, {sex}, 2174, 0, {hours}, United-States, {label}"
)


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_ms_pafl_adult_runs_on_files_in_adults_format(tmp_path, monkeypatch):
    # 300 training rows (3 per client) and 20 test rows, written as adult.data
    # and adult.test are (comma-separated, test labels end with ".").
    import numpy as np

    rng = np.random.default_rng(0)
    folder = tmp_path / "data" / "adult"
    folder.mkdir(parents=True)

    def rows(n: int, test: bool) -> str:
        out = []
        for _ in range(n):
            label = ">50K" if rng.random() < 0.3 else "<=50K"
            out.append(
                ADULT_ROW.format(
                    age=int(rng.integers(17, 90)),
                    sex="Male" if rng.random() < 0.6 else "Female",
                    hours=int(rng.integers(10, 70)),
                    label=label + ("." if test else ""),
                )
            )
        return "\n".join(out) + "\n"

    (folder / "adult.data").write_text(rows(300, False))
    (folder / "adult.test").write_text("|1x3 Cross validator\n" + rows(20, True))
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "data"))
    result = _train(PRESET_DIR / "ms-pafl-adult.yaml", tmp_path / "runs")
    assert result.rounds_completed == 2
    # the paper's d = 14 attributes, one weight each (no bias), one logit
    from dpfl.data import get_dataset

    config = load_config(PRESET_DIR / "ms-pafl-adult.yaml", [])
    assert config.data.partition == "label-subsets"
    data = get_dataset(
        "adult",
        num_clients=100,
        partition=config.data.partition,
        **config.data.options,
    )
    assert tuple(data.input_shape) == (14,)
    # every client holds one of the two labels, 3 records each (Li et al. §V-B:
    # uniformly distributed, each client holding a subset of the labels)
    labels = np.asarray(data.labels)
    per_client = [labels[np.asarray(i)] for i in data.client_indices]
    assert {len(set(c.tolist())) for c in per_client} == {1}
    assert 2 <= min(map(len, per_client)) <= max(map(len, per_client)) <= 4
    assert 0.0 <= result.metrics["test_accuracy"] <= 1.0
