"""Calibration speed: the noise multiplier of every preset for its own budget.

For each preset with a budget, times what ``dpfl train PRESET --set
privacy.noise_multiplier=null`` does before its first round: build the data,
read the algorithm's event at sigma = 1, and calibrate sigma with
``dpfl.accounting.calibrate.calibrate_noise_multiplier`` under the preset's
analysis and the ledger's bracket (planning, for per-participant schemes, for
the most active client). Target: under 30 s each on a 2-core machine.

Run: python benchmarks/calibration.py [--presets NAME ...]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

from dpfl.experiments import load_config
from dpfl.experiments.build import build_dataset
from dpfl.experiments.presets import resolve_config
from dpfl.experiments.privacy import resolve_privacy

PRESETS = [
    "digits-dsgd-rp",
    "dp-fedavg-digits",
    "ms-pafl-tabular",
    "prifedsync-digits",
    "locks-digits",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="*", default=PRESETS)
    args = parser.parse_args()
    print(f"# python {' '.join(sys.argv)}")
    print(f"# {platform.platform()}, python {platform.python_version()}")
    print(f"{'preset':<36} {'analysis':<9} {'rounds':>6} {'sigma':>8} {'seconds':>8}")
    for name in args.presets:
        cfg = load_config(resolve_config(name), ["privacy.noise_multiplier=null"])
        dataset = build_dataset(cfg)
        t0 = time.perf_counter()
        resolved = resolve_privacy(cfg, dataset)
        seconds = time.perf_counter() - t0
        print(
            f"{name:<36} {resolved.privacy.analysis:<9} {cfg.rounds:>6} "
            f"{resolved.privacy.noise_multiplier:>8.4f} {seconds:>8.1f}"
        )


if __name__ == "__main__":
    main()
