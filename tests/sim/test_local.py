"""Tests of dpfl.sim.local: cohort SGD and Adam steps on stacked client rows.

Tolerance: float32. The SGD step is compared with a per-client autograd loop
at atol 1e-5 (rtol 1e-4), as tests/sim/test_gradients.py does; the batched Adam
with ``torch.optim.Adam`` run row by row at atol 1e-6 (rtol 0) over several
steps (on CPU the two agree bit for bit; the tolerance leaves room for other
kernels).
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from dpfl.errors import InvalidParameterError, NonFiniteUpdateError
from dpfl.models import MLP
from dpfl.sim import local
from dpfl.sim.grad import stack_params
from dpfl.sim.local import cohort_adam_step, cohort_sgd_step

ATOL = 1e-5
RTOL = 1e-4


def cohort_data(n=3, b=4, seed=8):
    torch.manual_seed(seed)
    model = MLP(in_features=6, hidden=(5,), num_classes=3)
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    stacked = stack_params(params, n)
    for v in stacked.values():  # different params per client
        v.add_(0.1 * torch.randn_like(v))
    xb, yb = torch.randn(n, b, 6), torch.randint(0, 3, (n, b))
    return model, stacked, xb, yb


# ------------------------------------------------------------------------- SGD
def test_cohort_sgd_step_equals_per_client_loop():
    model, stacked, xb, yb = cohort_data()
    mask = torch.ones(3, 4)
    mask[1, 3] = 0.0  # client 1 has 3 examples (padded)
    new = cohort_sgd_step(model, stacked, xb, yb, learning_rate=0.5, sample_mask=mask)
    for k in range(3):
        keep = mask[k] > 0
        p = {n: v[k].clone().requires_grad_(True) for n, v in stacked.items()}
        out = torch.func.functional_call(model, p, (xb[k][keep],))
        loss = F.cross_entropy(out, yb[k][keep], reduction="sum")
        g = dict(zip(p, torch.autograd.grad(loss, list(p.values()))))
        count = int(keep.sum())
        for n in p:
            expected = stacked[n][k] - 0.5 * g[n] / count
            # atol 1e-5 float32 vs the per-client loop
            torch.testing.assert_close(new[n][k], expected, atol=ATOL, rtol=RTOL)


def test_cohort_sgd_step_has_no_clip_or_noise():
    # Clipping and noise belong to the algorithms (batched_client_grads,
    # dpfl.sim.privatize); the local SGD step takes neither.
    names = inspect.signature(cohort_sgd_step).parameters
    assert "clip" not in names and "noise" not in names


def test_cohort_non_finite_and_shape_errors():
    model, stacked, xb, yb = cohort_data()
    xb[0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteUpdateError):
        cohort_sgd_step(model, stacked, xb, yb, learning_rate=0.1)
    with pytest.raises(InvalidParameterError, match="leading dimension"):
        cohort_sgd_step(model, stacked, xb[:2], yb[:2], learning_rate=0.1)
    with pytest.raises(InvalidParameterError, match="learning_rate"):
        cohort_sgd_step(model, stacked, xb, yb, learning_rate=-1.0)


# ------------------------------------------------------------------------ Adam
def torch_adam_rows(theta0, grads, start, lr, betas, eps):
    """torch.optim.Adam on each row alone; ``start`` = (m1, m2, steps) or None."""
    rows = []
    for j in range(theta0.shape[0]):
        p = torch.nn.Parameter(theta0[j].clone())
        opt = torch.optim.Adam([p], lr=lr, betas=betas, eps=eps)
        if start is not None and int(start[2][j]) > 0:
            opt.state[p] = {
                "step": torch.tensor(float(start[2][j])),
                "exp_avg": start[0][j].clone(),
                "exp_avg_sq": start[1][j].clone(),
            }
        for g in grads:
            p.grad = g[j].clone()
            opt.step()
        rows.append((p.detach(), opt.state[p]))
    return rows


@pytest.mark.parametrize(
    ("lr", "betas", "eps", "shape"),
    [
        (1e-3, (0.9, 0.999), 1e-8, (5, 37)),
        (0.05, (0.8, 0.95), 1e-6, (3, 4, 6)),
        (0.5, (0.0, 0.5), 1e-3, (2, 9)),
    ],
)
@pytest.mark.parametrize("block", [None, 50])
def test_cohort_adam_equals_torch_adam_row_by_row(
    lr, betas, eps, shape, block, monkeypatch
):
    # Rows start at different step counts (0, 1, 2, ...: some with carried
    # moments), gradients span six orders of magnitude; after 7 steps every
    # row, its moments and its step count equal torch.optim.Adam's run on that
    # row alone (atol 1e-6, float32), whether the rows are updated in one block
    # or in blocks of one or two rows.
    if block is not None:
        monkeypatch.setattr(local, "_ADAM_BLOCK", block)
    torch.manual_seed(0)
    rows = shape[0]
    theta0 = torch.randn(shape)
    scale = 10.0 ** torch.randint(-4, 2, (rows,) + (1,) * (len(shape) - 1))
    grads = [torch.randn(shape) * scale for _ in range(7)]
    steps0 = torch.arange(rows)
    m1 = torch.randn(shape) * 0.01 * (steps0 > 0).view(-1, *(1,) * (len(shape) - 1))
    m2 = torch.rand(shape) * 1e-4 * (steps0 > 0).view(-1, *(1,) * (len(shape) - 1))
    ref = torch_adam_rows(theta0, grads, (m1, m2, steps0), lr, betas, eps)
    theta, steps = theta0.clone(), steps0.clone()
    for g in grads:
        theta = cohort_adam_step(
            theta, g, m1, m2, steps, learning_rate=lr, betas=betas, eps=eps
        )
    for j, (p, state) in enumerate(ref):
        torch.testing.assert_close(theta[j], p, atol=1e-6, rtol=0)
        torch.testing.assert_close(m1[j], state["exp_avg"], atol=1e-6, rtol=0)
        torch.testing.assert_close(m2[j], state["exp_avg_sq"], atol=1e-6, rtol=0)
        assert int(steps[j]) == int(state["step"])


def test_cohort_adam_leaves_params_and_validates():
    theta, g = torch.ones(2, 3), torch.ones(2, 3)
    m1, m2 = torch.zeros(2, 3), torch.zeros(2, 3)
    steps = torch.zeros(2, dtype=torch.long)
    new = cohort_adam_step(theta, g, m1, m2, steps, learning_rate=0.1)
    assert torch.equal(theta, torch.ones(2, 3))  # input not modified
    # First step moves each coordinate by lr (sign of the gradient).
    torch.testing.assert_close(new, torch.full((2, 3), 0.9), atol=1e-6, rtol=0)
    with pytest.raises(InvalidParameterError, match="learning_rate"):
        cohort_adam_step(theta, g, m1, m2, steps, learning_rate=0.0)
    with pytest.raises(InvalidParameterError, match="betas"):
        cohort_adam_step(theta, g, m1, m2, steps, learning_rate=0.1, betas=(1.0, 0.9))
    with pytest.raises(InvalidParameterError, match="shape"):
        cohort_adam_step(theta, g[:1], m1, m2, steps, learning_rate=0.1)
    with pytest.raises(InvalidParameterError, match="steps"):
        cohort_adam_step(theta, g, m1, m2, steps[:1], learning_rate=0.1)


@pytest.mark.parametrize("chunk", [2, 5])
@pytest.mark.parametrize("model_kind", ["relu-mlp", "tanh-mlp"])
def test_fused_inplace_step_equals_the_autograd_step(model_kind, chunk):
    # The fused step (the written-out ReLU MLP, or the ghost records of any
    # all-Linear model) against cohort_sgd_step (autograd gradients, then
    # θ − lr·Σg/b) on a masked batch: float32, sums in another order, 1e-6;
    # in chunks of 2 clients and in one pass.
    from torch import nn

    from dpfl.sim.grad.cohort import cohort_sgd_inplace, fused_sgd_supported
    from dpfl.sim.grad.mlp import mlp_plan

    torch.manual_seed(3)
    act = nn.ReLU() if model_kind == "relu-mlp" else nn.Tanh()
    model = nn.Sequential(nn.Linear(6, 7), act, nn.Linear(7, 4))
    assert fused_sgd_supported(model)
    assert (mlp_plan(model, F.cross_entropy) is not None) == (model_kind == "relu-mlp")
    params = {k: v.detach() for k, v in model.named_parameters()}
    m, b = 5, 3
    xb, yb = torch.randn(m, b, 6), torch.randint(0, 4, (m, b))
    mask = torch.ones(m, b)
    mask[1, 2] = 0
    mask[3] = 0  # a client with no record in this step does not move
    want = cohort_sgd_step(
        model, stack_params(params, m), xb, yb, learning_rate=0.3, sample_mask=mask
    )
    got = stack_params(params, m)
    scale = mask * (-0.3 / mask.sum(1).clamp_min(1))[:, None]
    cohort_sgd_inplace(
        model, got, xb, yb, scale.reshape(-1), loss_fn=F.cross_entropy, chunk=chunk
    )
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-6, rtol=1e-6)
    assert torch.equal(got["0.weight"][3], params["0.weight"])


def test_cohort_orders_equal_each_clients_own():
    # The cohort's keyed orders in one pass equal each client's streams'
    # orders (v3: keyed; v2 and seeded: the index generator), exactly.
    from dpfl.sim.randomness import CohortStreams, cohort_epoch_orders

    key = bytes(range(32))
    for version in ("chacha20-v3", "chacha20-v2"):
        for counts in ([5, 5, 5], [5, 2, 0]):

            def fresh(version=version):  # index generators are drawn from
                return CohortStreams(0, 4, [3, 1, 7], key=key, stream_version=version)

            got = cohort_epoch_orders(fresh(), counts, 2)
            own = fresh()
            for j, n in enumerate(counts):
                assert got[j].tolist() == own[j].epoch_orders(n, 2).tolist()
    got = cohort_epoch_orders(CohortStreams(0, 4, [3, 1]), [4, 4], 1)
    assert got[1].tolist() == CohortStreams(0, 4, [3, 1])[1].epoch_orders(4, 1).tolist()
