"""Flip test-time augmentation (trainer.tta_flip, trainkit.tasks.tta_flip): evaluation averages the model's outputs
for each image with those for its mirror, unmirrored by the task; its config checks live beside it."""

import pytest
import torch
import torch.nn.functional as F

from conftest import composed
from data_for_tests import signals
from helpers import record_run
from models_for_tests import LengthsNet
from tasks_for_tests import SignalClassification
from trainkit.config.rules import RULES
from trainkit.config.schema import find_problems
from trainkit.config.validation import RELATIONS, fill_task_defaults, problems
from trainkit.errors import ConfigError
from trainkit.tasks.classification import Classification
from trainkit.tasks.evaluation import evaluate
from trainkit.tasks.task import Task
from trainkit.tasks.tta_flip import average_with_mirror, with_mirror

CPU = torch.device("cpu")


def flipping(task):
    average_with_mirror(task, True)
    return task


def test_evaluate_averages_each_image_s_outputs_with_its_mirror_s_and_counts_every_sample_once():
    images = torch.tensor([1.0, 0.0]).view(1, 1, 1, 2).repeat(5, 1, 1, 1)  # flattened, class 0; mirrored, class 1
    labels = torch.zeros(5, dtype=torch.long)
    loader = [(images[:3], labels[:3]), (images[3:], labels[3:])]
    off = Classification(num_classes=2)
    average_with_mirror(off, False)  # off: the model alone
    plain = evaluate(torch.nn.Flatten(), loader, lambda x: x, off, "fp32", CPU)
    tta = evaluate(torch.nn.Flatten(), loader, lambda x: x, flipping(Classification(num_classes=2)), "fp32", CPU)
    assert plain["loss"] == pytest.approx(F.cross_entropy(torch.tensor([[1.0, 0.0]]), torch.tensor([0])).item())
    assert tta["samples"] == 5
    assert tta["loss"] == pytest.approx(F.cross_entropy(torch.tensor([[0.5, 0.5]]), torch.tensor([0])).item())


class TwoViewsDictOutput(torch.nn.Module):
    """Two image batches in, a dict out ({"logits", "embedding"}): what trainer.tta_flip averages leaf by leaf."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2 * 64, 10)

    def forward(self, first, second):
        features = torch.cat([first.flatten(1), 2 * second.flatten(1)], dim=1)  # not symmetric in its mirror
        return {"logits": self.linear(features), "embedding": features[:, :3]}


class TwoViewsOfLogits(Classification):
    """Gives the model each image twice (two views, as docs/recipes.md's two-view task) and scores its "logits"."""

    def transform(self, batch, transform):
        images, targets = batch
        return (transform(images), transform(images)), targets

    def outputs(self, model, batch):
        (first, second), _ = batch
        return model(first, second)["logits"]


def test_a_two_input_model_s_dict_of_outputs_is_averaged_with_its_mirror_s():
    torch.manual_seed(0)
    images, labels = torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,))
    model, task = TwoViewsDictOutput(), TwoViewsOfLogits(num_classes=10)
    plain = evaluate(model, [(images, labels)], torch.nn.Identity(), task, "fp32", CPU)
    flipped = evaluate(model, [(images, labels)], torch.nn.Identity(), flipping(task), "fp32", CPU)
    with torch.no_grad():
        logits = (model(images, images)["logits"] + model(images.flip(-1), images.flip(-1))["logits"]) / 2
        averaged = with_mirror(model, task)(images, images)  # every output, leaf by leaf
    assert flipped["loss"] == pytest.approx(F.cross_entropy(logits, labels).item(), abs=1e-6)
    assert flipped["acc"] == (logits.argmax(dim=1) == labels).float().mean().item()
    assert plain["loss"] != pytest.approx(flipped["loss"])  # the mirror counted
    torch.testing.assert_close(averaged["logits"], logits)
    first_pixels = (images.flatten(1)[:, :3] + images.flip(-1).flatten(1)[:, :3]) / 2
    torch.testing.assert_close(averaged["embedding"], first_pixels)


class ClassMaps(Task):
    """Predicts a class map and flips it back, as a segmentation does (test_segmentation_task.py checks its own)."""

    def mirror_outputs(self, outputs):
        return outputs.flip(-1)


def test_a_class_map_is_mirrored_back_before_it_is_averaged():
    torch.manual_seed(0)
    model = torch.nn.Conv2d(3, 4, kernel_size=3, padding=1)  # a map of 4 classes, not symmetric in its mirror
    images, task = torch.rand(2, 3, 6, 6), ClassMaps()
    with torch.no_grad():
        outputs, mirrored = (with_mirror(model, task)(batch) for batch in (images, images.flip(-1)))
        expected = (model(images) + model(images.flip(-1)).flip(-1)) / 2
    torch.testing.assert_close(outputs, expected)
    torch.testing.assert_close(mirrored, outputs.flip(-1))  # a mirrored image gets the mirrored map


def test_outputs_without_a_mean_and_a_batch_without_images_are_refused_in_one_line():
    images = torch.rand(4, 1, 8, 8)
    class_ids = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    with pytest.raises(ConfigError, match=r"^trainer\.tta_flip: .*torch\.int64, which has no mean"):
        with_mirror(lambda x: class_ids(x).argmax(dim=1), Classification(num_classes=10))(images)
    with pytest.raises(ConfigError, match=r"^trainer\.tta_flip: mirrors image batches .* given none"):
        task = flipping(SignalClassification(num_classes=10))
        evaluate(LengthsNet(9, 10), [signals(4)], torch.nn.Identity(), task, "fp32", CPU)


# A short run, as tests/e2e/test_wiring.py's, on digits said to be mirror-safe (they are not: the check would refuse
# tta_flip) and one evaluation batch for each of val and test.
SHORT_RUN = (
    *("device=cpu", "print_config=false", "data.batch_size=8", "data.eval_batch_size=512", "model.widths=[8,16]"),
    *("trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1"),
    *("regularization=none", "scheduler=constant", "data.mirror_changes_label=false"),
)


def test_a_run_evaluates_each_batch_and_its_mirror_in_validation_and_test(tmp_path, monkeypatch):
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "trainer.tta_flip=true")
    evaluation = recording.eval_forwards()
    assert len(evaluation) == 4  # one validation batch, one test batch: each with its mirror
    for plain, mirrored in zip(evaluation[::2], evaluation[1::2], strict=True):
        assert torch.equal(mirrored.inputs, plain.inputs.flip(-1))
    (tmp_path / "off").mkdir()
    assert len(record_run(tmp_path / "off", monkeypatch, *SHORT_RUN).eval_forwards()) == 2  # without: the batches


TABLE = [  # the digits as a table (tests/data_for_tests.py): data that is not images, without their keys
    "data._target_=data_for_tests.DigitsTable",
    *(f"~data.{key}" for key in ("channels", "image_size", "mean", "std", "mirror_changes_label")),
    "model.in_channels=64",
]


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.tta_flip=1"],  # a flag
        ["trainer.tta_flip=true"],  # the digits: a mirrored 2 is not a 2
        [*TABLE, "trainer.tta_flip=true"],  # not images
    ],
)
def test_its_config_checks_are_its_own_and_one_line_naming_the_key(overrides):
    cfg = composed(*overrides)
    fill_task_defaults(cfg)
    assert "trainer.tta_flip" not in find_problems(cfg, RULES, RELATIONS)  # no check in trainkit.config finds it
    assert list(problems(cfg)) == ["trainer.tta_flip"]
