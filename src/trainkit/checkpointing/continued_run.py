"""What resuming finds in a run's directory: whether the run has finished (then one line says how
to extend it, and a sweeper gets its value from summary.json), and the metrics.jsonl lines written
after the checkpoint, which the resumed run writes again."""

import json
from pathlib import Path

from omegaconf import DictConfig


def finished_message(state: dict, cfg: DictConfig, run_dir: Path) -> str | None:
    """One line when the checkpoint's run has nothing left to train under `cfg`, naming how to extend it."""
    trainer, stopping = cfg.trainer, state.get("early_stopping") or {}
    where = f"the run in {run_dir} has finished"
    if trainer.max_steps and state["step"] >= trainer.max_steps:
        return f"{where} (trainer.max_steps={trainer.max_steps} reached); resume with a higher trainer.max_steps"
    if state["batches_done"]:
        return None
    if state["epoch"] + 1 >= trainer.max_epochs:
        return (
            f"{where} (trainer.max_epochs={trainer.max_epochs} reached); resume with a higher trainer.max_epochs, "
            f"e.g. trainer.max_epochs={2 * trainer.max_epochs}"
        )
    early = cfg.regularization.early_stopping
    if early.enabled and stopping.get("epochs_without_improvement", 0) >= early.patience:
        return (
            f"{where} (early stopping: no improvement for {early.patience} epochs); resume with a higher "
            f"regularization.early_stopping.patience or regularization.early_stopping.enabled=false"
        )
    return None


def finished_value(run_dir: Path) -> float | None:
    """The finished run's optimized value, from its summary.json, for a sweeper."""
    summary = run_dir / "summary.json"
    return json.loads(summary.read_text()).get("optimized_value") if summary.is_file() else None


def trim_metrics(path: Path, state: dict) -> None:
    """Drop the metrics.jsonl lines written after the checkpoint (the resume writes them again):
    lines of later steps and, for a checkpoint inside an epoch, that epoch's end and test lines."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines()
    kept = []
    for line in lines:
        record = json.loads(line)
        later = record.get("step", 0) > state["step"]
        ends_the_epoch = "val/loss" in record or any(key.startswith("test/") for key in record)
        if later or (state["batches_done"] and record.get("epoch", -1) >= state["epoch"] and ends_the_epoch):
            continue
        kept.append(line)
    if len(kept) != len(lines):
        path.write_text("".join(f"{line}\n" for line in kept))
