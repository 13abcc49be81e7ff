"""Evaluate a trained run's checkpoint, or predict with it, exactly as the run tested itself.

    python eval.py checkpoint=outputs/runs/<time>           # its checkpoints/best.pt (else last.pt), test split
    python eval.py checkpoint=<run> split=val               # the validation split instead
    python eval.py checkpoint=<run> data.split_seed=1       # other data of the same shape
    python eval.py checkpoint=<run> precision=bf16
    python eval.py checkpoint=<run> trainer.tta_flip=true   # with its mirror  # feature: tta_flip
    python eval.py checkpoint=<run> distributed=ddp distributed.nproc_per_node=2
    python eval.py checkpoint=<run> predict=path/to/images  # each image's prediction (or one image file's)
    python eval.py checkpoint=<run> predict=path/to/texts   # token data: each .txt file's class
    python eval.py checkpoint=<run> predict=rows.csv        # other data: the files its option reads (a table's rows)
    python eval.py checkpoint=<run> prompt="'def f(n):'"    # a language model continues it  # feature: language_model
    python eval.py checkpoint=<run> predict=prompt.txt      # ... or a text file's  # feature: language_model
    python eval.py checkpoint=<run> export=<folder>         # the tested weights for others: model=hf in the Hugging
                                                            # Face format (from_pretrained), ours as safetensors + yaml

The config is the checkpoint's own (the resolved config the run trained with) with the keys this
command line sets on top, as a resume takes it; so the data split, eval transform, precision,
weights (their average where the run evaluated one) and test-time augmentation are the run's, and the numbers equal its
summary.json. The run's own keys need no + (data.max_length=32: its .hydra/overrides.yaml is
composed first); the model keeps the checkpoint's settings; of the config groups only precision=
and distributed= may be chosen (data=, model=, ...: one line). Each call writes into a new
directory, outputs/eval/<time>/: metrics.json; with predict=, predictions.csv (one class per image, or a text
file) or masks/ (one class per pixel) instead.
A picture of the predictions too: confusion_matrix.png, or predictions.png for segmentation.  # feature: eval_figures
"""

import csv
import json
import logging
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from trainkit import cli
from trainkit.checkpointing import averaged_weights, load_checkpoint, load_weights
from trainkit.checkpointing.files import find_checkpoint, read_checkpoint
from trainkit.checkpointing.overrides import config_with_overrides
from trainkit.checkpointing.resume import run_dir_of
from trainkit.config import to_dict
from trainkit.config.validation import validate
from trainkit.data import Data, build_data, make_data
from trainkit.data.class_folders import walk_files
from trainkit.data.datasets import ImageData, Tokenizer, data_class
from trainkit.data.images import image_extensions, open_image, resize_center_crop, save_png
from trainkit.distributed import ProcessInfo
from trainkit.distributed.launch import start_processes
from trainkit.errors import ConfigError
from trainkit.models import build_model
from trainkit.models.export import export_run  # feature: hf
from trainkit.models.finetune import fine_tune  # feature: finetune
from trainkit.runtime import pick_device, seed_everything
from trainkit.tasks import evaluate, evaluation_outputs
from trainkit.tasks.prompting import check_prompt, continue_text  # feature: language_model
from trainkit.tasks.task import Task
from trainkit.tasks.tta_flip import average_with_mirror  # feature: tta_flip
from trainkit.tracking import quiet_known_noise
from trainkit.tracking.evaluation_figures import save_evaluation_figures  # feature: eval_figures
from trainkit.tracking.loggers import strict_json

log = logging.getLogger("eval")
quiet_known_noise()

CHECKPOINTS = ("best.pt", "last.pt")  # in a run directory: the weights train.py tested, else the latest
SPLITS = ("test", "val")
GROUPS = ("precision", "distributed")  # the config groups an evaluation may choose; the others are the run's
_replayed: list[str] = []  # the run's own overrides, put before this command line's (with_the_runs_overrides)


