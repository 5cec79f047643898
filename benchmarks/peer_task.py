"""Benchmark: user-level DP-FedAvg on the peer task, against a torch.func reference.

The task (the same one a hand-written PyTorch loop and pfl-research are timed
on): 1,000 clients x 50 records of 64 features drawn from 10 Gaussian
classes (class means N(0, I), unit noise), an MLP 64-128-10; each round a
cohort of 50 clients drawn without replacement, 1 local epoch of SGD
(batch 10, lr 0.1), each client's update clipped to norm 1, N(0, 1²) noise
on the sum (σ = 1), the sum divided by 50, server learning rate 1.

Variants, timed round by round in one process, interleaved (every round
index runs each variant once, in an order shuffled anew with a fixed seed,
so that all see the same background load):

``dpfl secure``
    ``Trainer.step()`` of ``dp-fedavg``, batched executor, dpfl's default
    secure noise (:mod:`dpfl.sim.secure_noise`).
``dpfl seeded``
    the same with ``secure_noise=False`` (noise from seeded torch generators).
``vmap ref``
    an independent implementation of the same round, written as an expert
    would with ``torch.func``: the cohort's records stacked ``[50, 50, 64]``,
    the model's parameters stacked ``[50, ...]``, each local step one
    ``vmap(grad(loss))`` and ``p - lr * g``, then the updates flattened,
    clipped to norm 1, summed, ``N(0, σ² C²)`` from ``torch.randn`` (not
    secure: the reference has no key), divided by 50 and added.

Each variant runs twice: evaluating only at the end (the per-round median over
rounds 3..R is its figure), and evaluating every 10 rounds as
:meth:`dpfl.sim.loop.Trainer.fit` does (test loss and accuracy, and for dpfl
ε at δ = 1e-5 from the ledger, each variant paying for its own ε as a run
of its own would; the mean over rounds 3..R, evaluations included, is its
figure). The script prints dpfl's ratios to the reference
(paired per round for the end-only runs, then the median), and the ratio of
dpfl's evaluate-every-10 mean to its own end-only mean.

The objects alive when the timing starts (torch's, the data's, the
variants') are frozen out of the garbage collector (``gc.freeze``): a full
collection scans them all (about 175 ms) and lands on one variant's round
at random.

A shared machine's speed drifts, so the run repeats ``--repeats`` times, each
in a fresh process; every repeat's ratios are printed, then their median and
range (the figures to quote), with the command that produced them.

Usage::

    python benchmarks/peer_task.py [--rounds 32] [--repeats 3] [--device cpu|cuda]
        [--threads 1]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import shlex
import statistics
import subprocess
import sys
import time

import numpy as np

CLIENTS, RECORDS, FEATURES, CLASSES, HIDDEN = 1000, 50, 64, 10, 128
COHORT, BATCH, LR, CLIP, SIGMA, DELTA, EVAL_EVERY = 50, 10, 0.1, 1.0, 1.0, 1e-5, 10


def rss_mib() -> float:
    """Peak resident set size of this process, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def dataset(seed: int = 0):  # noqa: ANN201  (benchmark helper)
    """1,000 clients x 50 records of 64 Gaussian features, 10 classes."""
    from dpfl.data import FederatedDataset

    rng = np.random.default_rng(seed)
    means = rng.normal(size=(CLASSES, FEATURES)).astype(np.float32)
    n = CLIENTS * RECORDS
    labels = rng.integers(0, CLASSES, size=n + 2000)
    x = means[labels] + rng.normal(size=(n + 2000, FEATURES)).astype(np.float32)
    idx = [np.arange(k * RECORDS, (k + 1) * RECORDS) for k in range(CLIENTS)]
    return FederatedDataset(
        features=x[:n],
        labels=labels[:n].astype(np.int64),
        client_indices=idx,
        num_classes=CLASSES,
        test_features=x[n:],
        test_labels=labels[n:].astype(np.int64),
    )


