"""LR range test with the same config as train.py: which optimizer.lr should this run use?

    python scripts/lr_find.py                                   # digits + small CNN + SGD
    python scripts/lr_find.py model=timm optimizer=adamw lr_finder.max_lr=1
    python scripts/lr_find.py experiment=digits lr_finder.num_steps=200

Every override of train.py works here. The data, model (with its freezing and pretrained weights),
augmentation, optimizer groups (head_lr_scale) and precision are built as train.py builds them;
then the LR sweeps from lr_finder.min_lr to lr_finder.max_lr, one batch per update, on the task's
own training loss (classification, segmentation, yours), and the script logs the suggested
optimizer.lr and writes lr_finder.png and lr_finder.json to the run directory. Nothing is trained
for real: the sweep's weights are thrown away.

One batch of data.batch_size per update: with trainer.accumulate_grad_batches=k, train.py's updates
average k batches, and a k times larger LR (the linear rule) is a fair starting point. One process:
under DDP, train.py's lr_finder.enabled=true runs the same test on every rank.
"""

import functools
import json
import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from trainkit import cli
from trainkit.config.validation import validate
from trainkit.distributed.process_group import ProcessInfo
from trainkit.errors import ConfigError
from trainkit.optim import scaled_lr
from trainkit.runtime import pick_device, seed_everything
from trainkit.tuning.lr_finder import find_lr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train  # the run is built and stepped as train.py builds and steps it

log = logging.getLogger("lr_find")

SETTINGS = ("min_lr", "max_lr", "num_steps", "smoothing", "divergence_factor")  # of lr_finder.* in conf/config.yaml


@hydra.main(version_base=None, config_path="../conf", config_name="config")
@cli.report_config_errors
def main(cfg: DictConfig) -> float | None:
    validate(cfg)  # lr_finder.* included: a bad setting fails now, not after building data and model
    settings = {key: cfg.lr_finder[key] for key in SETTINGS}
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    device = pick_device(cfg.device)
    seed_everything(cfg.seed)
    # train.py's own construction (data, model, the data option's batch transforms, task, optimizer groups,
    # schedule) and its LR finder with its training step (forward, the task's loss, backward; tokens weighed as
    # the loop does). lr_finder.apply changes only this run's optimizer, thrown away.
    run = train.build_run(cfg, run_dir, ProcessInfo(), device)
    cfg = run.cfg  # resolved: a searched batch size (batch_size_finder) is in it
    if settings["num_steps"] > len(run.data.train):
        log.info(f"{settings['num_steps']} steps > {len(run.data.train)} batches per epoch: the data repeats")
    result = find_lr(run, functools.partial(train.train_step, run))  # train.py's: the sweep, then lr_finder.png
    plot = run_dir / "lr_finder.png"
    suggestion = result.suggestion
    (run_dir / "lr_finder.json").write_text(json.dumps({**result.to_dict(), "settings": settings}, indent=2))
    if suggestion is None:
        raise ConfigError(
            "lr_finder.min_lr",
            f"the loss never fell in the sweep (see {plot}); lower lr_finder.min_lr or raise lr_finder.num_steps",
        )
    # The sweep sets the effective base LR; with scale_lr_with_batch, optimizer.lr is before scaling.
    factor = 1.0
    if cfg.optimizer.get("scale_lr_with_batch", False):
        accumulate = cfg.trainer.accumulate_grad_batches
        factor = scaled_lr(1.0, cfg.data.batch_size, 1, accumulate, cfg.optimizer.reference_batch_size)
    head_scale = cfg.optimizer.get("head_lr_scale", 1.0)
    head = f" (the head at {suggestion * head_scale:.2e}, x{head_scale:g})" if head_scale != 1.0 else ""
    log.info(
        f"suggested optimizer.lr={suggestion / factor:.2e}{head}"
        f"{f' (effective {suggestion:.2e} after batch scaling)' if factor != 1.0 else ''}; "
        f"curve: {plot}{'; the loss diverged at ' + format(result.lrs[-1], '.2e') if result.stopped_early else ''}"
    )
    return suggestion / factor


if __name__ == "__main__":
    if {"--help", "-h"} & set(sys.argv[1:]):  # this script's usage, not train.py's
        OmegaConf.register_new_resolver("script_doc", lambda: __doc__.strip() + "\n", replace=True)
        sys.argv.append("hydra/help=lr_find")
    cli.run(main, resumes=False)  # a sweep continues no run: resume= is refused in one line
