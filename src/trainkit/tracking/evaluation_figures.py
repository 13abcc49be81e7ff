"""eval.py's pictures of a model's predictions on a split, chosen by what its task predicts (`task.predict`):

    save_evaluation_figures(model, loader, transform, task, precision, device, limit, data, out_dir, is_main)
    # ^ what eval.py calls (evaluate's arguments first), on every rank: the two below
    shown = predicted_on(model, data.test, transform, task, precision, device, num_classes)
    written = save_figures(shown, out_dir, class_names)   # rank 0 alone; the paths it wrote

- one class per image (`predict(outputs)["class"]`): confusion_matrix.png, rows the true class and columns the predicted
  one, each cell's count written in it up to 20 classes; the counts themselves in confusion_matrix.json;
- one class per pixel (`["mask"]`): predictions.png, a few images of the split beside their true and predicted masks;
- anything else: no picture.

The confusion counts are summed on the device over batches and then over ranks, so each sample counts once; every rank
calls `predicted_on` (it all-reduces), rank 0 alone `save_figures`. The mask task needs only rank 0's first batch.
matplotlib is imported where a figure is drawn, without
pyplot: no display or global backend is involved. `python scripts/trim.py --drop eval_figures` removes this module and
eval.py's call of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from trainkit.data.loaders import limited
from trainkit.distributed.process_group import all_reduce_sum
from trainkit.tasks.confusion import confusion_counts
from trainkit.tasks.evaluation import evaluation_outputs
from trainkit.tasks.task import Task, first_tensor

ANNOTATED_CLASSES = 20  # above this many classes the cells are too small for their numbers


@dataclass
class Predicted:
    """What the pictures show: the confusion counts of a task with one class per image ([K, K], all
    ranks summed; None for other tasks), and a few (image, true mask, predicted mask) of one class per pixel."""

    counts: Tensor | None = None
    masks: tuple[Tensor, Tensor, Tensor] | None = None  # images [N, C, H, W] as loaded, masks [N, H, W]


def save_evaluation_figures(
    model: nn.Module,
    loader: Iterable,
    transform: Callable[[Tensor], Tensor],
    task: Task,
    precision: str,
    device: torch.device,
    limit: int | None,
    data: Any,
    out_dir: Path,
    is_main: bool,
) -> None:
    """eval.py's picture of the evaluated split, for image data alone: a second pass over its first `limit`
    batches (every rank: the confusion counts are all-reduced), then rank 0 (`is_main`) writes it into `out_dir`."""
    if data.kind != "image":
        return
    shown = predicted_on(model, limited(loader, limit), transform, task, precision, device, data.num_classes)
    if is_main:
        save_figures(shown, out_dir, data.class_names)


def predicted_on(
    model: nn.Module,
    loader: Iterable,
    transform: Callable[[Tensor], Tensor],
    task: Task,
    precision: str,
    device: torch.device,
    num_classes: int,
    shown: int = 4,
) -> Predicted:
    """One pass over `loader` with the outputs evaluation sees (trainkit.tasks.evaluation.evaluation_outputs: the
    task's batch, any structure, through its transform and outputs; a mask's picture is the batch's first tensor).
    Every rank calls it: the confusion counts are all-reduced, a zero [K, K] where the task
    predicts no class, so every rank runs the same collective whatever its shard holds."""
    model.eval()
    counts = torch.zeros(num_classes, num_classes, dtype=torch.int64, device=device)
    masks = None
    with torch.no_grad():
        for loaded in loader:
            loaded = task.to_device(loaded, device)
            batch, outputs = evaluation_outputs(model, loaded, transform, task, precision)
            predicted, targets = task.predict(outputs), task.targets(batch)
            if "mask" in predicted:  # one class per pixel: the first few images (as loaded) are the picture
                masks = (first_tensor(loaded)[:shown].cpu(), targets[:shown].cpu(), predicted["mask"][:shown].cpu())
                break
            if "class" in predicted:
                counts += confusion_counts(predicted["class"], targets, num_classes)
    counts = all_reduce_sum(counts)
    return Predicted(counts.cpu() if counts.any() else None, masks)


def save_figures(predicted: Predicted, out_dir: Path, class_names: Sequence[str] = ()) -> list[Path]:
    """The pictures `predicted` holds, written into `out_dir`; the paths written."""
    written = []
    if predicted.counts is not None:
        names = list(class_names) or [str(label) for label in range(len(predicted.counts))]
        counts_file = out_dir / "confusion_matrix.json"  # rows: true class, columns: predicted
        counts_file.write_text(json.dumps({"classes": names, "counts": predicted.counts.tolist()}))
        written += [plot_confusion_matrix(predicted.counts, names, out_dir / "confusion_matrix.png"), counts_file]
    if predicted.masks is not None:
        written.append(plot_masks(*predicted.masks, out_dir / "predictions.png"))
    return written


def plot_confusion_matrix(counts: Tensor, class_names: Sequence[str], path: Path) -> Path:
    """counts[true, predicted] as a heat map, rows true and columns predicted, each cell's count in
    it (up to ANNOTATED_CLASSES classes), the accuracy in the title."""
    from matplotlib.figure import Figure

    size = len(class_names)
    figure = Figure(figsize=(2 + 0.45 * min(size, 40), 1.5 + 0.45 * min(size, 40)), dpi=100)
    axes = figure.subplots()
    image = axes.imshow(counts.numpy(), cmap="Blues")
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    if size <= ANNOTATED_CLASSES:
        darkest = int(counts.max())
        for true, row in enumerate(counts.tolist()):
            for guess, count in enumerate(row):
                color = "white" if count > darkest / 2 else "black"  # readable on the dark cells too
                axes.text(guess, true, str(count), ha="center", va="center", fontsize=8, color=color)
        axes.set_xticks(range(size), class_names, rotation=90 if size > 10 else 0)
        axes.set_yticks(range(size), class_names)
    accuracy = counts.diagonal().sum().item() / max(counts.sum().item(), 1)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    axes.set_title(f"confusion matrix: {int(counts.sum())} samples, accuracy {accuracy:.4f}")
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path


def plot_masks(images: Tensor, masks: Tensor, predicted: Tensor, path: Path) -> Path:
    """A row per image: the image (as loaded: uint8, or float in [0, 1]), its true mask, the
    predicted mask, both masks coloured by class on one scale."""
    from matplotlib.figure import Figure

    rows, classes = len(images), int(max(masks.max(), predicted.max())) + 1
    figure = Figure(figsize=(6, 2 * rows), dpi=100)
    axes = figure.subplots(rows, 3, squeeze=False)
    pictures = images.float() / 255 if not images.is_floating_point() else images.float()
    palette = 10 if classes <= 10 else 20  # class k is the palette's k-th colour, whatever the picture holds
    colours = dict(cmap=f"tab{palette}", vmin=0, vmax=palette - 1, interpolation="nearest")
    for row in range(rows):
        picture = pictures[row].clamp(0, 1).permute(1, 2, 0).numpy()
        axes[row, 0].imshow(picture[..., 0] if picture.shape[-1] == 1 else picture, cmap="gray", vmin=0, vmax=1)
        axes[row, 1].imshow(masks[row].numpy(), **colours)
        axes[row, 2].imshow(predicted[row].numpy(), **colours)
        for axis in axes[row]:
            axis.set_axis_off()
    for axis, title in zip(axes[0], ("image", "true mask", "predicted mask")):
        axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path
