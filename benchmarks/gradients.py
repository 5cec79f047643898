"""Benchmark: clipped per-sample gradient sums vs a non-private backward pass.

Paper CNN (random-participation App. B, 62 classes), 28 x 28 inputs, batch 700.
Times are interleaved round-robin in one process (the machine may be shared, so
each variant sees the same background load) and the minimum and median over
``--repeats`` calls are reported. Peak RSS is measured per variant in a fresh
subprocess (``VmHWM`` after two calls), next to the RSS of the same process
before the first call.

On a shared machine, set ``OMP_WAIT_POLICY=PASSIVE``: spinning OpenMP threads
competing with other processes made every variant 2-4x slower in our runs.

Usage::

    python benchmarks/gradients.py [--batch 700] [--segments 70] [--repeats 7]
                                   [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from dpfl.models import PaperCNN
from dpfl.sim.grad import clipped_grad_sum

VARIANTS = {
    "non-private backward": {},
    "ghost": {"method": "ghost"},
    "ghost, 70 segments": {"method": "ghost", "segmented": True},
    "vmap, max_batch=64": {"method": "vmap", "max_batch": 64},
    "vmap, default chunk": {"method": "vmap"},
    "vmap, max_batch=700": {"method": "vmap", "max_batch": 700},
    "vmap, 70 segments": {"method": "vmap", "segmented": True},
}


def make_call(name: str, batch: int, segments: int):
    torch.manual_seed(0)
    model = PaperCNN(num_classes=62)
    x = torch.randn(batch, 1, 28, 28)
    y = torch.randint(0, 62, (batch,))
    seg = torch.randint(0, segments, (batch,))
    spec = VARIANTS[name]
    if not spec:

        def call() -> None:
            model.zero_grad()
            F.cross_entropy(model(x), y).backward()

        return call
    params = {n: p.detach() for n, p in model.named_parameters()}
    kw = {"method": spec["method"]}
    if "max_batch" in spec:
        kw["max_batch"] = spec["max_batch"]
    if spec.get("segmented"):
        kw.update(segment_ids=seg, num_segments=segments)

    def call() -> None:
        clipped_grad_sum(model, params, x, y, clip=1.0, **kw)

    return call


def proc_status_mib(field: str) -> float:
    # VmRSS: current RSS; VmHWM: peak RSS of this process image. (ru_maxrss is
    # not used: Linux carries it over from the parent across fork + exec.)
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB -> MiB
    return float("nan")


def measure_memory(name: str, batch: int, segments: int) -> dict:
    call = make_call(name, batch, segments)
    before = proc_status_mib("VmRSS")
    call()
    call()
    return {"rss_before_mib": before, "peak_rss_mib": proc_status_mib("VmHWM")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=700)
    parser.add_argument("--segments", type=int, default=70)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_of:
        print(json.dumps(measure_memory(args.memory_of, args.batch, args.segments)))
        return

    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
        f"batch {args.batch}, segments {args.segments}, repeats {args.repeats}"
    )
    calls = {name: make_call(name, args.batch, args.segments) for name in VARIANTS}
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for call in calls.values():
        call()  # warm-up
    for _ in range(args.repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)

    base = min(times["non-private backward"])
    header = f"{'variant':<24}{'min ms':>9}{'median ms':>11}{'ratio':>8}"
    print(header + f"{'RSS before':>12}{'peak RSS':>10}")
    for name in VARIANTS:
        cmd = [sys.executable, __file__, "--memory-of", name]
        cmd += ["--batch", str(args.batch), "--segments", str(args.segments)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        mem = json.loads(subprocess.run(cmd, capture_output=True, check=True).stdout)
        ts = sorted(times[name])
        print(
            f"{name:<24}{ts[0] * 1e3:>9.1f}{ts[len(ts) // 2] * 1e3:>11.1f}"
            f"{ts[0] / base:>8.2f}{mem['rss_before_mib']:>10.0f}Mi"
            f"{mem['peak_rss_mib']:>8.0f}Mi"
        )
    print("ratio = min time / min time of the non-private backward")


if __name__ == "__main__":
    main()
