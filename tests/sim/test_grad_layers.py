"""Layer rules: a user's layer, registered with register_layer, runs through the
ghost and cohort kernels without editing dpfl.

Tolerance: float32; clipped sums and norms against a per-example autograd loop
at atol 1e-5 (rtol 1e-4), as in tests/sim/test_gradients.py.
"""

from __future__ import annotations

import doctest
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dpfl.sim.grad
from dpfl.errors import InvalidParameterError
from dpfl.sim.grad import (
    batched_client_grads,
    clipped_grad_sum,
    ghost_supported,
    register_layer,
    stack_params,
    unregister_layer,
)
from dpfl.sim.grad import layers as layers_module
from dpfl.sim.grad.layers import LayerRule, LinearRule, PerExample, layer_rule

ATOL = 1e-5
RTOL = 1e-4


class Scale(nn.Module):
    """Bias-free per-feature scale ``y = x * w`` (on ``[b, d]`` or ``[b, T, d]``)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.5 * torch.randn(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class ScaleRule(LayerRule):
    def records(self, module, a, g, saved=None):
        per_example = (a * g).reshape(a.shape[0], -1, a.shape[-1]).sum(1)
        return {"weight": PerExample(per_example)}

    def cohort_forward(self, module, x, params, m):
        w = params["weight"]  # [m, d]
        return (x.reshape(m, -1, x.shape[-1]) * w[:, None, :]).reshape(x.shape), None


class ScaledNet(nn.Module):
    """Scale on a 3-d input, then Linear on positions, Scale on 2-d, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.s1 = Scale(3)
        self.fc1 = nn.Linear(3, 4)
        self.s2 = Scale(4 * 2)
        self.out = nn.Linear(4 * 2, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [b, 2, 3]
        h = torch.tanh(self.fc1(self.s1(x))).flatten(1)
        return self.out(torch.tanh(self.s2(h)))


class MyLinear(nn.Linear):
    """A Linear subclass: not covered by nn.Linear's rule until registered."""


@pytest.fixture
def scale_rule():
    register_layer(Scale)(ScaleRule)
    try:
        yield
    finally:
        unregister_layer(Scale)


def params_of(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def loop_reference(model, params, x, y, clip, seg=None, num_segments=1):
    """Per-example autograd loop: clipped sums (per segment) and norms."""
    names = list(params)
    sums = {n: torch.zeros(num_segments, *params[n].shape) for n in names}
    norms = []
    for i in range(x.shape[0]):
        p = {n: params[n].clone().requires_grad_(True) for n in names}
        out = torch.func.functional_call(model, p, (x[i : i + 1],))
        g = torch.autograd.grad(F.cross_entropy(out, y[i : i + 1]), list(p.values()))
        norm = torch.sqrt(sum((t**2).sum() for t in g))
        norms.append(norm)
        s = 0 if seg is None else int(seg[i])
        for n, t in zip(names, g):
            sums[n][s] += min(1.0, clip / float(norm)) * t
    if seg is None:
        sums = {n: v[0] for n, v in sums.items()}
    return sums, torch.stack(norms)


def assert_dicts_close(a, b, atol=ATOL, rtol=RTOL):
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=rtol, msg=k)


def data(seed=0, b=9):
    torch.manual_seed(seed)
    model = ScaledNet()
    x, y = torch.randn(b, 2, 3), torch.randint(0, 5, (b,))
    return model, params_of(model), x, y


def test_registered_custom_layer_ghost_equals_vmap_equals_loop(scale_rule):
    # Property of the registry: with a rule for Scale registered, the ghost
    # kernel handles the model, and ghost == vmap == the per-example loop
    # (atol 1e-5) for clipped sums per segment and the per-example norms.
    model, params, x, y = data()
    assert ghost_supported(model)
    seg = torch.tensor([0, 1, 1, 2, 0, 2, 2, 1, 0])
    ref, ref_norms = loop_reference(model, params, x, y, 1.4, seg, 3)
    assert float(ref_norms.min()) < 1.4 < float(ref_norms.max())  # both regimes
    got = {}
    for method in ("ghost", "vmap"):
        kw = dict(segment_ids=seg, num_segments=3, return_norms=True, max_batch=4)
        got[method] = clipped_grad_sum(
            model, params, x, y, clip=1.4, method=method, **kw
        )
        assert_dicts_close(got[method][0], ref)
        torch.testing.assert_close(got[method][1], ref_norms, atol=ATOL, rtol=RTOL)
    assert_dicts_close(got["ghost"][0], got["vmap"][0])
    # Without segments, on the model's own parameters (direct call).
    ref1, _ = loop_reference(model, params, x, y, 1.4)
    assert_dicts_close(clipped_grad_sum(model, None, x, y, clip=1.4), ref1)


@pytest.mark.parametrize("clip", [None, 0.3])
def test_registered_custom_layer_in_the_cohort_kernel(scale_rule, clip):
    # The rule's cohort_forward: per-client sums (clipped or not, with a
    # padding mask) from the cross-client ghost kernel equal the vmap kernel
    # and, clipped, the per-client per-example loop (atol 1e-5).
    model, params, _, _ = data(seed=1)
    n, b = 3, 4
    stacked = stack_params(params, n)
    for v in stacked.values():
        v.add_(0.2 * torch.randn_like(v))
    xb, yb = torch.randn(n, b, 2, 3), torch.randint(0, 5, (n, b))
    mask = torch.ones(n, b)
    mask[1, 2:] = 0.0
    kw = dict(clip=clip, sample_mask=mask)
    ghost = batched_client_grads(model, stacked, xb, yb, method="ghost", **kw)
    vm = batched_client_grads(model, stacked, xb, yb, method="vmap", **kw)
    assert_dicts_close(ghost, vm)
    if clip is not None:
        for k in range(n):
            keep = mask[k] > 0
            p = {name: v[k] for name, v in stacked.items()}
            ref, _ = loop_reference(model, p, xb[k][keep], yb[k][keep], clip)
            assert_dicts_close({name: v[k] for name, v in ghost.items()}, ref)
    assert all("forward" not in vars(mod) for mod in model.modules())


def test_unregistered_layer_ghost_raises_and_auto_warns_once(monkeypatch):
    # No rule for Scale: "ghost" refuses, naming the layer type and how to
    # register a rule; "auto" falls back to vmap (equal to the loop) with one
    # UserWarning naming the type, not repeated on the next call.
    monkeypatch.setattr(dpfl.sim.grad, "_WARNED", set())
    model, params, x, y = data()
    assert layer_rule(Scale) is None and not ghost_supported(model)
    with pytest.raises(InvalidParameterError, match=r"Scale.*register_layer"):
        clipped_grad_sum(model, params, x, y, clip=0.3, method="ghost")
    with pytest.raises(InvalidParameterError, match="register_layer"):
        stacked = stack_params(params, 2)
        xb, yb = x[:4].reshape(2, 2, 2, 3), y[:4].reshape(2, 2)
        batched_client_grads(model, stacked, xb, yb, method="ghost")
    ref, _ = loop_reference(model, params, x, y, 0.3)
    with pytest.warns(UserWarning, match=r"no ghost-kernel rule for Scale"):
        got = clipped_grad_sum(model, params, x, y, clip=0.3)
    assert_dicts_close(got, ref)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clipped_grad_sum(model, params, x, y, clip=0.3)  # no second warning


def test_linear_subclass_needs_its_own_registration(monkeypatch):
    # Lookup is by exact type: a Linear subclass is unsupported until the
    # Linear rule is registered for it; then ghost equals the loop.
    monkeypatch.setattr(dpfl.sim.grad, "_WARNED", set())
    torch.manual_seed(3)
    model = nn.Sequential(MyLinear(6, 5), nn.ReLU(), nn.Linear(5, 3))
    params = params_of(model)
    x, y = torch.randn(7, 6), torch.randint(0, 3, (7,))
    assert not ghost_supported(model)
    register_layer(MyLinear)(LinearRule())
    try:
        assert ghost_supported(model)  # the cached structure was refreshed
        ref, _ = loop_reference(model, params, x, y, 0.2)
        got = clipped_grad_sum(model, params, x, y, clip=0.2, method="ghost")
        assert_dicts_close(got, ref)
    finally:
        unregister_layer(MyLinear)
    assert not ghost_supported(model)


def test_register_layer_validates_and_rules_must_cover_parameters():
    with pytest.raises(InvalidParameterError, match="nn.Module subclasses"):
        register_layer(int)  # type: ignore[arg-type]
    with pytest.raises(InvalidParameterError, match="LayerRule"):
        register_layer(Scale)(object())  # type: ignore[type-var]
    assert layer_rule(Scale) is None

    class Forgetful(ScaleRule):
        def records(self, module, a, g, saved=None):
            return {}

    register_layer(Scale)(Forgetful)
    try:
        model, params, x, y = data()
        with pytest.raises(InvalidParameterError, match=r"no record.*weight"):
            clipped_grad_sum(model, params, x, y, clip=0.3, method="ghost")
    finally:
        unregister_layer(Scale)


def test_layers_module_docstring_example_runs():
    result = doctest.testmod(layers_module, verbose=False)
    assert result.attempted > 0 and result.failed == 0
