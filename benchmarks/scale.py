"""Benchmark: cost of a round and of the client-level structures against the clients.

For each number of clients N (default 1e4, 1e5, 1e6) and each algorithm:
N clients x 2 records of 16 Gaussian features (10
classes), an MLP 16-32-10, secure noise (dpfl's default), batched executor.

``dp-fedavg``
    a fixed cohort of 50 clients a round, 1 local epoch of batch 2, clip 1,
    σ 1.
``dsgd-rp``
    each client w.p. 50/N, each of its records w.p. 0.5 (about 50 records
    a round), clip 1, σ 1.

Printed per (algorithm, N): the median milliseconds per round over rounds
3..R (``--rounds``), timed in one process per repeat that holds every N and
interleaves their rounds (the order shuffled anew at each round index,
seeded), so that all see the same load. Then, from one fresh process per
(algorithm, N), the build: the CPU time to build the data set (a
:class:`~dpfl.data.FederatedDataset` given its clients as a
:class:`~dpfl.data.ClientIndices`: one flat array of rows plus an offset a
client) and the algorithm with its trainer (its per-client structures:
statistics, samplers), beside the time the benchmark takes to draw the
records themselves (not dpfl's); and the memory: the records' resident
size, what the data set adds beyond them (its ``client_indices``) and what
the algorithm adds above the data set, in bytes per client (RSS differences
after each step), and the process's peak RSS after one round, also less the
interpreter's (RSS before the records) and the records'. Targets at 10^6
clients: beyond the records <= 64 B a client (data set plus algorithm), a
build (data set plus algorithm) <= 2 s and a peak <= 400 MiB above the data.
Then, per algorithm, the paired per-round ratio of the round time at the
largest N to that at the smallest (the median over rounds of one process,
then the median over the repeats), the target figure (<= 1.05).

Usage::

    python benchmarks/scale.py [--clients 1e4,1e5,1e6] [--rounds 30]
        [--repeats 3] [--algorithms dp-fedavg,dsgd-rp]
"""

from __future__ import annotations

import argparse
import json
import random
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


