"""eval.py's `prompt=<text>` (or `predict=<text file>`) and `sample.*`: a language model's run continues the text
into samples.txt. eval.py calls it from marked lines; conf/eval.yaml's `_checks_` names it for its keys."""

import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from trainkit.config.schema import Check, integer, number, show
from trainkit.errors import ConfigError
from trainkit.runtime import pick_device
from trainkit.tasks.language_model import write_samples, writes_text

log = logging.getLogger("eval")


def prompt_text(value: object) -> str | None:
    """eval.py's prompt: text, or null. Hydra reads prompt=42 as a number: quoted, it is the text."""
    if value is None or isinstance(value, str):
        return None
    return f"must be text, got {show(value)}; quote it: prompt=\"'{value}'\""


CONFIG_RULES: dict[str, Check] = {  # conf/eval.yaml's keys (its _checks_)
    "prompt": prompt_text,
    "sample.max_new_tokens": integer(1),
    "sample.temperature": number(0),  # 0: the most likely byte each time
    "sample.top_k": integer(1, null=True),  # null: from every byte
    "sample.seed": integer(0, 2**64 - 1, null=True),  # null: a fresh seed, printed; torch's seeds fit in 64 bits
}
CONFIG_RELATIONS = ()


def check_prompt(cfg: DictConfig) -> None:
    """prompt= is refused where predict= is given too, or where the run is not a language model's."""
    if cfg.prompt is not None and (cfg.get("predict") is not None or not writes_text(cfg)):
        reason = "predict= is given too; give one" if cfg.get("predict") is not None else "this run is not one; drop it"
        raise ConfigError("prompt", f"is the text a language model continues, but {reason}")


def prompt_of(cfg: DictConfig) -> str:
    """prompt=<the text>, or the text of predict=<a text file> (a mistyped file name is refused, not continued)."""
    if cfg.prompt is not None:
        return cfg.prompt
    given = Path(str(cfg.get("predict"))).expanduser()
    if not given.is_file():
        what = "is a folder" if given.is_dir() else "does not exist"
        raise ConfigError(
            "predict", f"'{given}' {what}; a language model continues a text file (predict=<file>) or prompt='<text>'"
        )
    try:
        return given.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError("predict", f"cannot read text file '{given}' ({error}); save it as UTF-8") from error


def continue_text(
    cfg: DictConfig,
    source: str,
    tested_model: Callable[[DictConfig, torch.device, int | None], tuple[torch.nn.Module, int | None, list[str]]],
    runs_data: Callable[[DictConfig], Any],
) -> bool:
    """The text continued by the tested weights (`tested_model`, with `runs_data(cfg)`'s tokenizer), printed and
    written to samples.txt; sample.seed=null draws a seed, saved and printed. False for any other evaluation."""
    if cfg.prompt is None and (cfg.get("predict") is None or not writes_text(cfg)):
        return False
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    drawn = cfg.sample.seed is None
    if drawn:
        cfg.sample.seed = random.SystemRandom().randrange(2**32)
        if (out_dir / ".hydra").is_dir():  # the config eval.py saved, with the seed sampled with
            OmegaConf.save(cfg, out_dir / ".hydra" / "config.yaml")
    prompt = prompt_of(cfg)
    model = tested_model(cfg, pick_device(cfg.device, 0), cfg.data.get("image_size"))[0]
    print(write_samples(model, prompt, cfg.sample, out_dir / "samples.txt", runs_data(cfg).learned()))
    seed = f"sample.seed={cfg.sample.seed}" + (" drawn: pass it to sample the same again" if drawn else "")
    log.info(f"sample of {cfg.sample.max_new_tokens} bytes ({seed}, {source}) -> samples.txt")
    return True
