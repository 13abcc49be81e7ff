"""eval.py's `export=<folder>`: a trained model in a form others load without trainkit's checkpoints.

    model=hf:        config.json + model.safetensors (transformers' save_pretrained): AutoModelFor...from_pretrained
    our own models:  model.safetensors (safetensors.torch.save_model) + model.yaml (the model config, `_target_`
                     and arguments): `load_exported(folder)` rebuilds it, or hydra.utils.instantiate + load_model

The weights are those the run tested (the EMA where it used one). The run's tokenizer (data.tokenizer: bpe, saved
in its directory, or a folder) is saved beside them for AutoTokenizer.from_pretrained; byte-level data has none
(byte b is id b + 1, 0 pads: trainkit.data.text).
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from trainkit.data.tokenizing import BPE, BYTES, PAD_TOKEN, folder_tokenizer, saved_tokenizer
from trainkit.errors import ConfigError
from trainkit.models.hf import HuggingFaceModel

WEIGHTS, CONFIG = "model.safetensors", "model.yaml"


def export_model(model: nn.Module, folder: Path, model_config: Mapping, class_names: list[str]) -> str:
    """Write `model` into `folder` (new or empty); return what was written, for the log line."""
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError("export", f"'{folder}' is not empty; give a new folder (nothing is overwritten)")
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


def export_tokenizer(spec: str, run_dir: Path | None, folder: Path) -> bool:
    """The run's data.tokenizer beside the exported weights, as `AutoTokenizer.from_pretrained(folder)` reads it
    (a tokenizer_config.json naming the class and the padding beside tokenizer.json: a bare tokenizer.json beside a
    BERT's config.json would be read as BERT's own WordPiece). bpe: the one the run saved in its directory; a
    folder: its tokenizer as transformers saves it. False for bytes: there is no tokenizer to export."""
    if spec == BYTES:
        return False
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    source = Path(spec).expanduser()
    tokenizer: Any
    if spec == BPE:
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
    return True


def load_exported(folder: str | Path) -> nn.Module:
    """One of our own models exported by eval.py: built from model.yaml, its weights from model.safetensors."""
    import hydra.utils
    from omegaconf import OmegaConf
    from safetensors.torch import load_model

    folder = Path(folder)
    model = hydra.utils.instantiate(OmegaConf.load(folder / CONFIG), _convert_="all")
    load_model(model, str(folder / WEIGHTS))
    return model
