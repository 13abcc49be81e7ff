"""eval.py's `predict=<folder or file>`: the predictions of a run's tested weights for new files (images, texts, or
what a data option says it reads), written as predictions.csv, or as masks/ for a task that predicts a map. One
process; eval.py calls it from a marked line and hands it what it evaluates (`Evaluated`)."""

import csv
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from trainkit.data import Data, make_data
from trainkit.data.class_folders import walk_files
from trainkit.data.datasets import ImageData, data_class
from trainkit.data.image_files import image_extensions, open_image, resize_center_crop, save_png
from trainkit.errors import ConfigError
from trainkit.runtime import pick_device
from trainkit.tasks import evaluation_outputs
from trainkit.tasks.task import Task

log = logging.getLogger("eval")


@dataclass(frozen=True)
class Evaluated:
    """What eval.py evaluates, as predictions need it: the run's task as evaluation runs it (`task(cfg)`), its data
    option with what the run learned (`data(cfg)`: a tokenizer; nothing is read), and its tested weights in its model
    on a device (`model(cfg, device, image_size)`: the model, the side its batches are resized to, the class names)."""

    task: Callable[[DictConfig], Any]
    data: Callable[[DictConfig], Data]
    model: Callable[[DictConfig, torch.device, int | None], tuple[torch.nn.Module, int | None, list[str]]]


def predict(
    cfg: DictConfig,
    source: str,
    task: Callable[[DictConfig], Any],
    data: Callable[[DictConfig], Data],
    model: Callable[[DictConfig, torch.device, int | None], tuple[torch.nn.Module, int | None, list[str]]],
) -> bool:
    """predict=<folder or file>: each file's prediction by the weights the run tested (`source` says which), and one
    log line saying how many and where; False where predict= is not given. `task`, `data` and `model` are eval.py's
    (see Evaluated)."""
    if cfg.predict is None:
        return False
    written, count = predict_folder(cfg, Path(HydraConfig.get().runtime.output_dir), Evaluated(task, data, model))
    kind = data_class(cfg.data._target_)
    what = "text file" if reads_texts(kind) else "image" if issubclass(kind, ImageData) else "sample"
    log.info(f"predictions for {count} {what}{'s' if count != 1 else ''} ({source}) -> {written}")
    return True


def predict_folder(cfg: DictConfig, out_dir: Path, evaluated: Evaluated) -> tuple[Path, int]:
    """predict=<folder or image file>: every image in it (sub-folders too) read as the run's data is (converted to its
    channels, resized and centre-cropped to data.image_size), then the eval transform, the model and task.predict. A
    task that predicts a map (a mask) sees each image resized whole instead, not cropped, and its map is resized back to
    the image's own size (nearest), so every pixel of the image gets a class. One process: there is no split to share
    out. Returns where the predictions are and how many images they cover."""
    given = Path(cfg.predict).expanduser()
    kind = data_class(cfg.data._target_)
    if reads_texts(kind):
        return predict_texts(cfg, out_dir, given, kind.prediction_files, evaluated)
    if not issubclass(kind, ImageData):
        return predict_files(cfg, out_dir, given, evaluated)
    if given.is_file():
        if given.suffix.lower() not in image_extensions():
            raise ConfigError(
                "predict", f"'{given}' is not an image file (.png, .jpg, ...); give an image or a folder of images"
            )
        folder, files = given.parent, [given]
    elif given.is_dir():
        folder, (files, hidden, others) = given, walk_files(given, image_extensions())
        report_not_read(folder, [*hidden, *others], "images")
    else:
        raise ConfigError("predict", f"'{given}' does not exist; give an image or a folder of images")
    if not files:
        raise ConfigError("predict", f"'{folder}' holds no images (.png, .jpg, ...); give a folder of images")
    data = make_data(cfg.data)
    assert isinstance(data, ImageData), "predict_folder sends other data to predict_texts or predict_files"
    if data.image_entries and type(data).prediction_batch is ImageData.prediction_batch:
        raise ConfigError(
            "predict",
            f"reads images, but {type(data).__name__} (data._target_) makes dict batches (image_entries), whose "
            f"form predict= cannot guess; give it a prediction_batch(images) that makes one of its batches "
            f"(without targets) from a list of images (docs/data.md)",
        )
    task, device, class_names, (model, input_size) = predicting(cfg, evaluated, cfg.data.image_size)
    transform = data.batch_transform(None, input_size, cfg.trainer.channels_last, train=False).to(device)

    def predict(images: list[torch.Tensor]) -> dict:
        return task_predictions(model, data.prediction_batch(images), transform, task, cfg, device)

    mode, size, batch_size = ("L" if cfg.data.channels == 1 else "RGB"), cfg.data.image_size, cfg.data.eval_batch_size
    writer = PredictionWriter(out_dir, folder, files, class_names)
    maps = False  # known after the first batch: whether the task predicts a map an image
    skipped: list[Path] = []
    for start in range(0, len(files), batch_size):
        batch = files[start : start + batch_size]
        opened = read_or_skip(batch, lambda path: read_image(path, mode, size), cfg, skipped)
        if not opened:
            continue
        predicted = predict([resize_center_crop(image, size) for image, _ in opened.values()]) if not maps else {}
        maps = maps or any(values.dim() > 1 for values in predicted.values())
        if maps:  # the whole image, so that its map covers every pixel of it
            predicted = predict([resize_whole(image, size) for image, _ in opened.values()])
        writer.write(predicted, list(opened), [file_size for _, file_size in opened.values()])
    report_skipped(folder, files, skipped)
    if len(writer.rows[0]) == 1:  # masks only (a row names its file alone): their PNGs are the predictions
        return out_dir / f"{next(iter(predicted))}s", len(writer.rows)
    return write_table(writer, out_dir), len(writer.rows)