def mlp():  # noqa: ANN201
    """The MLP 64-128-10, seeded."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES)
    )


class Dpfl:
    """dpfl's ``dp-fedavg`` round (batched executor) with or without secure noise."""

    def __init__(self, ds, device: str, *, secure: bool, eval_every: int | None):  # noqa: ANN001
        from dpfl.accounting.ledger import PrivacyLedger
        from dpfl.sim.algorithms import build_algorithm
        from dpfl.sim.loop import Trainer

        self.alg = build_algorithm(
            "dp-fedavg",
            dict(
                cohort_size=COHORT,
                sampling="fixed",
                local_epochs=1,
                batch_size=BATCH,
                learning_rate=LR,
                clipping="fixed",
                clip=CLIP,
                server_learning_rate=1.0,
            ),
            model=mlp(),
            dataset=ds,
            noise_multiplier=SIGMA,
            device=device,
        )
        self.ledger = PrivacyLedger()
        self.trainer = Trainer(
            self.alg, ledger=self.ledger, seed=0, secure_noise=secure
        )
        self.eval_every = eval_every
        self.queried = False

    def round(self, done: int, rounds: int) -> None:
        """One round; evaluate (model and ε) as ``fit`` does on its rounds."""
        from dpfl.accounting.accountant import _cached_price, composed_epsilon

        evaluated = self.eval_every is not None and (
            done % self.eval_every == 0 or done == rounds
        )
        self.trainer.diagnostics = evaluated
        self.trainer.step()
        if evaluated:
            self.alg.evaluate()
            # Each variant stands for a run of its own, but the accounting's
            # memos are per process: without this, whichever eval10 variant
            # asks second gets the other's ε for free. A query pays its
            # composition; a variant's first query also pays the one-round
            # PLDs, which a run prices once (all first queries come in round
            # 10, before any second one).
            composed_epsilon.cache_clear()
            if not self.queried:
                _cached_price.cache_clear()
                self.queried = True
            self.ledger.epsilon(DELTA)

    def accuracy(self) -> float:
        """Test accuracy of the global model."""
        return float(self.alg.evaluate()["test_accuracy"])


class Reference:
    """The same round written directly with ``torch.func`` (stacked cohort, vmap)."""

    def __init__(self, ds, device: str, *, eval_every: int | None) -> None:  # noqa: ANN001
        import torch
        import torch.nn.functional as F
        from torch.func import functional_call, grad, vmap

        self.torch = torch
        self.device = device
        self.model = mlp().to(device)
        self.params = {k: v.detach() for k, v in self.model.named_parameters()}
        self.x = torch.as_tensor(ds.features, device=device).view(
            CLIENTS, RECORDS, FEATURES
        )
        self.y = torch.as_tensor(ds.labels, device=device).view(CLIENTS, RECORDS)
        self.test_x = torch.as_tensor(ds.test_features, device=device)
        self.test_y = torch.as_tensor(ds.test_labels, device=device)
        self.gen = torch.Generator(device=device).manual_seed(1)
        model = self.model

        def loss(p, x, y):  # noqa: ANN001, ANN202
            return F.cross_entropy(functional_call(model, p, (x,)), y)

        self.grads = vmap(grad(loss))
        self.eval_every = eval_every

    def round(self, done: int, rounds: int) -> None:
        """Sample, local SGD (vmap(grad)), clip, sum, noise, average, apply."""
        torch, gen, dev = self.torch, self.gen, self.device
        cohort = torch.randperm(CLIENTS, generator=gen, device=dev)[:COHORT]
        order = torch.rand(COHORT, RECORDS, generator=gen, device=dev).argsort(1)
        rows = cohort[:, None]
        x, y = self.x[rows, order], self.y[rows, order]
        local = {k: v.expand(COHORT, *v.shape).clone() for k, v in self.params.items()}
        for s in range(0, RECORDS, BATCH):
            g = self.grads(local, x[:, s : s + BATCH], y[:, s : s + BATCH])
            for k in local:
                local[k].sub_(g[k], alpha=LR)
        delta = torch.cat(
            [(local[k] - p).flatten(1) for k, p in self.params.items()], dim=1
        )
        norms = torch.linalg.vector_norm(delta, dim=1)
        factor = (CLIP / norms).clamp(max=1.0)
        total = factor @ delta
        total += torch.randn(total.shape, generator=gen, device=dev) * (SIGMA * CLIP)
        total /= COHORT
        off = 0
        for p in self.params.values():
            p.add_(total[off : off + p.numel()].view_as(p))
            off += p.numel()
        if self.eval_every is not None and (
            done % self.eval_every == 0 or done == rounds
        ):
            self.accuracy()

    def accuracy(self) -> float:
        """Test accuracy of the global model."""
        with self.torch.no_grad():
            out = self.model(self.test_x)
            return float((out.argmax(1) == self.test_y).float().mean())


