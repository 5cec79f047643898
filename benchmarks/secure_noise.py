"""Cost of secure noise: time per million normals, and per round of typical runs.

Prints, for the device given (``--device cpu`` or ``cuda``):

1. The time to fill one million float32 values with N(0, 1) from dpfl's
   secure sampler (:mod:`dpfl.sim.secure_noise`: the ChaCha20 stream,
   Box–Muller in float64, four normals summed and halved) and from torch's
   seeded generator (``Tensor.normal_``), interleaved (secure, seeded,
   secure, ...) so that a change of machine load hits both alike; the
   figure is the median of the per-repeat ratios secure / seeded, with
   their range. On CUDA also the eager torch operations (no
   ``torch.compile``), the first call's compile time, and the earlier
   SHAKE-256 stream (``shake256-v1``, computed on the CPU and copied), for
   comparison.
2. The time per round of some runs with secure noise (the default) and with
   reproducible noise (``privacy.secure_noise: false``), rounds of the two
   interleaved; the figure is the median of the per-round ratios secure /
   seeded. On the CPU: the digits MLP under DP-FedAvg (preset
   dp-fedavg-digits, ``model.name=mlp``) and DP-DSGD with random
   participation (preset digits-dsgd-rp). On CUDA: PriFedSync with the
   paper's CNN (preset prifedsync-fmnist-shards, 100 clients, p = 0.5,
   K = 38 local steps of 16 records) on procedural 28×28 images
   (``synthetic-images``, so no data set is read), where every local step
   of every client draws 1.2 million normals.

Run: python benchmarks/secure_noise.py [--device cpu|cuda] [--millions 1]
     [--repeats 15] [--rounds 5] [--local-steps K] [--no-rounds | --no-draws]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.experiments import runner
from dpfl.experiments.config import load_config
from dpfl.sim import secure_noise as sn
from dpfl.sim.loop import Trainer

PRESETS = Path(__file__).resolve().parents[1] / "presets"
CPU_RUNS = {
    "DP-FedAvg (digits, MLP)": ("dp-fedavg-digits.yaml", ["model.name=mlp"]),
    "DP-DSGD rp (digits, MLP)": ("digits-dsgd-rp.yaml", []),
}
CUDA_RUNS = {
    "PriFedSync (paper CNN, 28x28 procedural images)": (
        "prifedsync-fmnist-shards.yaml",
        [
            "data={name: synthetic-images, num_clients: 100, partition: null, "
            "records_per_client: 600}",
        ],
    ),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fill, out: torch.Tensor) -> float:  # type: ignore[no-untyped-def]
    sync(out.device)
    t0 = time.perf_counter()
    fill(out)
    sync(out.device)
    return time.perf_counter() - t0


def spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.3g} (range {min(xs):.3g}-{max(xs):.3g})"


def per_million(device: torch.device, millions: float, repeats: int) -> None:
    """Secure vs seeded normals, interleaved; ms per million and the ratio."""
    n = int(millions * 1_000_000)
    out = torch.empty(n, device=device)
    seeded = torch.Generator(device=device)
    seeded.manual_seed(0)
    secure = sn.SecureGenerator(sn.new_key(), device)
    t0 = time.perf_counter()
    secure.normal_(out)  # first call: buffers, and on CUDA the compile
    sync(device)
    first = time.perf_counter() - t0
    out.normal_(generator=seeded)
    variants = {
        "secure": lambda t: secure.normal_(t),
        "seeded": lambda t: t.normal_(generator=seeded),
    }
    if device.type == "cuda":
        key = sn.derive_key(sn.new_key(), "noise")

        def eager(t: torch.Tensor) -> None:
            sn._fill_chacha20(key, 0, t, 1.0, compiled=False)

        variants["secure, eager (no torch.compile)"] = eager
        v1 = sn.SecureGenerator(sn.new_key(), device, version="shake256-v1")
        variants["shake256-v1 (CPU, copied)"] = lambda t: v1.normal_(t)
        eager(out)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):
        for name, fill in variants.items():
            times[name].append(timed(fill, out) / millions)
    ratios = [a / b for a, b in zip(times["secure"], times["seeded"])]
    print(f"one million N(0,1) (float32) on {device}, {repeats} interleaved repeats:")
    for name, ts in times.items():
        print(f"  {name}: ms {spread([t * 1e3 for t in ts])}")
    print(f"  secure / seeded: {spread(ratios)}")
    what = "compile and first draw" if device.type == "cuda" else "first draw"
    print(f"  {what}: {first:.2f} s")


def trainer(
    preset: str, overrides: list[str], secure: bool, device: str, steps: int | None
) -> Trainer:
    """The trainer ``dpfl train`` builds for the preset (σ fixed, no budget)."""
    extra = [*overrides, "privacy.noise_multiplier=1.0", "privacy.epsilon=.inf"]
    extra.append(f"device={device}")
    if steps is not None:
        extra.append(f"algorithm.params.local_steps={steps}")
    config = load_config(PRESETS / preset, extra)
    dataset = runner._build_dataset(config)
    config = runner._resolve(config, dataset)
    algorithm = runner._build_algorithm(config, dataset)
    return Trainer(
        algorithm,
        ledger=PrivacyLedger(None),
        seed=config.seed,
        execution=config.execution,
        secure_noise=secure,
    )


def per_round(
    preset: str,
    overrides: list[str],
    rounds: int,
    device: torch.device,
    steps: int | None,
) -> dict[str, float | list[float]]:
    """Round times (secure, seeded, interleaved) and the secure draws' share."""
    secure = trainer(preset, overrides, True, str(device), steps)
    seeded = trainer(preset, overrides, False, str(device), steps)
    secure.step(), seeded.step()  # warm-up (and on CUDA the compile)
    sync(device)
    drawn = {"normals": 0.0, "seconds": 0.0}
    normal_ = sn.SecureGenerator.normal_

    def counted(self, out, std=1.0, *, draw=None):  # type: ignore[no-untyped-def]
        drawn["normals"] += out.numel()
        return normal_(self, out, std, draw=draw)

    t_secure, t_seeded = [], []
    sn.SecureGenerator.normal_ = counted  # type: ignore[method-assign]
    try:
        for _ in range(rounds):
            for t, times in ((secure, t_secure), (seeded, t_seeded)):
                sync(device)
                t0 = time.perf_counter()
                t.step()
                sync(device)
                times.append(time.perf_counter() - t0)
    finally:
        sn.SecureGenerator.normal_ = normal_  # type: ignore[method-assign]
    return {
        "weights": float(secure.algorithm.weights.numel()),
        "normals": drawn["normals"] / rounds,
        "secure": t_secure,
        "seeded": t_seeded,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--millions", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--local-steps",
        type=int,
        default=None,
        help="override the CUDA run's local steps (the preset's 38 by default)",
    )
    ap.add_argument("--no-rounds", action="store_true", help="only the draws")
    ap.add_argument("--no-draws", action="store_true", help="only the rounds")
    a = ap.parse_args()
    logging.disable(logging.WARNING)
    device = torch.device(a.device)

    print("command:", shlex.join(["python", *sys.argv]))
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine()
    )
    print(
        f"device: {device} ({name}); {os.cpu_count()} cores, torch "
        f"{torch.__version__}, threads {torch.get_num_threads()}, OpenSSL ChaCha20 "
        f"{'yes' if sn._OPENSSL else 'no (torch operations)'}, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    if not a.no_draws:
        per_million(device, a.millions, a.repeats)
    if a.no_rounds:
        return
    runs = CUDA_RUNS if device.type == "cuda" else CPU_RUNS
    for title, (preset, overrides) in runs.items():
        f = per_round(preset, overrides, a.rounds, device, a.local_steps)
        s, r = f["secure"], f["seeded"]
        assert isinstance(s, list) and isinstance(r, list)
        ratios = [x / y for x, y in zip(s, r)]
        print(
            f"{title}: {f['weights']:,.0f} weights, {f['normals']:,.0f} secure "
            f"normals a round; a round: secure ms {spread([x * 1e3 for x in s])}, "
            f"seeded ms {spread([x * 1e3 for x in r])}; secure / seeded "
            f"{spread(ratios)} ({a.rounds} interleaved rounds)"
        )


if __name__ == "__main__":
    main()
