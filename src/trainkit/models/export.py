"""eval.py's `export=<folder>`: a trained model in a form others load without trainkit's checkpoints.

    model=hf:        config.json + model.safetensors (transformers' save_pretrained): AutoModelFor...from_pretrained
    our own models:  model.safetensors (safetensors.torch.save_model) + model.yaml (the model config, `_target_`
                     and arguments): `load_exported(folder)` rebuilds it, or hydra.utils.instantiate + load_model

The weights are those the run tested (the EMA where it used one). The run's tokenizer (data.tokenizer: bpe, saved
in its directory, or a folder) is saved beside them for AutoTokenizer.from_pretrained; byte-level data gets a
tokenizer that gives the ids the run trained on: byte b is id b + 1 with 0 padding for the classifiers' text
options, id b for a language model's data=text (the data option's byte_offset, trainkit.data.tokenizing).
"""

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from trainkit.checkpointing.resume import run_dir_of
from trainkit.config import to_dict
from trainkit.config.schema import Check, string
from trainkit.data.datasets import data_class
from trainkit.data.tokenizer_library import BPE, PAD_TOKEN, folder_tokenizer, saved_tokenizer
from trainkit.data.tokenizing import BYTES, Tokenized
from trainkit.errors import ConfigError
from trainkit.models.hf import HuggingFaceModel

log = logging.getLogger(__name__)

WEIGHTS, CONFIG = "model.safetensors", "model.yaml"
CONFIG_RULES: dict[str, Check] = {"export": string(null=True)}  # a folder (conf/eval.yaml's _checks_)
CONFIG_RELATIONS = ()


def export_run(
    cfg: DictConfig, source: str, tested_model: Callable[..., tuple[nn.Module, int | None, list[str]]]
) -> bool:
    """eval.py's export=<folder>: the weights the run tested and the run's tokenizer where it has one, written by
    one process on the CPU; nothing is evaluated. `tested_model(cfg, device, image_size)` (eval.py's `tested_model_on`)
    builds the model and names its classes. False where export= is not set."""
    if cfg.export is None:
        return False
    if cfg.get("predict") is not None or cfg.prompt is not None:
        raise ConfigError("export", "writes the model alone; drop predict= and prompt= (or run eval.py twice)")
    folder = Path(cfg.export).expanduser()
    check_free(folder)  # before the model is built: a refusal is one line
    model, _, class_names = tested_model(cfg, torch.device("cpu"), cfg.data.get("image_size"))
    written = export_model(model, folder, to_dict(cfg.model), class_names)
    log.info(f"exported the tested weights ({source}) to {folder} in {written}")
    tokenized = data_class(cfg.data._target_)
    if issubclass(tokenized, Tokenized):
        offset = tokenized.byte_offset  # the ids the run's bytes were (data=text's: the bytes themselves)
        what = export_tokenizer(cfg.data.get("tokenizer", BYTES), run_dir_of(Path(cfg.checkpoint)), folder, offset)
        log.info(f"exported the run's tokenizer (data.tokenizer={what}): AutoTokenizer loads it")
    return True


def export_model(model: nn.Module, folder: Path, model_config: Mapping, class_names: list[str]) -> str:
    """Write `model` into `folder` (new or empty); return what was written, for the log line."""
    check_free(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if isinstance(model, HuggingFaceModel):
        model.save_pretrained(folder, class_names)
        return "the Hugging Face format (config.json, model.safetensors): from_pretrained loads it"
    from omegaconf import OmegaConf
    from safetensors.torch import save_model

    save_model(model, str(folder / WEIGHTS))  # a tied weight (GPT's output layer) is written once
    config = {**model_config, **({"pretrained": False} if "pretrained" in model_config else {})}  # the weights: here
    (folder / CONFIG).write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    return f"{WEIGHTS} and {CONFIG}: trainkit.models.export.load_exported rebuilds it"


def check_free(folder: Path) -> None:
    """A ConfigError unless `folder` is new or an empty folder: an export overwrites nothing."""
    if folder.exists() and not folder.is_dir():
        raise ConfigError("export", f"'{folder}' is a file; give a new folder (nothing is overwritten)")
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError("export", f"'{folder}' is not empty; give a new folder (nothing is overwritten)")


def export_tokenizer(spec: str, run_dir: Path | None, folder: Path, byte_offset: int = 1) -> str:
    """The run's data.tokenizer beside the exported weights, as `AutoTokenizer.from_pretrained(folder)` reads it
    (a tokenizer_config.json naming the class and the padding beside tokenizer.json: a bare tokenizer.json beside a
    BERT's config.json would be read as BERT's own WordPiece). bpe: the one the run saved in its directory; a
    folder: its tokenizer as transformers saves it; bytes: byte b as id b + `byte_offset` (the data option's), the
    ids the run trained on. Returns what was exported, for the log line."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    source = Path(spec).expanduser()
    tokenizer: Any
    if spec == BYTES:
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=byte_tokenizer(byte_offset),
            pad_token=PAD_TOKEN if byte_offset else None,
            split_special_tokens=True,  # "<pad>" written in a text is its bytes, as the run read it
        )
    elif spec == BPE:
        saved = saved_tokenizer(run_dir) if run_dir is not None else None
        if saved is None or not saved.is_file():
            raise ConfigError("export", f"data.tokenizer is bpe, but the run saved no tokenizer.json ({saved})")
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(saved)), pad_token=PAD_TOKEN)
    elif (source / "tokenizer_config.json").is_file() or not (source / "tokenizer.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    else:  # a bare tokenizer.json: its padding (if any) named, as the run read it (folder_tokenizer)
        read = folder_tokenizer(source, needs_padding=False)
        pad = read.tokenizer.id_to_token(read.pad_id) if read.pad_id is not None else None
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=read.tokenizer, pad_token=pad)
    tokenizer.save_pretrained(str(folder))
    if spec == BYTES:
        return "bytes: byte b is id b + 1, 0 pads" if byte_offset else "bytes: byte b is id b, no padding"
    return spec


def byte_tokenizer(offset: int) -> Any:
    """A `tokenizers` Tokenizer of bytes alone: byte b is id b + `offset` (1: id 0 is <pad>), no merges, as
    trainkit.data.tokenizing.ByteTokens encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters = {byte: chr(byte) for byte in printable}  # GPT-2's byte-level alphabet, as pre_tokenizers.ByteLevel
    characters |= {byte: chr(256 + n) for n, byte in enumerate(b for b in range(256) if b not in characters)}
    vocab = {character: byte + offset for byte, character in characters.items()} | ({PAD_TOKEN: 0} if offset else {})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    if offset:
        tokenizer.add_special_tokens([PAD_TOKEN])
    return tokenizer


def load_exported(folder: str | Path) -> nn.Module:
    """One of our own models exported by eval.py: built from model.yaml, its weights from model.safetensors."""
    import hydra.utils
    from omegaconf import OmegaConf
    from safetensors.torch import load_model

    folder = Path(folder)
    model = hydra.utils.instantiate(OmegaConf.load(folder / CONFIG), _convert_="all")
    load_model(model, str(folder / WEIGHTS))
    return model
