"""A model and a loss of the user's own code, named in a configuration.

The user's module (``tiny_runs.USER_CODE``) is written into ``tmp_path`` by each
test and put on ``sys.path`` and ``PYTHONPATH``, as an installed package or a
folder on ``PYTHONPATH`` would be: ``model.factory`` / ``loss.factory`` name it
as ``MODULE:make_model``. Checked: the configuration's errors (one line naming
the key and the value), ``dpfl train --check`` (the import, the output against
the data's classes, the loss run on two records), a 2-round run with the
factory's file hash in ``run.json``, ``dpfl resume`` refusing a changed file,
a sweep of 2 variants in worker processes, and the check a Ray worker makes of
the user's modules before it unpickles a replica. Flower and Ray runs:
``test_flower.py`` and ``test_ray.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpfl.errors import DpflError, InvalidParameterError
from dpfl.experiments import ConfigError, config_from_dict, resume, run, run_sweep
from dpfl.experiments.build import build_algorithm, build_dataset, prepare
from tiny_runs import tiny_config, user_code

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def mod(tmp_path, monkeypatch):
    """The name of a fresh module of the user's code (on sys.path, PYTHONPATH)."""
    return user_code(tmp_path / "code", monkeypatch)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _factory_tree(tmp_path: Path, mod: str, **top) -> dict:
    tree = tiny_config(tmp_path, rounds=2, eval_every=1).to_dict()
    tree["model"] = {"factory": f"{mod}:make_model", "options": {"hidden": 6}}
    tree.update(top)
    return tree


# -- the configuration -----------------------------------------------------------
def test_the_configuration_records_the_factorys_file(tmp_path, mod):
    path = tmp_path / "code" / f"{mod}.py"
    cfg = config_from_dict(
        _factory_tree(
            tmp_path, mod, loss={"factory": f"{mod}:make_loss", "options": {}}
        )
    )
    assert cfg.model.factory == f"{mod}:make_model"
    assert cfg.model.factory_sha256 == _sha(path)
    assert cfg.loss is not None and cfg.loss.factory_sha256 == _sha(path)
    tree = cfg.to_dict()
    assert tree["model"] == {
        "factory": f"{mod}:make_model",
        "options": {"hidden": 6},
        "factory_sha256": _sha(path),
    }
    assert config_from_dict(tree) == cfg  # the recorded hash reads back
    # a built-in model's section is what it was: name and options
    builtin = tiny_config(tmp_path).to_dict()
    assert builtin["model"] == {"name": "mlp", "options": {"hidden": 8}}
    assert builtin["loss"] is None


def test_naming_a_factory_anew_takes_its_file_as_it_is(tmp_path, mod):
    # a recorded hash belongs to the factory named when it was recorded: a
    # --set or a sweep point that names a model anew drops it
    path = tmp_path / "code" / f"{mod}.py"
    recorded = config_from_dict(_factory_tree(tmp_path, mod)).to_dict()
    path.write_text(path.read_text() + "\n# edited\n")
    with pytest.raises(ConfigError, match="changed since the configuration"):
        config_from_dict(recorded)
    again = config_from_dict(recorded, [f"model.factory={mod}:make_model"])
    assert again.model.factory_sha256 == _sha(path)
    builtin = config_from_dict(
        recorded, ["model.factory=null", "model.name=mlp", "model.options={}"]
    )
    assert builtin.to_dict()["model"] == {"name": "mlp", "options": {}}


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"model": {"factory": "no_such_module_x:make"}},
            r"^model\.factory: no module named 'no_such_module_x' can be imported "
            r".*PYTHONPATH.*; got 'no_such_module_x:make'$",
        ),
        (
            {"model": {"factory": "MOD:make_modle"}},
            r"^model\.factory: 'MOD' has no attribute 'make_modle'; did you mean "
            r"'MOD:make_model'\?",
        ),
        (
            {"model": {"factory": "MOD.make_model"}},
            r"^model\.factory must be 'package\.module:name'.*got 'MOD\.make_model'$",
        ),
        (
            {"model": {"factory": "MOD:Net", "options": {}}},
            r"^model\.options\.features is required by model\.factory",
        ),
        (
            {"model": {"factory": "MOD:make_model", "options": {"hiden": 4}}},
            r"^unknown configuration key 'model\.options\.hiden'; did you mean "
            r"'model\.options\.hidden'\?",
        ),
        (
            {"model": {"factory": "MOD:make_model", "options": {"hidden": "x"}}},
            r"^model\.options\.hidden must be an integer.*got 'x'",
        ),
        (
            {"model": {"factory": "MOD:make_model", "options": {"num_classes": 3}}},
            r"^model\.options\.num_classes is set by the data",
        ),
        (
            {"model": {"name": "mlp", "factory": "MOD:make_model"}},
            r"^model\.name and model\.factory are exclusive",
        ),
        (
            {"model": {"factory": "MOD:make_model", "factory_sha256": "0" * 64}},
            r"MOD\.py changed since the configuration recorded it \(model\.factory "
            r"'MOD:make_model' is defined there; SHA-256 0000000000000000\.\.\. "
            r"recorded",
        ),
        ({"loss": {"options": {}}}, r"^loss\.factory is required in a loss section"),
        (
            {"loss": {"factory": "MOD:make_loss", "options": {"smooth": 0.1}}},
            r"^unknown configuration key 'loss\.options\.smooth'; did you mean "
            r"'loss\.options\.smoothing'\?",
        ),
    ],
)
def test_configuration_errors_name_the_key_and_the_value(
    tmp_path, mod, section, message
):
    tree = tiny_config(tmp_path).to_dict()
    tree.update(json.loads(json.dumps(section).replace("MOD", mod)))
    with pytest.raises(ConfigError, match=message.replace("MOD", mod)) as info:
        config_from_dict(tree)
    assert "\n" not in str(info.value)


