"""Benchmark: DP-FedAvg rounds per second, batched cohort vs one client at a time.

K = 1000 clients of procedural images (``dpfl.data.synthetic_images``, held
in memory as a real data set is), a cohort of 50 per round, 1 local epoch of
mini-batch SGD with batch 10 over 50 records per client, a small CNN
``Conv(1→8) → ReLU → MaxPool 2 → Conv(8→16) → ReLU → MaxPool 2 → Linear``.
Two image geometries, both run by default (``--sizes``):

``8``
    8 × 8 images, the size of the embedded default data (scikit-learn's
    digits); 3 × 3 convolutions with padding 1 (1,898 parameters).
``28``
    28 × 28 images, the size of MNIST (the paper's data); 5 × 5 convolutions
    without padding (5,994 parameters).

The two variants run the *same* round (``Trainer.step``: sampling, data,
local training, clipping, noise, average) and differ only in the executor
(``Trainer(..., execution=...)``):

``batched``
    ``DpFedAvg.client_steps``: every local step of the whole cohort is one
    ``cohort_sgd_step``, one forward/backward pass over the cohort's ``m·B``
    examples in which each layer applies each client's own weights;
``loop``
    ``DpFedAvg.client_step`` for each client in turn, one ordinary
    forward/backward per mini-batch.

Each client draws its batches from its own generator, so both variants train
on the same batches and end at the same weights up to float rounding
(``max |Δθ|``).

``floor`` times the same number of steps as one plain forward/backward over
all ``m·B`` examples with *shared* weights: what a perfectly batched step
costs in the model's own layers. The loop's time over this floor bounds what
any batching can win: when a client's step is mostly arithmetic (28 × 28),
the loop is only a few floors and so is the best speed-up; when it is mostly
per-call overhead (8 × 8), batching wins an order of magnitude.

Rounds are interleaved (batched, loop, batched, ...) so both variants see the
same background load; medians are reported. The OpenMP wait policy changes
the figures: with ``OMP_WAIT_POLICY=PASSIVE`` (kind to a shared machine) each
parallel operation wakes the sleeping worker thread, which triples the cost
of the loop's many small operations and flatters the speed-up; quote the
default policy. The script prints the policy in effect.

Usage::

    python benchmarks/dp_fedavg.py [--sizes 8,28] [--clients 1000] [--cohort 50]
        [--records 50] [--batch 10] [--epochs 1] [--rounds 8] [--threads N]
        [--device cpu] [--max-clients M] [--lazy]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import synthetic_images
from dpfl.sim.algorithms import build_algorithm
from dpfl.sim.loop import Trainer


class SmallCNN(nn.Module):
    """Conv(1→8) → ReLU → MaxPool 2 → Conv(8→16) → ReLU → MaxPool 2 → Linear.

    ``size`` 28: 5 × 5 kernels, no padding (28 → 24 → 12 → 8 → 4);
    any other size (a multiple of 4): 3 × 3 kernels with padding 1.
    """

    def __init__(self, size: int = 28, num_classes: int = 10) -> None:
        super().__init__()
        if size == 28:
            k, pad, side = 5, 0, 4
        else:
            k, pad, side = 3, 1, size // 4
        self.net = nn.Sequential(
            nn.Conv2d(1, 8, k, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, k, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(16 * side * side, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _timed(fn: Callable[[], object], device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def measure(size: int, args: argparse.Namespace) -> dict[str, float | int]:
    """Interleaved batched/loop rounds and the shared-weight floor at one size."""
    ds = synthetic_images(
        num_clients=args.clients,
        records_per_client=args.records,
        shape=(1, size, size),
        seed=0,
    )
    if not args.lazy:
        ds = dataclasses.replace(ds, features=np.asarray(ds.features))
    params = {
        "cohort_size": args.cohort,
        "local_epochs": args.epochs,
        "batch_size": args.batch,
        "learning_rate": 0.05,
        "clipping": "median",
    }
    trainers = {}
    for execution in ("batched", "loop"):
        torch.manual_seed(0)
        alg = build_algorithm(
            "dp-fedavg",
            params,
            model=SmallCNN(size),
            dataset=ds,
            noise_multiplier=1.0,
            device=args.device,
            max_clients=args.max_clients,
        )
        trainers[execution] = Trainer(
            alg, ledger=PrivacyLedger(None), seed=0, execution=execution
        )
    times: dict[str, list[float]] = {k: [] for k in trainers}
    for r in range(args.rounds + 1):  # round 0 is warm-up
        for name, trainer in trainers.items():
            t = _timed(trainer.step, args.device)
            if r > 0:
                times[name].append(t)
    drift = float(
        (trainers["batched"].algorithm.weights - trainers["loop"].algorithm.weights)
        .abs()
        .max()
    )
    # The floor: the same number of SGD steps, each one plain forward and
    # backward over all m*B examples with shared weights.
    torch.manual_seed(0)
    ref = SmallCNN(size).to(args.device)
    steps = args.epochs * -(-args.records // args.batch)
    xf = torch.randn(args.cohort * args.batch, 1, size, size, device=args.device)
    yf = torch.randint(0, 10, (args.cohort * args.batch,), device=args.device)

    def floor_round() -> None:
        for _ in range(steps):
            ref.zero_grad()
            nn.functional.cross_entropy(ref(xf), yf).backward()

    floor_round()
    floor = [_timed(floor_round, args.device) for _ in range(args.rounds)]
    batched = statistics.median(times["batched"])
    loop = statistics.median(times["loop"])
    return {
        "image_size": size,
        "parameters": sum(p.numel() for p in ref.parameters()),
        "batched_ms": 1e3 * batched,
        "loop_ms": 1e3 * loop,
        "floor_ms": 1e3 * statistics.median(floor),
        "batched_rounds_per_s": 1.0 / batched,
        "loop_rounds_per_s": 1.0 / loop,
        "speedup": loop / batched,
        "loop_over_floor": loop / statistics.median(floor),
        "max_abs_param_difference": drift,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,28", help="image sizes (default 8,28)")
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--cohort", type=int, default=50)
    ap.add_argument("--records", type=int, default=50, help="records per client")
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds per variant")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--max-clients", type=int, default=None, help="clients per batched chunk"
    )
    ap.add_argument(
        "--lazy",
        action="store_true",
        help="build each round's images when drawn (procedural) instead of "
        "holding all images in memory as a real data set does",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    policy = os.environ.get("OMP_WAIT_POLICY", "unset (OpenMP default)")
    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(
        f"torch {torch.__version__}, device {args.device}, threads "
        f"{torch.get_num_threads()}, OMP_WAIT_POLICY {policy}; K = {args.clients}, "
        f"cohort {args.cohort}, {args.records} records per client, batch "
        f"{args.batch}, {args.epochs} epoch(s), {args.rounds} rounds (+1 warm-up); "
        f"1-min load average {os.getloadavg()[0]:.2f}"
    )
    rows = [measure(int(s), args) for s in args.sizes.split(",")]
    head = (
        f"{'images':>7} {'params':>7} {'batched ms':>11} {'loop ms':>9} "
        f"{'floor ms':>9} {'speed-up':>9} {'loop/floor':>11} {'max |Δθ|':>9}"
    )
    print(head)
    for r in rows:
        print(
            f"{r['image_size']:>4}²{'':2} {r['parameters']:>7} "
            f"{r['batched_ms']:>11.1f} {r['loop_ms']:>9.1f} {r['floor_ms']:>9.1f} "
            f"{r['speedup']:>8.2f}× "
            f"{r['loop_over_floor']:>10.2f}× {r['max_abs_param_difference']:>9.1e}"
        )
    print(
        f"1-min load average after: {os.getloadavg()[0]:.2f}; "
        "target: speed-up >= 10 at 8x8"
    )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
