"""trainkit.tasks.classification and the Task contract's helpers: what the loop asks of a task."""

import pytest
import torch
import torch.nn.functional as F

from trainkit.tasks import Task, evaluate
from trainkit.tasks.classification import Classification
from trainkit.tasks.task import higher_is_better, metric_names_of

LOGITS = torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 2.0], [2.0, 0.0, 0.0]])
LABELS = torch.tensor([0, 1, 0, 0])  # three of four right


def test_the_training_loss_smooths_labels_and_evaluation_does_not():
    task = Classification(num_classes=3, label_smoothing=0.2)
    assert task.loss(LOGITS, LABELS) == pytest.approx(F.cross_entropy(LOGITS, LABELS, label_smoothing=0.2).item())
    per_sample = task.evaluation_loss(LOGITS, LABELS)
    assert per_sample.shape == (4,) and torch.allclose(per_sample, F.cross_entropy(LOGITS, LABELS, reduction="none"))


def test_accuracy_is_summed_then_divided_and_soft_targets_count_their_larger_share():
    task = Classification(num_classes=3)
    sums = task.metric_sums(LOGITS, LABELS) + task.metric_sums(LOGITS[:1], LABELS[:1])
    assert task.metrics(sums) == {"acc": 4 / 5}  # (3 + 1) / (4 + 1): samples weigh, batches do not
    soft = F.one_hot(LABELS, 3).float() * 0.7 + F.one_hot(torch.tensor([1, 0, 2, 1]), 3).float() * 0.3
    assert task.metrics(task.metric_sums(LOGITS, soft)) == {"acc": 3 / 4}  # the 0.7 share is the label
    assert torch.equal(task.empty_metric_sums(torch.device("cpu")), torch.zeros(2))


def test_predictions_are_a_class_and_its_probability():
    predicted = Classification(num_classes=3).predict(LOGITS)
    assert predicted["class"].tolist() == [0, 1, 2, 0]
    assert torch.allclose(predicted["probability"], LOGITS.softmax(dim=1).max(dim=1).values)


def test_metric_names_and_directions_come_from_the_task_class():
    assert metric_names_of(Classification) == ("loss", "acc")
    assert higher_is_better(Classification, "val/acc") and not higher_is_better(Classification, "test/loss")

    class Regression(Task):
        metric_names = ("mae",)
        minimized_metrics = ("mae",)

    assert not higher_is_better(Regression, "val/mae")


def test_evaluate_counts_every_sample_once():
    class Fixed(torch.nn.Module):  # logits that depend on whether the image was mirrored
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return torch.stack([images[:, 0, 0, 0], images[:, 0, 0, -1]], dim=1)

    images = torch.zeros(5, 1, 2, 2)
    images[:, 0, 0, 0] = 1.0  # left pixel on: class 0; mirrored, class 1
    labels = torch.zeros(5, dtype=torch.long)
    loader = [(images[:3], labels[:3]), (images[3:], labels[3:])]
    task, cpu = Classification(num_classes=2), torch.device("cpu")
    plain = evaluate(Fixed(), loader, lambda x: x, task, "fp32", cpu)
    assert plain["samples"] == 5 and plain["acc"] == 1.0
    assert plain["loss"] == pytest.approx(F.cross_entropy(torch.tensor([[1.0, 0.0]]), torch.tensor([0])).item())


def test_float_targets_a_sample_are_refused_in_one_line_naming_the_task_they_suit():
    from trainkit.errors import ConfigError

    task = Classification(num_classes=3)
    outputs, numbers = torch.zeros(4, 3), torch.tensor([0.5, 1.25, 2.0, 3.5])
    for loss in (task.loss, task.evaluation_loss):
        with pytest.raises(ConfigError, match=r"targets are float32 numbers: they suit a regression task") as error:
            loss(outputs, numbers)
        assert error.value.key == "task._target_" and "\n" not in str(error.value)
    soft = torch.full((4, 3), 1 / 3)  # MixUp's shares: a distribution over the classes, taken as it is
    assert torch.isfinite(task.loss(outputs, soft))


@pytest.mark.parametrize("name", ["loss", "acc", "grad_norm"])
def test_a_recorded_value_may_not_take_a_name_the_loop_logs(name):
    task = Classification(num_classes=2)
    with pytest.raises(
        ValueError, match=rf"Classification.record\('{name}'\): train/{name} is logged already; pick another name"
    ):
        task.record(name, torch.tensor(1.0))
    task.record("aux_loss", torch.tensor(1.0))
    assert task.take_recorded() == {"aux_loss": torch.tensor(1.0)}
