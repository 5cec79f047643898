"""Time of ``dpfl reproduce all --scale smoke``: wall and CPU seconds, per paper.

The target: within 4 minutes on an idle 2-core machine, every report
written. On a shared machine the wall time depends on the load, so the
script prints the CPU seconds of the command (user + system, from the
child's resource usage) beside the wall time and the load average before
and after, and each report's own accounting and experiment times.

Usage::

    python benchmarks/reproduce_smoke.py [--out DIR]

It runs ``python -m dpfl.cli reproduce all --scale smoke --out DIR`` (the
``dpfl`` of the tree on ``PYTHONPATH``) and prints the figures and that
command.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    """Run the command once; print wall, CPU, load and the per-report times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="report folder (default: a temporary one)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="dpfl-smoke-"))
    cmd = [sys.executable, "-m", "dpfl.cli", "reproduce", "all", "--scale", "smoke"]
    cmd += ["--out", str(out)]
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"command: {' '.join(cmd)}")
    print(f"exit status {done.returncode}")
    print(f"wall {wall:.1f} s, CPU {cpu:.1f} s (user + system)")
    print(
        f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}"
    )
    pattern = re.compile(r"_(Accounting recomputed in|Experiment:) ([0-9.]+) s")
    for report in sorted(out.glob("*/report.md")):
        times = pattern.findall(report.read_text())
        parts = ", ".join(f"{k.split()[0].lower()} {v} s" for k, v in times)
        print(f"  {report.parent.name}: {parts}")
    print(f"reports written: {len(list(out.glob('*/report.md')))}")
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
