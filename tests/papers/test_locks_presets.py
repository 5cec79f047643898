"""LOCKS against its uniform-sampling baseline, like for like (the Figure 1 presets).

The two presets must upload the same expected number of clients per round
(within 5 %) and charge the same expected client the same epsilon, under the
same budget. Both figures are computed from the configurations: the expected
uploads by :meth:`dpfl.sim.algorithms.locks.Locks.expected_uploads` (Monte
Carlo over the first stage and the norm noise, every update clipped to C as
measured at that learning rate, see the preset), the epsilon by composing an
expected client's Gaussian releases exactly in Gaussian DP (Dong, Roth & Su
2022, Corollary 3.3) and converting with :func:`dpfl.accounting.gaussian.gdp_epsilon`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from dpfl.accounting.gaussian import gdp_epsilon
from dpfl.experiments.config import load_config
from dpfl.experiments.presets import PRESET_DIR

pytest.importorskip("torch")

LOCKS = PRESET_DIR / "locks-fmnist.yaml"
UNIFORM = PRESET_DIR / "locks-fmnist-uniform.yaml"


def _expected(config, seed):
    """(expected uploads a round, expected client's epsilon after the run)."""
    from dpfl.sim.algorithms.base import DataStats
    from dpfl.sim.algorithms.locks import Locks

    p = config.algorithm.params
    k = config.data.num_clients
    sigma = config.privacy.noise_multiplier
    uploads = Locks.expected_uploads(
        p, DataStats(k, (600,) * k), sigma, rng=np.random.default_rng(seed)
    )
    # An expected client: in S1 (one noisy norm, std sigma_n C on a query in
    # [0, C]) T q1 times, in S2 (one noisy update, std sigma_g C, sensitivity
    # C under zero-out) T E|S2| / K times.
    norms = config.rounds * p.first_stage_probability
    updates = config.rounds * uploads / k
    mu = math.sqrt(norms / (p.norm_noise_ratio * sigma) ** 2 + updates / sigma**2)
    return uploads, gdp_epsilon(config.privacy.delta, mu=mu)


def test_locks_and_uniform_presets_are_like_for_like():
    locks = load_config(LOCKS, [])
    uniform = load_config(UNIFORM, [])
    # the same task, length and budget
    assert locks.data == uniform.data
    assert locks.model == uniform.model
    assert locks.rounds == uniform.rounds
    assert locks.privacy.epsilon == uniform.privacy.epsilon
    assert locks.privacy.delta == uniform.privacy.delta
    lp, up = locks.algorithm.params, uniform.algorithm.params
    for field in ("clip", "local_steps", "batch_size", "local_learning_rate"):
        assert getattr(lp, field) == getattr(up, field), field

    locks_uploads, locks_eps = _expected(locks, 0)
    uniform_uploads, uniform_eps = _expected(uniform, 1)
    # The baseline is uniform: every stage-1 client uploads (K q1, Monte
    # Carlo s.e. about 0.02 at 20,000 draws).
    k = uniform.data.num_clients
    assert uniform_uploads == pytest.approx(k * up.first_stage_probability, abs=0.1)
    # LOCKS's noisy norms make the cap p2 <= 1 bind: fewer than m2 uploads.
    assert locks_uploads < lp.second_stage_size
    # Like for like: uploads within 5 %, the expected client's epsilon within 1 %.
    assert uniform_uploads == pytest.approx(locks_uploads, rel=0.05)
    assert uniform_eps == pytest.approx(locks_eps, rel=0.01)
    assert locks_eps < locks.privacy.epsilon


def _variant(experiment, label):
    (overrides,) = [o for name, o in experiment.variants if name == label]
    return [*experiment.overrides, *overrides]


def test_reproduce_runs_the_two_presets_as_they_ship():
    # `dpfl reproduce locks` at the default (and paper) scale: its LOCKS
    # variant is preset locks-fmnist, its uniform variant preset
    # locks-fmnist-uniform, every setting alike but the run's name.
    from dpfl.papers.locks import _locks_experiment

    for scale in ("default", "paper"):
        experiment = _locks_experiment(scale)
        assert experiment.preset == "locks-fmnist"
        locks = load_config(LOCKS, _variant(experiment, "LOCKS"))
        uniform = load_config(LOCKS, _variant(experiment, "uniform"))
        assert dataclasses.replace(locks, name="x") == dataclasses.replace(
            load_config(LOCKS, []), name="x"
        )
        shipped = load_config(UNIFORM, [])
        assert dataclasses.replace(uniform, name="x") == dataclasses.replace(
            shipped, name="x"
        )
        # the keys the comparison rests on, spelled out
        up, sp = uniform.algorithm.params, shipped.algorithm.params
        assert up.first_stage_probability == sp.first_stage_probability == 0.075
        assert uniform.privacy.noise_multiplier == 1.39
        for key in (
            "second_stage_size",
            "norm_noise_ratio",
            "norm_floor",
            "clip",
            "server_learning_rate",
            "server_schedule",
        ):
            assert getattr(up, key) == getattr(sp, key), key
        # equal budget: the experiment does not lift it
        assert uniform.privacy.epsilon == locks.privacy.epsilon == 20.0


def test_smoke_scale_carries_the_baseline_over_to_digits():
    # locks-digits is locks-fmnist's algorithm and privacy on digits, so the
    # uniform preset's changes mean the same there.
    from dpfl.papers.locks import _locks_experiment

    experiment = _locks_experiment("smoke")
    digits = load_config(PRESET_DIR / "locks-digits.yaml", [])
    fmnist = load_config(LOCKS, [])
    assert digits.algorithm == fmnist.algorithm
    assert digits.privacy == fmnist.privacy
    assert digits.data.num_clients == fmnist.data.num_clients
    path = PRESET_DIR / f"{experiment.preset}.yaml"
    uniform = load_config(path, _variant(experiment, "uniform"))
    shipped = load_config(UNIFORM, [])
    assert uniform.algorithm == shipped.algorithm
    assert uniform.privacy == shipped.privacy
    assert uniform.rounds == 3


def test_preset_changes_refuses_a_setting_it_cannot_remove():
    # locks-fmnist has no norm floor, the uniform preset has one: the way
    # back cannot be written as --set items.
    from dpfl.errors import DpflError
    from dpfl.experiments.presets import preset_changes

    with pytest.raises(DpflError, match="norm_floor"):
        preset_changes("locks-fmnist-uniform", "locks-fmnist")


STALE = PRESET_DIR / "locks-fmnist-stale.yaml"


def _only_norm_source_differs(stale, current):
    # the two variants' configurations are equal once the norm source is set alike
    assert stale.algorithm.params.norm_source == "stale"
    assert current.algorithm.params.norm_source == "current"
    params = dataclasses.replace(current.algorithm.params, norm_source="stale")
    algorithm = dataclasses.replace(current.algorithm, params=params)
    assert dataclasses.replace(current, algorithm=algorithm) == stale


def test_reproduce_runs_the_stale_preset_against_the_current_norm():
    # `dpfl reproduce locks` at the default (and paper) scale: a second
    # experiment whose stale variant is preset locks-fmnist-stale as it ships
    # (budget on) and whose current variant changes only the norm source.
    from dpfl.papers.locks import PAPER

    for scale in ("default", "paper"):
        experiment = PAPER.reproduction.experiments(scale)[1]
        assert experiment.preset == "locks-fmnist-stale"
        assert [label for label, _ in experiment.variants] == ["stale", "current"]
        stale = load_config(STALE, _variant(experiment, "stale"))
        current = load_config(STALE, _variant(experiment, "current"))
        assert stale == load_config(STALE, [])
        _only_norm_source_differs(stale, current)
        assert current.privacy.epsilon == 20.0


def test_noise_free_ablation_isolates_the_norms_age_at_equal_uploads():
    # The third experiment at the default (and paper) scale: the stale task
    # with no noise at all, so stale and current differ only in the age of an
    # exactly released norm, and uniform sampling uploads as many clients a
    # round as LOCKS's second stage expects to (within 5 %).
    from dpfl.papers.locks import PAPER
    from dpfl.sim.algorithms.base import DataStats
    from dpfl.sim.algorithms.locks import Locks

    for scale in ("default", "paper"):
        experiment = PAPER.reproduction.experiments(scale)[2]
        assert experiment.preset == "locks-fmnist-stale"
        labels = [label for label, _ in experiment.variants]
        assert labels == [
            "stale (no noise)",
            "current (no noise)",
            "uniform (no noise)",
        ]
        configs = {
            label: load_config(STALE, _variant(experiment, label)) for label in labels
        }
        for config in configs.values():
            assert config.privacy.noise_multiplier == 0
            assert config.privacy.epsilon == math.inf
            assert config.rounds == load_config(STALE, []).rounds
        _only_norm_source_differs(
            configs["stale (no noise)"], configs["current (no noise)"]
        )
        locks, uniform = configs["current (no noise)"], configs["uniform (no noise)"]
        assert locks.data == uniform.data and locks.model == uniform.model
        k = locks.data.num_clients
        stats = DataStats(k, (600,) * k)
        # the clients' update norms on this task lie in 0.5-0.8 (the preset)
        norms = np.random.default_rng(1).uniform(0.5, 0.8, size=k)
        locks_uploads = Locks.expected_uploads(
            locks.algorithm.params,
            stats,
            0.0,
            rng=np.random.default_rng(2),
            norms=norms,
        )
        uniform_uploads = Locks.expected_uploads(
            uniform.algorithm.params, stats, 0.0, rng=np.random.default_rng(3)
        )
        assert uniform_uploads == pytest.approx(locks_uploads, rel=0.05)
        assert uniform_uploads == pytest.approx(10.0, rel=0.01)  # K q1


def test_smoke_scale_carries_the_stale_task_over_to_digits():
    # At smoke scale both variants are locks-digits with the stale preset's
    # changes to locks-fmnist (shards, local step 0.05, the stale norm); the
    # current variant differs only in the norm source.
    from dpfl.papers.locks import PAPER

    experiments = PAPER.reproduction.experiments("smoke")
    assert len(experiments) == 2  # no noise-free ablation at smoke scale
    experiment = experiments[1]
    assert experiment.preset == "locks-digits"
    path = PRESET_DIR / "locks-digits.yaml"
    stale = load_config(path, _variant(experiment, "stale"))
    current = load_config(path, _variant(experiment, "current"))
    _only_norm_source_differs(stale, current)
    shipped = load_config(STALE, [])
    assert stale.algorithm == shipped.algorithm
    assert stale.privacy == shipped.privacy
    assert stale.data.partition == shipped.data.partition == "shards"
    assert stale.data.options["shards_per_client"] == 2
    assert stale.data.name == "digits" and stale.rounds == 10


def test_smoke_stale_task_keeps_every_update_below_the_clip_norm():
    # The stale and current norms differ only where updates are not clipped:
    # at the smoke task's first round every client's update (E = 5 steps of
    # 0.05 from the initial model) is below C = 1, so stage 2 sees norms that
    # vary by client and by round (measured 0.40-0.75; at locks-digits's own
    # step 0.5 they are 1.5-2.2, all clipped to C).
    import torch

    from dpfl.experiments.build import build_algorithm, build_dataset
    from dpfl.papers.locks import PAPER

    _, experiment = PAPER.reproduction.experiments("smoke")
    path = PRESET_DIR / "locks-digits.yaml"
    clip = load_config(path, _variant(experiment, "stale")).algorithm.params.clip
    config = load_config(
        path, [*_variant(experiment, "stale"), "algorithm.params.clip=1e9"]
    )
    dataset = build_dataset(config)
    torch.manual_seed(0)
    alg = build_algorithm(config, dataset)
    k = config.data.num_clients
    rngs = [np.random.default_rng(c) for c in range(k)]
    norms = alg.clipped_updates(alg.weights, np.arange(k), rngs).norm(dim=1)
    assert clip == 1.0
    assert float(norms.max()) < clip
    assert float(norms.min()) > 0.1  # the norms vary, none near 0
