"""How big DP-FedAvg's noise is next to the CNN's weights, per local setting.

For preset ``dp-fedavg-fmnist`` (McMahan et al.'s CNN, Fashion-MNIST in
two-label shards, K = 100, m = 50, σ = 1.1933, median clipping) and each
local learning rate given, the script

1. trains the first ``--clients`` clients from the initial model for E local
   epochs of B-record SGD and prints each update's norm, overall and per
   layer; their median stands in for the round's clipping bound S;
2. prints the noise the round adds to every coordinate of the average,
   ``σ S / m``, beside each layer's initial weight rms;
3. adds that noise alone to the initial model for 1, 3, 7 and 11 rounds
   (``σ S √t / m`` per coordinate) and prints the test loss, accuracy and
   the logits' standard deviation on 2,000 test images.

Usage::

    python tools/dp_fedavg_noise_scale.py --lr 0.05,0.01,0.003 --epochs 5
    python tools/dp_fedavg_noise_scale.py --lr 0.01,0.003 --epochs 1

The preset's header quotes its figures (one CPU thread pair, seed 0).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import torch

from dpfl.data import get_dataset
from dpfl.models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lr", default="0.05", help="comma-separated learning rates")
    parser.add_argument("--epochs", type=int, default=5, help="local epochs E")
    parser.add_argument("--batch", type=int, default=10, help="batch size B")
    parser.add_argument("--clients", type=int, default=3, help="clients trained")
    parser.add_argument("--sigma", type=float, default=1.1933)
    parser.add_argument("--cohort", type=int, default=50, help="m")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    data = get_dataset(
        "fashion-mnist",
        num_clients=100,
        partition="shards",
        shards_per_client=2,
        seed=args.seed,
    )
    x = torch.as_tensor(np.asarray(data.features), dtype=torch.float32)
    y = torch.as_tensor(np.asarray(data.labels))
    x_test = torch.as_tensor(np.asarray(data.test_features[:2000]), dtype=torch.float32)
    y_test = torch.as_tensor(np.asarray(data.test_labels[:2000]))
    torch.manual_seed(args.seed)
    model = build_model("mcmahan_cnn", input_shape=(1, 28, 28), num_classes=10)
    init = {k: v.detach().clone() for k, v in model.named_parameters()}

    def evaluate(params: dict[str, torch.Tensor]) -> tuple[float, float, float]:
        with torch.no_grad():
            out = torch.func.functional_call(model, params, (x_test,))
            loss = torch.nn.functional.cross_entropy(out, y_test).item()
            acc = (out.argmax(1) == y_test).float().mean().item()
            return loss, acc, out.std().item()

    rms = {
        k: v.pow(2).mean().sqrt().item()
        for k, v in init.items()
        if k.endswith("weight")
    }
    print(
        "initial test loss / accuracy / logit sd:",
        *(f"{v:.3f}" for v in evaluate(init)),
    )
    print("initial weight rms:", {k: round(v, 4) for k, v in rms.items()})
    rng = np.random.default_rng(args.seed)
    for lr in (float(v) for v in args.lr.split(",")):
        norms = []
        for client in range(args.clients):
            rows = np.asarray(data.client_indices[client])
            params = {k: v.clone().requires_grad_(True) for k, v in init.items()}
            start = time.perf_counter()
            for _ in range(args.epochs):
                order = rng.permutation(rows)
                for i in range(0, len(order), args.batch):
                    batch = order[i : i + args.batch]
                    out = torch.func.functional_call(model, params, (x[batch],))
                    loss = torch.nn.functional.cross_entropy(out, y[batch])
                    grads = torch.autograd.grad(loss, list(params.values()))
                    with torch.no_grad():
                        for value, grad in zip(params.values(), grads):
                            value -= lr * grad
            delta = {k: (params[k] - init[k]).detach() for k in init}
            norm = math.sqrt(sum(v.pow(2).sum().item() for v in delta.values()))
            norms.append(norm)
            layers = {k: round(v.norm().item(), 3) for k, v in delta.items()}
            print(
                f"eta {lr} E {args.epochs}: client {client} update norm {norm:.3f} "
                f"({time.perf_counter() - start:.0f} s) per layer {layers}",
                flush=True,
            )
        s = float(np.median(norms))
        coord = args.sigma * s / args.cohort
        d = sum(v.numel() for v in init.values())
        print(
            f"eta {lr} E {args.epochs}: S = {s:.3f}; noise sigma S / m = {coord:.4f} "
            f"a coordinate a round; its norm sigma S sqrt(d) / m = "
            f"{coord * math.sqrt(d):.1f} against a clipped signal of norm <= {s:.2f}"
        )
        gen = torch.Generator().manual_seed(args.seed + 1)
        for t in (1, 3, 7, 11):
            noisy = {
                k: v + coord * math.sqrt(t) * torch.randn(v.shape, generator=gen)
                for k, v in init.items()
            }
            loss, acc, sd = evaluate(noisy)
            print(
                f"   that noise alone for {t} rounds: test loss {loss:.3f}, "
                f"accuracy {acc:.3f}, logit sd {sd:.3f}"
            )


if __name__ == "__main__":
    main()
