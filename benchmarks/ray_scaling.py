"""Benchmark: ``execution: ray`` rounds per second and peak memory against workers.

A CPU-heavy round: PriFedSync (noisy Adam, interpolation helper; every synced
client runs K noisy local steps of B records with per-record clipping) with
the paper's CNN (``prifedsync_cnn``, 1,199,882 parameters) on 28 × 28
images: Fashion-MNIST when its files are found (:mod:`dpfl.data.loaders`),
otherwise procedural 28 × 28 images built in this process
(:func:`dpfl.data.synthetic_images`, 10 classes, held in memory as a real
data set is); the script says which.

Variants, each in a fresh process, one after the other:

``batched``
    the in-process batched executor, torch on ``--threads`` threads;
``ray-1``
    :class:`dpfl.integrations.ray.RayExecutor` on a local instance, one
    worker reserving ``--threads`` CPUs (so its torch has as many threads);
``ray-2``
    two workers reserving ``--threads / 2`` CPUs each.

All run the same rounds (same seed: the same clients sync, the same batches
and noise), so round ``t`` of each is the same work; the figure per variant
is the median round time over ``--rounds`` timed rounds after ``--warmup``
(the first Ray round builds the replicas), and the ratio to ``batched`` is
the median of the per-round ratios. A Ray round is split into the driver's
phases: ``select`` (the server picks the cohort), ``put`` (weights into the
object store), ``submit`` (tasks, with the clients' state, made compact and
sent), ``wait`` (the workers' compute and the transfers), ``get`` (shares
fetched and unpickled), ``join`` and ``server`` (the server step and the
ledger). Peak memory is ``ru_maxrss`` of each process: the driver, and every
worker (:meth:`~dpfl.integrations.ray.RayExecutor.workers`); Ray's own
processes and the shared-memory object store are not counted. The final
weights of every variant are compared with ``batched`` (``max |Δθ|``).

The timed processes run with ``GOMP_SPINCOUNT`` as the ``dpfl`` command line
sets it (``dpfl._runtime.openmp_defaults``); the Ray workers inherit it.

Usage::

    python benchmarks/ray_scaling.py [--clients 50] [--records 64]
        [--sync 0.2] [--batch 16] [--local-steps 4] [--rounds 6] [--warmup 1]
        [--threads 2] [--variants batched,ray-1,ray-2] [--repeats 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("batched", "ray-1", "ray-2")


# -- one variant, in its own process ------------------------------------------------
def _dataset(args: argparse.Namespace):
    import numpy as np

    from dpfl.data import get_dataset, synthetic_images
    from dpfl.data.loaders import DatasetNotFoundError

    try:
        ds = get_dataset(
            "fashion-mnist",
            num_clients=args.clients,
            partition="equal-size",
            records_per_client=args.records,
            seed=0,
        )
        return ds, "Fashion-MNIST"
    except DatasetNotFoundError:
        ds = synthetic_images(
            num_clients=args.clients, records_per_client=args.records, seed=0
        )
        ds = dataclasses.replace(ds, features=np.asarray(ds.features))
        return ds, "procedural 28x28 images (synthetic_images; no Fashion-MNIST here)"


def _algorithm(args: argparse.Namespace, dataset):
    import torch

    from dpfl.models import build_model
    from dpfl.sim.algorithms import build_algorithm

    torch.manual_seed(0)
    model = build_model(
        "prifedsync_cnn",
        input_shape=dataset.input_shape,
        num_classes=dataset.num_classes,
    )
    params = {
        "sync_probability": args.sync,
        "batch_size": args.batch,
        "local_steps": args.local_steps,
        "clip": 1.0,
        "learning_rate": 0.001,
        "optimizer": "adam",
    }
    return build_algorithm(
        "prifedsync", params, model=model, dataset=dataset, noise_multiplier=1.0
    )


def child(args: argparse.Namespace) -> dict:
    """Run one variant; return its round times, phases and memory."""
    import torch

    from dpfl.accounting.ledger import PrivacyLedger
    from dpfl.sim.loop import Trainer

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    dataset, source = _dataset(args)
    algorithm = _algorithm(args, dataset)
    built = time.perf_counter() - t0
    executor = None
    if args.child == "batched":
        execution = "batched"
    else:
        from dpfl.integrations.ray import RayExecutor

        workers = int(args.child.split("-")[1])
        executor = RayExecutor(
            num_workers=workers, num_cpus_per_worker=args.threads / workers
        )
        execution = executor
    trainer = Trainer(
        algorithm, ledger=PrivacyLedger(None), seed=0, execution=execution
    )
    t0 = time.perf_counter()
    if executor is not None:
        executor.start(algorithm)  # Ray and the workers
    started = time.perf_counter() - t0
    rounds, phases, cohort = [], [], []
    for r in range(args.warmup + args.rounds):
        t0 = time.perf_counter()
        plan = trainer.begin_round()
        t1 = time.perf_counter()
        messages = trainer.executor.run(
            algorithm, algorithm.weights, plan.cohort.tasks, plan.streams
        )
        t2 = time.perf_counter()
        trainer.finish_round(plan, messages)
        t3 = time.perf_counter()
        if r < args.warmup:
            continue
        rounds.append(t3 - t0)
        cohort.append(len(plan.cohort.tasks))
        split = {"select": t1 - t0}
        if executor is not None:
            split.update(
                {k: v for k, v in executor.last_timings.items() if k != "total"}
            )
        else:
            split["compute"] = t2 - t1
        split["server"] = t3 - t2
        phases.append(split)
    out = {
        "variant": args.child,
        "data": source,
        "parameters": algorithm.num_weights,
        "build_s": built,
        "start_s": started,
        "round_s": rounds,
        "cohort": cohort,
        "phases": {k: statistics.median(p[k] for p in phases) for k in phases[0]},
        "driver_peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "workers": [],
        "torch_threads": torch.get_num_threads(),
    }
    if executor is not None:
        out["workers"] = [dataclasses.asdict(w) for w in executor.workers()]
        executor.close()
    torch.save(algorithm.weights.clone(), args.weights_out)
    return out


# -- the comparison -------------------------------------------------------------------
def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--records", type=int, default=64, help="records per client")
    ap.add_argument("--sync", type=float, default=0.2, help="sync probability p")
    ap.add_argument("--batch", type=int, default=16, help="B")
    ap.add_argument("--local-steps", type=int, default=4, help="K")
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds")
    ap.add_argument("--warmup", type=int, default=1, help="untimed first rounds")
    ap.add_argument("--threads", type=int, default=2, help="CPUs of every variant")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--repeats", type=int, default=1, help="runs of every variant")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--weights-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return

    from dpfl._runtime import openmp_defaults

    env = dict(os.environ)
    openmp_defaults(env)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (src, env.get("PYTHONPATH", "")) if p
    )
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    variants = args.variants.split(",")
    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(
        f"{os.cpu_count()} CPUs, threads per variant {args.threads}, "
        f"GOMP_SPINCOUNT {env.get('GOMP_SPINCOUNT', 'default')}, OMP_WAIT_POLICY "
        f"{env.get('OMP_WAIT_POLICY', 'unset')}; PriFedSync, {args.clients} clients x "
        f"{args.records} records, p = {args.sync}, B = {args.batch}, K = "
        f"{args.local_steps}; {args.rounds} timed rounds after {args.warmup}; "
        f"1-min load average {os.getloadavg()[0]:.2f}"
    )
    results: dict[str, list[dict]] = {v: [] for v in variants}
    weights: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for v in variants:
                path = os.path.join(tmp, f"{v}-{rep}.pt")
                cmd = [sys.executable, __file__, *sys.argv[1:], "--child", v]
                cmd += ["--weights-out", path]
                done = subprocess.run(
                    cmd, env=env, capture_output=True, text=True, check=False
                )
                if done.returncode:
                    sys.exit(f"{v} failed:\n{done.stderr[-4000:]}")
                results[v].append(json.loads(done.stdout.strip().splitlines()[-1]))
                weights[v] = path
        import torch

        ref = torch.load(weights[variants[0]])
        drift = {v: float((torch.load(weights[v]) - ref).abs().max()) for v in variants}
    first = results[variants[0]][0]
    print(
        f"data: {first['data']}; model prifedsync_cnn, {first['parameters']:,} "
        f"parameters; synced clients per timed round: {first['cohort']}"
    )
    base = results[variants[0]]
    head = (
        f"{'variant':<8} {'round s':>8} {'rounds/s':>9} {'vs ' + variants[0]:>11} "
        f"{'start s':>8} {'driver MB':>10} {'workers MB':>14} {'max |Δθ|':>9}"
    )
    print(head)
    for v in variants:
        runs = results[v]
        med = statistics.median(t for r in runs for t in r["round_s"])
        ratio = statistics.median(
            a / b
            for r, r0 in zip(runs, base)
            for a, b in zip(r["round_s"], r0["round_s"])
        )
        last = runs[-1]
        workers = "/".join(_mb(w["peak_rss_bytes"]) for w in last["workers"]) or "-"
        print(
            f"{v:<8} {med:>8.3f} {1 / med:>9.2f} {ratio:>10.2f}× "
            f"{last['start_s']:>8.1f} {_mb(last['driver_peak_rss']):>10} "
            f"{workers:>14} {drift[v]:>9.1e}"
        )
    print("driver phases per round (median seconds):")
    for v in variants:
        ph = results[v][-1]["phases"]
        print(f"  {v:<8} " + "  ".join(f"{k} {t:.3f}" for k, t in ph.items()))
        if "wait" in ph:  # what the driver does alone, however many workers
            serial = sum(t for k, t in ph.items() if k != "wait")
            print(f"  {'':<8} driver-serial (all but wait) {serial:.3f}")
    cohort = statistics.mean(first["cohort"])
    d = first["parameters"]
    print(
        f"mean synced clients per round {cohort:.1f}; each moves about 6d floats "
        f"through the driver a round (helper and Adam moments out, model and "
        f"moments back): {6 * d * 4 / 2**20:.1f} MB a client"
    )
    nodes = max(len({w["node_id"] for w in r[-1]["workers"]}) for r in results.values())
    print(
        f"Ray nodes per variant: {max(nodes, 1)} (the driver and its workers share "
        "this machine: its peak is about the driver's and the workers' together)"
    )
    print("target: ray-1 / batched <= 1.3")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
