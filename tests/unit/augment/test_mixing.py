"""MixUp / CutMix with soft targets (trainkit.augment.mixing); that they reach the loop: tests/e2e/test_wiring.py."""

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from trainkit.augment.mixing import LabelMixing

MIXUP = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0}


def mixed(seed: int, augmentation=MIXUP, batch: int = 16, classes: int = 5):
    torch.manual_seed(0)
    images, labels = torch.rand(batch, 3, 8, 8), torch.randint(0, classes, (batch,))
    torch.manual_seed(seed)
    return images, labels, *LabelMixing(augmentation, classes)(images, labels)


@pytest.mark.parametrize("augmentation", [MIXUP, {"mixup_alpha": 0.2}, {"cutmix_alpha": 1.0, "mixup_alpha": None}])
def test_soft_targets_sum_to_one_and_images_keep_shape_and_dtype(augmentation):
    images, labels, out, targets = mixed(0, augmentation)
    assert out.shape == images.shape and out.dtype == torch.float32
    assert targets.shape == (16, 5) and targets.dtype == torch.float32
    torch.testing.assert_close(targets.sum(dim=1), torch.ones(16))
    assert not torch.equal(out, images)
    # Each sample mixed with its neighbour (the batch rolled by one), one weight for the batch.
    own, neighbour = F.one_hot(labels, 5).float(), F.one_hot(labels.roll(1), 5).float()
    weight = (targets * own).sum(dim=1)[labels != labels.roll(1)][0]
    torch.testing.assert_close(targets, weight * own + (1 - weight) * neighbour)


def test_the_same_seed_draws_the_same_mix_and_another_seed_another():
    first, again, other = mixed(3), mixed(3), mixed(4)  # train.py seeds each rank with seed + rank
    assert torch.equal(first[2], again[2]) and torch.equal(first[3], again[3])
    assert not torch.equal(first[3], other[3])


def test_off_returns_the_batch_as_it_is():
    for augmentation in (None, {"mixup_alpha": 0, "cutmix_alpha": None}, OmegaConf.create({"name": "none"})):
        mixing = LabelMixing(augmentation, 10)
        images, labels = torch.rand(4, 1, 8, 8), torch.arange(4)
        assert not mixing.enabled and mixing(images, labels) == (images, labels)


def test_label_smoothing_applies_to_soft_targets_as_to_class_indices():
    logits, labels = torch.randn(8, 5), torch.randint(0, 5, (8,))
    loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    torch.testing.assert_close(loss(logits, F.one_hot(labels, 5).float()), loss(logits, labels))
    soft = torch.softmax(torch.randn(8, 5), dim=1)
    smoothed = soft * 0.9 + 0.1 / 5
    torch.testing.assert_close(loss(logits, soft), -(smoothed * logits.log_softmax(dim=1)).sum(dim=1).mean())
