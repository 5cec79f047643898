"""Cost of secure noise: time per million normals and per round of typical runs.

Prints (1) the time to draw one million float32 N(0, 1) values from dpfl's
secure sampler (SHAKE-256 stream, Box–Muller, four normals summed per
output: :mod:`dpfl.sim.secure_noise`) beside torch's seeded generator
(``Tensor.normal_``), and (2) the time per round of two digits runs with an
MLP, DP-FedAvg (preset dp-fedavg-digits with ``model.name=mlp``) and DP-DSGD
with random participation (preset digits-dsgd-rp), with secure noise (the
default) and with reproducible noise (``privacy.secure_noise: false``), and
the time the secure draws take inside those rounds beside torch's time for
as many normals. Rounds of the two modes alternate so that a change of
machine load hits both alike; every figure is the fastest of its repeats (on
a shared machine the fastest is the least disturbed).

Run: python benchmarks/secure_noise.py [--millions 1] [--repeats 5] [--rounds 10]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from pathlib import Path

import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.experiments import runner
from dpfl.experiments.config import load_config
from dpfl.sim.loop import Trainer
from dpfl.sim.secure_noise import SecureGenerator, fill_normal_, new_key

PRESETS = Path(__file__).resolve().parents[1] / "presets"
RUNS = {
    "DP-FedAvg (digits, MLP)": ("dp-fedavg-digits.yaml", ["model.name=mlp"]),
    "DP-DSGD rp (digits, MLP)": ("digits-dsgd-rp.yaml", []),
}


def per_million(generator: object, millions: float, repeats: int) -> float:
    """Fastest seconds per million normals (float32) over ``repeats`` draws."""
    out = torch.empty(int(millions * 1_000_000))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fill_normal_(out, generator)  # type: ignore[arg-type]
        times.append((time.perf_counter() - t0) / millions)
    return min(times)


def trainer(preset: str, overrides: list[str], secure: bool) -> Trainer:
    """The trainer ``dpfl train`` builds for the preset (σ fixed, no budget)."""
    config = load_config(
        PRESETS / preset,
        [*overrides, "privacy.noise_multiplier=1.0", "privacy.epsilon=.inf"],
    )
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


def per_round(preset: str, overrides: list[str], rounds: int) -> dict[str, float]:
    """Fastest seconds a round (secure, reproducible) and of its secure draws."""
    secure, seeded = trainer(preset, overrides, True), trainer(preset, overrides, False)
    secure.step(), seeded.step()  # warm-up
    drawn = {"normals": 0.0, "seconds": 0.0}
    normal_ = SecureGenerator.normal_

    def timed(self, out, std=1.0, *, draw=None):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        normal_(self, out, std, draw=draw)
        drawn["seconds"] += time.perf_counter() - t0
        drawn["normals"] += out.numel()
        return out

    t_secure, t_seeded, t_draws = [], [], []
    SecureGenerator.normal_ = timed  # type: ignore[method-assign]
    try:
        for _ in range(rounds):
            drawn["seconds"] = 0.0
            for t, times in ((secure, t_secure), (seeded, t_seeded)):
                t0 = time.perf_counter()
                t.step()
                times.append(time.perf_counter() - t0)
            t_draws.append(drawn["seconds"])  # the seeded round draws none
    finally:
        SecureGenerator.normal_ = normal_  # type: ignore[method-assign]
    normals = drawn["normals"] / rounds
    g = torch.Generator()
    g.manual_seed(0)
    return {
        "weights": float(secure.algorithm.weights.numel()),
        "normals": normals,
        "secure": min(t_secure),
        "seeded": min(t_seeded),
        "secure_draws": min(t_draws),
        "torch_draws": per_million(g, normals / 1e6, 20) * normals / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--millions", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=10)
    a = ap.parse_args()
    logging.disable(logging.WARNING)

    print(f"command: python benchmarks/secure_noise.py {' '.join(sys.argv[1:])}")
    print(
        f"machine: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    g = torch.Generator()
    g.manual_seed(0)
    secure = per_million(SecureGenerator(new_key()), a.millions, a.repeats)
    seeded = per_million(g, a.millions, a.repeats)
    print(
        f"one million N(0,1) (float32): secure {secure * 1e3:.1f} ms, torch "
        f"generator {seeded * 1e3:.2f} ms ({secure / seeded:.0f}x)"
    )
    for name, (preset, overrides) in RUNS.items():
        f = per_round(preset, overrides, a.rounds)
        s, r = f["secure"], f["seeded"]
        print(
            f"{name}: {f['weights']:,.0f} weights, {f['normals']:,.0f} normals a "
            f"round; drawing them: secure {f['secure_draws'] * 1e3:.2f} ms, torch "
            f"{f['torch_draws'] * 1e3:.3f} ms; a whole round: secure "
            f"{s * 1e3:.1f} ms, reproducible {r * 1e3:.1f} ms ({(s - r) / r:+.0%}, "
            "load included)"
        )


if __name__ == "__main__":
    main()
