"""Accounting speed: an epsilon query per scheme at 1e3, 1e4 and 1e5 rounds, and
the per-round cost of the per-participant ledger at 1e4 clients.

Part 1. For one event of every scheme (the event classes of
``dpfl.accounting.events``), the time of epsilon(delta = 1e-5) after T rounds:

* ``account``: a first query, as ``dpfl account`` makes it (cold caches, the
  Accountant's default tolerance 0.005);
* ``in a run``: the query a run makes at an evaluation (the ledger's tolerance
  0.02, the one-round PLDs cached by the previous evaluation ten rounds
  earlier). Target (issue 23): <= 0.1 s at 1e4 rounds.

Best of ``--repeats`` with the median beside it (the spread), the bracket and
the path that answered.

Part 2. A ``PrivacyLedger`` with a budget (so its guard checks every round)
records check-in and two-stage rounds of 1e4 clients, each taking part w.p.
0.01 (about 100 charged per round); the mean wall and CPU time of ``record``
(check + charge) over rounds 1-1000 and over the last 1000 of
``--ledger-rounds`` (on a machine shared with other work, the CPU time is
the cost).
Target (issue 23): <= 0.5 ms per round at 1e4 clients x 1e4 rounds, flat in
the number of rounds.

Run: PYTHONPATH=src python benchmarks/accounting.py [--repeats 3]
     [--rounds 1000,10000,100000] [--ledger-rounds 10000] [--skip-ledger]
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import sys
import time

import numpy as np

from dpfl.accounting.accountant import Accountant, _cached_price
from dpfl.accounting.events import (
    CheckIn,
    ClientPoisson,
    FixedCohort,
    Gaussian,
    PoissonSampled,
    RecordPoisson,
    SelfComposed,
    TwoStage,
    WithoutReplacement,
)
from dpfl.accounting.ledger import Budget, PrivacyLedger

DELTA = 1e-5

#: One event per scheme (name, event).
SCHEMES = [
    ("Gaussian", Gaussian(30.0)),
    ("PoissonSampled", PoissonSampled(0.01, Gaussian(1.0))),
    ("RecordPoisson (DP-SGD)", RecordPoisson(0.01, 100, Gaussian(1.0))),
    ("ClientPoisson", ClientPoisson(0.01, Gaussian(1.0))),
    (
        "random participation",
        ClientPoisson(0.001, RecordPoisson(0.1, 30, Gaussian(2.5))),
    ),
    ("FixedCohort (DP-FedAvg)", FixedCohort(100, 10_000, Gaussian(1.0))),
    ("WithoutReplacement", WithoutReplacement(64, 60_000, Gaussian(1.0))),
    ("CheckIn (MS-PAFL)", CheckIn(0.01, Gaussian(5.0))),
    ("TwoStage (LOCKS)", TwoStage(0.01, 10, 0.1, Gaussian(5.0), Gaussian(5.0))),
    (
        "CheckIn of K steps (PriFedSync)",
        CheckIn(0.1, SelfComposed(WithoutReplacement(32, 600, Gaussian(2.0)), 5)),
    ),
]


def _query(event, rounds, tolerance):
    return Accountant(tolerance=tolerance).compose(event, rounds).epsilon(DELTA)


def time_queries(event, rounds: int, repeats: int):
    """(account times, run times, bracket) over ``repeats`` interleaved tries."""
    cold, warm = [], []
    bound = None
    for _ in range(repeats):
        _cached_price.cache_clear()
        t0 = time.perf_counter()
        bound = _query(event, rounds, 0.005)
        cold.append(time.perf_counter() - t0)
        _cached_price.cache_clear()
        _query(event, rounds - 10, 0.02)  # the previous evaluation
        t0 = time.perf_counter()
        _query(event, rounds, 0.02)
        warm.append(time.perf_counter() - t0)
    return cold, warm, bound


def ledger_cost(kind: str, clients: int, rounds: int, seed: int = 0):
    """Mean wall and CPU seconds per ``record``: rounds 1-1000 and the last 1000."""
    rng = np.random.default_rng(seed)
    if kind == "check-in":
        event = CheckIn(0.01, Gaussian(20.0))
    else:
        event = TwoStage(0.01, 10, 0.1, Gaussian(20.0), Gaussian(20.0))
    ledger = PrivacyLedger(Budget(1e6, 1e-5))
    wall = np.empty(rounds)
    cpu = np.empty(rounds)
    for r in range(rounds):
        parts = np.flatnonzero(rng.random(clients) < 0.01).tolist()
        extra = (
            {"second_stage": parts[: len(parts) // 10]} if kind != "check-in" else {}
        )
        t0, c0 = time.perf_counter(), time.process_time()
        ledger.record(event, participants=parts, extra=extra)
        wall[r] = time.perf_counter() - t0
        cpu[r] = time.process_time() - c0
    w = min(1000, rounds)
    return [
        float(x[s].mean()) for x in (wall, cpu) for s in (slice(w), slice(-w, None))
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", default="1000,10000,100000")
    ap.add_argument("--ledger-rounds", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--skip-ledger", action="store_true")
    a = ap.parse_args()
    logging.disable(logging.WARNING)
    counts = [int(x) for x in a.rounds.split(",")]

    print(f"command: PYTHONPATH=src {' '.join(['python', *sys.argv])}")
    print(
        f"machine: {platform.processor() or platform.machine()}, "
        f"python {platform.python_version()}; best (median) of {a.repeats}"
    )
    print(f"\nepsilon at delta={DELTA}: first query ('account') and in a run")
    header = (
        f"{'scheme':<32}{'T':>7}{'account [s]':>18}{'in a run [s]':>18}"
        f"{'epsilon':>12}{'gap':>9}  method"
    )
    print(header)
    print("-" * len(header))
    for name, event in SCHEMES:
        for rounds in counts:
            cold, warm, b = time_queries(event, rounds, a.repeats)
            print(
                f"{name:<32}{rounds:>7}"
                f"{min(cold):>10.3f} ({statistics.median(cold):.3f})"
                f"{min(warm):>10.3f} ({statistics.median(warm):.3f})"
                f"{b.upper:>12.5g}{b.gap:>9.1e}  {b.method}",
                flush=True,
            )
    if a.skip_ledger:
        return
    print(
        f"\nper-participant ledger: {a.clients} clients, each round w.p. 0.01 "
        f"(~{a.clients // 100} charged), {a.ledger_rounds} rounds, guard on"
    )
    for kind in ("check-in", "two-stage"):
        first, last, cpu_first, cpu_last = ledger_cost(kind, a.clients, a.ledger_rounds)
        print(
            f"{kind:<12} record (check + charge) per round: rounds 1-1000 "
            f"{first * 1e3:.3f} ms ({cpu_first * 1e3:.3f} ms CPU), last 1000 "
            f"{last * 1e3:.3f} ms ({cpu_last * 1e3:.3f} ms CPU)"
        )


if __name__ == "__main__":
    main()