def with_the_runs_overrides(argv: list[str]) -> list[str]:
    """argv with the checkpoint's run's own overrides (its .hydra/overrides.yaml) before this command line's, as a
    resume replays them: Hydra then composes the run's groups (data=textfolder, model=sequence), so an override of
    the run's own key (data.max_length=32) needs no +. Only this command line's are applied to the checkpoint's
    config (checkpoint_config). A checkpoint= that cannot be read: as it is, for checkpoint_config to report."""
    global _replayed
    _replayed = []
    if any(chosen_group(arg) for arg in argv[1:]):  # refused by checkpoint_config; no replay would compose with it
        return argv
    given = next((arg.split("=", 1)[1].strip("'\"") for arg in reversed(argv) if arg.startswith("checkpoint=")), None)
    try:
        run_dir = run_dir_of(find_checkpoint(given, key="checkpoint", names=CHECKPOINTS)) if given else None
    except (ConfigError, OSError):
        run_dir = None
    saved = run_dir / ".hydra" / "overrides.yaml" if run_dir else None
    overrides = [str(override) for override in OmegaConf.load(saved)] if saved and saved.is_file() else []
    skipped = ("hydra.", "hydra/", "resume=", "hparams_search=")  # where the run was written, continued or swept
    _replayed = [override for override in overrides if not override.lstrip("+~").startswith(skipped)]
    return [argv[0], *_replayed, *argv[1:]]


def checkpoint_config(cfg: DictConfig) -> DictConfig:
    """The checkpoint's config with this command line's overrides on top, checked in one pass.
    checkpoint= becomes the file found (a run directory's best.pt, else last.pt)."""
    if OmegaConf.is_missing(cfg, "checkpoint"):
        raise ConfigError("checkpoint", "is required; pass checkpoint=<run directory or .pt file>")
    checkpoint = find_checkpoint(cfg.checkpoint, key="checkpoint", names=CHECKPOINTS, sharded=False)
    state = read_checkpoint(checkpoint, mmap=True, key="checkpoint")  # a trainkit checkpoint, of this format
    overrides = list(HydraConfig.get().overrides.task)[len(_replayed) :]  # this command line's own
    refuse_groups(overrides)
    # The model stays the checkpoint's (its weights): data.max_length=32 cuts the texts, not the model's positions.
    when = "on top of a checkpoint's config"
    cfg = config_with_overrides(state["config"], cfg, overrides, when=when, relinked=lambda part: part != "model")
    cfg.checkpoint, cfg.resume = str(checkpoint), None  # (resume= itself is refused by cli.run)
    if cfg.split not in SPLITS:
        raise ConfigError("split", f"must be one of {', '.join(SPLITS)}, got {cfg.split!r}")
    validate(cfg)  # every error the config alone can reveal, before any data or model is built
    check_prompt(cfg)  # feature: language_model
    check_data_fits(state["config"], cfg.data.get("channels"), cfg.data.num_classes)  # null: a folder counts later
    return cfg


def chosen_group(override: str) -> str | None:
    """The config group an override chooses (data=textfolder: data), where eval.py takes none (not GROUPS)."""
    group = override.split("=", 1)[0].lstrip("+~")
    choosable = group in GROUPS or group.startswith("hydra") or "." in group
    return None if choosable or not (Path(__file__).parent / "conf" / group).is_dir() else group


def refuse_groups(overrides: list[str]) -> None:
    """A config group other than GROUPS (data=, model=, experiment=, ...) is one line: the run's config is evaluated."""
    for group in filter(None, map(chosen_group, overrides)):
        raise ConfigError(
            group,
            f"eval.py evaluates the run's own config (its checkpoint's), so {group}= cannot be chosen here; "
            f"override the run's keys one by one (e.g. data.root=<folder>, data.max_length=32), or choose "
            f"{' or '.join(f'{name}=' for name in GROUPS)}",
        )


def check_data_fits(saved: dict, channels: int | None, num_classes: int | None) -> None:
    """The checkpoint's model takes the channels and predicts the classes of the data it was trained
    on; other data must have the same (a data= or data.* override of another shape is refused here)."""
    for key, value in (("channels", channels), ("num_classes", num_classes)):
        trained = saved["data"].get(key)  # data that is not images has no channels
        if value is not None and value != trained:
            raise ConfigError(
                f"data.{key}",
                f"is {value}, but the checkpoint's model was trained on data with data.{key}={trained}; "
                f"evaluate it on data with {trained}",
            )


def predicted_class_names(cfg: DictConfig, state: dict) -> list[str]:
    """What predictions call the classes (in label order; [] for numbers): the checkpoint keeps what the run's data
    named them, so no data is read; a checkpoint from before it kept them: what the data names them now."""
    return state["class_names"] if "class_names" in state else make_data(cfg.data).class_names()


def tested_weights(state: dict) -> tuple[str, dict]:
    """("averaged", the average of the weights) where the run evaluated one in their place (the checkpoint holds
    it: Run.averaged, kept by a feature such as regularization.ema), else ("model", the trained weights)."""
    if state.get("averaged") is not None:
        return "averaged", averaged_weights(state["averaged"])
    return "model", state["model"]