def test_the_check_runs_the_model_and_the_loss_on_two_records(tmp_path, mod):
    tree = _factory_tree(tmp_path, mod)
    tree["model"] = {"factory": f"{mod}:three_outputs"}
    with pytest.raises(
        InvalidParameterError,
        match=rf"^model\.factory '{mod}:three_outputs' must output \[batch, "
        r"num_classes\] scores for the data's 10 classes; got output of shape "
        r"\(2, 3\)",
    ):
        prepare(config_from_dict(tree))
    tree = _factory_tree(tmp_path, mod, loss={"factory": f"{mod}:mse"})
    with pytest.raises(
        InvalidParameterError,
        match=rf"^loss\.factory '{mod}:mse' must take the model's output",
    ):
        prepare(config_from_dict(tree))


def _write_yaml(path: Path, tree: dict) -> Path:
    path.write_text(json.dumps(tree))  # JSON is YAML
    return path


def test_train_check_from_the_command_line(tmp_path, mod):
    config = _write_yaml(
        tmp_path / "run.yaml",
        _factory_tree(
            tmp_path, mod, loss={"factory": f"{mod}:make_loss", "options": {}}
        ),
    )
    argv = [sys.executable, "-m", "dpfl.cli", "train", str(config), "--check"]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    # 64 inputs -> 6 hidden -> 10 classes: 64*6 + 6 + 6*10 + 10 parameters
    assert "valid" in done.stdout and "460 model parameters" in done.stdout
    # without the module's folder on PYTHONPATH: one line, the key and the value
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.factory: no module named" in lines[0]
    assert f"got '{mod}:make_model'" in lines[0]


# -- runs --------------------------------------------------------------------------
def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    return state["trainer"]["algorithm"]["model"]


def test_a_run_trains_the_factorys_model_with_its_loss(tmp_path, mod):
    path = tmp_path / "code" / f"{mod}.py"
    seeded = {"noise_multiplier": 1.0, "epsilon": float("inf"), "secure_noise": False}

    def train(name, loss):
        tree = _factory_tree(tmp_path, mod, name=name, loss=loss)
        tree["privacy"].update(seeded)
        return run(config_from_dict(tree), progress=False)

    plain = train("plain", None)
    same = train("same", {"factory": f"{mod}:make_loss", "options": {}})
    smoothed = train(
        "smooth", {"factory": f"{mod}:make_loss", "options": {"smoothing": 0.5}}
    )
    assert plain.rounds_completed == smoothed.rounds_completed == 2
    manifest = json.loads((smoothed.run_dir / "run.json").read_text())
    assert manifest["frozen"]["model"]["factory"] == f"{mod}:make_model"
    assert manifest["frozen"]["model"]["factory_sha256"] == _sha(path)
    assert manifest["frozen"]["loss"] == {
        "factory": f"{mod}:make_loss",
        "options": {"smoothing": 0.5},
        "factory_sha256": _sha(path),
    }
    assert "loss" not in json.loads((plain.run_dir / "run.json").read_text())["frozen"]
    w_plain, w_same = _weights(plain.run_dir), _weights(same.run_dir)
    assert set(w_plain) == {"hidden.weight", "hidden.bias", "out.weight", "out.bias"}
    assert w_plain["hidden.weight"].shape == (6, 64)  # the factory's, hidden 6
    # cross-entropy without smoothing is the built-in loss: the same run; with
    # smoothing the loss is another one, and so is the model
    for k in w_plain:
        torch.testing.assert_close(w_same[k], w_plain[k], rtol=0, atol=0)
    assert not torch.equal(
        _weights(smoothed.run_dir)["out.weight"], w_plain["out.weight"]
    )


