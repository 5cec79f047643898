"""Benchmark: DP-DSGD with random participation at the paper's scenario-1 scale.

23,264 clients x 30 procedural 28x28 images (``synthetic_images``, 62 classes),
p = 0.001, q = 0.1 (about 23 participants and 70 records a round), the paper
CNN (random-participation App. B). Two variants on the *same* sampled records
(round t of both uses ``round_generators(seed, t)``):

``dp``
    ``Trainer.step()`` of ``dsgd-rp``: sample, build the records, clipped
    per-sample gradient sum, Gaussian noise, 1/(pNqd) scaling, momentum step,
    ledger record (no budget, so no pricing cost in the loop).
``non-private``
    the same sampling and records, then a plain mean-loss backward and a
    ``torch.optim.SGD`` momentum step.

Rounds are interleaved (dp, non-private, dp, ...) so both see the same
background load; the minimum and median round times are reported. Peak RSS
(``ru_maxrss``; torch CPU allocations count in it) is measured per variant in a
fresh subprocess, next to the RSS after building the data set and model; on
CUDA also ``torch.cuda.max_memory_allocated``.

The OpenMP wait policy moves the ratio: ``OMP_WAIT_POLICY=PASSIVE`` (worker
threads sleep between operations; kind to a shared machine) slows the
non-private round more than the DP round, the default (threads spin) the
reverse, and one thread sits between. The script prints the policy in effect;
quote it with the figures.

Usage::

    python benchmarks/engine.py [--rounds 40] [--device cpu|cuda] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import synthetic_images
from dpfl.models import PaperCNN
from dpfl.sim.algorithms import build_algorithm
from dpfl.sim.loop import Trainer, round_generators

SEED = 0


def rss_mib() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def setup(args: argparse.Namespace):
    ds = synthetic_images(
        num_clients=args.clients,
        records_per_client=args.records,
        num_classes=62,
        seed=0,
    )
    torch.manual_seed(0)
    dp_model = PaperCNN(num_classes=62)
    np_model = PaperCNN(num_classes=62).to(args.device)
    np_model.load_state_dict(dp_model.state_dict())
    alg = build_algorithm(
        "dsgd-rp",
        model=dp_model,
        dataset=ds,
        device=args.device,
        participation_probability=args.p,
        record_probability=args.q,
        noise_multiplier=args.noise_multiplier,
        clip=1.0,
        learning_rate=0.002,
        momentum=0.9,
    )
    trainer = Trainer(alg, ledger=PrivacyLedger(), seed=SEED)
    opt = torch.optim.SGD(np_model.parameters(), lr=0.002, momentum=0.9)
    sampler = alg.sampler

    def dp_round() -> int:
        return int(trainer.step().metrics["records"])

    counter = {"t": 0}

    def non_private_round() -> int:
        rng, _ = round_generators(SEED, counter["t"])
        counter["t"] += 1
        sample = sampler.sample(rng)
        x, y = ds.take(sample.records)
        x = torch.as_tensor(x).to(args.device)
        y = torch.as_tensor(y).to(args.device)
        opt.zero_grad()
        if len(y):
            F.cross_entropy(np_model(x), y).backward()
            opt.step()
        return len(y)

    return ds, {"dp": dp_round, "non-private": non_private_round}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure_memory(args: argparse.Namespace) -> dict:
    _, calls = setup(args)
    before = rss_mib()
    call = calls[args.memory_of]
    for _ in range(args.rounds):
        call()
    sync(args.device)
    out = {"rss_before_mib": before, "peak_rss_mib": rss_mib()}
    if args.device.startswith("cuda"):
        out["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--clients", type=int, default=23_264)
    parser.add_argument("--records", type=int, default=30)
    parser.add_argument("--p", type=float, default=0.001)
    parser.add_argument("--q", type=float, default=0.1)
    # Sound σ for per-round (0.015, 1e-6) in scenario 1 (SPEC.md §0.3 table).
    parser.add_argument("--noise-multiplier", type=float, default=2.4903)
    parser.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_of:
        print(json.dumps(measure_memory(args)))
        return

    print("command:", shlex.join([sys.executable, *sys.argv]))
    dev = args.device
    if dev.startswith("cuda"):
        dev += f" ({torch.cuda.get_device_name()})"
    policy = os.environ.get("OMP_WAIT_POLICY", "unset (OpenMP default)")
    print(
        f"torch {torch.__version__}, device {dev}, threads {torch.get_num_threads()}, "
        f"OMP_WAIT_POLICY {policy}, "
        f"{args.clients:,} clients x {args.records} records, p={args.p}, q={args.q}, "
        f"sigma={args.noise_multiplier}, rounds {args.rounds} (+{args.warmup} warm-up)"
    )
    t0 = time.perf_counter()
    ds, calls = setup(args)
    print(
        f"setup {time.perf_counter() - t0:.2f} s; data set holds "
        f"{ds.nbytes() / 2**20:.1f} MiB; RSS after setup {rss_mib():.0f} MiB"
    )
    for _ in range(args.warmup):
        for call in calls.values():
            call()
    times: dict[str, list[float]] = {k: [] for k in calls}
    records: list[int] = []
    load_before = os.getloadavg()[0]
    for _ in range(args.rounds):
        for name, call in calls.items():
            sync(args.device)
            start = time.perf_counter()
            n = call()
            sync(args.device)
            times[name].append(time.perf_counter() - start)
            if name == "dp":
                records.append(n)
    print(
        f"records per round: mean {sum(records) / len(records):.1f}, "
        f"min {min(records)}, max {max(records)}; 1-min load average "
        f"{load_before:.2f} before timing, {os.getloadavg()[0]:.2f} after "
        f"({os.cpu_count()} cores; a busy machine flatters the ratio)"
    )
    base_min = min(times["non-private"])
    base_med = sorted(times["non-private"])[len(times["non-private"]) // 2]
    header = f"{'variant':<13}{'min ms':>9}{'median ms':>11}{'rounds/s':>10}"
    header += f"{'ratio min':>11}{'ratio med':>11}{'RSS setup':>11}{'peak RSS':>10}"
    if args.device.startswith("cuda"):
        header += f"{'cuda peak':>11}"
    print(header)
    for name, ts in times.items():
        cmd = [sys.executable, __file__, "--memory-of", name]
        cmd += ["--rounds", str(args.rounds), "--device", args.device]
        cmd += ["--clients", str(args.clients), "--records", str(args.records)]
        cmd += ["--p", str(args.p), "--q", str(args.q)]
        cmd += ["--noise-multiplier", str(args.noise_multiplier)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        mem = json.loads(subprocess.run(cmd, capture_output=True, check=True).stdout)
        ts = sorted(ts)
        med = ts[len(ts) // 2]
        line = (
            f"{name:<13}{ts[0] * 1e3:>9.1f}{med * 1e3:>11.1f}{1 / med:>10.1f}"
            f"{ts[0] / base_min:>11.2f}{med / base_med:>11.2f}"
            f"{mem['rss_before_mib']:>9.0f}Mi{mem['peak_rss_mib']:>8.0f}Mi"
        )
        if "cuda_peak_mib" in mem:
            line += f"{mem['cuda_peak_mib']:>9.0f}Mi"
        print(line)
    paired = sorted(d / n for d, n in zip(times["dp"], times["non-private"]))
    q1, q2, q3 = (paired[int(f * (len(paired) - 1))] for f in (0.25, 0.5, 0.75))
    print(
        "ratio min/med = min/median dp time over min/median non-private time; "
        f"paired per-round ratio dp/non-private (same records): median {q2:.2f} "
        f"(quartiles {q1:.2f}-{q3:.2f})"
    )
    print("targets: peak RSS <= 2 GiB; dp round <= 1.3 x the non-private round")


if __name__ == "__main__":
    main()
