"""dpfl's DP-SGD numbers beside Opacus's and dp_accounting's, on the same settings.

Prints the Markdown tables of the docs page ``docs/dp-sgd.md``: for each
setting (Poisson rate q, noise multiplier σ, steps T, δ = 1e-5), ε from

* ``dpfl account dp-sgd`` (every analysis: exact, rdp, gdp-clt; and the
  fixed-batch sampler's exact, rdp and as-poisson rows);
* dp_accounting's PLD accountant (connect-the-dots, value discretisation
  1e-4) and its RDP accountant;
* Opacus's ``rdp``, ``prv`` and ``gdp`` accountants, if Opacus is
  importable (``pip install --no-deps opacus``: it needs torch, which the
  ``[train]`` extra installs; without it those rows say "not installed");

then σ for a target ε from each calibrator, with the seconds each took.

Usage::

    python tools/dp_sgd_accountants.py            # about a minute or two
    python tools/dp_sgd_accountants.py --no-calibration
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import platform
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpfl.accounting._quiet import quiet
from dpfl.cli.main import build_parser

DELTA = 1e-5

#: name -> (description, q, sigma, steps, fixed batch (B, n) of the same rate)
SETTINGS = {
    "A": ("a short run: q = 1/38, 190 steps (5 epochs)", 1 / 38, 0.91, 190, (10, 380)),
    "B": (
        "Abadi et al. (2016) on MNIST: B = 256 of 60,000, 14,062 steps (60 epochs)",
        256 / 60000,
        1.1,
        14062,
        (256, 60000),
    ),
    "C": ("few steps, large q: q = 0.5, 10 steps", 0.5, 1.0, 10, (50, 100)),
}

#: setting -> target ε for the calibration table
TARGETS = {"A": 3.0, "B": 2.0}


def _timed(f: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = f()
    return value, time.perf_counter() - start


def _dpfl(argv: list[str]) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    with quiet():
        return dict(args.handler(args).result)


def _dpfl_account(q: float, sigma: float, t: int, analysis: str) -> float:
    argv = ["account", "dp-sgd", "--q", repr(q), "--steps", str(t)]
    argv += ["--noise-multiplier", repr(sigma), "--analysis", analysis]
    argv += ["--delta", repr(DELTA), "--json"]
    return float(_dpfl(argv)["epsilon"])


def _dpfl_fixed(b: int, n: int, sigma: float, t: int, analysis: str) -> float:
    argv = ["account", "dp-sgd", "--sampling", "fixed", "--batch-size", str(b)]
    argv += ["--dataset-size", str(n), "--steps", str(t), "--analysis", analysis]
    argv += ["--noise-multiplier", repr(sigma), "--delta", repr(DELTA), "--json"]
    return float(_dpfl(argv)["epsilon"])


def _dp_accounting(q: float, sigma: float, t: int, kind: str) -> float:
    one = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))
    acc: Any
    if kind == "pld":
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    else:
        acc = rdp_privacy_accountant.RdpAccountant()
    with quiet():
        acc.compose(dp_event.SelfComposedDpEvent(one, t))
        return float(acc.get_epsilon(DELTA))


def _dpfl_calibrate(q: float, t: int, target: float, analysis: str) -> float:
    argv = ["calibrate", "dp-sgd", "--q", repr(q), "--steps", str(t)]
    argv += ["--epsilon", repr(target), "--delta", repr(DELTA)]
    argv += ["--analysis", analysis, "--json"]
    return float(_dpfl(argv)["noise_multiplier"])


def _opacus_sigma(q: float, t: int, target: float, kind: str) -> float:
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(
            get_noise_multiplier(
                target_epsilon=target,
                target_delta=DELTA,
                sample_rate=q,
                steps=t,
                accountant=kind,
            )
        )


def _opacus() -> Any:
    try:
        import opacus.accountants as accountants
    except ImportError:
        return None
    return accountants


def _opacus_epsilon(mod: Any, kind: str, q: float, sigma: float, t: int) -> float:
    acc = mod.create_accountant(kind)
    acc.history = [(sigma, q, t)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(DELTA))


def _cell(value: float | None, seconds: float | None) -> str:
    if value is None:
        return "not installed | —"
    return f"{value:.5g} | {seconds:.1f}"


def account_table() -> list[str]:
    """ε per accountant and setting, with seconds."""
    mod = _opacus()
    lines = []
    for key, (what, q, sigma, t, (b, n)) in SETTINGS.items():
        lines += [
            f"**Setting {key}**: {what}; σ = {sigma}, δ = {DELTA:g}.",
            "",
            "| accountant | status | ε | seconds |",
            "|---|---|---|---|",
        ]
        op = None if mod is None else functools.partial(_opacus_epsilon, mod)
        rows: list[tuple[str, str, Callable[[], float] | None]] = [
            (
                "dpfl `exact` (PLD, certified)",
                "proven",
                functools.partial(_dpfl_account, q, sigma, t, "exact"),
            ),
            (
                "dp_accounting PLD",
                "proven",
                functools.partial(_dp_accounting, q, sigma, t, "pld"),
            ),
            (
                "Opacus `prv`",
                "proven (numerical error bounded)",
                op and functools.partial(op, "prv", q, sigma, t),
            ),
            (
                "dpfl `rdp`",
                "proven, looser",
                functools.partial(_dpfl_account, q, sigma, t, "rdp"),
            ),
            (
                "dp_accounting RDP",
                "proven, looser",
                functools.partial(_dp_accounting, q, sigma, t, "rdp"),
            ),
            (
                "Opacus `rdp`",
                "proven, looser",
                op and functools.partial(op, "rdp", q, sigma, t),
            ),
            (
                "dpfl `gdp-clt`",
                "invalid (an estimate)",
                functools.partial(_dpfl_account, q, sigma, t, "gdp-clt"),
            ),
            (
                "Opacus `gdp`",
                "invalid (an estimate)",
                op and functools.partial(op, "gdp", q, sigma, t),
            ),
            (
                f"dpfl fixed batch {b} of {n}, `exact` (replace-one)",
                "proven",
                functools.partial(_dpfl_fixed, b, n, sigma, t, "exact"),
            ),
            (
                f"dpfl fixed batch {b} of {n}, `rdp` (replace-one)",
                "proven, looser",
                functools.partial(_dpfl_fixed, b, n, sigma, t, "rdp"),
            ),
            (
                f"dpfl Poisson at σ/2 = {sigma / 2:g}, `exact`",
                "proven",
                functools.partial(_dpfl_account, q, sigma / 2, t, "exact"),
            ),
        ]
        for name, status, f in rows:
            value, seconds = (None, None) if f is None else _timed(f)
            lines.append(f"| {name} | {status} | {_cell(value, seconds)} |")
        lines.append("")
    return lines


def calibration_table() -> list[str]:
    """σ for a target ε per calibrator, with seconds."""
    mod = _opacus()
    lines = ["| setting | calibrator | σ | seconds |", "|---|---|---|---|"]
    for key, target in TARGETS.items():
        _, q, _, t, _ = SETTINGS[key]
        label = f"{key}, ε = {target:g}"

        rows: list[tuple[str, Callable[[], float] | None]] = [
            (
                f"dpfl `{a}`" + (" (invalid)" if a == "gdp-clt" else ""),
                functools.partial(_dpfl_calibrate, q, t, target, a),
            )
            for a in ("exact", "rdp", "gdp-clt")
        ]
        for kind in ("prv", "rdp", "gdp"):
            rows.append(
                (
                    f"Opacus `{kind}`",
                    None
                    if mod is None
                    else functools.partial(_opacus_sigma, q, t, target, kind),
                )
            )
        for name, f in rows:
            value, seconds = (None, None) if f is None else _timed(f)
            lines.append(f"| {label} | {name} | {_cell(value, seconds)} |")
    return lines


def main() -> None:
    """Print the tables, then the command and the machine."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-calibration", action="store_true")
    args = parser.parse_args()
    mod = _opacus()
    version = None if mod is None else importlib.metadata.version("opacus")
    print("\n".join(account_table()))
    if not args.no_calibration:
        print("\n".join(calibration_table()))
    print()
    print(
        f"`python {' '.join(['tools/dp_sgd_accountants.py', *sys.argv[1:]])}`; "
        f"Python {platform.python_version()}, dp_accounting "
        f"{importlib.metadata.version('dp-accounting')}, Opacus "
        f"{version or 'not installed'}."
    )


if __name__ == "__main__":
    main()
