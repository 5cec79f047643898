"""Benchmark: DP-DSGD with random participation at the paper's scenario-1 scale.

23,264 clients x 30 procedural 28x28 images (``synthetic_images``, 62 classes),
p = 0.001, q = 0.1 (about 23 participants and 70 records a round), the paper
CNN (random-participation App. B). Four variants on the *same* sampled
records (round t of each uses the seeded server streams
``server_streams(seed, t)``: ``secure_noise=False``), and one with secure
noise:

``dp``
    ``Trainer.step()`` of ``dsgd-rp``: sample, build the records, clipped
    per-sample gradient sum, Gaussian noise (seeded), 1/(pNqd) scaling,
    momentum step, ledger record (no budget, so no pricing cost in the loop).
``dp secure``
    the same with secure noise (dpfl's default: :mod:`dpfl.sim.secure_noise`,
    drawn in the background while the gradients are computed). Its records
    are sampled from the run's secret key, so they are other records (as
    many on average); the paired per-round ratio ``dp secure / dp`` is the
    figure of the secure-noise target.
``non-private``
    the same sampling and records, then a plain PyTorch mean-loss backward
    and a ``torch.optim.SGD`` momentum step: the baseline of the target.
``dpfl clip only``
    ``Trainer.step()`` of ``dsgd-rp`` with clipping but no noise: with the
    next variant, it splits the DP round's extra time into clipping and noise.
``dpfl baseline``
    ``Trainer.step()`` of ``dsgd-rp`` without noise or clipping (the
    non-private run of ``dpfl demo``), for reference: what dpfl's own
    machinery (sampling, 1/(pNqd) scaling, momentum, ledger) adds.

Rounds are interleaved (each round index runs all five variants) so all see
the same background load, and the paired per-round ratio dp / non-private on
the same records is the headline figure. A round leaves the caches and the
OpenMP workers in a state that speeds or slows the next, so the five are
shuffled anew at every round index (seeded; ``--order random``, the default):
in the fixed order dp, non-private, clip only, baseline (``--order fixed``)
the DP round always follows the baseline and the noise then looks 4-5 times
as costly as in random order (fixed 1.39-1.41 vs random 1.31-1.36 under
libgomp's default spin). The machine's speed drifts by tens
of percent over seconds on a shared host, and the ratio drifts with it, so
the timing runs ``--repeats`` times, each in a fresh process, one after the
other; each repeat's paired median is printed and their median is the
figure to quote. Peak RSS (``ru_maxrss``; torch CPU allocations count in it)
is measured per variant in a fresh subprocess, next to the RSS after
building the data set and model; on CUDA also
``torch.cuda.max_memory_allocated``.

The OpenMP wait policy moves the ratio: ``OMP_WAIT_POLICY=PASSIVE`` (worker
threads sleep between operations; kind to a shared machine) slows the
non-private round more than the DP round, libgomp's default spin (300,000
rounds) the reverse, and one thread sits between. The timed processes run
with ``GOMP_SPINCOUNT`` as the ``dpfl`` command line sets it
(``dpfl._runtime.GOMP_SPINCOUNT``, 10,000: the non-private round is as fast as
with the default spin, and the DP round's noise draw no longer competes with
a spinning worker); ``--omp-spincount default`` leaves libgomp's default,
and an ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` in the environment is kept.
The script prints what was in effect; quote it with the figures.

Usage::

    python benchmarks/engine.py [--rounds 60] [--repeats 5] [--device cpu|cuda]
        [--threads N] [--order random|fixed] [--omp-spincount N|default]
        [--no-memory]

``--no-memory`` leaves out the per-variant memory subprocesses (one fresh
process each, rebuilding the data set: most of a short run's time), so the
table has no memory columns.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shlex
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from dpfl._runtime import GOMP_SPINCOUNT, openmp_defaults
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import synthetic_images
from dpfl.models import PaperCNN
from dpfl.sim.algorithms import build_algorithm
from dpfl.sim.loop import Trainer
from dpfl.sim.randomness import server_streams
from dpfl.sim.secure_noise import noise_kernel

SEED = 0


def rss_mib() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


VARIANTS = ("dp", "dp secure", "non-private", "dpfl clip only", "dpfl baseline")


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
    base_model = PaperCNN(num_classes=62)
    base_model.load_state_dict(dp_model.state_dict())
    params = dict(
        participation_probability=args.p,
        record_probability=args.q,
        learning_rate=0.002,
        momentum=0.9,
    )
    common = dict(dataset=ds, device=args.device)
    alg = build_algorithm(
        "dsgd-rp",
        {**params, "clip": 1.0},
        model=dp_model,
        noise_multiplier=args.noise_multiplier,
        **common,
    )
    clip_model = PaperCNN(num_classes=62)
    clip_model.load_state_dict(dp_model.state_dict())
    clip_only = build_algorithm(
        "dsgd-rp", {**params, "clip": 1.0}, model=clip_model, **common
    )
    base = build_algorithm(
        "dsgd-rp", {**params, "clip": None}, model=base_model, **common
    )
    secure_model = PaperCNN(num_classes=62)
    secure_model.load_state_dict(dp_model.state_dict())
    secure_alg = build_algorithm(
        "dsgd-rp",
        {**params, "clip": 1.0},
        model=secure_model,
        noise_multiplier=args.noise_multiplier,
        **common,
    )
    seeded = dict(ledger=PrivacyLedger(), seed=SEED, secure_noise=False)
    trainer = Trainer(alg, **seeded)
    secure_trainer = Trainer(secure_alg, ledger=PrivacyLedger(), seed=SEED)
    clip_trainer = Trainer(clip_only, **{**seeded, "ledger": PrivacyLedger()})
    base_trainer = Trainer(base, **{**seeded, "ledger": PrivacyLedger()})
    opt = torch.optim.SGD(np_model.parameters(), lr=0.002, momentum=0.9)
    sampler = alg.sampler(alg.params, alg.stats)

    def dp_round() -> int:
        return int(trainer.step().metrics["records"])

    def secure_round() -> int:
        return int(secure_trainer.step().metrics["records"])

    def clip_round() -> int:
        return int(clip_trainer.step().metrics["records"])

    def base_round() -> int:
        return int(base_trainer.step().metrics["records"])

    counter = {"t": 0}

    def non_private_round() -> int:
        server = server_streams(SEED, counter["t"])
        counter["t"] += 1
        sample = sampler.sample(server.rng).resolve(ds.client_indices)
        x, y = ds.take(sample.records)
        x = torch.as_tensor(x).to(args.device)
        y = torch.as_tensor(y).to(args.device)
        opt.zero_grad()
        if len(y):
            F.cross_entropy(np_model(x), y).backward()
            opt.step()
        return len(y)

    calls = {"dp": dp_round, "dp secure": secure_round}
    calls["non-private"] = non_private_round
    calls["dpfl clip only"] = clip_round
    calls["dpfl baseline"] = base_round
    return ds, calls


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


def measure_times(args: argparse.Namespace) -> dict:
    """One repeat: warm-up, then ``args.rounds`` interleaved rounds of each variant."""
    t0 = time.perf_counter()
    ds, calls = setup(args)
    setup_s = time.perf_counter() - t0
    rss_setup = rss_mib()
    for _ in range(args.warmup):
        for call in calls.values():
            call()
    times: dict[str, list[float]] = {k: [] for k in calls}
    records: list[int] = []
    secure_records: list[int] = []
    load_before = os.getloadavg()[0]
    order = list(calls)
    shuffler = random.Random(SEED)
    for _ in range(args.rounds):
        if args.order == "random":
            shuffler.shuffle(order)
        for name in order:
            call = calls[name]
            sync(args.device)
            start = time.perf_counter()
            n = call()
            sync(args.device)
            times[name].append(time.perf_counter() - start)
            if name == "dp":
                records.append(n)
            elif name == "dp secure":
                secure_records.append(n)
    return {
        "times": times,
        "records": records,
        "secure_records": secure_records,
        "setup_s": setup_s,
        "data_mib": ds.nbytes() / 2**20,
        "rss_setup_mib": rss_setup,
        "load": [load_before, os.getloadavg()[0]],
        "noise_kernel": noise_kernel(args.device),
    }


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    xs = sorted(xs)
    return tuple(xs[int(f * (len(xs) - 1))] for f in (0.25, 0.5, 0.75))  # type: ignore[return-value]


def forwarded(args: argparse.Namespace) -> list[str]:
    """The workload options, for a subprocess to rebuild the same setup."""
    cmd = ["--rounds", str(args.rounds), "--warmup", str(args.warmup)]
    cmd += ["--device", args.device]
    cmd += ["--clients", str(args.clients), "--records", str(args.records)]
    cmd += ["--p", str(args.p), "--q", str(args.q)]
    cmd += ["--noise-multiplier", str(args.noise_multiplier)]
    cmd += ["--order", args.order]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return cmd


def child_env(args: argparse.Namespace) -> dict[str, str]:
    """Environment of the timed processes (OpenMP spin, see the docstring)."""
    env = dict(os.environ)
    if args.omp_spincount != "default":
        openmp_defaults(env, args.omp_spincount)
    return env


def openmp_setting(env: dict[str, str]) -> str:
    policy = env.get("OMP_WAIT_POLICY", "unset")
    spin = env.get("GOMP_SPINCOUNT", "unset (libgomp default 300,000)")
    return f"OMP_WAIT_POLICY {policy}, GOMP_SPINCOUNT {spin}"


def run_child(args: argparse.Namespace, *extra: str) -> dict:
    cmd = [sys.executable, __file__, *forwarded(args), *extra]
    out = subprocess.run(cmd, capture_output=True, check=True, env=child_env(args))
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--order", choices=("fixed", "random"), default="random")
    parser.add_argument("--omp-spincount", default=GOMP_SPINCOUNT)
    parser.add_argument("--clients", type=int, default=23_264)
    parser.add_argument("--records", type=int, default=30)
    parser.add_argument("--p", type=float, default=0.001)
    parser.add_argument("--q", type=float, default=0.1)
    # Sound σ for per-round (0.015, 1e-6) in scenario 1 (docs/analyses.md table).
    parser.add_argument("--noise-multiplier", type=float, default=2.4903)
    parser.add_argument(
        "--no-memory",
        action="store_true",
        help="skip the per-variant peak-memory subprocesses",
    )
    parser.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--timing-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_of:
        print(json.dumps(measure_memory(args)))
        return
    if args.timing_worker:
        print(json.dumps(measure_times(args)))
        return
    if args.rounds < 1 or args.repeats < 1:
        parser.error("--rounds and --repeats must be at least 1")

    print("command:", shlex.join([sys.executable, *sys.argv]))
    dev = args.device
    if dev.startswith("cuda"):
        dev += f" ({torch.cuda.get_device_name()})"
    print(
        f"torch {torch.__version__}, device {dev}, threads {torch.get_num_threads()}, "
        f"{openmp_setting(child_env(args))}, "
        f"{args.clients:,} clients x {args.records} records, p={args.p}, q={args.q}, "
        f"sigma={args.noise_multiplier}, {args.repeats} repeats x {args.rounds} "
        f"rounds (+{args.warmup} warm-up) per variant, {args.order} order, "
        "each repeat a fresh process"
    )
    runs = []
    for i in range(args.repeats):
        run = run_child(args, "--timing-worker")
        runs.append(run)
        t = run["times"]
        med = {k: quantiles(v)[1] * 1e3 for k, v in t.items()}
        paired = [d / n for d, n in zip(t["dp"], t["non-private"])]
        q1, q2, q3 = quantiles(paired)
        run["paired_median"] = q2
        secure = [s / d for s, d in zip(t["dp secure"], t["dp"])]
        s1, s2, s3 = quantiles(secure)
        run["secure_median"] = s2
        recs, srecs = run["records"], run["secure_records"]
        print(
            f"repeat {i + 1}: median ms "
            + ", ".join(f"{k} {v:.1f}" for k, v in med.items())
            + f"; paired dp/non-private median {q2:.2f} (quartiles {q1:.2f}-{q3:.2f})"
            f"; paired dp secure/dp median {s2:.2f} (quartiles {s1:.2f}-{s3:.2f})"
            f"; records/round mean {sum(recs) / len(recs):.1f} (secure "
            f"{sum(srecs) / len(srecs):.1f}); 1-min load "
            f"{run['load'][0]:.2f} -> {run['load'][1]:.2f}; secure noise kernel "
            f"{run['noise_kernel']}",
            flush=True,
        )
    first = runs[0]
    print(
        f"setup {first['setup_s']:.2f} s; data set holds {first['data_mib']:.1f} MiB; "
        f"RSS after setup {first['rss_setup_mib']:.0f} MiB ({os.cpu_count()} cores; "
        "a busy machine flatters the ratio)"
    )
    pooled = {k: [x for r in runs for x in r["times"][k]] for k in VARIANTS}
    base_med = quantiles(pooled["non-private"])[1]
    header = f"{'variant':<16}{'median ms':>10}{'rounds/s':>10}{'vs non-private':>16}"
    if not args.no_memory:
        header += f"{'RSS setup':>11}{'peak RSS':>10}"
        if args.device.startswith("cuda"):
            header += f"{'cuda peak':>11}"
    print(header)
    for name in VARIANTS:
        med = quantiles(pooled[name])[1]
        line = f"{name:<16}{med * 1e3:>10.1f}{1 / med:>10.1f}{med / base_med:>16.2f}"
        if not args.no_memory:
            mem = run_child(args, "--memory-of", name)
            line += f"{mem['rss_before_mib']:>9.0f}Mi{mem['peak_rss_mib']:>8.0f}Mi"
            if "cuda_peak_mib" in mem:
                line += f"{mem['cuda_peak_mib']:>9.0f}Mi"
        print(line, flush=True)
    per_repeat = sorted(r["paired_median"] for r in runs)
    print(
        "paired per-round ratio dp/non-private (same records), median of the "
        f"{len(runs)} repeats' medians: {statistics.median(per_repeat):.2f} "
        f"(repeats {per_repeat[0]:.2f}-{per_repeat[-1]:.2f})"
    )
    per_secure = sorted(r["secure_median"] for r in runs)
    print(
        "paired per-round ratio dp secure/dp (secure against seeded noise), "
        f"median of the {len(runs)} repeats' medians: "
        f"{statistics.median(per_secure):.2f} (repeats {per_secure[0]:.2f}-"
        f"{per_secure[-1]:.2f})"
    )
    print(
        "targets: peak RSS <= 2 GiB; dp round <= 1.3 x the non-private round; "
        "dp secure round <= 1.25 x the dp round"
        + (" (memory not measured: --no-memory)" if args.no_memory else "")
    )


if __name__ == "__main__":
    main()