def test_resume_refuses_a_changed_factory_file(tmp_path, mod):
    path = tmp_path / "code" / f"{mod}.py"
    done = run(config_from_dict(_factory_tree(tmp_path, mod)), progress=False)
    original = path.read_text()
    path.write_text(original + "\n# an edit after the run started\n")
    with pytest.raises(ConfigError) as info:
        resume(done.run_dir, progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path.resolve()} changed since the configuration")
    assert "model.factory" in message
    # config.yaml given the new file's hash: refused against run.json
    config_yaml = done.run_dir / "config.yaml"
    text = config_yaml.read_text()
    config_yaml.write_text(text.replace(_sha_text(original), _sha(path)))
    with pytest.raises(
        DpflError, match=r"config\.yaml no longer matches.*factory_sha256"
    ):
        resume(done.run_dir, progress=False)
    config_yaml.write_text(text)
    path.write_text(original)  # the file restored: the run resumes (it is done)
    again = resume(done.run_dir, progress=False)
    assert again.rounds_completed == 2


def _sha_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize(
    "jobs",
    [
        1,
        # spawned worker processes import the factory as this process does
        # (they get its sys.path); slow: each imports torch (30+ s here)
        pytest.param(2, marks=pytest.mark.slow),
    ],
)
def test_a_sweep_of_two_variants(tmp_path, mod, jobs):
    result = run_sweep(
        _factory_tree(tmp_path, mod),
        [0],
        grid={"model.options.hidden": [3, 5]},
        out=tmp_path / "sweep",
        jobs=jobs,
    )
    assert [r.get("error") for r in result.runs] == [None, None]
    for r, hidden in zip(result.runs, [3, 5], strict=True):
        run_dir = tmp_path / "sweep" / r["run_dir"]
        frozen = json.loads((run_dir / "run.json").read_text())["frozen"]
        assert frozen["model"]["options"] == {"hidden": hidden}
        assert _weights(run_dir)["hidden.weight"].shape == (hidden, 64)


# -- what a Ray worker checks --------------------------------------------------------
def test_a_worker_imports_the_users_modules_and_refuses_another_file(tmp_path, mod):
    from dpfl.integrations.ray_worker import check_code, code_of

    path = tmp_path / "code" / f"{mod}.py"
    tree = _factory_tree(
        tmp_path, mod, loss={"factory": f"{mod}:make_loss", "options": {}}
    )
    config = config_from_dict(tree)
    algorithm = build_algorithm(config, build_dataset(config))
    code = code_of(algorithm)
    assert code == [(mod, _sha(path))]  # the model's and the loss's module, once
    check_code(code, "here")  # the same file: accepted
    refused = f"{path} on the Ray worker on here is not the driver's file of module"
    with pytest.raises(DpflError, match="^" + re.escape(refused)):
        check_code([(mod, "0" * 64)], "here")
    with pytest.raises(DpflError, match=r"cannot import module 'no_such_mod_y'"):
        check_code([("no_such_mod_y", "0" * 64)], "here")
    # built-in models and losses name no module of the user's
    builtin = tiny_config(tmp_path)
    assert code_of(build_algorithm(builtin, build_dataset(builtin))) == []


def test_the_docs_example_is_a_valid_run(tmp_path, monkeypatch):
    # the module and configuration of "Your own model and loss in a
    # configuration" (docs/getting-started.md), as a user copies them
    import yaml

    page = (ROOT / "docs" / "getting-started.md").read_text()
    section = page.split("### Your own model and loss in a configuration")[1]
    section = section.split("\n### ")[0]
    (module,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    config = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)[0]
    (tmp_path / "mymodels.py").write_text(module)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        tree = yaml.safe_load(config)
        tree["output_dir"] = str(tmp_path / "runs")
        # a given sigma: the page's --check calibrates it (2.385, tens of seconds)
        tree["privacy"].update(noise_multiplier=2.385)
        prepared = prepare(config_from_dict(tree))
        assert prepared.parameters == 2410  # what the page says --check prints
        assert "2410 model parameters, noise multiplier 2.385" in section.replace(
            "\n# ", " "
        )
    finally:
        sys.modules.pop("mymodels", None)
