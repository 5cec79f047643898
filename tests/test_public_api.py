"""Every public module's __all__ names something real.

The README's code blocks run in tests/test_docs.py.
"""

import importlib

import pytest

MODULES = [
    "dpfl.accounting",
    "dpfl.accounting.accountant",
    "dpfl.accounting.bounds",
    "dpfl.accounting.calibrate",
    "dpfl.accounting.checkin",
    "dpfl.accounting.checkin_global",
    "dpfl.accounting.composition",
    "dpfl.accounting.costs",
    "dpfl.accounting.events",
    "dpfl.accounting.fdp",
    "dpfl.accounting.gaussian",
    "dpfl.accounting.chain",
    "dpfl.accounting.ledger",
    "dpfl.accounting.spend",
    "dpfl.accounting.participation",
    "dpfl.accounting.pld",
    "dpfl.accounting.rdp",
    "dpfl.data",
    "dpfl.errors",
    "dpfl.cli.main",
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
