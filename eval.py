"""Evaluate a trained run's checkpoint, or predict with it, exactly as the run tested itself.

    python eval.py checkpoint=outputs/runs/<time>           # its checkpoints/best.pt (else last.pt), test split
    python eval.py checkpoint=<run> split=val               # the validation split instead
    python eval.py checkpoint=<run> data.split_seed=1       # other data of the same shape
    python eval.py checkpoint=<run> precision=bf16
    python eval.py checkpoint=<run> trainer.tta_flip=true   # with its mirror  # feature: tta_flip
    torchrun --standalone --nproc_per_node=2 eval.py checkpoint=<run> distributed=ddp   # in 2 processes
    python eval.py checkpoint=<run> predict=path/to/images  # each image's prediction (or a file's)  # feature: predict
    python eval.py checkpoint=<run> predict=path/to/texts   # token data: each .txt file's class  # feature: predict
    python eval.py checkpoint=<run> predict=rows.csv        # other data: the files its option reads  # feature: predict
    python eval.py checkpoint=<run> prompt="'def f(n):'"    # a language model continues it  # feature: language_model
    python eval.py checkpoint=<run> predict=prompt.txt      # ... or a text file's  # feature: language_model
    python eval.py checkpoint=<run> export=<folder>         # the tested weights for others  # feature: hf

The config is the checkpoint's own (the resolved config the run trained with) with the keys this command line sets on
top, as a resume takes it; so the data split, eval transform, precision, weights (their average where the run evaluated
one) and test-time augmentation are the run's, and the numbers equal its summary.json. The run's own keys need no +
(data.max_length=32: its .hydra/overrides.yaml is composed first); the model keeps the checkpoint's settings; of the
config groups only precision= and distributed= may be chosen (data=, model=, ...: one line). It evaluates in one process
unless the command line names distributed (or torchrun started several). Each call writes into a new directory,
outputs/eval/<time>/: metrics.json.
predict= writes predictions.csv (one class per image or text file) or masks/ (a class per pixel).  # feature: predict
A picture of the predictions too: confusion_matrix.png, or predictions.png for segmentation.  # feature: eval_figures
export= writes model=hf's in the Hugging Face format (from_pretrained), ours as safetensors + yaml.  # feature: hf
"""

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import hydra
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
from trainkit.distributed import ProcessInfo
from trainkit.distributed.launch import start_processes
from trainkit.distributed.process_group import launched_externally
from trainkit.errors import ConfigError
from trainkit.models import build_model
from trainkit.models.export import export_run  # feature: hf
from trainkit.models.finetune import fine_tune  # feature: finetune
from trainkit.prediction import predict  # feature: predict
from trainkit.runtime import seed_everything
from trainkit.tasks import evaluate
from trainkit.tasks.prompting import check_prompt, continue_text  # feature: language_model
from trainkit.tasks.task import Task
from trainkit.tasks.tta_flip import average_with_mirror  # feature: tta_flip
from trainkit.tracking.evaluation_figures import save_evaluation_figures  # feature: eval_figures
from trainkit.tracking.loggers import strict_json

log = logging.getLogger("eval")

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
    for group in filter(None, map(chosen_group, overrides)):  # data=, model=, ...: the run's config is evaluated
        raise ConfigError(
            group,
            f"eval.py evaluates the run's own config (its checkpoint's), so {group}= cannot be chosen here; "
            f"override the run's keys one by one (e.g. data.root=<folder>, data.max_length=32), or choose "
            f"{' or '.join(f'{name}=' for name in GROUPS)}",
        )
    # The model stays the checkpoint's (its weights): data.max_length=32 cuts the texts, not the model's positions.
    when = "on top of a checkpoint's config"
    cfg = config_with_overrides(state["config"], cfg, overrides, when=when, relinked=lambda part: part != "model")
    cfg.checkpoint, cfg.resume = str(checkpoint), None  # (resume= itself is refused by cli.run)
    if not launched_externally() and not any(override.lstrip("+~").startswith("distributed") for override in overrides):
        cfg.distributed = OmegaConf.load(Path(__file__).parent / "conf" / "distributed" / "none.yaml")  # one process
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


def tested_weights(state: dict) -> tuple[str, dict]:
    """("averaged", the average of the weights) where the run evaluated one in their place (the checkpoint holds
    it: Run.averaged, kept by a feature such as regularization.ema), else ("model", the trained weights)."""
    if state.get("averaged") is not None:
        return "averaged", averaged_weights(state["averaged"])
    return "model", state["model"]