def trained_model(
    cfg: DictConfig, weights: dict, image_size: int | None, device: torch.device
) -> tuple[torch.nn.Module, int | None]:
    """The run's model with `weights`, on the device, and the side length batches are resized to.
    No pretrained weights are loaded first: the checkpoint's replace them, so their file or hub
    need not be reachable here."""
    model_config = to_dict(cfg.model)
    if "pretrained" in model_config:
        model_config["pretrained"] = False
    model, input_size = build_model(model_config), image_size
    finetune = {**cfg.finetune, "pretrained_path": None}  # feature: finetune
    input_size = fine_tune(model, model_config, finetune, image_size)  # feature: finetune
    load_weights(model, weights)  # a model= override of another shape: one line naming model
    # Module.to takes a device and a memory_format together; torch's overloads list memory_format alone.
    memory_format = torch.channels_last if cfg.trainer.channels_last else torch.contiguous_format
    return model.to(device, memory_format=memory_format).eval(), input_size  # type: ignore[call-overload]


def evaluate_process(cfg: DictConfig, out_dir: Path, proc: ProcessInfo, device: torch.device) -> dict:
    """Runs in every process (one, or each DDP rank): evaluate the split, each rank its shard, as
    train.py tests. Rank 0 writes metrics.json and the picture; every rank returns the metrics."""
    seed_everything(cfg.seed + proc.rank)
    data = build_data(
        cfg.data,
        device=device,
        seed=cfg.seed,
        rank=proc.rank,
        world_size=proc.world_size,
        run_dir=run_dir_of(Path(cfg.checkpoint)),
        trains_tokenizer=False,
    )  # what it learned (a tokenizer): the run's own
    state = load_checkpoint(cfg.checkpoint, device)
    check_data_fits(state["config"], data.channels, data.num_classes)
    cfg.data.num_classes = data.num_classes  # an image folder counts its classes; model and task read this key
    weights_name, weights = tested_weights(state)
    # Not compiled even where the run was (trainer.compile): one pass over a split does not repay it.
    model, input_size = trained_model(cfg, weights, data.image_size, device)
    _, transform = data.transforms(None, input_size, cfg.trainer.channels_last, device)  # the option's, as tested
    task = instantiate(cfg.task)
    task.tokenizer = data.tokenizer
    average_with_mirror(task, cfg.trainer.tta_flip)  # feature: tta_flip
    loader = data.test if cfg.split == "test" else data.val
    limit = batch_limit(cfg)
    evaluated = (model, loader, transform, task, cfg.precision.name, device, limit)  # the figures pass it on too
    metrics = evaluate(*evaluated)
    save_evaluation_figures(*evaluated, data, out_dir, proc.is_main)  # feature: eval_figures
    results = {f"{cfg.split}/{name}": value for name, value in metrics.items() if name != "samples"}
    results |= {"samples": metrics["samples"], "weights": weights_name, "world_size": proc.world_size}
    if proc.is_main:
        (out_dir / "metrics.json").write_text(strict_json(metrics_report(cfg, results), indent=2))
    return results


def tested_model(cfg: DictConfig, device: torch.device) -> torch.nn.Module:
    """The weights the run tested in its model on `device`, at the run's own input size."""
    weights = tested_weights(load_checkpoint(cfg.checkpoint, device))[1]
    return trained_model(cfg, weights, cfg.data.get("image_size"), device)[0]


def tested_model_on_cpu(cfg: DictConfig) -> tuple[torch.nn.Module, list[str]]:
    """The weights the run tested in its model on the CPU, and what its classes are called (export=)."""
    state = load_checkpoint(cfg.checkpoint, torch.device("cpu"))
    model, _ = trained_model(cfg, tested_weights(state)[1], cfg.data.get("image_size"), torch.device("cpu"))
    return model, predicted_class_names(cfg, state)


# What eval.py may do in place of evaluating: each does its job and returns True where the command line asks for it
# (export=), else returns False.
INSTEAD: list[Callable[[DictConfig, str], bool]] = []
INSTEAD.append(lambda cfg, source: export_run(cfg, source, tested_model_on_cpu))  # feature: hf
INSTEAD.append(lambda cfg, source: continue_text(cfg, source, tested_model, runs_tokenizer))  # feature: language_model


def batch_limit(cfg: DictConfig) -> int | None:
    """The batches a process evaluates: split=val validates as the run did, with trainer.limit_val_batches
    (so its numbers are the run's best epoch's); the test split is always whole, as the run's test was."""
    return cfg.trainer.limit_val_batches if cfg.split == "val" else None


