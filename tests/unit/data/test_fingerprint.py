"""trainkit.data.fingerprint: what a checkpoint records of the data, and the line a resume prints when it changed."""

import pytest
import torch

from trainkit.data import Splits
from trainkit.data.fingerprint import check_same_data, data_fingerprint
from trainkit.errors import ConfigError


def refusal(saved, now) -> str:
    with pytest.raises(ConfigError) as error:
        check_same_data(saved, now)
    return str(error.value).split(" since the checkpoint")[0]


def test_in_memory_data_is_checked_by_shape_and_values_in_order():
    images, labels = torch.arange(24.0).reshape(6, 1, 2, 2), torch.tensor([0, 1, 0, 1, 0, 1])
    saved = data_fingerprint(Splits((images, labels), (images, labels), (images, labels), 2))
    check_same_data(saved, data_fingerprint(Splits((images, labels), (images, labels), (images, labels), 2)))
    shuffled = data_fingerprint(Splits((images.flip(0), labels), (images, labels), (images[:4], labels[:4]), 2))
    assert refusal(saved, shuffled) == (
        "data: the train split holds other values (its shape is the same); "
        "the test split is [4, 1, 2, 2], was [6, 1, 2, 2]"
    )


def test_masks_as_labels_are_checked_too():
    """Segmentation: a mask of classes a sample, summed per sample like the images."""
    images, masks = torch.zeros(4, 1, 3, 3), torch.zeros(4, 3, 3, dtype=torch.long)
    saved = data_fingerprint(Splits((images, masks), (images, masks), (images, masks), 2))
    check_same_data(saved, data_fingerprint(Splits((images, masks), (images, masks), (images, masks), 2)))
    relabelled = masks.clone()
    relabelled[2, 1, 1] = 1
    changed = data_fingerprint(Splits((images, relabelled), (images, masks), (images, masks), 2))
    assert refusal(saved, changed) == "data: the train split holds other values (its shape is the same)"


def test_another_fold_is_named_alone_and_no_folds_is_no_fold():
    images, labels = torch.arange(24.0).reshape(6, 1, 2, 2), torch.tensor([0, 1, 0, 1, 0, 1])
    splits = Splits((images[:4], labels[:4]), (images[4:], labels[4:]), (images, labels), 2)
    other = Splits((images[2:], labels[2:]), (images[:2], labels[:2]), (images, labels), 2)
    saved = data_fingerprint(splits, fold="fold 0 of 3")
    assert saved["fold"] == "fold 0 of 3" and "fold" not in data_fingerprint(splits)  # no folds: as before folds
    check_same_data(saved, data_fingerprint(splits, fold="fold 0 of 3"))
    # the splits differ because the fold does: one change is named, not each split's
    assert refusal(saved, data_fingerprint(other, fold="fold 1 of 3")) == (
        "data: the val split is fold 1 of 3 (data.folds, data.fold), was fold 0 of 3"
    )
    assert refusal(data_fingerprint(splits), data_fingerprint(other, fold="fold 1 of 3")) == (
        "data: the val split is fold 1 of 3 (data.folds, data.fold), was carved by data.val_fraction"
    )
    assert refusal(saved, data_fingerprint(splits)) == (
        "data: the val split is carved by data.val_fraction (data.folds, data.fold), was fold 0 of 3"
    )
