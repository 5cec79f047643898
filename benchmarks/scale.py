"""Benchmark: cost of a round and of the client-level structures against the clients.

For each number of clients N (default 1e4, 1e5, 1e6) and each algorithm,
in a fresh process: N clients x 2 records of 16 Gaussian features (10
classes), an MLP 16-32-10, secure noise (dpfl's default), batched executor.

``dp-fedavg``
    a fixed cohort of 50 clients a round, 1 local epoch of batch 2, clip 1,
    σ 1.
``dsgd-rp``
    each client w.p. 50/N, each of its records w.p. 0.5 (about 50 records
    a round), clip 1, σ 1.

Printed per (algorithm, N): the median seconds per round over rounds 3..R
(``--rounds``), the time to build the algorithm (its per-client structures:
statistics, samplers) and the resident memory it adds above the data set
(RSS after building the algorithm minus RSS after building the data set),
in bytes per client; the time to build the data set (a
:class:`~dpfl.data.FederatedDataset` with one index array per client) and
its own bytes per client beyond the records' features and labels (its index
arrays), which the algorithm does not own; and the process's peak RSS.
Then, per algorithm, the ratio of the round time at the largest N to that
at the smallest, the target figure (<= 1.05). A shared machine's speed drifts, so each
(algorithm, N) runs ``--repeats`` times, fresh processes interleaved over N;
each repeat is printed, the median is the figure to quote.

Usage::

    python benchmarks/scale.py [--clients 1e4,1e5,1e6] [--rounds 30]
        [--repeats 3] [--algorithms dp-fedavg,dsgd-rp]
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np

RECORDS, FEATURES, CLASSES, HIDDEN, COHORT = 2, 16, 10, 32, 50


def rss_mib() -> float:
    """Current resident set size of this process, MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def peak_mib() -> float:
    """Peak resident set size of this process, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def dataset(n: int):  # noqa: ANN201  (benchmark helper)
    """``n`` clients x 2 records of 16 Gaussian features, 10 classes."""
    from dpfl.data import FederatedDataset

    rng = np.random.default_rng(0)
    total = n * RECORDS
    labels = rng.integers(0, CLASSES, size=total + 1000)
    x = rng.normal(size=(total + 1000, FEATURES)).astype(np.float32)
    rows = np.arange(total, dtype=np.int64).reshape(n, RECORDS)
    return FederatedDataset(
        features=x[:total],
        labels=labels[:total].astype(np.int64),
        client_indices=list(rows),
        num_classes=CLASSES,
        test_features=x[total:],
        test_labels=labels[total:].astype(np.int64),
    )


def run(algorithm: str, n: int, rounds: int) -> dict:
    """Build the data and the algorithm, run ``rounds`` rounds; times and memory."""
    import torch
    from torch import nn

    from dpfl.accounting.ledger import PrivacyLedger
    from dpfl.sim.algorithms import build_algorithm
    from dpfl.sim.loop import Trainer

    torch.set_num_threads(1)
    base = rss_mib()
    t0 = time.process_time()
    ds = dataset(n)
    data_s = time.process_time() - t0
    data_rss = rss_mib()
    records_bytes = ds.features.nbytes + ds.labels.nbytes
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)
    )
    if algorithm == "dp-fedavg":
        params = dict(
            cohort_size=COHORT,
            local_epochs=1,
            batch_size=RECORDS,
            learning_rate=0.1,
            clip=1.0,
        )
    else:
        params = dict(
            participation_probability=COHORT / n,
            record_probability=0.5,
            clip=1.0,
            learning_rate=0.1,
        )
    t0 = time.process_time()
    alg = build_algorithm(
        algorithm, params, model=model, dataset=ds, noise_multiplier=1.0
    )
    trainer = Trainer(alg, ledger=PrivacyLedger(), seed=0)
    build_s = time.process_time() - t0
    built_rss = rss_mib()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        trainer.step()
        times.append(time.perf_counter() - t)
    return {
        "round_s": statistics.median(times[2:]),
        "build_s": build_s,
        "data_s": data_s,
        "alg_bytes_per_client": (built_rss - data_rss) * 2**20 / n,
        "data_overhead_bytes_per_client": ((data_rss - base) * 2**20 - records_bytes)
        / n,
        "data_mib": data_rss - base,
        "peak_mib": peak_mib(),
    }


def main() -> None:
    """Run every (algorithm, N) in fresh processes and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="1e4,1e5,1e6")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--algorithms", default="dp-fedavg,dsgd-rp")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        alg, n = args.child
        print(json.dumps(run(alg, int(float(n)), args.rounds)))
        return
    print("command:", shlex.join([sys.executable, *sys.argv]))
    sizes = [int(float(c)) for c in args.clients.split(",")]
    algorithms = args.algorithms.split(",")
    results: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.repeats):
        for alg in algorithms:
            for n in sizes:
                proc = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        alg,
                        str(n),
                        "--rounds",
                        str(args.rounds),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                out = json.loads(proc.stdout.strip().splitlines()[-1])
                results.setdefault((alg, n), []).append(out)
    print(
        f"{args.repeats} fresh processes per row, rounds 3-{args.rounds}, 1 torch "
        "thread, secure noise, batched executor"
    )
    for alg in algorithms:
        for n in sizes:
            rs = results[(alg, n)]

            def med(key: str, rs: list[dict] = rs) -> float:
                return statistics.median(r[key] for r in rs)

            each = ", ".join(f"{r['round_s'] * 1e3:.2f}" for r in rs)
            over = med("data_overhead_bytes_per_client")
            print(
                f"  {alg:9s} N={n:>8d}  {med('round_s') * 1e3:6.2f} ms/round "
                f"(repeats {each})  build {med('build_s'):.2f} s (data "
                f"{med('data_s'):.2f} s)  algorithm "
                f"{med('alg_bytes_per_client'):6.1f} B/client  data "
                f"{med('data_mib'):.0f} MiB ({over:.0f} B/client beyond the "
                f"records)  peak RSS {med('peak_mib'):.0f} MiB"
            )
        lo, hi = min(sizes), max(sizes)
        ratios = [
            a["round_s"] / b["round_s"]
            for a, b in zip(results[(alg, hi)], results[(alg, lo)])
        ]
        print(
            f"  {alg}: round at N={hi:g} / at N={lo:g} = "
            f"{statistics.median(ratios):.3f} (repeats: "
            f"{', '.join(f'{r:.3f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()
