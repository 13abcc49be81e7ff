"""trainkit.tasks.segmentation and its confusion-matrix metrics, against a hand-worked example."""

import math

import pytest
import torch
import torch.nn.functional as F

from trainkit.errors import ConfigError
from trainkit.tasks.confusion import confusion_counts
from trainkit.tasks.segmentation import Segmentation, miou_and_pixel_acc
from trainkit.tasks.task import metric_names_of

# Six pixels, four classes; class 3 occurs in neither the targets nor the predictions.
TARGETS = torch.tensor([[[0, 0, 1], [1, 2, 2]]])
PREDICTIONS = torch.tensor([[[0, 1, 1], [1, 0, 2]]])
EXPECTED = torch.tensor([[1, 1, 0, 0], [0, 2, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]])  # [target, prediction]


def test_confusion_counts_of_the_worked_example():
    assert torch.equal(confusion_counts(PREDICTIONS, TARGETS, num_classes=4), EXPECTED)


def test_miou_averages_over_the_classes_that_occur():
    # IoU: class 0 1/(2+2-1) = 1/3, class 1 2/(2+3-2) = 2/3, class 2 1/(2+1-1) = 1/2; class 3 left out.
    miou, pixel_accuracy = miou_and_pixel_acc(EXPECTED)
    assert miou.dtype == torch.float32 and miou.dim() == 0
    assert miou.item() == pytest.approx((1 / 3 + 2 / 3 + 1 / 2) / 3)
    assert pixel_accuracy.item() == pytest.approx(4 / 6)


def test_a_class_only_predicted_counts_with_iou_zero():
    miou, _ = miou_and_pixel_acc(torch.tensor([[3, 1], [0, 0]]))  # class 1 never a target, predicted once
    assert miou.item() == pytest.approx((3 / 4 + 0) / 2)


def test_a_target_out_of_range_raises_rather_than_counting_wrong():
    with pytest.raises((IndexError, RuntimeError)):
        confusion_counts(PREDICTIONS, TARGETS + 4, num_classes=4)


def test_no_pixels_give_nan():
    miou, pixel_accuracy = miou_and_pixel_acc(torch.zeros(3, 3, dtype=torch.int64))
    assert math.isnan(miou.item()) and math.isnan(pixel_accuracy.item())


def test_the_task_sums_counts_over_batches_before_the_ratio():
    task = Segmentation(num_classes=4)
    logits = F.one_hot(PREDICTIONS, 4).permute(0, 3, 1, 2).float() * 5
    sums = task.metric_sums(logits, TARGETS) + task.metric_sums(logits[..., :1], TARGETS[..., :1])
    counts = EXPECTED + torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])  # + column 0
    miou, pixel_acc = miou_and_pixel_acc(counts)
    assert task.metrics(sums) == {"miou": pytest.approx(miou.item()), "pixel_acc": pytest.approx(pixel_acc.item())}
    assert torch.equal(task.empty_metric_sums(torch.device("cpu")), torch.zeros(16))


def test_losses_are_per_pixel_and_tta_mirrors_the_class_map_back():
    task = Segmentation(num_classes=4)
    logits = torch.randn(2, 4, 3, 5)
    masks = torch.randint(0, 4, (2, 3, 5))
    assert task.loss(logits, masks) == pytest.approx(F.cross_entropy(logits, masks).item())
    per_image = task.evaluation_loss(logits, masks)
    assert per_image.shape == (2,) and per_image.mean().item() == pytest.approx(task.loss(logits, masks).item())
    assert torch.equal(task.mirror_outputs(logits), logits.flip(-1))
    assert torch.equal(task.predict(logits)["mask"], logits.argmax(dim=1))


def test_labels_instead_of_masks_are_one_line_naming_the_task():
    with pytest.raises(ConfigError, match=r"^task: needs an int64 mask"):
        Segmentation(num_classes=4).to_device((torch.rand(2, 3, 8, 8), torch.tensor([1, 2])), torch.device("cpu"))


def test_a_classifier_s_outputs_are_one_line_naming_the_model():
    task = Segmentation(num_classes=3)
    masks = torch.zeros(2, 4, 4, dtype=torch.long)
    for score in (task.loss, task.evaluation_loss):
        with pytest.raises(ConfigError, match=r"class scores per pixel .*model=unet") as error:
            score(torch.zeros(2, 3), masks)  # [B, classes]: one row an image
        assert error.value.key == "model._target_"


def test_training_augmentation_moves_image_and_mask_together():
    torch.manual_seed(0)
    masks = torch.randint(0, 4, (8, 16, 16))
    images = masks[:, None].float().expand(8, 3, 16, 16).clone()  # the image shows its mask
    moved_images, moved_masks = Segmentation(4, horizontal_flip=True, crop_padding=0.25).augment((images, masks))
    assert torch.equal(moved_images[:, 0].round().long(), moved_masks)  # shifted-in border: 0 in both
    assert not torch.equal(moved_masks, masks)


def test_metric_names_come_from_the_task_class():
    assert metric_names_of(Segmentation) == ("loss", "miou", "pixel_acc")
