"""Accounting speed: epsilon after 10,000 rounds, with the upper/lower bracket.

Prints, for (1) random participation (sound analysis, scenario 1 of
random-participation.txt: d = 30, p = 0.001, q = 0.1, sigma = 2.5) and (2) a
Poisson-subsampled Gaussian (q = 1e-4, sigma = 2.5), the time dpfl takes to
compute epsilon at delta = 1e-6 after 10,000 rounds and how far apart its upper
and lower bounds are, beside dp_accounting's own time for (2).
Target (issue 2): <= 1 s each on a 2-core machine, bounds <= 2% apart.

Run: python benchmarks/accounting.py [--rounds 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import functools
import logging
import platform
import sys
import time

from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpfl.accounting import participation
from dpfl.accounting.accountant import Accountant, _cached_price
from dpfl.accounting.events import Gaussian, PoissonSampled


def best_time(fn, repeats):
    best, value = float("inf"), None
    for _ in range(repeats):
        for cache in (_cached_price,):  # measure cold: no cached one-round PLDs
            cache.cache_clear()
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10_000)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    logging.disable(logging.WARNING)

    rp = functools.partial(
        participation.epsilon,
        a.delta,
        rounds=a.rounds,
        participation_probability=0.001,
        record_probability=0.1,
        records_per_client=30,
        noise_multiplier=2.5,
        analysis="sound",
    )
    t_rp, b_rp = best_time(rp, a.repeats)

    event = PoissonSampled(1e-4, Gaussian(2.5))
    ps = lambda: Accountant().compose(event, a.rounds).epsilon(a.delta)  # noqa: E731
    t_ps, b_ps = best_time(ps, a.repeats)

    def reference():
        pld = pld_lib.from_gaussian_mechanism(
            2.5, sampling_prob=1e-4, value_discretization_interval=1e-6
        )
        return pld.self_compose(a.rounds).get_epsilon_for_delta(a.delta)

    t_ref, eps_ref = best_time(reference, a.repeats)

    print(f"command: {' '.join([sys.executable.split('/')[-1], *sys.argv])}")
    print(
        f"machine: {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}; best of {a.repeats}, cold caches"
    )
    print(f"epsilon at delta={a.delta} after {a.rounds} rounds")
    header = f"{'computation':<52}{'time [s]':>9}{'epsilon':>11}{'lower':>11}{'gap':>8}"
    print(header)
    print("-" * len(header))
    rows = [
        ("dpfl  random participation, sound (scenario 1, s=2.5)", t_rp, b_rp),
        ("dpfl  Poisson-subsampled Gaussian (q=1e-4, s=2.5)", t_ps, b_ps),
    ]
    for name, t, b in rows:
        print(f"{name:<52}{t:>9.3f}{b.upper:>11.5f}{b.lower:>11.5f}{b.gap:>8.2%}")
    print(
        f"{'dp_accounting Poisson-subsampled Gaussian (h=1e-6)':<52}{t_ref:>9.3f}"
        f"{eps_ref:>11.5f}{'-':>11}{'-':>8}"
    )


if __name__ == "__main__":
    main()
