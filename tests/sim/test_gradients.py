"""Tests of dpfl.sim.grad against per-example Python loops.

Tolerance: float32 throughout; per-example gradients and clipped sums are
compared with the loop reference at atol 1e-5 (rtol 1e-4 where sums of many
terms of magnitude ~1 are involved), as Opacus does for its per-sample tests.
The reference is the definition: for each example i, autograd on the loss of
the batch x[i:i+1], g_i scaled by min(1, C/||g_i||), summed per segment.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from dpfl.errors import InvalidParameterError, NonFiniteUpdateError
from dpfl.models import MLP, PaperCNN
from dpfl.sim.grad import (
    batched_client_grads,
    check_finite,
    clipped_grad_sum,
    ghost_supported,
    per_sample_grads,
    stack_params,
)
from dpfl.sim.grad._conv import conv2d_per_sample_weight_grad

ATOL = 1e-5
RTOL = 1e-4


class TinyCNN(nn.Module):
    """Exercises both conv kernels (one input channel; several), and Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(1, 3, kernel_size=3, stride=2, padding=1)
        self.c2 = nn.Conv2d(3, 4, kernel_size=2, stride=1, dilation=2)
        self.fc = nn.Linear(4 * 2 * 2, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.c1(x))  # 8x8 -> 4x4
        h = torch.tanh(self.c2(h))  # 4x4 -> 2x2
        return self.fc(h.flatten(1))


def params_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def reference(model, params, x, y, clip, seg=None, num_segments=None, loss_fn=None):
    """Per-example loop: returns (per-example grads list, sums, norms)."""
    loss_fn = loss_fn or F.cross_entropy
    names = list(params)
    grads, norms = [], []
    for i in range(x.shape[0]):
        p = {n: params[n].clone().requires_grad_(True) for n in names}
        out = torch.func.functional_call(model, p, (x[i : i + 1],))
        g = torch.autograd.grad(loss_fn(out, y[i : i + 1]), [p[n] for n in names])
        grads.append(dict(zip(names, g)))
        norms.append(torch.sqrt(sum((t**2).sum() for t in g)))
    norms_t = torch.stack(norms) if norms else torch.zeros(0)
    if seg is None:
        sums = {n: torch.zeros_like(params[n]) for n in names}
    else:
        sums = {n: torch.zeros(num_segments, *params[n].shape) for n in names}
    for i, g in enumerate(grads):
        factor = min(1.0, clip / float(norms_t[i]))
        for n in names:
            if seg is None:
                sums[n] += factor * g[n]
            else:
                sums[n][int(seg[i])] += factor * g[n]
    return grads, sums, norms_t


def assert_dicts_close(a, b, atol=ATOL, rtol=RTOL):
    assert set(a) == set(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=rtol, msg=k)


# ---------------------------------------------------------------- per_sample_grads
def test_per_sample_grads_equal_loop():
    torch.manual_seed(0)
    model = TinyCNN()
    params = params_of(model)
    x, y = torch.randn(6, 1, 8, 8), torch.randint(0, 5, (6,))
    ref, _, _ = reference(model, params, x, y, clip=1.0)
    got = per_sample_grads(model, params, x, y)
    for i in range(6):
        for n in params:
            # atol 1e-5 float32 (loop reference)
            torch.testing.assert_close(got[n][i], ref[i][n], atol=ATOL, rtol=RTOL)