def metrics_report(cfg: DictConfig, results: dict) -> dict:
    """metrics.json: the metrics, the checkpoint, and the run's own summary.json test metrics
    beside them for comparison (null where the checkpoint is not in a run directory with one)."""
    checkpoint = Path(cfg.checkpoint).resolve()
    run_dir = run_dir_of(checkpoint)
    summary = run_dir / "summary.json" if run_dir else None
    run_test = json.loads(summary.read_text()).get("test") if summary and summary.is_file() else None
    limited = {"limit_val_batches": limit} if (limit := batch_limit(cfg)) else {}
    return {**results, "split": cfg.split, **limited, "checkpoint": str(checkpoint), "run_summary_test": run_test}


def predict_folder(cfg: DictConfig, out_dir: Path) -> tuple[Path, int]:
    """predict=<folder or image file>: every image in it (sub-folders too) read as the run's data is
    (converted to its channels, resized and centre-cropped to data.image_size), then the eval
    transform, the model and task.predict. A task that predicts a map (a mask) sees each image
    resized whole instead, not cropped, and its map is resized back to the image's own size
    (nearest), so every pixel of the image gets a class. One process: there is no split to share
    out. Returns where the predictions are and how many images they cover."""
    given = Path(cfg.predict).expanduser()
    kind = data_class(cfg.data._target_)
    if reads_texts(kind):
        return predict_texts(cfg, out_dir, given, kind.prediction_files)
    if not issubclass(kind, ImageData):
        return predict_files(cfg, out_dir, given)
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
    task, device, state, (model, input_size) = predicting(cfg, cfg.data.image_size)
    transform = data.batch_transform(None, input_size, cfg.trainer.channels_last, train=False).to(device)

    def predict(images: list[torch.Tensor]) -> dict:
        return task_predictions(model, data.prediction_batch(images), transform, task, cfg, device)

    mode, size, batch_size = ("L" if cfg.data.channels == 1 else "RGB"), cfg.data.image_size, cfg.data.eval_batch_size
    writer = PredictionWriter(out_dir, folder, files, predicted_class_names(cfg, state))
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
    if writer.maps_only:  # masks only: their PNGs are the predictions
        return out_dir / f"{next(iter(predicted))}s", len(writer.rows)
    return write_table(writer, out_dir), len(writer.rows)


def reads_texts(kind: type[Data]) -> bool:
    """Whether predict= files are texts, each one sample: token data that names the files it reads."""
    return kind.kind == "tokens" and bool(kind.prediction_files)


def predict_texts(cfg: DictConfig, out_dir: Path, given: Path, extensions: tuple[str, ...]) -> tuple[Path, int]:
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
    task, device, state, (model, _) = predicting(cfg)
    data = runs_data(cfg)
    skipped: list[Path] = []
    texts = read_or_skip(files, data.read_for_prediction, cfg, skipped)  # all, checked (as the data reads its files)
    report_skipped(given, files, skipped)
    writer = PredictionWriter(out_dir, given, list(texts), predicted_class_names(cfg, state))
    readable = list(texts.items())
    for start in range(0, len(readable), cfg.data.eval_batch_size):
        batch = dict(readable[start : start + cfg.data.eval_batch_size])
        ids = [sample for samples in batch.values() for sample in samples]  # a text is one sample
        predicted = task_predictions(model, data.prediction_batch(ids), torch.nn.Identity(), task, cfg, device)
        writer.write(predicted, list(batch), [(0, 0)] * len(batch))  # no maps: sizes are for masks
    return write_table(writer, out_dir), len(writer.rows)


def predict_files(cfg: DictConfig, out_dir: Path, given: Path) -> tuple[Path, int]:
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
    task, device, state, (model, _) = predicting(cfg)
    transform = data.batch_transform(None, None, cfg.trainer.channels_last, train=False).to(device)
    skipped: list[Path] = []
    read = read_or_skip(files, lambda path: list(data.read_for_prediction(path)), cfg, skipped)
    report_skipped(given, files, skipped)
    samples = [(path, row, sample) for path, found in read.items() for row, sample in enumerate(found)]
    if not samples:
        raise ConfigError("predict", f"the files under '{given}' hold no samples; give files with rows")
    writer = PredictionWriter(out_dir, given, list(read), predicted_class_names(cfg, state))
    for start in range(0, len(samples), cfg.data.eval_batch_size):
        part = samples[start : start + cfg.data.eval_batch_size]
        batch = data.prediction_batch([sample for _, _, sample in part])
        predicted = task_predictions(model, batch, transform, task, cfg, device)
        writer.write(predicted, [path for path, _, _ in part], [(0, 0)] * len(part), [row for _, row, _ in part])
    return write_table(writer, out_dir), len(writer.rows)


