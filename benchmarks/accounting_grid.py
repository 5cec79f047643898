"""Accounting at extreme but valid parameters: time, memory and method per case.

Draws a seeded random grid of Poisson-subsampled Gaussian cases (sigma
log-uniform in [0.3, 20], q log-uniform in [1e-5, 1] with a share of q = 1,
T log-uniform in [1, 1e5], delta log-uniform in [1e-10, 1e-2]) and asks the
Accountant for epsilon(delta) of each, one case per child process (so a crash
or a memory blow-up of one case is recorded, not fatal), under a wall-clock
limit. Prints per case: the parameters, the bracket, the method that answered,
the time and the child's peak resident memory; then the worst case and the
command that produced the table. Target (issue 16): every case answers, in
<= 10 s for T <= 1e5 on two cores, within about 2 GiB.

Run: PYTHONPATH=src python benchmarks/accounting_grid.py [--cases 120]
     [--seed 16] [--timeout 60] [--jobs 1]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np

_CHILD = r"""
import json, resource, sys, time
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.events import Gaussian, PoissonSampled
s, q, t, d = json.loads(sys.argv[1])
t0 = time.perf_counter()
try:
    b = Accountant().compose(PoissonSampled(q, Gaussian(s)), int(t)).epsilon(d)
    out = {"lower": b.lower, "upper": b.upper,
           "method": getattr(b, "method", "") or "?"}
except BaseException as exc:  # record what happened, whatever it is
    out = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
out["seconds"] = time.perf_counter() - t0
out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
"""


def draw_cases(n: int, seed: int) -> list[tuple[float, float, int, float]]:
    """``n`` seeded random (sigma, q, T, delta) cases; about 1 in 6 has q = 1."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        sigma = float(np.exp(rng.uniform(math.log(0.3), math.log(20.0))))
        q = float(10.0 ** rng.uniform(-5.0, 0.0))
        if rng.uniform() < 1 / 6:
            q = 1.0
        t = int(round(10.0 ** rng.uniform(0.0, 5.0)))
        delta = float(10.0 ** rng.uniform(-10.0, -2.0))
        out.append(
            (round(sigma, 4), float(f"{q:.4g}"), max(t, 1), float(f"{delta:.3g}"))
        )
    return out


def run_case(case: tuple[float, float, int, float], timeout: float) -> dict:
    """Run one case in a child process; record its result, error or timeout."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(case)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=os.environ.copy(),
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout > {timeout:g} s", "seconds": timeout}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {
            "error": f"exit {proc.returncode}: {tail[:120]}",
            "seconds": time.perf_counter() - t0,
        }
    return json.loads(lines[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=120)
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--only", type=str, default="", help="comma-separated case indices")
    a = p.parse_args()
    cases = draw_cases(a.cases, a.seed)
    idx = list(range(len(cases)))
    if a.only:
        idx = [int(i) for i in a.only.split(",")]
    print(
        f"# {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs; seed {a.seed}, {len(idx)} cases"
    )
    print(
        f"{'#':>4} {'sigma':>7} {'q':>9} {'T':>6} {'delta':>8}  "
        f"{'lower':>12} {'upper':>12} {'method':<14} {'s':>6} {'MiB':>6}"
    )
    results = {}
    with cf.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        futs = {pool.submit(run_case, cases[i], a.timeout): i for i in idx}
        for fut in cf.as_completed(futs):
            i = futs[fut]
            r = fut.result()
            results[i] = r
            s, q, t, d = cases[i]
            if "error" in r:
                mid = f"{'ERROR ' + r['error']:<55}"
            else:
                mid = f"{r['lower']:12.6g} {r['upper']:12.6g} {r['method']:<14}"
            print(
                f"{i:4d} {s:7.4g} {q:9.3g} {t:6d} {d:8.2g}  {mid} "
                f"{r['seconds']:6.2f} {r.get('peak_mib', float('nan')):6.0f}",
                flush=True,
            )
    errors = [i for i in idx if "error" in results[i]]
    worst = max(idx, key=lambda i: results[i]["seconds"])
    mem = max(idx, key=lambda i: results[i].get("peak_mib", 0.0))
    print(f"# errors: {len(errors)} {errors}")
    print(
        f"# slowest: case {worst} {cases[worst]} "
        f"{results[worst]['seconds']:.2f} s ({results[worst].get('method', '')})"
    )
    print(
        f"# most memory: case {mem} {cases[mem]} "
        f"{results[mem].get('peak_mib', float('nan')):.0f} MiB"
    )
    secs = sorted(results[i]["seconds"] for i in idx)
    print(
        f"# median {secs[len(secs) // 2]:.2f} s, over 10 s: {sum(x > 10 for x in secs)}"
    )
    print(
        "# command: PYTHONPATH=src python benchmarks/accounting_grid.py "
        + " ".join(sys.argv[1:])
    )


if __name__ == "__main__":
    main()
