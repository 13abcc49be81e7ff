"""The pictures eval.py draws: chosen by what the task predicts, counts summed over every batch."""

import json

import numpy as np
import torch
from matplotlib.image import imread
from torch import nn

from data_for_tests import signals
from models_for_tests import LengthsNet, WithAuxiliaryOutput
from tasks_for_tests import AuxiliaryLoss as TwoLosses
from tasks_for_tests import PixelClasses, SignalClassification
from trainkit.tasks.classification import Classification
from trainkit.tasks.confusion import confusion_counts
from trainkit.tracking.evaluation_figures import Predicted, plot_masks, predicted_on, save_figures

CPU = torch.device("cpu")


def not_blank(path) -> bool:
    picture = imread(path)
    return picture.ndim == 3 and picture[..., :3].reshape(-1, 3).std(axis=0).max() > 0.05


class WithAuxiliaryLogits(nn.Module):
    """Returns (its inputs as logits, auxiliary logits that would predict class 0 everywhere)."""

    def forward(self, inputs):
        return inputs, torch.zeros_like(inputs).index_fill_(1, torch.tensor([0]), 9.0)


class AuxiliaryLoss(Classification):
    def step(self, model, batch):
        logits, aux_logits = model(batch[0])
        return self.loss(logits, batch[1]) + self.loss(aux_logits, batch[1]), logits

    def outputs(self, model, batch):
        return model(batch[0])[0]


def test_the_counts_are_of_the_outputs_the_task_picks_of_a_model_with_two_outputs():
    """The figures' pass reads the outputs as evaluation does (task.outputs): a model returning (logits, aux logits),
    whose task scores the logits, is counted on its logits (a plain model(inputs) would be a tuple)."""
    predictions, labels = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 2, 1])
    batches = [(nn.functional.one_hot(predictions, 3).float(), labels)]
    shown = predicted_on(WithAuxiliaryLogits(), batches, nn.Identity(), AuxiliaryLoss(3), "fp32", CPU, num_classes=3)
    assert shown.counts.tolist() == [[1, 0, 0], [0, 1, 1], [0, 0, 1]]


def test_a_class_an_image_gives_the_confusion_counts_of_every_batch(tmp_path):
    # The "model" returns its inputs as logits, so each prediction is the argmax of a one-hot input.
    predictions, labels = torch.tensor([0, 1, 1, 2, 2, 2, 0]), torch.tensor([0, 1, 2, 2, 2, 0, 0])
    inputs = nn.functional.one_hot(predictions, 3).float()
    batches = [(inputs[:4], labels[:4]), (inputs[4:], labels[4:])]
    shown = predicted_on(nn.Identity(), batches, nn.Identity(), Classification(3), "fp32", CPU, num_classes=3)
    assert shown.masks is None
    assert shown.counts.tolist() == [[2, 0, 1], [0, 1, 0], [0, 1, 2]]  # rows: true class, columns: predicted

    written = save_figures(shown, tmp_path, class_names=["cat", "dog", "fox"])
    assert sorted(path.name for path in written) == ["confusion_matrix.json", "confusion_matrix.png"]
    assert json.loads((tmp_path / "confusion_matrix.json").read_text()) == {
        "classes": ["cat", "dog", "fox"],
        "counts": [[2, 0, 1], [0, 1, 0], [0, 1, 2]],
    }
    assert not_blank(tmp_path / "confusion_matrix.png")


class Threshold(nn.Module):
    """Class 1 where a grey image is brighter than 0.5: logits [B, 2, H, W]."""

    def forward(self, images):
        return torch.cat([images < 0.5, images >= 0.5], dim=1).float()


def test_a_class_a_pixel_gives_a_few_images_with_their_masks(tmp_path):
    images = torch.rand(6, 1, 8, 8)
    masks = (images[:, 0] >= 0.5).long()
    task = PixelClasses()
    shown = predicted_on(Threshold(), [(images, masks)], nn.Identity(), task, "fp32", CPU, num_classes=2, shown=3)
    assert shown.counts is None and [len(part) for part in shown.masks] == [3, 3, 3]
    assert torch.equal(shown.masks[0], images[:3]) and torch.equal(shown.masks[1], shown.masks[2])  # right everywhere
    assert [path.name for path in save_figures(shown, tmp_path)] == ["predictions.png"]
    assert not_blank(tmp_path / "predictions.png")


def test_a_task_that_predicts_neither_gets_no_picture(tmp_path):
    assert save_figures(Predicted(), tmp_path) == [] and not list(tmp_path.iterdir())


def test_uint8_rgb_images_and_many_classes_are_drawn(tmp_path):
    images = torch.randint(0, 256, (2, 3, 6, 6), dtype=torch.uint8)
    masks = torch.randint(0, 15, (2, 6, 6))
    assert not_blank(plot_masks(images, masks, masks.flip(-1), tmp_path / "masks.png"))
    assert np.array(imread(tmp_path / "masks.png")).shape[0] > 100


def test_the_counts_take_a_dict_batch_and_a_model_that_returns_a_tuple():
    """eval.py's figures (predicted_on) go through the task's batch contract as evaluation does: a dict batch, and
    a model that returns (logits, aux)."""
    torch.manual_seed(0)
    batches = [signals(5, seed) for seed in range(3)]
    model, task = LengthsNet(9, 10), SignalClassification(num_classes=10)
    counts = predicted_on(model, batches, nn.Identity(), task, "fp32", CPU, num_classes=10).counts
    with torch.no_grad():
        expected = sum(confusion_counts(model(b["signal"], b["lengths"]).argmax(1), b["label"], 10) for b in batches)
    assert counts is not None and torch.equal(counts, expected) and counts.sum() == 15

    images, labels = torch.rand(6, 1, 8, 8), torch.randint(0, 10, (6,))
    model, task = WithAuxiliaryOutput(1, 10, widths=(4, 8)), TwoLosses(num_classes=10)
    counts = predicted_on(model, [(images, labels)], nn.Identity(), task, "fp32", CPU, num_classes=10).counts
    with torch.no_grad():
        assert counts is not None and torch.equal(counts, confusion_counts(model(images)[0].argmax(1), labels, 10))
