"""Run configuration: YAML, --set overrides, validation messages, round trip."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml

from dpfl.errors import DpflError, InvalidParameterError
from dpfl.experiments.config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    load_config,
)
from dpfl.experiments.config_yaml import apply_overrides
from dpfl.experiments.presets import PRESET_DIR

EXAMPLE = PRESET_DIR / "digits-dsgd-rp.yaml"


def _error(data, overrides=()):
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, overrides)
    return str(info.value)


def test_defaults_and_example_file():
    cfg = config_from_dict({})
    assert cfg == RunConfig()
    assert cfg.privacy.noise_multiplier is None
    ex = load_config(EXAMPLE)
    assert ex.name == "digits-dsgd-rp"
    assert ex.data.records_per_client == 5
    assert ex.privacy.delta == 1e-5
    assert ex.run_dir == Path("runs") / "digits-dsgd-rp"


def test_unknown_key_suggests_closest():
    msg = _error({"round": 5})
    assert "'round'" in msg and "did you mean 'rounds'" in msg
    msg = _error({"algorithm": {"learning_rat": 0.1}})
    assert "'algorithm.params.learning_rat'" in msg
    assert "did you mean 'algorithm.params.learning_rate'" in msg
    # far from every key: no suggestion, but the known keys are listed
    msg = _error({"privacy": {"zzz": 1}})
    assert "privacy.zzz" in msg and "did you mean" not in msg and "analysis" in msg


def test_unknown_key_through_override():
    msg = _error({}, ["privacy.epsilom=3"])
    assert "privacy.epsilom" in msg and "privacy.epsilon" in msg


@pytest.mark.parametrize(
    ("data", "key", "shown"),
    [
        ({"rounds": "ten"}, "rounds", "'ten'"),
        ({"rounds": 2.5}, "rounds", "2.5"),
        ({"rounds": True}, "rounds", "True"),
        ({"data": {"num_clients": [1, 2]}}, "data.num_clients", "[1, 2]"),
        ({"privacy": {"epsilon": "lots"}}, "privacy.epsilon", "'lots'"),
        ({"privacy": {"noise_multiplier": "x"}}, "privacy.noise_multiplier", "'x'"),
        ({"model": {"options": 3}}, "model.options", "3"),
        ({"data": 7}, "data", "7"),
        ({"name": 12}, "name", "12"),
    ],
)
def test_wrong_type_names_key_and_value(data, key, shown):
    msg = _error(data)
    assert msg.startswith(key + " must be")
    assert shown in msg


@pytest.mark.parametrize(
    ("data", "key", "shown"),
    [
        ({"rounds": 0}, "rounds", "0"),
        (
            {"algorithm": {"participation_probability": 1.5}},
            "algorithm.params.participation_probability",
            "1.5",
        ),
        (
            {"algorithm": {"record_probability": 0}},
            "algorithm.params.record_probability",
            "0.0",
        ),
        ({"algorithm": {"momentum": 1.0}}, "algorithm.params.momentum", "1.0"),
        ({"algorithm": {"clip": -1}}, "algorithm.params.clip", "-1.0"),
        ({"algorithm": {"server": "semi"}}, "algorithm.params.server", "'semi'"),
        ({"privacy": {"delta": 1}}, "privacy.delta", "1"),
        ({"privacy": {"epsilon": 0}}, "privacy.epsilon", "0"),
        ({"privacy": {"analysis": "tight"}}, "privacy.analysis", "'tight'"),
        ({"privacy": {"noise_multiplier": -0.1}}, "privacy.noise_multiplier", "-0.1"),
        ({"data": {"records_per_client": 0}}, "data.records_per_client", "0"),
        ({"name": "a/b"}, "name", "'a/b'"),
        ({"device": "tpu"}, "device", "'tpu'"),
    ],
)
def test_out_of_range_names_key_and_value(data, key, shown):
    msg = _error(data)
    assert msg.startswith(key + " ")
    assert msg.endswith("got " + shown)


def test_errors_are_dpfl_errors():
    # the CLI turns DpflError into a one-line message and exit status 2
    assert issubclass(ConfigError, InvalidParameterError)
    assert issubclass(ConfigError, DpflError)


def test_overrides_are_parsed_as_yaml():
    cfg = config_from_dict(
        {"privacy": {"noise_multiplier": 1.5}},
        [
            "privacy.epsilon=2",  # int -> float field
            "privacy.noise_multiplier=null",
            "rounds=7",
            "data.options.beta=0.3",  # creates the nested mapping
            "model.options.hidden=[32, 16]",
            "algorithm.params.server=untrusted",
            "name=x=y",  # only the first '=' splits
        ],
    )
    assert cfg.privacy.epsilon == 2.0 and isinstance(cfg.privacy.epsilon, float)
    assert cfg.privacy.noise_multiplier is None
    assert cfg.rounds == 7
    assert cfg.data.options == {"beta": 0.3}
    assert cfg.model.options == {"hidden": [32, 16]}
    assert cfg.algorithm.params.server == "untrusted"
    assert cfg.name == "x=y"


def test_overrides_do_not_modify_input_and_bad_items():
    tree = {"algorithm": {"clip": 2.0}}
    out = apply_overrides(tree, ["algorithm.clip=3"])
    assert tree == {"algorithm": {"clip": 2.0}} and out["algorithm"]["clip"] == 3
    for bad in ["rounds", "=3", "a..b=1"]:
        with pytest.raises(ConfigError, match="key.sub=value"):
            apply_overrides({}, [bad])
    with pytest.raises(ConfigError, match="rounds.x"):
        apply_overrides({"rounds": 5}, ["rounds.x=1"])
    with pytest.raises(ConfigError, match="not YAML"):
        apply_overrides({}, ["rounds=[1"])


def test_yaml_11_exponent_strings_accepted_for_floats():
    # PyYAML (YAML 1.1) reads "1e-5" as a string; a float field accepts it
    cfg = config_from_dict(yaml.safe_load("privacy: {delta: 1e-5}"))
    assert cfg.privacy.delta == 1e-5


def test_infinite_epsilon_needs_a_noise_multiplier():
    msg = _error({"privacy": {"epsilon": math.inf}})
    assert "privacy.noise_multiplier" in msg
    cfg = config_from_dict(
        yaml.safe_load("privacy: {epsilon: .inf, noise_multiplier: 0}")
    )
    assert math.isinf(cfg.privacy.epsilon) and cfg.privacy.noise_multiplier == 0.0


def test_round_trip_and_frozen(tmp_path):
    cfg = load_config(EXAMPLE, ["privacy.noise_multiplier=1.25", "seed=3"])
    again = config_from_dict(cfg.to_dict())
    assert again == cfg
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    assert load_config(path) == cfg
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rounds = 3  # type: ignore[misc]
    assert cfg.replace(rounds=3).rounds == 3 and cfg.rounds == 100


def test_load_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    seq = tmp_path / "seq.yaml"
    seq.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(seq)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == RunConfig()
