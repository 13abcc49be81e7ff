"""Tasks the tests select with task._target_=tasks_for_tests.<Name>."""

import torch
import torch.nn.functional as F
from torch import Tensor

from trainkit.tasks.classification import Classification
from trainkit.tasks.task import Task


class TenfoldLoss(Classification):
    """Classification trained on ten times its cross-entropy: a loss no built-in task has, so a tool
    that trains on the task's loss is told apart from one that hard-codes cross-entropy."""

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return 10 * super().loss(outputs, targets)


class Regression(Task):
    """The README's regression (one number per sample, mean squared error, mean absolute error), on float
    targets as the data gives them: a task that weighs samples and does not mix batches."""

    metric_names = ("mae",)
    minimized_metrics = ("mae",)
    headline_metric = "mae"

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return self.evaluation_loss(outputs, targets).mean()

    def evaluation_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.mse_loss(outputs.float().squeeze(1), targets, reduction="none")

    def empty_metric_sums(self, device: torch.device) -> Tensor:
        return torch.zeros(2, device=device)

    def metric_sums(self, outputs: Tensor, targets: Tensor) -> Tensor:
        errors = (outputs.float().squeeze(1) - targets).abs()
        return torch.stack([errors.sum(), errors.new_full((), errors.numel())])

    def metrics(self, sums: Tensor) -> dict[str, float]:
        error, count = sums.tolist()
        return {"mae": error / max(count, 1)}

    def predict(self, outputs: Tensor) -> dict[str, Tensor]:
        return {"value": outputs.float().squeeze(1)}


class TokenTagging(Task):
    """A class a token: inputs [B, T] padded token ids, targets [B, T] with -100 where there is padding;
    weighed by real tokens (the loss is their mean), as a language model is."""

    metric_names = ("acc",)
    headline_metric = "acc"
    weighs = "tokens"

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs.flatten(0, 1), targets.flatten(), ignore_index=-100)

    def evaluation_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        real = targets.flatten() != -100
        return F.cross_entropy(outputs.float().flatten(0, 1)[real], targets.flatten()[real], reduction="none")

    def empty_metric_sums(self, device: torch.device) -> Tensor:
        return torch.zeros(2, device=device)

    def metric_sums(self, outputs: Tensor, targets: Tensor) -> Tensor:
        real = targets != -100
        right = ((outputs.argmax(dim=-1) == targets) & real).sum()
        return torch.stack([right, real.sum()]).float()

    def metrics(self, sums: Tensor) -> dict[str, float]:
        right, count = sums.tolist()
        return {"acc": right / max(count, 1)}

    def predict(self, outputs: Tensor) -> dict[str, Tensor]:
        return {"class": outputs.argmax(dim=-1)}


class SignalClassification(Classification):
    """Classification of dict batches, {"signal": [B, T] zero-padded, "lengths": [B], "label": [B]}
    (file_data_for_tests.DigitSignals): the model takes the signal and its lengths (models_for_tests.LengthsNet).
    What a dict batch needs of a task: where the data's transform goes, what the model is given (outputs: the default
    step trains on them), what the outputs are scored against."""

    def transform(self, batch: dict, transform) -> dict:
        return {**batch, "signal": transform(batch["signal"])}

    def augment(self, batch: dict) -> dict:
        return batch  # nothing to mix

    def outputs(self, model, batch: dict) -> Tensor:
        return model(batch["signal"], batch["lengths"])  # step: the loss of these against targets(batch)

    def targets(self, batch: dict) -> Tensor:
        return batch["label"]


class AuxiliaryLoss(Classification):
    """Classification of a model that returns (logits, aux) (models_for_tests.WithAuxiliaryOutput): trains on
    cross-entropy + aux_weight x aux; the metrics, val/loss and predictions score the logits alone."""

    def __init__(self, *args, aux_weight: float = 0.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.aux_weight = aux_weight

    def step(self, model, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        inputs, targets = batch
        logits, aux = model(inputs)
        return self.loss(logits.float(), targets) + self.aux_weight * aux, logits

    def outputs(self, model, batch: tuple[Tensor, Tensor]) -> Tensor:
        return model(batch[0])[0]  # evaluation and predictions: the logits


class CaptionedClassification(Classification):
    """Classification of image + text dict batches, {"image", "caption", "targets"}
    (file_data_for_tests.CaptionedDigits, models_for_tests.ImageAndCaption): the defaults train and score it (the
    model takes the entries by name); the trackers show its images."""

    def shown_images(self, batch: dict) -> Tensor:
        return batch["image"]


class InBatchContrastive(Classification):
    """Classification plus a contrastive term over the batch (each sample's outputs against every other sample's):
    a loss that couples the samples of a batch, as its class says (couples_batch), each rank's batch alone."""

    couples_batch = True

    def step(self, model, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        inputs, targets = batch
        outputs = model(inputs).float()
        similarity = F.normalize(outputs, dim=1) @ F.normalize(outputs, dim=1).T
        same = torch.arange(len(outputs), device=outputs.device)
        return self.loss(outputs, targets) + F.cross_entropy(similarity, same), outputs


class PixelClasses(Task):
    """Predicts one class per pixel from [B, K, H, W] logits, as a segmentation does: what eval.py's pictures and the
    trackers' pictures of class maps need of a task, without the segmentation capability. It declares one target per
    pixel (`spatial_targets`), so the config check holds it to what moves the image with its targets."""

    spatial_targets = True

    def __init__(self, class_names=(), **settings):
        self.class_names = list(class_names or ())

    def predict(self, outputs):
        return {"mask": outputs.argmax(dim=1)}

    def pictures_for_logging(self, batch, outputs, shown):
        """Images [N, 1, 8, 8] in [0, 1] drawn 16 times larger as uint8 RGB, their true and predicted maps alike."""

        def grown(tensor):
            return tensor.repeat_interleave(16, -2).repeat_interleave(16, -1)

        pictures = grown((shown[0] * 255).round().to(torch.uint8).expand(-1, 3, -1, -1)).permute(0, 2, 3, 1)
        return pictures.contiguous(), grown(shown[1]), grown(self.predict(outputs)["mask"]), self.class_names