def reads_texts(kind: type[Data]) -> bool:
    """Whether predict= files are texts, each one sample: token data that names the files it reads."""
    return kind.kind == "tokens" and bool(kind.prediction_files)


def predict_texts(
    cfg: DictConfig, out_dir: Path, given: Path, extensions: tuple[str, ...], evaluated: Evaluated
) -> tuple[Path, int]:
    """predict=<folder or text file> for token data: every file of `extensions` in it (sub-folders too) read as the
    run's data reads a text (its read_for_prediction: its tokens, cut at data.max_length), batches padded to their
    longest; predictions.csv names each file's class (the names the checkpoint keeps: folders, packages). One
    process."""
    if given.is_dir():
        files, hidden, others = walk_files(given, extensions)
        report_not_read(given, [*hidden, *others], "text files")
    elif given.is_file():
        files, given = [given], given.parent
    else:
        named = ", ".join(extensions)
        raise ConfigError("predict", f"'{given}' does not exist; give a text file or a folder of {named} files")
    if not files:
        raise ConfigError("predict", f"'{given}' holds no text files ({', '.join(extensions)})")
    task, device, class_names, (model, _) = predicting(cfg, evaluated)
    data = evaluated.data(cfg)
    skipped: list[Path] = []
    texts = read_or_skip(files, data.read_for_prediction, cfg, skipped)  # all, checked (as the data reads its files)
    report_skipped(given, files, skipped)
    writer = PredictionWriter(out_dir, given, list(texts), class_names)
    readable = list(texts.items())
    for start in range(0, len(readable), cfg.data.eval_batch_size):
        batch = dict(readable[start : start + cfg.data.eval_batch_size])
        ids = [sample for samples in batch.values() for sample in samples]  # a text is one sample
        predicted = task_predictions(model, data.prediction_batch(ids), torch.nn.Identity(), task, cfg, device)
        writer.write(predicted, list(batch), [(0, 0)] * len(batch))  # no maps: sizes are for masks
    return write_table(writer, out_dir), len(writer.rows)


