import subprocess
import sys

import pytest

from dpfl.accounting import events as ev
from dpfl.errors import InvalidParameterError


def test_roundtrip_and_hashable():
    e = ev.ClientPoisson(0.001, ev.RecordPoisson(0.1, 30, ev.Gaussian(2.5)))
    assert ev.event_from_dict(ev.event_to_dict(e)) == e
    assert (
        len({e, ev.ClientPoisson(0.001, ev.RecordPoisson(0.1, 30, ev.Gaussian(2.5)))})
        == 1
    )


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: ev.Gaussian(0.0), "noise_multiplier"),
        (lambda: ev.PoissonSampled(1.5, ev.Gaussian(1.0)), "sampling_probability"),
        (lambda: ev.ClientPoisson(0.0, ev.Gaussian(1.0)), "participation_probability"),
        (lambda: ev.RecordPoisson(0.1, -1, ev.Gaussian(1.0)), "records_per_client"),
        (lambda: ev.FixedCohort(11, 10, ev.Gaussian(1.0)), "cohort_size"),
        (lambda: ev.SelfComposed(ev.Gaussian(1.0), 0), "count"),
        (lambda: ev.event_from_dict({"type": "Nope"}), "event type"),
    ],
)
def test_invalid_parameters_name_the_parameter(make, name):
    with pytest.raises(InvalidParameterError, match=name):
        make()


def test_accounting_imports_neither_torch_nor_ray_nor_flower():
    # Every module of dpfl.accounting (and the CLI's entry point) imports
    # without the training or distribution extras: `pip install dpfl` then
    # `dpfl account ...` must work on a machine without torch, ray or flwr.
    code = (
        "import sys, pkgutil, importlib, dpfl.accounting, dpfl.cli.main\n"
        "names = [m.name for m in pkgutil.walk_packages("
        "dpfl.accounting.__path__, 'dpfl.accounting.')]\n"
        "assert len(names) > 10, names\n"
        "for name in names: importlib.import_module(name)\n"
        "bad = sorted({'torch', 'ray', 'flwr'} & set(sys.modules))\n"
        "assert not bad, f'dpfl.accounting imported {bad}'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_simulator_does_not_import_ray_or_flower():
    # Ray and Flower are optional extras: the simulator, the runner and the
    # CLI load them only when a run asks for them.
    code = (
        "import sys, dpfl.sim.loop, dpfl.sim.algorithms, dpfl.experiments.runner, "
        "dpfl.cli.main\n"
        "bad = sorted({'ray', 'flwr'} & set(sys.modules))\n"
        "assert not bad, f'imported {bad}'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