def arrays(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The records of ``n`` clients x 2 (16 Gaussian features, 10 classes) + 1000 test.

    Drawn straight in float32 and int64: no temporary larger than the data.
    """
    rng = np.random.default_rng(0)
    total = n * RECORDS + 1000
    labels = rng.integers(0, CLASSES, size=total, dtype=np.int64)
    x = rng.standard_normal(size=(total, FEATURES), dtype=np.float32)
    return x, labels


def dataset(n: int, x: np.ndarray, labels: np.ndarray):  # noqa: ANN201
    """The federated data set: client ``k`` holds rows ``2k`` and ``2k + 1``."""
    from dpfl.data import ClientIndices, FederatedDataset

    total = n * RECORDS
    return FederatedDataset(
        features=x[:total],
        labels=labels[:total],
        client_indices=ClientIndices.from_sizes(
            np.arange(total, dtype=np.int64), np.full(n, RECORDS)
        ),
        num_classes=CLASSES,
        test_features=x[total:],
        test_labels=labels[total:],
    )


def build(algorithm: str, n: int):  # noqa: ANN201  (benchmark helper)
    """The records, the data set, then the algorithm and its trainer; times and RSS."""
    import torch
    from torch import nn

    from dpfl.accounting.ledger import PrivacyLedger
    from dpfl.sim.algorithms import build_algorithm
    from dpfl.sim.loop import Trainer

    base = rss_mib()
    t0 = time.process_time()
    x, labels = arrays(n)
    arrays_s = time.process_time() - t0
    records_rss = rss_mib()
    t0 = time.process_time()
    ds = dataset(n, x, labels)
    data_s = time.process_time() - t0
    data_rss = rss_mib()
    del x, labels
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
    facts = {
        "arrays_s": arrays_s,
        "data_s": data_s,
        "build_s": build_s,
        "alg_bytes_per_client": (rss_mib() - data_rss) * 2**20 / n,
        "data_overhead_bytes_per_client": (data_rss - records_rss) * 2**20 / n,
        "index_bytes_per_client": ds.client_indices.nbytes / n,
        "records_mib": records_rss - base,
        "base_mib": base,
    }
    return trainer, facts


def memory(algorithm: str, n: int) -> dict:
    """Build one (algorithm, N) in this fresh process: build times and memory."""
    import torch

    torch.set_num_threads(1)
    from dpfl.data import FederatedDataset

    trainer, facts = build(algorithm, n)
    trainer.step()  # a round's own allocations count in the peak
    peak = peak_mib()
    # The same data set given a list of per-client arrays (as partitions return
    # them), after the peak was read: the list alone is about 100 B a client.
    ds = trainer.algorithm.dataset
    arrays_list = list(ds.client_indices)
    t0 = time.process_time()
    FederatedDataset(
        features=ds.features,
        labels=ds.labels,
        client_indices=arrays_list,
        num_classes=ds.num_classes,
    )
    from_list_s = time.process_time() - t0
    return {
        **facts,
        "peak_mib": peak,
        "above_data_mib": peak - facts["base_mib"] - facts["records_mib"],
        "data_from_list_s": from_list_s,
    }


def timing(algorithm: str, sizes: list[int], rounds: int) -> dict:
    """Rounds at every N, interleaved (order shuffled per round index, seeded)."""
    import torch

    torch.set_num_threads(1)
    trainers = {n: build(algorithm, n)[0] for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    order = list(sizes)
    shuffle = random.Random(0)
    for _ in range(rounds):
        shuffle.shuffle(order)
        for n in order:
            t = time.perf_counter()
            trainers[n].step()
            times[n].append(time.perf_counter() - t)
    lo, hi = min(sizes), max(sizes)
    return {
        "round_s": {str(n): statistics.median(v[2:]) for n, v in times.items()},
        "ratio": statistics.median(a / b for a, b in zip(times[hi][2:], times[lo][2:])),
    }


def child(args: list[str]) -> dict:
    """Run one child process's part and return its figures."""
    proc = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run the timing and memory children and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="1e4,1e5,1e6")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--algorithms", default="dp-fedavg,dsgd-rp")
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--timing-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        alg, n = args.memory_child
        print(json.dumps(memory(alg, int(float(n)))))
        return
    if args.timing_child:
        alg, ns = args.timing_child
        sizes = [int(float(c)) for c in ns.split(",")]
        print(json.dumps(timing(alg, sizes, args.rounds)))
        return
    print("command:", shlex.join([sys.executable, *sys.argv]))
    sizes = [int(float(c)) for c in args.clients.split(",")]
    algorithms = args.algorithms.split(",")
    print(
        f"timing: {args.repeats} fresh processes per algorithm, each interleaving "
        f"rounds 1-{args.rounds} of every N (medians over rounds 3-{args.rounds}); "
        "memory: one fresh process per (algorithm, N); 1 torch thread, secure "
        "noise, batched executor"
    )
    for alg in algorithms:
        runs = [
            child(["--timing-child", alg, args.clients, "--rounds", str(args.rounds)])
            for _ in range(args.repeats)
        ]
        for n in sizes:
            mem = child(["--memory-child", alg, str(n)])
            each = [r["round_s"][str(n)] * 1e3 for r in runs]
            print(
                f"  {alg:9s} N={n:>8d}  {statistics.median(each):6.2f} ms/round "
                f"(repeats {', '.join(f'{t:.2f}' for t in each)})"
            )
            print(
                f"    build: data set {mem['data_s']:.2f} s + algorithm "
                f"{mem['build_s']:.2f} s = "
                f"{mem['data_s'] + mem['build_s']:.2f} s (data set from a list "
                f"of arrays {mem['data_from_list_s']:.2f} s; drawing the records "
                f"{mem['arrays_s']:.2f} s)"
            )
            beyond = mem["data_overhead_bytes_per_client"] + mem["alg_bytes_per_client"]
            print(
                f"    memory: records {mem['records_mib']:.0f} MiB; beyond them "
                f"{beyond:.1f} B/client: the data set "
                f"{mem['data_overhead_bytes_per_client']:.1f} (client_indices "
                f"{mem['index_bytes_per_client']:.1f}), the algorithm "
                f"{mem['alg_bytes_per_client']:.1f}; peak RSS "
                f"{mem['peak_mib']:.0f} MiB, {mem['above_data_mib']:.0f} MiB "
                "above the interpreter and the records"
            )
        ratios = [r["ratio"] for r in runs]
        print(
            f"  {alg}: paired round ratio N={max(sizes):g} / N={min(sizes):g} = "
            f"{statistics.median(ratios):.3f} (repeats: "
            f"{', '.join(f'{r:.3f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()