# ----------------------------------------------------------------- clipped sums
@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
@settings(max_examples=30, deadline=None)
@given(
    batch=st.integers(1, 9),
    clip=st.floats(0.01, 10.0),
    num_segments=st.integers(1, 4),
    max_batch=st.integers(1, 5),
    method=st.sampled_from(["vmap", "ghost"]),
    seed=st.integers(0, 2**16),
)
def test_clipped_sum_equals_loop(batch, clip, num_segments, max_batch, method, seed):
    # Property: both kernels equal the per-example loop (atol 1e-5, float32)
    # for any batch size, clip, number of segments and chunking.
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = TinyCNN()
    params = params_of(model)
    x = torch.randn(batch, 1, 8, 8, generator=g)
    y = torch.randint(0, 5, (batch,), generator=g)
    seg = torch.randint(0, num_segments, (batch,), generator=g)
    _, ref_sums, ref_norms = reference(model, params, x, y, clip, seg, num_segments)
    sums, norms = clipped_grad_sum(
        model,
        params,
        x,
        y,
        clip=clip,
        segment_ids=seg,
        num_segments=num_segments,
        max_batch=max_batch,
        method=method,
        return_norms=True,
    )
    assert_dicts_close(sums, ref_sums)
    torch.testing.assert_close(norms, ref_norms, atol=ATOL, rtol=RTOL)
    # Each segment's clipped sum has norm <= clip * (examples in the segment).
    flat = torch.cat([s.reshape(num_segments, -1) for s in sums.values()], 1)
    counts = torch.bincount(seg, minlength=num_segments).float()
    assert torch.all(flat.norm(dim=1) <= clip * counts * (1 + 1e-5) + 1e-6)


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
@pytest.mark.parametrize("method", ["vmap", "ghost"])
def test_paper_cnn_clipped_sum_equals_loop(method):
    torch.manual_seed(1)
    model = PaperCNN(num_classes=10)
    params = params_of(model)
    x, y = torch.randn(12, 1, 28, 28), torch.randint(0, 10, (12,))
    seg = torch.tensor([0, 2, 2, 1, 0, 2, 2, 2, 1, 0, 2, 1])
    # clip 0.05 is below every per-example norm here, so all are clipped.
    _, ref_sums, ref_norms = reference(model, params, x, y, 0.05, seg, 3)
    assert torch.all(ref_norms > 0.05)
    sums, norms = clipped_grad_sum(
        model,
        params,
        x,
        y,
        clip=0.05,
        segment_ids=seg,
        num_segments=3,
        method=method,
        max_batch=5,
        return_norms=True,
    )
    assert_dicts_close(sums, ref_sums)  # atol 1e-5 vs loop
    torch.testing.assert_close(norms, ref_norms, atol=1e-4, rtol=RTOL)


def test_unsegmented_sum_is_sum_of_segments_and_segments_are_subsets():
    torch.manual_seed(2)
    model = MLP(in_features=64, hidden=(16,), num_classes=10)
    params = params_of(model)
    x, y = torch.randn(20, 64), torch.randint(0, 10, (20,))
    seg = torch.randint(0, 4, (20,))
    seg[:4] = torch.arange(4)  # every segment non-empty
    per_seg = clipped_grad_sum(
        model, params, x, y, clip=0.5, segment_ids=seg, num_segments=6
    )
    total = clipped_grad_sum(model, params, x, y, clip=0.5)
    for n in params:
        # Sum over segments equals the unsegmented sum (atol 1e-5).
        torch.testing.assert_close(per_seg[n].sum(0), total[n], atol=ATOL, rtol=RTOL)
        # Segments 4 and 5 have no example: exactly zero.
        assert torch.count_nonzero(per_seg[n][4:]) == 0
    for s in range(4):
        mask = seg == s
        alone = clipped_grad_sum(model, params, x[mask], y[mask], clip=0.5)
        for n in params:
            torch.testing.assert_close(per_seg[n][s], alone[n], atol=ATOL, rtol=RTOL)


def test_large_clip_gives_plain_gradient_sum():
    # clip far above every norm: the clipped sum is B * (gradient of mean loss).
    torch.manual_seed(3)
    model = TinyCNN()
    x, y = torch.randn(7, 1, 8, 8), torch.randint(0, 5, (7,))
    sums = clipped_grad_sum(model, None, x, y, clip=1e6)
    model.zero_grad()
    (F.cross_entropy(model(x), y) * 7).backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(sums[n], p.grad, atol=ATOL, rtol=RTOL)


