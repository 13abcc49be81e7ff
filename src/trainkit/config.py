"""Check the composed config before any work starts, so a typo costs a second, not a run.

Each rule names its key; a failure raises ConfigError with a one-line fix-it message.
"""
from omegaconf import DictConfig, OmegaConf

from trainkit.errors import ConfigError
from trainkit.runtime import pick_device

METRICS = ("val/acc", "val/loss")
OPTIMIZED_METRICS = ("val/acc", "val/loss", "test/acc", "test/loss")


def _describe(value) -> str:
    return f"{value!r} ({type(value).__name__})"


def _number(cfg, key: str, *, minimum=None, maximum=None, strict_min=False, integer=False, optional=False):
    value = OmegaConf.select(cfg, key)
    if value is None and optional:
        return
    kind = "a whole number" if integer else "a number"
    valid_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not valid_type:
        raise ConfigError(key, f"must be {kind}{' or null' if optional else ''}, got {_describe(value)}")
    if minimum is not None and (value <= minimum if strict_min else value < minimum):
        raise ConfigError(key, f"must be {'>' if strict_min else '>='} {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(key, f"must be <= {maximum}, got {value}")


def _bool(cfg, key: str) -> None:
    value = OmegaConf.select(cfg, key)
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {_describe(value)}")


def _choice(cfg, key: str, choices) -> None:
    value = OmegaConf.select(cfg, key)
    if value not in choices:
        raise ConfigError(key, f"must be one of {', '.join(map(str, choices))}; got {_describe(value)}")


def validate(cfg: DictConfig) -> None:
    _number(cfg, "seed", integer=True, minimum=0)
    _number(cfg, "trainer.max_epochs", integer=True, minimum=1)
    _number(cfg, "trainer.max_steps", integer=True, minimum=1, optional=True)
    _number(cfg, "trainer.accumulate_grad_batches", integer=True, minimum=1)
    _number(cfg, "trainer.grad_clip", minimum=0, strict_min=True, optional=True)
    _number(cfg, "trainer.log_every_n_steps", integer=True, minimum=1)
    _number(cfg, "trainer.checkpoint_every_n_steps", integer=True, minimum=1, optional=True)
    _number(cfg, "trainer.limit_train_batches", integer=True, minimum=1, optional=True)
    _number(cfg, "trainer.limit_val_batches", integer=True, minimum=1, optional=True)
    for flag in ("channels_last", "compile", "progress_bar"):
        _bool(cfg, f"trainer.{flag}")

    _number(cfg, "data.batch_size", integer=True, minimum=1)
    _number(cfg, "data.eval_batch_size", integer=True, minimum=1)
    _number(cfg, "data.num_workers", integer=True, minimum=0)
    _number(cfg, "data.channels", integer=True, minimum=1)
    _number(cfg, "data.image_size", integer=True, minimum=1)
    _number(cfg, "data.num_classes", integer=True, minimum=2, optional=True)
    for key in ("data.mean", "data.std"):
        values = OmegaConf.select(cfg, key)
        if not OmegaConf.is_list(values) or len(values) not in (1, cfg.data.channels):
            raise ConfigError(key, f"must be a list of 1 or data.channels={cfg.data.channels} numbers, got {values}")
    if any(isinstance(m, bool) or not isinstance(m, (int, float)) for m in cfg.data.mean):
        raise ConfigError("data.mean", f"every entry must be a number, got {list(cfg.data.mean)}")
    if any(isinstance(s, bool) or not isinstance(s, (int, float)) or s <= 0 for s in cfg.data.std):
        raise ConfigError("data.std", f"every entry must be a number > 0, got {list(cfg.data.std)}")

    _number(cfg, "optimizer.lr", minimum=0, strict_min=True)
    _number(cfg, "optimizer.weight_decay", minimum=0)
    if "momentum" in cfg.optimizer:
        _number(cfg, "optimizer.momentum", minimum=0, maximum=1)

    _number(cfg, "scheduler.warmup_epochs", minimum=0)
    for key in ("min_lr_ratio", "gamma"):
        if key in cfg.scheduler:
            _number(cfg, f"scheduler.{key}", minimum=0, maximum=1)
    for key in ("cycle_epochs", "step_epochs"):
        if key in cfg.scheduler:
            _number(cfg, f"scheduler.{key}", minimum=0, strict_min=True)
    if "cycle_mult" in cfg.scheduler:
        _number(cfg, "scheduler.cycle_mult", integer=True, minimum=1)

    _choice(cfg, "precision.name", ("fp32", "bf16", "fp16"))
    _number(cfg, "regularization.label_smoothing", minimum=0, maximum=0.99)
    _number(cfg, "regularization.dropout", minimum=0, maximum=0.99)
    _bool(cfg, "regularization.early_stopping.enabled")
    _choice(cfg, "regularization.early_stopping.monitor", METRICS)
    _choice(cfg, "regularization.early_stopping.mode", ("min", "max"))
    _number(cfg, "regularization.early_stopping.patience", integer=True, minimum=1)
    _number(cfg, "regularization.early_stopping.min_delta", minimum=0)
    _choice(cfg, "optimized_metric", OPTIMIZED_METRICS)
    _bool(cfg, "print_config")

    _choice(cfg, "distributed.name", ("none", "ddp"))
    _choice(cfg, "distributed.backend", ("auto", "nccl", "gloo"))
    _bool(cfg, "distributed.sync_batchnorm")
    _number(cfg, "distributed.timeout_seconds", minimum=0, strict_min=True)
    if cfg.distributed.sync_batchnorm and pick_device(cfg.device).type != "cuda":
        raise ConfigError("distributed.sync_batchnorm", "SyncBatchNorm runs on CUDA GPUs only; on CPU leave it false "
                          "(BatchNorm statistics are then averaged across ranks before eval and save)")