def predict_files(cfg: DictConfig, out_dir: Path, given: Path, evaluated: Evaluated) -> tuple[Path, int]:
    """predict=<folder or file> for data that is neither images nor text: the files the data option reads
    (`prediction_files`, sub-folders too), each read into samples by its `read_for_prediction` (a table: a sample a
    row), in batches of data.eval_batch_size of its own form (`prediction_batch`); predictions.csv has a row a
    sample, naming its file and its row in the file. One process. Data without `prediction_files`: one line."""
    data = make_data(cfg.data)
    extensions = type(data).prediction_files
    if not extensions:
        raise ConfigError(
            "predict",
            f"reads files as the data option says, but {type(data).__name__} (data._target_) does not say how; give "
            f"it prediction_files (the extensions read) and read_for_prediction(path) (docs/data.md), or evaluate "
            f"a split",
        )
    named = ", ".join(extensions)
    if given.is_dir():
        files, hidden, others = walk_files(given, extensions)
        report_not_read(given, [*hidden, *others], f"{named} files")
    elif given.is_file() and given.suffix.lower() in extensions:
        files, given = [given], given.parent
    else:
        what = "is not one of them" if given.is_file() else "does not exist"
        raise ConfigError("predict", f"'{given}' {what}; give a {named} file or a folder of them")
    if not files:
        raise ConfigError("predict", f"'{given}' holds no {named} files; give a folder of them")
    task, device, class_names, (model, _) = predicting(cfg, evaluated)
    transform = data.batch_transform(None, None, cfg.trainer.channels_last, train=False).to(device)
    skipped: list[Path] = []
    read = read_or_skip(files, lambda path: list(data.read_for_prediction(path)), cfg, skipped)
    report_skipped(given, files, skipped)
    samples = [(path, row, sample) for path, found in read.items() for row, sample in enumerate(found)]
    if not samples:
        raise ConfigError("predict", f"the files under '{given}' hold no samples; give files with rows")
    writer = PredictionWriter(out_dir, given, list(read), class_names)
    for start in range(0, len(samples), cfg.data.eval_batch_size):
        part = samples[start : start + cfg.data.eval_batch_size]
        batch = data.prediction_batch([sample for _, _, sample in part])
        predicted = task_predictions(model, batch, transform, task, cfg, device)
        writer.write(predicted, [path for path, _, _ in part], [(0, 0)] * len(part), [row for _, row, _ in part])
    return write_table(writer, out_dir), len(writer.rows)


def predicting(
    cfg: DictConfig, evaluated: Evaluated, image_size: int | None = None
) -> tuple[Any, torch.device, list, tuple]:
    """What predict= predicts with: the run's task, the device, what the classes are called, and the tested model on
    the device with the side length its batches are resized to. A task that does not say what a prediction is
    (`predict(outputs)`) is one line naming what to add."""
    task = evaluated.task(cfg)
    if getattr(type(task), "predict", Task.predict) is Task.predict:
        raise ConfigError(
            "task",
            f"{type(task).__name__} (task._target_) says not what predict= writes of a sample; give it a "
            f'predict(outputs) returning a dict of one tensor per sample, e.g. {{"class": outputs.argmax(dim=1)}}',
        )
    device = pick_device(cfg.device)
    model, input_size, class_names = evaluated.model(cfg, device, image_size)
    return task, device, class_names, (model, input_size)


def task_predictions(
    model: torch.nn.Module, batch: tuple, transform: Callable, task: Any, cfg: DictConfig, device: torch.device
) -> dict:
    """What the task predicts for a batch read from predict= files, (inputs, None: no targets), as evaluation sees
    a test batch (evaluation_outputs: the task's transform and outputs, precision, test-time augmentation), so a
    model of several inputs or outputs predicts as its task scores it."""
    with torch.no_grad():
        batch = Task.to_device(task, batch, device)  # the base move: a task's own may need the targets it lacks
        _, outputs = evaluation_outputs(model, batch, transform, task, cfg.precision.name)
    return task.predict(outputs)


def read_or_skip(paths: list[Path], read: Callable[[Path], Any], cfg: DictConfig, skipped: list) -> dict[Path, Any]:
    """{path: what `read` makes of it} for each predict= file; one it cannot read is one line naming it, or, with
    data.skip_bad_files=true (the run's, or this command line's), left out and added to `skipped`."""
    read_files = {}
    for path in paths:
        try:
            read_files[path] = read(path)
        except Exception as error:  # whatever reading the file raises (Pillow's errors, UnicodeDecodeError) is its
            if not cfg.data.get("skip_bad_files", False):
                switch = ", or pass data.skip_bad_files=true to skip it" if "skip_bad_files" in cfg.data else ""
                reason = f"{type(error).__name__}: {error}"
                raise ConfigError("predict", f"cannot read '{path}' ({reason}); fix or remove it{switch}") from error
            skipped.append(path)
    return read_files


def report_not_read(folder: Path, not_read: list[Path], what: str) -> None:
    """One log line counting and naming what a predict= folder holds that is not read: hidden entries (a hidden
    folder once) and those that are not `what` (imagefolder.walk_files, the rule that lists the others)."""
    if not_read:
        log.info(
            f"'{folder}': {len(not_read)} file(s) not read (hidden, or not {what}): {named(sorted(not_read), folder)}"
        )


def report_skipped(folder: Path, files: list[Path], skipped: list[Path]) -> None:
    """One warning line for the files data.skip_bad_files=true left out; a refusal when no file was left."""
    if skipped and len(skipped) == len(files):
        raise ConfigError("predict", f"none of the {len(files)} file(s) under '{folder}' could be read")
    if skipped:
        log.warning(f"skipped {len(skipped)} unreadable file(s) (data.skip_bad_files=true): {named(skipped, folder)}")