def evaluate_process(cfg: DictConfig, out_dir: Path, proc: ProcessInfo, device: torch.device) -> dict:
    """Runs in every process (one, or each DDP rank): evaluate the split, each rank its shard, as
    train.py tests. Rank 0 writes metrics.json and the picture; every rank returns the metrics."""
    seed_everything(cfg.seed + proc.rank)
    checkpoint = Path(cfg.checkpoint).resolve()
    run_dir = run_dir_of(checkpoint)
    data = build_data(
        cfg.data,
        device=device,
        seed=cfg.seed,
        rank=proc.rank,
        world_size=proc.world_size,
        run_dir=run_dir,
        trains_tokenizer=False,
    )  # what it learned (a tokenizer): the run's own
    state = load_checkpoint(cfg.checkpoint, device)
    check_data_fits(state["config"], data.channels, data.num_classes)
    cfg.data.num_classes = data.num_classes  # an image folder counts its classes; model and task read this key
    # Not compiled even where the run was (trainer.compile): one pass over a split does not repay it.
    model, input_size, _ = tested_model_on(cfg, device, data.image_size, state)
    _, transform = data.transforms(None, input_size, cfg.trainer.channels_last, device)  # the option's, as tested
    task = tested_task(cfg)
    task.tokenizer = data.tokenizer
    loader = data.test if cfg.split == "test" else data.val
    limit = batch_limit(cfg)
    evaluated = (model, loader, transform, task, cfg.precision.name, device, limit)  # the figures pass it on too
    metrics = evaluate(*evaluated)
    save_evaluation_figures(*evaluated, data, out_dir, proc.is_main)  # feature: eval_figures
    results = {f"{cfg.split}/{name}": value for name, value in metrics.items() if name != "samples"}
    results |= {"samples": metrics["samples"], "weights": tested_weights(state)[0], "world_size": proc.world_size}
    if proc.is_main:  # metrics.json: beside the metrics, the run's own summary.json test metrics (null: none found)
        summary = run_dir / "summary.json" if run_dir else None
        run_test = json.loads(summary.read_text()).get("test") if summary and summary.is_file() else None
        limited = {"limit_val_batches": limit} if limit else {}
        report = {**results, "split": cfg.split, **limited, "checkpoint": str(checkpoint), "run_summary_test": run_test}
        (out_dir / "metrics.json").write_text(strict_json(report, indent=2))
    return results


def tested_task(cfg: DictConfig) -> Task:
    """The run's task, evaluating as the run did (averaged with its mirror where trainer.tta_flip is set)."""
    task = instantiate(cfg.task)
    average_with_mirror(task, cfg.trainer.tta_flip)  # feature: tta_flip
    return task


def tested_model_on(
    cfg: DictConfig, device: torch.device, image_size: int | None, state: dict | None = None
) -> tuple[torch.nn.Module, int | None, list[str]]:
    """The weights the run tested in its model on `device`, the side length batches are resized to, and the class
    names in label order: the checkpoint's ([] for numbers; no data is read), the data's for a checkpoint without.
    `state`: the checkpoint, where the caller has read it. No pretrained weights are loaded first: the checkpoint's
    replace them, so their file or hub need not be reachable here."""
    state = load_checkpoint(cfg.checkpoint, device) if state is None else state
    model_config = to_dict(cfg.model)
    if "pretrained" in model_config:
        model_config["pretrained"] = False
    model, input_size = build_model(model_config), image_size
    finetune = {**cfg.finetune, "pretrained_path": None}  # feature: finetune
    input_size = fine_tune(model, model_config, finetune, image_size)  # feature: finetune
    load_weights(model, tested_weights(state)[1])  # a model= override of another shape: one line naming model
    # Module.to takes a device and a memory_format together; torch's overloads list memory_format alone.
    memory_format = torch.channels_last if cfg.trainer.channels_last else torch.contiguous_format
    model = model.to(device, memory_format=memory_format).eval()  # type: ignore[call-overload]
    return model, input_size, state["class_names"] if "class_names" in state else make_data(cfg.data).class_names()


# What eval.py may do in place of evaluating (a row's, from its marked line): each returns True where it did its job.
INSTEAD: list[Callable[[DictConfig, str], bool]] = []
INSTEAD.append(lambda cfg, source: export_run(cfg, source, tested_model_on))  # feature: hf
INSTEAD.append(lambda cfg, source: continue_text(cfg, source, tested_model_on, runs_data))  # feature: language_model
INSTEAD.append(lambda cfg, source: predict(cfg, source, tested_task, runs_data, tested_model_on))  # feature: predict


def batch_limit(cfg: DictConfig) -> int | None:
    """The batches a process evaluates: split=val validates as the run did, with trainer.limit_val_batches
    (so its numbers are the run's best epoch's); the test split is always whole, as the run's test was."""
    return cfg.trainer.limit_val_batches if cfg.split == "val" else None


def runs_data(cfg: DictConfig) -> Data:
    """The run's data option, not its data (nothing is read), with what the run learned of its training split made
    (a tokenizer: read back from its directory, never learned here)."""
    data = make_data(cfg.data)
    data.read_learned(run_dir_of(Path(cfg.checkpoint)))
    return data


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