class WithUnused(nn.Module):
    """A layer that never runs: its clipped sum must be exactly zero."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(1, 2, kernel_size=3, stride=2)
        self.unused = nn.Linear(3, 3)
        self.fc = nn.Linear(2 * 3 * 3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.c(x)).flatten(1))


@pytest.mark.parametrize("method", ["vmap", "ghost"])
def test_unsegmented_sums_are_one_flat_buffer_and_unused_layers_zero(method):
    # Without segments the sums are views into one flat buffer (in the order
    # of the parameters), written by the first chunk; a layer that never runs
    # gets exact zeros, over several chunks too.
    torch.manual_seed(8)
    model = WithUnused()
    params = params_of(model)
    x, y = torch.randn(7, 1, 8, 8), torch.randint(0, 4, (7,))
    used = {n: t for n, t in params.items() if not n.startswith("unused.")}
    _, ref_sums, _ = reference(model, used, x, y, 0.4)
    for max_batch in (None, 3):
        sums = clipped_grad_sum(
            model, params, x, y, clip=0.4, method=method, max_batch=max_batch
        )
        assert_dicts_close({n: sums[n] for n in used}, ref_sums)
        assert torch.count_nonzero(sums["unused.weight"]) == 0
        assert torch.count_nonzero(sums["unused.bias"]) == 0
        tensors = list(sums.values())
        base = tensors[0].untyped_storage().data_ptr()
        offset = tensors[0].storage_offset()
        for t in tensors:
            assert t.untyped_storage().data_ptr() == base
            assert t.storage_offset() == offset and t.is_contiguous()
            offset += t.numel()


def test_ghost_on_the_models_own_parameters_equals_copies_and_frozen_layers():
    # params=None (or detached aliases of the model's own parameters) calls the
    # model directly; copies go through functional_call; a frozen parameter
    # (requires_grad=False) forces functional_call. All equal the loop.
    torch.manual_seed(9)
    model = PaperCNN(num_classes=10)
    x, y = torch.randn(9, 1, 28, 28), torch.randint(0, 10, (9,))
    _, ref_sums, ref_norms = reference(model, params_of(model), x, y, 0.05)
    aliases = {n: p.detach() for n, p in model.named_parameters()}
    for params in (None, aliases, params_of(model)):
        sums, norms = clipped_grad_sum(
            model, params, x, y, clip=0.05, method="ghost", return_norms=True
        )
        assert_dicts_close(sums, ref_sums)
        torch.testing.assert_close(norms, ref_norms, atol=1e-4, rtol=RTOL)
        assert all(p.grad is None for p in model.parameters())
    model.features[0].weight.requires_grad_(False)
    assert_dicts_close(
        clipped_grad_sum(model, aliases, x, y, clip=0.05, method="ghost"), ref_sums
    )


@pytest.mark.parametrize(
    ("cin", "kernel", "stride", "padding", "dilation", "batch"),
    [
        (1, (3, 2), (2, 1), (1, 2), (1, 2), 5),
        (3, (2, 3), (1, 2), (0, 1), (2, 1), 4),
        (2, 1, 1, 0, 1, 3),
        (1, 3, 1, 0, 2, 4),
        (1, 8, 2, 3, 1, 130),  # one input channel: a forward conv, no columns
    ],
)
def test_conv_per_sample_weight_grads_equal_per_example_autograd(
    cin, kernel, stride, padding, dilation, batch
):
    # The im2col gather (cached index) and the one-channel forward-convolution
    # kernels of per-example Conv2d weight gradients against autograd on each
    # example (strides, dilations and paddings that differ by axis).
    torch.manual_seed(10)
    conv = nn.Conv2d(cin, 4, kernel, stride=stride, padding=padding, dilation=dilation)
    a = torch.randn(batch, cin, 11, 9)
    out = conv(a)
    g = torch.randn_like(out)
    got = conv2d_per_sample_weight_grad(conv, a, g.detach())
    assert got.shape == (batch, *conv.weight.shape)
    for i in range(0, batch, max(1, batch // 4)):
        (want,) = torch.autograd.grad(
            conv(a[i : i + 1]), conv.weight, g[i : i + 1], retain_graph=False
        )
        torch.testing.assert_close(got[i], want, atol=ATOL, rtol=RTOL)


def test_auto_falls_back_to_vmap_for_groupnorm_and_matches_loop():
    torch.manual_seed(4)
    model = nn.Sequential(
        nn.Linear(6, 8), nn.GroupNorm(2, 8), nn.ReLU(), nn.Linear(8, 3)
    )
    assert not ghost_supported(model)
    params = params_of(model)
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    _, ref_sums, _ = reference(model, params, x, y, 0.3)
    assert_dicts_close(clipped_grad_sum(model, params, x, y, clip=0.3), ref_sums)
    with pytest.raises(InvalidParameterError, match="ghost"):
        clipped_grad_sum(model, params, x, y, clip=0.3, method="ghost")


class Reused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.fc(x)))


def test_layer_called_twice_falls_back_to_vmap():
    torch.manual_seed(5)
    model = Reused()
    params = params_of(model)
    x, y = torch.randn(5, 4), torch.randint(0, 4, (5,))
    _, ref_sums, _ = reference(model, params, x, y, 0.2)
    assert_dicts_close(clipped_grad_sum(model, params, x, y, clip=0.2), ref_sums)
    with pytest.raises(InvalidParameterError, match="more than once"):
        clipped_grad_sum(model, params, x, y, clip=0.2, method="ghost")


def test_mse_loss_and_sequence_linear():
    # Linear applied to [b, T, in] inputs (per-sample grads summed over T).
    torch.manual_seed(6)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2), nn.Flatten())
    params = params_of(model)
    x, y = torch.randn(6, 5, 3), torch.randn(6, 10)
    _, ref, _ = reference(model, params, x, y, 0.7, loss_fn=F.mse_loss)
    for method in ("vmap", "ghost"):
        got = clipped_grad_sum(
            model, params, x, y, clip=0.7, loss_fn=F.mse_loss, method=method
        )
        assert_dicts_close(got, ref)


def test_empty_batch_gives_zeros():
    model = MLP(8, (4,), 3)
    sums, norms = clipped_grad_sum(
        model,
        None,
        torch.zeros(0, 8),
        torch.zeros(0, dtype=torch.long),
        clip=1.0,
        segment_ids=torch.zeros(0, dtype=torch.long),
        num_segments=2,
        return_norms=True,
    )
    assert norms.shape == (0,)
    assert all(s.shape[0] == 2 and torch.count_nonzero(s) == 0 for s in sums.values())


# ----------------------------------------------------------------- non-finite
@pytest.mark.parametrize("method", ["vmap", "ghost"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_input_raises(method, bad):
    torch.manual_seed(7)
    model = TinyCNN()
    x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 5, (4,))
    x[2, 0, 3, 3] = bad
    with pytest.raises(NonFiniteUpdateError, match="non-finite"):
        clipped_grad_sum(model, None, x, y, clip=1.0, method=method)


def test_check_finite_message_counts_entries():
    t = torch.zeros(10)
    t[1] = float("nan")
    t[4] = float("inf")
    t[5] = -float("inf")
    with pytest.raises(NonFiniteUpdateError) as info:
        check_finite({"w": torch.ones(3), "b": t}, "client updates")
    msg = str(info.value)
    assert "'b'" in msg and "3 non-finite" in msg and "1 NaN" in msg
    assert "2 Inf" in msg and "client updates" in msg
    check_finite({"w": torch.ones(3)}, "fine")  # no error
    check_finite(torch.arange(3), "integers are always finite")


# ----------------------------------------------------------------- validation
def test_invalid_arguments():
    model = MLP(8, (4,), 3)
    x, y = torch.randn(5, 8), torch.randint(0, 3, (5,))
    with pytest.raises(InvalidParameterError, match="clip"):
        clipped_grad_sum(model, None, x, y, clip=0.0)
    with pytest.raises(InvalidParameterError, match="segment_ids"):
        clipped_grad_sum(
            model, None, x, y, clip=1.0, segment_ids=torch.arange(5), num_segments=3
        )
    with pytest.raises(InvalidParameterError, match="batch"):
        clipped_grad_sum(model, None, x, y[:4], clip=1.0)
    with pytest.raises(InvalidParameterError, match="method"):
        clipped_grad_sum(model, None, x, y, clip=1.0, method="fast")
    with pytest.raises(InvalidParameterError, match="num_segments"):
        clipped_grad_sum(model, None, x, y, clip=1.0, num_segments=2)
    bn = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    with pytest.raises(InvalidParameterError, match="BatchNorm"):
        clipped_grad_sum(bn, None, x, y, clip=1.0)


# ----------------------------------------------------------------- cohorts
def cohort_data(n=3, b=4, seed=8):
    torch.manual_seed(seed)
    model = MLP(in_features=6, hidden=(5,), num_classes=3)
    stacked = stack_params(params_of(model), n)
    for v in stacked.values():  # different params per client
        v.add_(0.1 * torch.randn_like(v))
    xb, yb = torch.randn(n, b, 6), torch.randint(0, 3, (n, b))
    return model, stacked, xb, yb


def test_stack_params_copies():
    model = MLP(4, (3,), 2)
    stacked = stack_params(params_of(model), 3)
    for n, p in model.named_parameters():
        assert stacked[n].shape == (3, *p.shape)
        torch.testing.assert_close(stacked[n][2], p.detach())  # exact copy
    stacked["net.0.weight"][0].zero_()
    assert torch.count_nonzero(stacked["net.0.weight"][1]) > 0


def test_batched_client_grads_chunks_agree_and_shapes():
    model, stacked, xb, yb = cohort_data(n=5)
    full = batched_client_grads(model, stacked, xb, yb, clip=0.2)
    chunked = batched_client_grads(model, stacked, xb, yb, clip=0.2, max_clients=2)
    for n, v in stacked.items():
        assert full[n].shape == v.shape
    assert_dicts_close(full, chunked)


# ----------------------------------------------- devices, reduced precision
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]


@contextlib.contextmanager
def reduced_precision():
    """What a caller may have switched on: float32 products with fewer bits.

    TF32 for cuBLAS and cuDNN on CUDA (10 mantissa bits), bfloat16 inside
    oneDNN's float32 products on CPUs that have it (8 bits).
    """
    matmul = torch.get_float32_matmul_precision()
    cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("medium")
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn


def contribution_ratios(sums, n, clip):
    """‖per-example contribution‖ / C, in float64, for sums [n, ...] per name."""
    flat = torch.cat([s.reshape(n, -1).double().cpu() for s in sums.values()], 1)
    return flat.norm(dim=1) / clip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["vmap", "ghost"])
def test_a_clipped_contribution_never_exceeds_the_clip(device, method):
    # The sensitivity the noise is calibrated to: each example's clipped
    # contribution to a sum has norm <= C(1 + 1e-6) (float32 rounding,
    # ~1e-7, allowed), whatever reduced precision the caller allowed (TF32
    # rounding would give ~1e-3). Adversarial C: just below the smallest
    # per-example norm (a factor 1 - 1e-7 that rounding could undo), the
    # median and far below. Every example is its own segment, so each
    # segment's sum is one contribution as the kernel sums it; also one
    # example alone (no segments) and the cohort kernel (one example per
    # client).
    torch.manual_seed(11)
    n = 24
    model = PaperCNN(num_classes=10).to(device)
    x = 2 * torch.randn(n, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (n,), device=device)
    seg = torch.arange(n, device=device)
    params = {k: v.detach() for k, v in model.named_parameters()}
    kw = dict(segment_ids=seg, num_segments=n, method=method)
    with reduced_precision():
        _, norms = clipped_grad_sum(
            model, None, x, y, clip=1e9, return_norms=True, **kw
        )
        low = float(norms.min())
        for clip in (low / (1 + 1e-7), float(norms.median()), 0.3 * low):
            sums = clipped_grad_sum(model, None, x, y, clip=clip, **kw)
            worst = float(contribution_ratios(sums, n, clip).max())
            assert worst <= 1 + 1e-6, (clip, worst)
            alone = clipped_grad_sum(
                model, None, x[:1], y[:1], clip=clip, method=method
            )
            assert float(contribution_ratios(alone, 1, clip)) <= 1 + 1e-6
            cohort = batched_client_grads(
                model,
                stack_params(params, n),
                x[:, None],
                y[:, None],
                clip=clip,
                method=method,
            )
            assert float(contribution_ratios(cohort, n, clip).max()) <= 1 + 1e-6


def test_full_precision_restores_the_callers_settings():
    from dpfl.sim.grad.sums import full_precision

    with reduced_precision():
        before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
        with full_precision():
            assert torch.get_float32_matmul_precision() == "highest"
            assert not torch.backends.cudnn.allow_tf32
        assert (
            (
                torch.get_float32_matmul_precision(),
                torch.backends.cudnn.allow_tf32,
            )
            == before
            == ("medium", True)
        )


#: PaperCNN's layers whose products TF32 rounds (two convolutions, two linear
#: layers), and the longest reduction among their products, forward and
#: backward (the first linear layer's 512 inputs; the convolutions reduce
#: over 64 and 256 inputs, their weight gradients over 196 and 25 positions).
TF32_LAYERS, TF32_LONGEST = 4, 512


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("method", ["vmap", "ghost"])
def test_cuda_matches_cpu(method):
    torch.manual_seed(9)
    model = PaperCNN(num_classes=10)
    x, y = torch.randn(40, 1, 28, 28), torch.randint(0, 10, (40,))
    seg = torch.randint(0, 5, (40,))
    clip = 0.1
    kw = dict(clip=clip, segment_ids=seg, num_segments=5, method=method)
    cpu = clipped_grad_sum(model, None, x, y, **kw)
    gpu_model = PaperCNN(num_classes=10).cuda()
    gpu_model.load_state_dict(model.state_dict())
    from dpfl.sim.grad.sums import full_precision

    with full_precision():  # the whole computation in float32 on the GPU
        exact = clipped_grad_sum(gpu_model, None, x, y, **kw)
    with reduced_precision():  # TF32 convolutions and matrix products
        tf32 = clipped_grad_sum(gpu_model, None, x, y, **kw)
    for n in cpu:
        scale = float(cpu[n].abs().max())
        print(
            f"{method} {n}: max |gpu - cpu| / max |cpu|: float32 "
            f"{float((exact[n].cpu() - cpu[n]).abs().max()) / scale:.2e}, TF32 "
            f"{float((tf32[n].cpu() - cpu[n]).abs().max()) / scale:.2e}"
        )
        # float32 throughout: the same sums up to the order of float32
        # reductions (cuDNN's algorithms, atomic adds): 1e-4 absolute for
        # entries up to ~0.1 (C = 0.1, five segments), 1e-3 relative.
        torch.testing.assert_close(exact[n].cpu(), cpu[n], atol=1e-4, rtol=1e-3)
    # TF32 keeps 10 of float32's 23 mantissa bits: every operand of a
    # convolution or matrix product moves by up to 2^-10 of itself, and a
    # reduction of K such products by ~sqrt(K)·2^-10 of its terms' size
    # (rounding errors add as a random walk). Each layer's products perturb
    # the activations and backward signals of the layers after it, so an
    # example's gradient moves by up to L·sqrt(K)·2^-10 of its norm (L = 4
    # layers, K = 512: 8.8 %), and its clipped contribution, of norm <= C, by
    # that much of C. A segment's sum of n_s contributions therefore differs
    # by at most L·sqrt(K)·2^-10·C·n_s, in norm over all parameters. Entries
    # are not compared one by one: a sum that cancels to near zero has
    # errors of the size of its terms, and a ReLU or max-pool decision that
    # TF32 rounding flips moves one example's gradient by more than rounding
    # (emulating TF32 on the CPU for these inputs: per-example errors of
    # 1.7e-3·C typically, 0.13·C for the worst example, segment sums within
    # 0.02·C·n_s). The clipping itself is exact (test above).
    bound = TF32_LAYERS * math.sqrt(TF32_LONGEST) * 2.0**-10 * clip
    sizes = torch.bincount(seg, minlength=5).double()
    error = torch.cat(
        [(tf32[n].cpu() - cpu[n]).double().reshape(5, -1) for n in cpu], 1
    ).norm(dim=1)
    print(
        f"{method} TF32: max over segments of |gpu - cpu| / (C n_s): "
        f"{float((error / (clip * sizes.clamp(min=1))).max()):.2e} "
        f"(bound {bound / clip:.2e})"
    )
    assert bool((error <= bound * sizes).all()), (error / (clip * sizes)).tolist()


# ------------------------------------------------ cross-client ghost kernel
def client_loop_reference(model, stacked, xb, yb, clip, mask=None):
    """Per-client, per-example autograd loop: Σ_i m_ki clip(g_ki) per client."""
    n = xb.shape[0]
    sums = {k: torch.zeros_like(v) for k, v in stacked.items()}
    for k in range(n):
        params = {name: v[k] for name, v in stacked.items()}
        keep = (
            torch.ones(xb.shape[1], dtype=torch.bool) if mask is None else mask[k] > 0
        )
        if not bool(keep.any()):
            continue
        _, s, _ = reference(model, params, xb[k][keep], yb[k][keep], clip)
        for name in sums:
            sums[name][k] = s[name]
    return sums


class DeepMLP(nn.Module):
    """Two hidden layers, one without bias, mixed activations."""

    def __init__(self, d: int, h: int, c: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, h, bias=False)
        self.out = nn.Linear(h, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.fc2(F.relu(self.fc1(x)))))


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 5),
    b=st.integers(1, 6),
    clip=st.sampled_from([0.01, 0.3, 1.0, 100.0]),
    arch=st.sampled_from(["mlp", "deep", "logistic"]),
    masked=st.booleans(),
    max_clients=st.sampled_from([None, 2]),
    seed=st.integers(0, 2**16),
)
def test_batched_ghost_equals_client_example_loop(
    n, b, clip, arch, masked, max_clients, seed
):
    # Property: the cross-client ghost kernel equals the per-client,
    # per-example autograd loop (atol 1e-5 float32) for random MLPs, any
    # number of clients, batch, clip, padding mask and client chunking.
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    d, c = 7, 4
    model = {
        "mlp": lambda: MLP(in_features=d, hidden=(6,), num_classes=c),
        "deep": lambda: DeepMLP(d, 5, c),
        "logistic": lambda: MLP(in_features=d, hidden=(), num_classes=c),
    }[arch]()
    assert ghost_supported(model)
    stacked = stack_params(params_of(model), n)
    for v in stacked.values():  # different params per client
        v.add_(0.3 * torch.randn(v.shape, generator=g))
    xb = 2.0 * torch.randn(n, b, d, generator=g)
    yb = torch.randint(0, c, (n, b), generator=g)
    mask = None
    if masked:
        mask = (torch.rand(n, b, generator=g) < 0.6).float()
        xb[mask == 0] = 0.0  # padding holds finite values
    ref = client_loop_reference(model, stacked, xb, yb, clip, mask)
    got = batched_client_grads(
        model,
        stacked,
        xb,
        yb,
        clip=clip,
        sample_mask=mask,
        max_clients=max_clients,
        method="ghost",
    )
    assert_dicts_close(got, ref)
    # "auto" takes the same kernel; "vmap" agrees.
    auto = batched_client_grads(model, stacked, xb, yb, clip=clip, sample_mask=mask)
    assert_dicts_close(auto, got, atol=1e-6, rtol=1e-6)
    vm = batched_client_grads(
        model, stacked, xb, yb, clip=clip, sample_mask=mask, method="vmap"
    )
    assert_dicts_close(vm, got)


@pytest.mark.parametrize("clip", [None, 0.05])
def test_batched_ghost_unclipped_and_conv_equal_vmap(clip):
    # Unclipped sums and a convolutional model (per-sample conv weight
    # gradients from the cross-client pass) agree with the vmap kernel.
    torch.manual_seed(11)
    model = TinyCNN()
    n, b = 3, 4
    stacked = stack_params(params_of(model), n)
    for v in stacked.values():
        v.add_(0.1 * torch.randn_like(v))
    xb, yb = torch.randn(n, b, 1, 8, 8), torch.randint(0, 5, (n, b))
    mask = torch.ones(n, b)
    mask[2, 1:] = 0.0
    kw = dict(clip=clip, sample_mask=mask)
    ghost = batched_client_grads(model, stacked, xb, yb, method="ghost", **kw)
    assert_dicts_close(
        ghost, batched_client_grads(model, stacked, xb, yb, method="vmap", **kw)
    )
    if clip is not None:
        assert_dicts_close(
            ghost, client_loop_reference(model, stacked, xb, yb, clip, mask)
        )


def test_batched_ghost_falls_back_for_unsupported_models():
    # GroupNorm (not ghost-supported) and a layer called twice per forward
    # pass: "auto" falls back to vmap and equals the loop; "ghost" raises.
    torch.manual_seed(12)
    n, b = 3, 4
    for model, d in (
        (
            nn.Sequential(
                nn.Linear(6, 8), nn.GroupNorm(2, 8), nn.ReLU(), nn.Linear(8, 3)
            ),
            6,
        ),
        (Reused(), 4),
    ):
        stacked = stack_params(params_of(model), n)
        for v in stacked.values():
            v.add_(0.1 * torch.randn_like(v))
        xb, yb = torch.randn(n, b, d), torch.randint(0, 3, (n, b))
        ref = client_loop_reference(model, stacked, xb, yb, 0.2)
        assert_dicts_close(batched_client_grads(model, stacked, xb, yb, clip=0.2), ref)
        with pytest.raises(InvalidParameterError, match="ghost"):
            batched_client_grads(model, stacked, xb, yb, clip=0.2, method="ghost")
    # Partial params: auto uses vmap, ghost refuses.
    model, stacked, xb, yb = cohort_data()
    part = {"net.2.weight": stacked["net.2.weight"]}
    out = batched_client_grads(model, part, xb, yb, clip=0.2)
    assert set(out) == set(part)
    with pytest.raises(InvalidParameterError, match="ghost"):
        batched_client_grads(model, part, xb, yb, clip=0.2, method="ghost")
    with pytest.raises(InvalidParameterError, match="method"):
        batched_client_grads(model, stacked, xb, yb, clip=0.2, method="fast")


def test_batched_ghost_non_finite_raises():
    model, stacked, xb, yb = cohort_data()
    xb[1, 2, 0] = float("inf")
    with pytest.raises(NonFiniteUpdateError, match="norms"):
        batched_client_grads(model, stacked, xb, yb, clip=1.0, method="ghost")


class ConvNet(nn.Module):
    """Configurable: first conv (im2col route when cin < 4), second conv
    (grouped route, needs an input gradient), pooling, a Linear on 3-d input."""

    def __init__(self, cin, k1, stride, pad, dil, bias, pool) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, 3, k1, stride=stride, padding=pad, dilation=dil)
        self.c2 = nn.Conv2d(3, 4, 2, bias=bias)
        self.pool = pool
        self.seq = nn.Linear(4, 3, bias=bias)  # on [b, positions, 4]
        self.fc = nn.LazyLinear(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.c1(x))
        if self.pool:
            h = F.max_pool2d(h, 2, stride=1)
        h = torch.tanh(self.c2(h))
        h = self.seq(h.flatten(2).transpose(1, 2))  # [b, L, 3]
        return self.fc(h.flatten(1))


@settings(max_examples=20, deadline=None)
@given(
    cin=st.sampled_from([1, 2, 5]),
    k1=st.integers(1, 3),
    stride=st.integers(1, 2),
    pad=st.integers(0, 1),
    dil=st.integers(1, 2),
    bias=st.booleans(),
    pool=st.booleans(),
    clip=st.sampled_from([None, 0.05, 10.0]),
    n=st.integers(1, 4),
    b=st.integers(1, 4),
    masked=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cohort_conv_kernel_equals_client_example_loop(
    cin, k1, stride, pad, dil, bias, pool, clip, n, b, masked, seed
):
    # Property: the cross-client kernel (per-client im2col or grouped
    # convolutions over the flat batch) equals the per-client, per-example
    # autograd loop (atol 1e-5, float32) for convolutions with any stride,
    # padding, dilation, bias or none, clipped or not, with padding masks.
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = ConvNet(cin, k1, stride, pad, dil, bias, pool)
    model(torch.zeros(1, cin, 9, 9))  # materialise the lazy layer
    assert ghost_supported(model)
    stacked = stack_params(params_of(model), n)
    for v in stacked.values():
        v.add_(0.2 * torch.randn(v.shape, generator=g))
    xb = torch.randn(n, b, cin, 9, 9, generator=g)
    yb = torch.randint(0, 5, (n, b), generator=g)
    mask = None
    if masked:
        mask = (torch.rand(n, b, generator=g) < 0.6).float()
        xb[mask == 0] = 0.0
    got = batched_client_grads(
        model, stacked, xb, yb, clip=clip, sample_mask=mask, method="ghost"
    )
    ref = client_loop_reference(model, stacked, xb, yb, clip or 1e9, mask)
    assert_dicts_close(got, ref)
    # The model's own modules are restored after the cohort pass.
    assert all("forward" not in vars(mod) for mod in model.modules())


def test_cohort_pass_restores_a_patched_forward():
    # A forward set on a layer instance before the cohort pass (a user's patch)
    # is the one in place afterwards.
    model = TinyCNN()
    original = model.fc.forward

    def patched(x):
        return original(x)

    model.fc.forward = patched
    stacked = stack_params(params_of(model), 2)
    xb, yb = torch.randn(2, 3, 1, 8, 8), torch.randint(0, 5, (2, 3))
    batched_client_grads(model, stacked, xb, yb, method="ghost")
    assert vars(model.fc)["forward"] is patched
    assert "forward" not in vars(model.c1)