def named(paths: list[Path], folder: Path, shown: int = 5) -> str:
    """The first `shown` paths, relative to `folder`, and how many more."""
    names = ", ".join(str(path.relative_to(folder)) for path in paths[:shown])
    return names + (f" and {len(paths) - shown} more" if len(paths) > shown else "")


def write_table(writer: "PredictionWriter", out_dir: Path) -> Path:
    table = out_dir / "predictions.csv"
    with table.open("w", newline="") as f:
        csv_writer = csv.DictWriter(f, fieldnames=list(writer.rows[0]))
        csv_writer.writeheader()
        csv_writer.writerows(writer.rows)
    return table


class PredictionWriter:
    """One row per image of what the task predicts: a number per image (class, probability) is a column of the row, a
    map per image (a mask) a PNG in <key>s/ with the class index as pixel value, at the image's own size. Classes are
    named where the data names them (an image folder's class folders). A map's file is the image's path with .png for
    its extension, or with .png added where two images would share that name (a.png, a.PNG and a.jpg: a.png.png,
    a.PNG.png, a.jpg.png); a name shared even so is one line naming both, before anything is predicted."""

    def __init__(self, out_dir: Path, folder: Path, files: list[Path], class_names: list[str]):
        self.out_dir, self.folder, self.class_names = out_dir, folder, class_names
        self.map_names = distinct_map_names([path.relative_to(folder) for path in files])
        self.rows: list[dict] = []

    def write(
        self, predicted: dict, files: list[Path], image_sizes: list[tuple[int, int]], rows: list[int] | None = None
    ) -> None:
        """`rows`: each sample's row in its file (a table's), a column of its own; None: one sample per file."""
        for i, (path, (width, height)) in enumerate(zip(files, image_sizes, strict=True)):
            name = path.relative_to(self.folder)
            row: dict = {"file": str(name)} | ({"row": rows[i]} if rows is not None else {})
            for key, values in predicted.items():
                value = values[i].cpu()
                if value.dim() == 2:
                    mask = resize_map(value.to(torch.uint8), height, width)
                    save_png(mask.numpy(), self.out_dir / f"{key}s" / self.map_names[name])
                elif value.dim() == 1:  # a vector per sample (scores, several numbers)
                    row[key] = " ".join(f"{number:g}" for number in value.tolist())
                elif value.dim() > 2:
                    shape = list(value.shape)
                    raise ConfigError(
                        "task", f"predict() gives {key} of {shape} a sample; give a number, vector or map"
                    )
                elif key == "class" and self.class_names:
                    row[key] = self.class_names[int(value)]
                else:
                    row[key] = value.item()
            self.rows.append(row)


def distinct_map_names(files: list[Path]) -> dict[Path, Path]:
    """Each image's map file name (see PredictionWriter)."""
    plain = {name: name.with_suffix(".png") for name in files}
    sharing = Counter(plain.values())
    names = {name: name.with_name(name.name + ".png") if sharing[plain[name]] > 1 else plain[name] for name in files}
    seen: dict[Path, Path] = {}
    for name, map_name in names.items():
        if (other := seen.setdefault(map_name, name)) != name:
            raise ConfigError(
                "predict", f"'{other}' and '{name}' would both be written as {map_name}; rename one of them"
            )
    return names


def resize_map(values: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """A class map [h, w] at another size, nearest neighbour (classes are not averaged)."""
    if tuple(values.shape) == (height, width):
        return values
    resized = torch.nn.functional.interpolate(values[None, None].float(), size=(height, width), mode="nearest")
    return resized[0, 0].to(values.dtype)


def read_image(path: Path, mode: str, size: int) -> tuple[Any, tuple[int, int]]:
    """The image in `mode` as trainkit.data.imagefolder opens a training image (a PIL image; a JPEG
    may be decoded at a reduced scale still at least `size`), and the file's own (width, height). Raises what Pillow
    raises for a file it cannot read (read_or_skip reports it)."""
    from PIL import Image

    with Image.open(path) as file:
        file_size = file.size
    return open_image(str(path), mode, size), file_size


def resize_whole(image: Any, size: int) -> torch.Tensor:
    """uint8 [C, size, size]: the whole image resized (its aspect ratio not kept), nothing cropped."""
    from PIL import Image

    pixels = np.array(image.resize((size, size), Image.Resampling.BILINEAR))
    return torch.from_numpy(pixels).unsqueeze(0) if pixels.ndim == 2 else torch.from_numpy(pixels).permute(2, 0, 1)