def run(rounds: int, device: str, threads: int | None) -> dict:
    """Every variant, interleaved round by round; per-round times and ratios."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    ds = dataset()
    variants = {
        "dpfl secure": Dpfl(ds, device, secure=True, eval_every=None),
        "dpfl seeded": Dpfl(ds, device, secure=False, eval_every=None),
        "vmap ref": Reference(ds, device, eval_every=None),
        "dpfl secure eval10": Dpfl(ds, device, secure=True, eval_every=EVAL_EVERY),
        "dpfl seeded eval10": Dpfl(ds, device, secure=False, eval_every=EVAL_EVERY),
        "vmap ref eval10": Reference(ds, device, eval_every=EVAL_EVERY),
    }
    # A full collection scans every object alive, torch's own included: about
    # 175 ms here, landing on whichever variant's round allocates last, and
    # charged to it (seen as one eval10 mean 1.6 times its neighbours'). The
    # objects made so far are kept out of the collector's scans; all variants
    # are timed the same way.
    gc.collect()
    gc.freeze()
    times: dict[str, list[float]] = {k: [] for k in variants}
    order = list(variants)
    shuffle = random.Random(0)
    cuda = device.startswith("cuda")
    for r in range(rounds):
        shuffle.shuffle(order)
        for name in order:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            variants[name].round(r + 1, rounds)
            if cuda:
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a][2:], times[b][2:]))

    def mean(a: str) -> float:
        return statistics.fmean(times[a][2:])

    return {
        "median_s": {k: statistics.median(v[2:]) for k, v in times.items()},
        "mean_s": {k: mean(k) for k in times},
        "ratios": {
            "secure / ref (eval at end)": paired("dpfl secure", "vmap ref"),
            "seeded / ref (eval at end)": paired("dpfl seeded", "vmap ref"),
            "secure / ref (eval every 10, means)": mean("dpfl secure eval10")
            / mean("vmap ref eval10"),
            "seeded / ref (eval every 10, means)": mean("dpfl seeded eval10")
            / mean("vmap ref eval10"),
            "secure eval10 / secure at end (means)": mean("dpfl secure eval10")
            / mean("dpfl secure"),
        },
        "accuracy": {k: v.accuracy() for k, v in variants.items()},
        "peak_rss_mib": rss_mib(),
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    """Run ``--repeats`` fresh processes and print every ratio with its spread."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run(args.rounds, args.device, args.threads)))
        return
    print("command:", shlex.join([sys.executable, *sys.argv]))
    runs = []
    for _ in range(args.repeats):
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                "--rounds",
                str(args.rounds),
                "--device",
                args.device,
                "--threads",
                str(args.threads),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(
        f"{args.repeats} fresh processes x {args.rounds} interleaved rounds, device "
        f"{args.device}, {runs[0]['torch_threads']} torch threads"
    )
    for name in runs[0]["median_s"]:
        med = [r["median_s"][name] * 1e3 for r in runs]
        mean = [r["mean_s"][name] * 1e3 for r in runs]
        acc = runs[-1]["accuracy"][name]
        print(
            f"  {name:20s} median ms/round (rounds 3-{args.rounds}) "
            f"{statistics.median(med):7.2f} [{min(med):.2f}-{max(med):.2f}]"
            f"   mean (3-{args.rounds}) {statistics.median(mean):7.2f} "
            f"[{min(mean):.2f}-{max(mean):.2f}]   test accuracy {acc:.3f}"
        )
    for name in runs[0]["ratios"]:
        vals = [r["ratios"][name] for r in runs]
        print(
            f"  ratio {name:40s} {statistics.median(vals):.3f} "
            f"(repeats: {', '.join(f'{v:.3f}' for v in vals)})"
        )
    print(
        f"  peak RSS {max(r['peak_rss_mib'] for r in runs):.0f} MiB (all six variants)"
    )


if __name__ == "__main__":
    main()
