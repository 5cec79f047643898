"""The ``python`` code blocks of docs/data.md run, in order, in one namespace.

Blocks fenced ``py`` (the flwr-datasets adapter, which needs a package dpfl
does not depend on) and ``yaml``/``text`` blocks are not run; the YAML blocks
are parsed as run configurations instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dpfl.experiments.config import config_from_dict

DOC = Path(__file__).resolve().parents[2] / "docs" / "data.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), re.M | re.S)


def test_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPFL_DATA", str(tmp_path / "none"))
    blocks = _blocks("python")
    assert len(blocks) >= 8
    namespace: dict[str, object] = {}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"docs/data.md block {i}", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the failure report
            pytest.fail(f"docs/data.md python block {i} failed: {exc!r}\n{code}")


def test_yaml_blocks_are_valid_configs():
    blocks = _blocks("yaml")
    assert len(blocks) >= 4
    for code in blocks:
        config_from_dict(yaml.safe_load(code))