def predicting_task(cfg: DictConfig) -> Any:
    """The run's task, where it says what a prediction is (`predict(outputs)`); one line naming what to add where
    it does not."""
    task = instantiate(cfg.task)
    if getattr(type(task), "predict", Task.predict) is Task.predict:
        raise ConfigError(
            "task",
            f"{type(task).__name__} (task._target_) says not what predict= writes of a sample; give it a "
            f'predict(outputs) returning a dict of one tensor per sample, e.g. {{"class": outputs.argmax(dim=1)}}',
        )
    return task


def predicting(cfg: DictConfig, image_size: int | None = None) -> tuple[Any, torch.device, dict, tuple]:
    """What predict= predicts with: the run's task (predicting_task), the device, the checkpoint's state, and the
    tested model on the device with the side length its batches are resized to (trained_model)."""
    task = predicting_task(cfg)
    average_with_mirror(task, cfg.trainer.tta_flip)  # feature: tta_flip
    device = pick_device(cfg.device)
    state = load_checkpoint(cfg.checkpoint, device)
    return task, device, state, trained_model(cfg, tested_weights(state)[1], image_size, device)


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


def runs_tokenizer(cfg: DictConfig) -> Tokenizer | None:
    """The run's tokenizer (one it learned: the one it saved in its directory, never learned here); None: none."""
    return runs_data(cfg).learned()


def runs_data(cfg: DictConfig) -> Data:
    """The run's data option, not its data (nothing is read), with what the run learned of its training split made
    (a tokenizer: read back from its directory, never learned here)."""
    data = make_data(cfg.data)
    data.read_learned(run_dir_of(Path(cfg.checkpoint)))
    return data


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
    """One row per image of what the task predicts: a number per image (class, probability) is a
    column of the row, a map per image (a mask) a PNG in <key>s/ with the class index as pixel
    value, at the image's own size. Classes are named where the data names them (an image folder's
    class folders). A map's file is the image's path with .png for its extension, or with .png
    added where two images would share that name (a.png, a.PNG and a.jpg: a.png.png, a.PNG.png,
    a.jpg.png); a name shared even so is one line naming both, before anything is predicted."""

    def __init__(self, out_dir: Path, folder: Path, files: list[Path], class_names: list[str]):
        self.out_dir, self.folder, self.class_names = out_dir, folder, class_names
        self.map_names = distinct_map_names([path.relative_to(folder) for path in files])
        self.rows: list[dict] = []

    @property
    def maps_only(self) -> bool:
        return len(self.rows[0]) == 1

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


@hydra.main(version_base=None, config_path="conf", config_name="eval")
@cli.report_config_errors
def main(cfg: DictConfig) -> None:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    cfg = checkpoint_config(cfg)  # the checkpoint's config, this command's overrides on top
    if (out_dir / ".hydra").is_dir():  # what is evaluated, not only what was typed (hydra.output_subdir=null: none)
        OmegaConf.save(cfg, out_dir / ".hydra" / "config.yaml")
    checkpoint = Path(cfg.checkpoint)
    run_dir = run_dir_of(checkpoint)
    source = f"{checkpoint.parent.name}/{checkpoint.name} of {run_dir}" if run_dir else str(checkpoint)
    if any(job(cfg, source) for job in INSTEAD):
        return
    if cfg.predict is not None:
        written, count = predict_folder(cfg, out_dir)
        kind = data_class(cfg.data._target_)
        what = "text file" if reads_texts(kind) else "image" if issubclass(kind, ImageData) else "sample"
        log.info(f"predictions for {count} {what}{'s' if count != 1 else ''} ({source}) -> {written}")
        return
    # Here, or in the DDP processes started for this evaluation (each evaluates its shard).
    results = start_processes(cfg, out_dir, evaluate_process)
    metrics = [key for key in results if key.startswith(f"{cfg.split}/") and not key.endswith("/loss")]
    shown = " ".join(f"{key} {results[key]:.4f}" for key in [*metrics, f"{cfg.split}/loss"])
    limit = batch_limit(cfg)
    batches = f"{limit} batch{'es' if limit != 1 else ''}"
    sampled = f", a seeded sample of {batches} per process (trainer.limit_val_batches={limit})" if limit else ""
    log.info(f"{shown} on {results['samples']} samples{sampled} ({source}) -> {out_dir}")


if __name__ == "__main__":
    if {"--help", "-h"} & set(sys.argv[1:]):  # this script's usage, not train.py's
        OmegaConf.register_new_resolver("script_doc", lambda: __doc__.strip() + "\n", replace=True)
        sys.argv.append("hydra/help=eval")
    sys.argv = with_the_runs_overrides(sys.argv)
    cli.run(main, resumes=False)
