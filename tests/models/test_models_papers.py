"""The papers' models at their own input shapes and at others, and the binary loss.

Parameter counts are the papers' where a paper states one:
- McMahan et al. 2017 (AISTATS), §3: the MNIST CNN has "1,663,370 total parameters";
- the TensorFlow CNN tutorial cited by Zheng et al. 2021 (§4.2, footnote 3)
  prints 122,570 trainable parameters for its CIFAR-10 CNN;
- the random-participation CNN (arXiv 2205.01556, App. B) and the PriFedSync
  MNIST CNN state no count; their closed forms are computed by hand below.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpfl.errors import InvalidParameterError
from dpfl.models import (
    LogisticRegression,
    McMahanCNN,
    PaperCNN,
    PriFedSyncCNN,
    TfTutorialCNN,
    build_model,
    classification_loss,
    predicted_labels,
    split_parameters,
)

CNNS = ["paper_cnn", "prifedsync_cnn", "mcmahan_cnn", "tf_tutorial_cnn"]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_mcmahan_cnn_has_the_papers_parameter_count():
    model = McMahanCNN()
    # 5*5*1*32+32 + 5*5*32*64+64 + 7*7*64*512+512 + 512*10+10, "same" padding.
    assert n_params(model) == 1_663_370
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert model.features(torch.zeros(1, 1, 28, 28)).shape == (1, 64, 7, 7)


def test_mcmahan_cnn_at_reduced_width():
    # The same stack with c1 = 8, c2 = 16 channels and 64 hidden units:
    # 5*5*1*8+8 + 5*5*8*16+16 + 7*7*16*64+64 + 64*10+10, by hand.
    model = build_model(
        "mcmahan_cnn",
        input_shape=(1, 28, 28),
        num_classes=10,
        channels=[8, 16],
        hidden=64,
    )
    assert n_params(model) == 208 + 3216 + 50240 + 650
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    for bad in ({"channels": [8]}, {"channels": [8, 0]}, {"hidden": 0}):
        with pytest.raises(InvalidParameterError):
            McMahanCNN(**bad)


def test_tf_tutorial_cnn_has_the_tutorials_parameter_count():
    model = TfTutorialCNN()
    # 896 + 18,496 + 36,928 + 65,600 + 650 (Keras model.summary of the tutorial).
    assert n_params(model) == 122_570
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert model.features(torch.zeros(1, 3, 32, 32)).shape == (1, 64, 4, 4)


@pytest.mark.parametrize(
    ("cls", "shape", "flat"),
    [
        # (32+6-8)//2+1 = 16, pool -> 15, (15-4)//2+1 = 6, pool -> 5: 32*5*5.
        (PaperCNN, (3, 32, 32), 32 * 5 * 5),
        # 32 -> 30 -> 28 -> pool 14: 64*14*14.
        (PriFedSyncCNN, (3, 32, 32), 64 * 14 * 14),
        # 32 -> 16 -> 8: 64*8*8.
        (McMahanCNN, (3, 32, 32), 64 * 8 * 8),
        # 28 -> 26 -> 13 -> 11 -> 5 -> 3: 64*3*3.
        (TfTutorialCNN, (1, 28, 28), 64 * 3 * 3),
    ],
)
def test_cnns_size_their_classifier_from_the_image(cls, shape, flat):
    model = cls(7, in_channels=shape[0], image_size=shape[1:])
    first = model.classifier[1]
    assert isinstance(first, nn.Linear) and first.in_features == flat
    assert model(torch.zeros(4, *shape)).shape == (4, 7)


@pytest.mark.parametrize("name", CNNS)
@pytest.mark.parametrize("shape", [(1, 28, 28), (28, 28), (3, 32, 32), (2, 40, 36)])
def test_build_model_cnns_take_any_image_shape(name, shape):
    model = build_model(name, input_shape=shape, num_classes=5)
    x = torch.zeros(3, *shape) if len(shape) == 3 else torch.zeros(3, 1, *shape)
    assert model(x).shape == (3, 5)


@pytest.mark.parametrize("name", CNNS)
def test_cnns_refuse_images_too_small(name):
    with pytest.raises(InvalidParameterError, match="too small"):
        build_model(name, input_shape=(1, 2, 2), num_classes=10)
    with pytest.raises(InvalidParameterError, match="image_size"):
        PaperCNN(10, image_size=(28, 0))


def test_binary_logistic_regression_from_the_registry():
    model = build_model(
        "logistic_regression", input_shape=(14,), num_classes=2, binary=True, bias=False
    )
    assert isinstance(model, LogisticRegression)
    assert model(torch.zeros(5, 14)).shape == (5,)
    # MS-PAFL §V-A: the first half of the d = 14 feature weights is private.
    split = split_parameters(model, private_fraction=0.5)
    assert split.private_index.tolist() == list(range(7))
    with pytest.raises(InvalidParameterError, match="needs 2 classes"):
        build_model(
            "logistic_regression", input_shape=(14,), num_classes=3, binary=True
        )


def test_classification_loss_is_bce_for_one_logit_and_ce_otherwise():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, generator=gen)
    y = torch.randint(0, 2, (8,), generator=gen)
    # BCE by hand: -mean(y log s(z) + (1-y) log(1 - s(z))).
    s = torch.sigmoid(logits)
    by_hand = -(y * s.log() + (1 - y) * (1 - s).log()).mean()
    assert classification_loss(logits, y) == pytest.approx(float(by_hand), rel=1e-6)
    assert predicted_labels(logits).tolist() == (logits > 0).long().tolist()
    multi = torch.randn(8, 3, generator=gen)
    labels = torch.randint(0, 3, (8,), generator=gen)
    assert classification_loss(multi, labels) == F.cross_entropy(multi, labels)
    assert predicted_labels(multi).tolist() == multi.argmax(1).tolist()
