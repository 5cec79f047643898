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


def test_accounting_does_not_import_torch():
    code = (
        "import sys, dpfl.accounting, dpfl.accounting.accountant, "
        "dpfl.accounting.ledger, dpfl.cli; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
