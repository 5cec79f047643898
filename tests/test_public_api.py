"""Every public module's __all__ names something real, and the README snippet runs."""

import importlib
import re
from pathlib import Path

import pytest

MODULES = [
    "dpfl.accounting",
    "dpfl.accounting.accountant",
    "dpfl.accounting.bounds",
    "dpfl.accounting.calibrate",
    "dpfl.accounting.checkin",
    "dpfl.accounting.composition",
    "dpfl.accounting.events",
    "dpfl.accounting.fdp",
    "dpfl.accounting.gaussian",
    "dpfl.accounting.ledger",
    "dpfl.accounting.participation",
    "dpfl.accounting.pld",
    "dpfl.accounting.rdp",
    "dpfl.data",
    "dpfl.errors",
    "dpfl.cli",
    "dpfl.sim.grad",
    "dpfl.sim.grad.layers",
    "dpfl.sim.local",
]


@pytest.mark.parametrize("name", MODULES)
def test_all_names_exist(name):
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported, f"{name} has no __all__"
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ lists missing names {missing}"


def test_readme_python_snippet_runs():
    readme = Path(__file__).resolve().parents[1] / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102
    bound = namespace["bound"]
    assert 0 < bound.lower <= bound.upper
    # The training example: three rounds through the batched executor.
    assert len(blocks) >= 2, "README has no training example"
    namespace = {}
    exec(compile(blocks[1], "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["trainer"].round == 3
    assert namespace["trainer"].ledger.rounds == 3
