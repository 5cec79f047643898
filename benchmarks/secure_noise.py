"""Cost of secure noise: time per million normals, and per round of typical runs.

Prints, for the device given (``--device cpu`` or ``cuda``):

1. The time to fill one million float32 values with N(0, 1) from dpfl's
   secure sampler (:mod:`dpfl.sim.secure_noise`: the ChaCha20 stream,
   Box–Muller in float64, four normals summed and halved) and from torch's
   seeded generator (``Tensor.normal_``), interleaved (secure, seeded,
   secure, ...) so that a change of machine load hits both alike; the
   figure is the median of the per-repeat ratios secure / seeded, with
   their range. The secure draw runs as dpfl runs it (on CUDA the fused
   Triton kernel when Triton is installed and its probe passed; the line
   ``secure noise kernel`` says which). On CUDA also the torch operations
   with the ``torch.compile``d keystream (what runs without Triton), the
   eager torch operations, the first call's probe and compile time, and the
   earlier SHAKE-256 stream (``shake256-v1``, computed on the CPU and
   copied), for comparison.
2. The time per round of some runs with secure noise (the default) and with
   reproducible noise (``privacy.secure_noise: false``), rounds of the two
   interleaved; the figure is the median of the per-round ratios secure /
   seeded. On the CPU: the digits MLP under DP-FedAvg (preset
   dp-fedavg-digits, ``model.name=mlp``) and DP-DSGD with random
   participation (preset digits-dsgd-rp). On CUDA: PriFedSync with the
   paper's CNN (preset prifedsync-fmnist-shards, 100 clients, p = 0.5,
   K = 38 local steps of 16 records) on procedural 28×28 images
   (``synthetic-images``, so no data set is read), where every local step
   of every client draws 1.2 million normals (the cohort's rows of a step in
   one launch: :func:`dpfl.sim.secure_noise.fill_normal_rows_`, timed alone
   too), and DP-FedAvg with McMahan et al.'s CNN (preset dp-fedavg-mnist,
   one local epoch) on the same images, whose server draws 1.7 million
   normals a round. ``--runs`` picks others.

Run: python benchmarks/secure_noise.py [--device cpu|cuda] [--millions 1]
     [--repeats 15] [--rounds 5] [--local-steps K] [--runs NAME,...]
     [--set KEY=VALUE ...] [--no-rounds | --no-draws]
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

import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.experiments import build
from dpfl.experiments.config import load_config
from dpfl.experiments.presets import PRESET_DIR
from dpfl.experiments.privacy import resolve_privacy
from dpfl.sim import chacha, keys, privatize
from dpfl.sim import secure_noise as sn
from dpfl.sim.loop import Trainer

PRESETS = PRESET_DIR
#: 100 clients of 600 procedural 28×28 images (no data set is read).
IMAGES = (
    "data={name: synthetic-images, num_clients: 100, partition: null, "
    "records_per_client: 600}"
)
#: --runs name -> (title, preset, overrides)
RUNS = {
    "dp-fedavg-mlp": (
        "DP-FedAvg (digits, MLP)",
        "dp-fedavg-digits.yaml",
        ["model.name=mlp"],
    ),
    "dsgd-rp": ("DP-DSGD rp (digits, MLP)", "digits-dsgd-rp.yaml", []),
    "prifedsync": (
        "PriFedSync (paper CNN, 28x28 procedural images)",
        "prifedsync-fmnist-shards.yaml",
        [IMAGES],
    ),
    # The server draws one noise vector a round (1.7 million normals);
    # one local epoch (the preset has 5) keeps the round short, and so makes
    # the noise's share larger than in the preset's round.
    "dp-fedavg-cnn": (
        "DP-FedAvg (McMahan CNN, 28x28 procedural images, 1 local epoch)",
        "dp-fedavg-mnist.yaml",
        [IMAGES, "algorithm.params.local_epochs=1"],
    ),
}
DEFAULT_RUNS = {"cpu": "dp-fedavg-mlp,dsgd-rp", "cuda": "prifedsync,dp-fedavg-cnn"}


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
    secure = sn.SecureGenerator(keys.new_key(), device)
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
        key = keys.derive_key(keys.new_key(), "noise")

        def compiled(t: torch.Tensor) -> None:
            chacha._fill_torch(key, 0, t, 0.5, compiled=True)

        def eager(t: torch.Tensor) -> None:
            sn._fill_chacha20(key, 0, t, 1.0, compiled=False)

        variants["secure, torch ops, compiled keystream (no Triton)"] = compiled
        variants["secure, eager torch ops"] = eager
        v1 = sn.SecureGenerator(keys.new_key(), device, version="shake256-v1")
        variants["shake256-v1 (CPU, copied)"] = lambda t: v1.normal_(t)
        t0 = time.perf_counter()
        compiled(out)
        sync(device)
        compile_s = time.perf_counter() - t0
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
    kernel = sn.noise_kernel(device)
    print(f"  secure noise kernel: {kernel}")
    if device.type == "cuda" and kernel != "triton":
        index = device if device.index is not None else torch.cuda.current_device()
        why = chacha._FUSED.get(torch.device("cuda", index), "DPFL_NOISE_TRITON=0")
        print(f"  the fused Triton kernel is not used: {why}")
    what = "probe or compile, and first draw" if device.type == "cuda" else "first draw"
    print(f"  {what}: {first:.2f} s")
    if device.type == "cuda":
        print(f"  torch.compile of the keystream and first draw: {compile_s:.2f} s")
        cohort_rows(device, repeats)


def cohort_rows(device: torch.device, repeats: int, m: int = 50) -> None:
    """A cohort's rows of noise (PriFedSync's step): one launch against in turn."""
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    d = 1_199_882  # the paper CNN's weights
    out = torch.empty(m, d, device=device)
    cohort_keys = [keys.new_key() for _ in range(m)]
    together = [sn.SecureGenerator(k, device) for k in cohort_keys]
    alone = [sn.SecureGenerator(k, device) for k in cohort_keys]
    seeded = [torch.Generator(device=device) for _ in range(m)]
    for i, g in enumerate(seeded):
        g.manual_seed(i)

    def in_turn(t: torch.Tensor, gens: list) -> None:  # type: ignore[type-arg]
        for row, g in zip(t, gens):
            sn.fill_normal_(row, g)

    variants = {
        "secure, one launch": lambda t: sn.fill_normal_rows_(t, together),
        "secure, a row at a time": lambda t: in_turn(t, alone),
        "seeded, a row at a time": lambda t: in_turn(t, seeded),
    }
    for fill in variants.values():
        timed(fill, out)  # warm-up
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(repeats):
        for name, fill in variants.items():
            times[name].append(timed(fill, out))
    per = m * d / 1e6
    found = chacha._FUSED.get(device)
    rows = (
        "one launch"
        if chacha._fused_rows(device) is not None
        else "a row at a time ("
        + (found.rows_why if isinstance(found, chacha._Fused) else str(found))
        + ")"
    )
    print(f"a cohort's noise: {m} rows of {d:,} (one local step of PriFedSync's CNN):")
    for name, ts in times.items():
        print(f"  {name}: ms per million {spread([t * 1e3 / per for t in ts])}")
    print(f"  fill_normal_rows_ draws: {rows}")


def trainer(
    preset: str, overrides: list[str], secure: bool, device: str, steps: int | None
) -> Trainer:
    """The trainer ``dpfl train`` builds for the preset (σ fixed, no budget)."""
    extra = [*overrides, "privacy.noise_multiplier=1.0", "privacy.epsilon=.inf"]
    extra.append(f"device={device}")
    config = load_config(PRESETS / preset, extra)
    if steps is not None and hasattr(config.algorithm.params, "local_steps"):
        extra.append(f"algorithm.params.local_steps={steps}")
        config = load_config(PRESETS / preset, extra)
    dataset = build.build_dataset(config)
    config = resolve_privacy(config, dataset)
    algorithm = build.build_algorithm(config, dataset)
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
    """Round times (secure, seeded, interleaved) and the secure draws' share.

    Each round's times are printed as they come (a run stopped by a time
    limit still shows what it measured).
    """
    t0 = time.perf_counter()
    secure = trainer(preset, overrides, True, str(device), steps)
    seeded = trainer(preset, overrides, False, str(device), steps)
    print(f"  set-up {time.perf_counter() - t0:.1f} s", flush=True)
    for t, name in ((secure, "secure"), (seeded, "seeded")):
        sync(device)
        t0 = time.perf_counter()
        t.step()  # warm-up (and on CUDA the kernels' compile)
        sync(device)
        print(f"  warm-up round, {name}: {time.perf_counter() - t0:.2f} s", flush=True)
    drawn = {"normals": 0.0, "inside rows": 0.0}
    normal_ = sn.SecureGenerator.normal_
    rows_ = privatize.fill_normal_rows_

    def counted(self, out, std=1.0, *, draw=None):  # type: ignore[no-untyped-def]
        if not drawn["inside rows"]:  # rows drawn one at a time: counted below
            drawn["normals"] += out.numel()
        return normal_(self, out, std, draw=draw)

    def counted_rows(out, generators, std=1.0):  # type: ignore[no-untyped-def]
        if any(isinstance(g, sn.SecureGenerator) for g in generators):
            drawn["normals"] += out.numel()
        drawn["inside rows"] += 1
        try:
            return rows_(out, generators, std)
        finally:
            drawn["inside rows"] -= 1

    # The two runs draw their cohorts from other streams (the secure run's
    # from its key), so a round's cohorts differ in size: the time per
    # participant is compared too.
    t_secure, t_seeded = [], []
    per_client: list[float] = []
    sn.SecureGenerator.normal_ = counted  # type: ignore[method-assign]
    privatize.fill_normal_rows_ = counted_rows
    try:
        for i in range(rounds):
            sizes = []
            for t, times in ((secure, t_secure), (seeded, t_seeded)):
                sync(device)
                t0 = time.perf_counter()
                report = t.step()
                sync(device)
                times.append(time.perf_counter() - t0)
                sizes.append(max(1, len(report.participants)))
            per_client.append((t_secure[-1] / sizes[0]) / (t_seeded[-1] / sizes[1]))
            print(
                f"  round {i + 1}: secure {t_secure[-1] * 1e3:.4g} ms "
                f"({sizes[0]} participants), seeded {t_seeded[-1] * 1e3:.4g} ms "
                f"({sizes[1]}); secure / seeded {t_secure[-1] / t_seeded[-1]:.3g}, "
                f"per participant {per_client[-1]:.3g}",
                flush=True,
            )
    finally:
        sn.SecureGenerator.normal_ = normal_  # type: ignore[method-assign]
        privatize.fill_normal_rows_ = rows_
    return {
        "weights": float(secure.algorithm.weights.numel()),
        "normals": drawn["normals"] / rounds,
        "secure": t_secure,
        "seeded": t_seeded,
        "per_client": per_client,
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
        help="override the local steps of runs that have them (PriFedSync's 38)",
    )
    ap.add_argument(
        "--runs",
        default=None,
        help=f"the runs timed, comma-separated, of {', '.join(RUNS)} (default: "
        f"{DEFAULT_RUNS['cpu']} on the CPU, {DEFAULT_RUNS['cuda']} on CUDA)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a configuration override for every run timed (repeatable), after "
        "the run's own (e.g. a smaller run for a quick check)",
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
    names = (a.runs or DEFAULT_RUNS["cuda" if device.type == "cuda" else "cpu"]).split(
        ","
    )
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        ap.error(f"--runs: unknown {', '.join(unknown)} (known: {', '.join(RUNS)})")
    for name in names:
        title, preset, overrides = RUNS[name]
        overrides = [*overrides, *a.set]
        print(f"{title}:", flush=True)
        f = per_round(preset, overrides, a.rounds, device, a.local_steps)
        s, r, pc = f["secure"], f["seeded"], f["per_client"]
        assert isinstance(s, list) and isinstance(r, list) and isinstance(pc, list)
        ratios = [x / y for x, y in zip(s, r)]
        print(
            f"{title}: {f['weights']:,.0f} weights, {f['normals']:,.0f} secure "
            f"normals a round; a round: secure ms {spread([x * 1e3 for x in s])}, "
            f"seeded ms {spread([x * 1e3 for x in r])}; secure / seeded "
            f"{spread(ratios)}, per participant {spread(pc)} ({a.rounds} "
            "interleaved rounds)"
        )


if __name__ == "__main__":
    main()
