"""``dpfl presets list|show|copy`` and preset names wherever a config is taken.

The presets are package data, so they must be found from the installed
package (the wheel test, ``test_wheel.py``, checks that from a fresh venv).
"""

from __future__ import annotations

import pytest

from dpfl.cli.main import main
from dpfl.experiments.presets import (
    PRESET_DIR,
    find_preset,
    list_presets,
    resolve_config,
)


def test_list_names_every_preset_with_its_header(capsys):
    assert main(["presets", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list_presets()
    assert len(lines) == len(list(PRESET_DIR.glob("*.yaml"))) >= 20
    row = next(line for line in lines if line.startswith("dp-fedavg-digits "))
    assert "DP-FedAvg" in row  # the header's first line


def test_show_prints_the_yaml_and_copy_writes_it(tmp_path, capsys):
    assert main(["presets", "show", "locks-digits"]) == 0
    text = (PRESET_DIR / "locks-digits.yaml").read_text()
    assert capsys.readouterr().out == text
    assert main(["presets", "copy", "locks-digits", str(tmp_path / "mine")]) == 0
    assert (tmp_path / "mine" / "locks-digits.yaml").read_text() == text
    assert "dpfl train" in capsys.readouterr().out
    # a second copy refuses to overwrite, in one line, unless --force
    assert main(["presets", "copy", "locks-digits", str(tmp_path / "mine")]) == 2
    assert "--force" in capsys.readouterr().err
    args = ["presets", "copy", "locks-digits", str(tmp_path / "mine"), "--force"]
    assert main(args) == 0


def test_an_unknown_name_says_did_you_mean(capsys):
    assert main(["presets", "show", "dp-fedavg-digit"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'dp-fedavg-digits'" in err and len(err.splitlines()) == 1


def test_train_takes_a_preset_name(tmp_path, capsys):
    pytest.importorskip("torch")
    assert main(["train", "fedavg-digits", "--check", "--out", str(tmp_path)]) == 0
    assert "fedavg-digits: valid" in capsys.readouterr().out
    assert main(["train", "fedavg-digts", "--check"]) == 2
    assert "did you mean 'fedavg-digits'" in capsys.readouterr().err


def test_resolve_config_prefers_a_file_and_leaves_paths_to_the_reader(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert resolve_config("locks-digits") == PRESET_DIR / "locks-digits.yaml"
    (tmp_path / "locks-digits").write_text("name: mine\n")
    assert resolve_config("locks-digits").resolve() == tmp_path / "locks-digits"
    # a path (a folder or a .yaml) that does not exist is the reader's to report
    assert str(resolve_config("nope/x.yaml")) == "nope/x.yaml"
    assert find_preset("locks-digits") == PRESET_DIR / "locks-digits.yaml"


def test_reproduce_check_validates_every_variant_without_running(tmp_path, capsys):
    out = tmp_path / "reports"
    args = ["reproduce", "locks", "--scale", "smoke", "--check", "--out", str(out)]
    assert main(args) == 0
    line = capsys.readouterr().out
    assert line.startswith("locks: valid: preset locks-digits") and "2 variants" in line
    # both experiments: Figure 1 and the stale norm against the current one
    assert "(LOCKS, uniform) x 2 seeds" in line and "(stale, current) x 2 seeds" in line
    assert not out.exists()  # nothing written
