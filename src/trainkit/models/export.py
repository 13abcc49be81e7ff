"""eval.py's `export=<folder>`: a trained model in a form others load without trainkit's checkpoints.

    model=hf:        config.json + model.safetensors (transformers' save_pretrained): AutoModelFor...from_pretrained
    our own models:  model.safetensors (safetensors.torch.save_model) + model.yaml (the model config, `_target_`
                     and arguments): `load_exported(folder)` rebuilds it, or hydra.utils.instantiate + load_model

The weights are those the run tested (the EMA where it used one). A tokenizer the run saved in its directory
(`tokenizer/`) is copied beside them; byte-level data has none (byte b is id b + 1, 0 pads: trainkit.data.text).
"""

import shutil
from collections.abc import Mapping
from pathlib import Path

from torch import nn

from trainkit.errors import ConfigError
from trainkit.models.hf import HuggingFaceModel

WEIGHTS, CONFIG = "model.safetensors", "model.yaml"
TOKENIZER = "tokenizer"  # the folder in a run directory that holds the tokenizer the run trained or read


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


def copy_tokenizer(run_dir: Path | None, folder: Path) -> bool:
    """The run's tokenizer files beside the exported weights; False where the run saved none."""
    saved = run_dir / TOKENIZER if run_dir else None
    if saved is None or not saved.is_dir():
        return False
    for file in saved.iterdir():
        if file.is_file():
            shutil.copy2(file, folder / file.name)
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
