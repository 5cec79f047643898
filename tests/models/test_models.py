"""Tests of dpfl.models: shapes, parameter counts, registry, public/private split."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpfl.errors import InvalidParameterError
from dpfl.models import (
    MLP,
    MODEL_NAMES,
    LogisticRegression,
    PaperCNN,
    ParameterSplit,
    PriFedSyncCNN,
    build_model,
    split_parameters,
)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------ shapes, counts
def test_paper_cnn_matches_appendix_b():
    # random-participation App. B, Fig. 8: the first FC layer takes 32 x 4 x 4,
    # which the conv/pool stack must produce from 28 x 28:
    # (28+6-8)/2+1 = 14, pool(2,1) -> 13, (13-4)//2+1 = 5, pool(2,1) -> 4.
    model = PaperCNN()
    assert model.features(torch.zeros(2, 1, 28, 28)).shape == (2, 32, 4, 4)
    assert model(torch.zeros(3, 1, 28, 28)).shape == (3, 62)
    # Closed form: 16*1*64+16 + 32*16*16+32 + 512*256+256 + 256*62+62 = 156526.
    assert n_params(model) == 156_526


def test_prifedsync_cnn_shape_and_count():
    model = PriFedSyncCNN()
    assert model(torch.zeros(4, 1, 28, 28)).shape == (4, 10)
    # Closed form: 32*9+32 + 64*32*9+64 + 9216*128+128 + 128*10+10 = 1199882.
    assert n_params(model) == 1_199_882


def test_linear_models_flatten_inputs():
    lr = LogisticRegression(64, 10)
    assert lr(torch.zeros(5, 8, 8)).shape == (5, 10)
    binary = LogisticRegression(14, 1, bias=False)
    assert binary(torch.zeros(5, 14)).shape == (5,)
    assert n_params(binary) == 14
    mlp = MLP()
    assert mlp(torch.zeros(5, 8, 8)).shape == (5, 10)
    assert n_params(mlp) == 64 * 64 + 64 + 64 * 10 + 10
    deep = MLP(64, hidden=[32, 16], num_classes=3)
    assert deep(torch.zeros(2, 64)).shape == (2, 3)


def test_no_batchnorm_anywhere():
    for name in MODEL_NAMES:
        shape = (1, 28, 28) if "cnn" in name else (64,)
        model = build_model(name, input_shape=shape, num_classes=10)
        assert not any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()
        )


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_mlp_fits_8x8_digits():
    # The MLP must be able to fit scikit-learn's 1,797 digits: full-batch Adam,
    # 150 steps, seeded. Non-private training accuracy of such a network is
    # ~100%; we require > 95% (a broken model or shape stays near 10%).
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(8, 8), num_classes=10)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(150):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    accuracy = (model(x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.95


# ------------------------------------------------------------------ registry
def test_build_model_names_and_shapes():
    cnn = build_model("paper_cnn", input_shape=(1, 28, 28), num_classes=62)
    assert isinstance(cnn, PaperCNN)
    cnn2 = build_model("Paper-CNN", input_shape=(28, 28), num_classes=10)
    assert cnn2(torch.zeros(1, 28, 28).unsqueeze(1)).shape == (1, 10)
    pf = build_model("prifedsync_cnn", input_shape=(1, 28, 28), num_classes=10)
    assert isinstance(pf, PriFedSyncCNN)
    lr = build_model("logistic_regression", input_shape=(14,), num_classes=1)
    assert isinstance(lr, LogisticRegression) and lr.in_features == 14
    mlp = build_model("mlp", input_shape=(8, 8), num_classes=10, hidden=(32,))
    assert mlp(torch.zeros(2, 8, 8)).shape == (2, 10)


def test_build_model_errors():
    with pytest.raises(InvalidParameterError, match="unknown model 'resnet'"):
        build_model("resnet", input_shape=(3, 32, 32), num_classes=10)
    with pytest.raises(InvalidParameterError, match=r"\(C, H, W\)"):
        build_model("paper_cnn", input_shape=(3 * 32 * 32,), num_classes=10)
    with pytest.raises(InvalidParameterError, match="too small"):
        build_model("paper_cnn", input_shape=(1, 8, 8), num_classes=10)
    with pytest.raises(InvalidParameterError, match="keyword"):
        build_model("mlp", input_shape=(64,), num_classes=10, depth=3)
    with pytest.raises(InvalidParameterError, match="num_classes"):
        build_model("mlp", input_shape=(64,), num_classes=0)
    with pytest.raises(InvalidParameterError, match="input_shape"):
        build_model("mlp", input_shape=64, num_classes=10)


# ------------------------------------------------------------------ split
def test_logistic_regression_split_first_half_private():
    # docs/analyses.md / ms-pafl §V-A: d = 14, first 7 coordinates private.
    model = LogisticRegression(14, 1, bias=False)
    split = split_parameters(model)
    assert split.num_parameters == 14
    assert split.private_index.tolist() == list(range(7))
    assert split.public_index.tolist() == list(range(7, 14))
    assert split.private_names == ("linear.weight",)
    assert split.public_names == ("linear.weight",)
    w = torch.arange(14.0).reshape(1, 14)
    vec = split.flatten({"linear.weight": w})
    assert split.private(vec).tolist() == list(range(7))
    assert split.public(vec).tolist() == [float(i) for i in range(7, 14)]


def test_split_roundtrips():
    torch.manual_seed(0)
    model = MLP(6, (4,), 3)
    params = {n: p.detach() for n, p in model.named_parameters()}
    split = split_parameters(params, private_fraction=0.3)
    total = 6 * 4 + 4 + 4 * 3 + 3
    assert split.num_parameters == total
    assert split.num_private == int(0.3 * total)  # floor, = 12
    vec = split.flatten(params)
    back = split.unflatten(vec)
    for n in params:
        assert torch.equal(back[n], params[n])
    merged = split.merge(split.public(vec), split.private(vec))
    assert torch.equal(merged, vec)
    # Batched (stacked client) vectors keep their leading dimension.
    stacked = {n: torch.stack([p, 2 * p]) for n, p in params.items()}
    vecs = split.flatten(stacked, batch_dims=1)
    assert vecs.shape == (2, total)
    assert torch.equal(vecs[1], 2 * vec)
    assert split.unflatten(vecs)["net.0.weight"].shape == (2, 4, 6)


def test_split_by_predicate():
    model = MLP(6, (4,), 3)
    split = split_parameters(model, predicate=lambda name, t: name.startswith("net.0"))
    assert split.private_names == ("net.0.weight", "net.0.bias")
    assert split.public_names == ("net.2.weight", "net.2.bias")
    assert split.num_private == 6 * 4 + 4


def test_split_errors():
    model = MLP(6, (4,), 3)
    with pytest.raises(InvalidParameterError, match="not both"):
        split_parameters(model, private_fraction=0.5, predicate=lambda n, t: True)
    with pytest.raises(InvalidParameterError, match="private_fraction"):
        split_parameters(model, private_fraction=1.5)
    split = split_parameters(model)
    with pytest.raises(InvalidParameterError, match="last dimension"):
        split.unflatten(torch.zeros(3))
    with pytest.raises(InvalidParameterError, match="lacks"):
        split.flatten({})
    with pytest.raises(InvalidParameterError, match="private_mask"):
        ParameterSplit(
            names=("a",), shapes=(torch.Size([2]),), private_mask=torch.ones(3) > 0
        )
