"""Benchmark: DP-FedAvg rounds per second, batched cohort vs one client at a time.

K = 1000 clients of procedural 28 x 28 images (``dpfl.data.synthetic_images``),
a cohort of 50 per round, 1 local epoch of mini-batch SGD with batch 10, a
small CNN (two 5 x 5 convolutions, 8 and 16 channels, then a linear layer;
5,994 parameters; ``--channels`` changes the widths). The two variants run
the *same* round (``DpFedAvg.run_round``: sampling, data, local training,
clipping, noise, average) and differ only in ``execution``:

``batched``
    every local step of the whole cohort is one ``cohort_sgd_step`` over
    stacked parameters: one forward/backward pass over the cohort's ``m·B``
    examples in which each layer applies each client's own weights;
``loop``
    each client in turn, one ordinary forward/backward per mini-batch.

A third figure, ``shared_weight_floor``, times the same number of steps as
one plain forward/backward over all ``m·B`` examples with shared weights: the
reference for a batched step (the batched step pays more for per-client
first-layer convolutions, and less for pooling, which it runs channels-last).

The images are built once and held in memory (157 MB), as a real data set
is; ``--lazy`` builds each round's images from the procedural generator
instead (≈ 25 ms a round that both variants pay).

Rounds are interleaved (batched, loop, batched, ...) so both variants see the
same background load; the median and the best time per round are reported.
Set ``OMP_WAIT_POLICY=PASSIVE`` on a shared machine.

Usage::

    OMP_WAIT_POLICY=PASSIVE python benchmarks/dp_fedavg.py [--clients 1000]
        [--cohort 50] [--records 50] [--batch 10] [--rounds 5] [--threads N]
        [--device cpu] [--channels 8,16] [--max-clients M] [--lazy]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import sys
import time

import numpy as np
import torch
from torch import nn

from dpfl.data import synthetic_images
from dpfl.sim.algorithms.dp_fedavg import DpFedAvg


class SmallCNN(nn.Module):
    """Conv(1→c1, 5) → ReLU → MaxPool 2 → Conv(c1→c2, 5) → ReLU → MaxPool 2 → Linear."""

    def __init__(self, num_classes: int = 10, channels: tuple[int, int] = (8, 16)):
        super().__init__()
        c1, c2 = channels
        self.net = nn.Sequential(
            nn.Conv2d(1, c1, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(c2 * 4 * 4, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--cohort", type=int, default=50)
    ap.add_argument("--records", type=int, default=50, help="records per client")
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per variant")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--channels", default="8,16", help="conv channels c1,c2 (default 8,16)"
    )
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
    print("command:", shlex.join([sys.executable, *sys.argv]))

    ds = synthetic_images(
        num_clients=args.clients, records_per_client=args.records, seed=0
    )
    if not args.lazy:
        ds = dataclasses.replace(ds, features=np.asarray(ds.features))
    c1, c2 = (int(c) for c in args.channels.split(","))
    channels = (c1, c2)
    algs = {}
    for execution in ("batched", "loop"):
        torch.manual_seed(0)
        algs[execution] = DpFedAvg(
            model=SmallCNN(channels=channels),
            dataset=ds,
            device=args.device,
            cohort_size=args.cohort,
            noise_multiplier=1.0,
            local_epochs=args.epochs,
            batch_size=args.batch,
            learning_rate=0.05,
            clipping="median",
            execution=execution,
            max_clients=args.max_clients,
        )
    n_params = sum(p.numel() for p in algs["batched"].model.parameters())
    times: dict[str, list[float]] = {k: [] for k in algs}
    for r in range(args.rounds + 1):  # round 0 is warm-up
        for name, alg in algs.items():
            rng = np.random.default_rng(r)
            gen = torch.Generator(device=args.device).manual_seed(r)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            alg.run_round(r, rng, gen)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            if r > 0:
                times[name].append(time.perf_counter() - t0)
    drift = float(
        max(
            (a.detach() - b.detach()).abs().max()
            for a, b in zip(
                algs["batched"].model.parameters(), algs["loop"].model.parameters()
            )
        )
    )
    out = {
        "clients": args.clients,
        "cohort": args.cohort,
        "records_per_client": args.records,
        "batch": args.batch,
        "epochs": args.epochs,
        "parameters": n_params,
        "channels": list(channels),
        "max_clients": args.max_clients,
        "images_in_memory": not args.lazy,
        "threads": torch.get_num_threads(),
        "device": args.device,
    }
    # Compute floor: the same number of SGD steps, each one plain forward and
    # backward over all m*B examples with *shared* weights (no per-client
    # parameters, no data gathering): what a perfectly batched step costs.
    torch.manual_seed(0)
    ref = SmallCNN(channels=channels).to(args.device)
    steps = args.epochs * -(-args.records // args.batch)
    xf = torch.randn(args.cohort * args.batch, 1, 28, 28, device=args.device)
    yf = torch.randint(0, 10, (args.cohort * args.batch,), device=args.device)
    floor = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            ref.zero_grad()
            nn.functional.cross_entropy(ref(xf), yf).backward()
        floor.append(time.perf_counter() - t0)
    out["shared_weight_floor_round_s_median"] = statistics.median(floor)
    for name, ts in times.items():
        out[f"{name}_round_s_median"] = statistics.median(ts)
        out[f"{name}_round_s_min"] = min(ts)
        out[f"{name}_rounds_per_s"] = 1.0 / statistics.median(ts)
    out["speedup_median"] = out["loop_round_s_median"] / out["batched_round_s_median"]
    out["max_abs_param_difference_after_all_rounds"] = drift
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
