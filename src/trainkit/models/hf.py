"""`model=hf`: any Hugging Face `transformers` model, from a local folder or from a config, on the template's loop.

    model.path=<folder>                         # saved with save_pretrained: from_pretrained, local files only
    model.config='{model_type: bert, hidden_size: 64, num_hidden_layers: 2, ...}'   # a config class, from scratch

The head follows the task (`model.task`, the task's `_target_`): task=classification gets the
model's `AutoModelForSequenceClassification` (data.num_classes labels), task=language_model its
`AutoModelForCausalLM`. `create_hf_model` wraps it in `HuggingFaceModel`, whose forward takes the
batch's token ids as our own models do and returns the logits alone, so every task, the finders,
EMA, evaluation, tta, sampling and eval.py take it unchanged: the ModelOutput (a dict-like with
logits, hidden states, a cache) stops here, at the one place that knows it is there. The attention
mask comes from the padding: a classifier's inputs are padded with `model.pad_token_id` (the data's
padding id, trainkit.data.text.PAD_ID for bytes), masked out of attention and pooling; a language
model's blocks hold no padding, and its causal attention never lets a real token see a later pad.

transformers is imported inside the functions that build, so `--help`, config errors and other
models never pay for it.
"""

import difflib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from trainkit.config.schema import flag, integer, text
from trainkit.errors import ConfigError
from trainkit.models.examples import token_ids

log = logging.getLogger(__name__)

HEADS = {"causal_lm": "AutoModelForCausalLM", "sequence_classification": "AutoModelForSequenceClassification"}
# model.config holds the architecture; what follows from the data and the task has keys of its own.
SET_APART = {"vocab_size": "model.vocab_size", "num_labels": "model.num_labels", "pad_token_id": "model.pad_token_id"}
POSITION_KEYS = ("max_position_embeddings", "n_positions")  # a config's longest sequence, as models name it


class HuggingFaceModel(nn.Module):
    """A transformers model on token ids [B, T]: its logits ([B, num_labels] or [B, T, vocab]), the padding
    (`pad_token_id`, None: none) masked out. `model` is the transformers model itself: save_pretrained it."""

    def __init__(self, model: nn.Module, pad_token_id: int | None, causal: bool) -> None:
        super().__init__()
        self.model: Any = model  # a transformers PreTrainedModel (typed loosely: its config and methods are its own)
        self.pad_token_id, self.causal = pad_token_id, causal
        if causal:  # the context sampling crops to (trainkit.tasks.language_model.context_length)
            self.block_size = next(filter(None, (getattr(self.model.config, key, None) for key in POSITION_KEYS)), None)
        # FSDP shards one of these a unit (trainkit.distributed.fsdp.blocks): the model's transformer layers
        self.block_names = sorted(getattr(model, "_no_split_modules", None) or [])

    def forward(self, tokens: Tensor) -> Tensor:
        options: dict[str, Any] = {"use_cache": False} if self.causal else {}  # no key-value cache to build
        if self.pad_token_id is not None:
            mask = tokens != self.pad_token_id
            mask[:, 0] |= ~mask.any(dim=1)  # an empty text attends to its first position (no row of all -inf)
            options["attention_mask"] = mask.long()
        return self.model(input_ids=tokens, **options).logits

    def no_weight_decay(self) -> list[str]:
        """Names trainkit.optim leaves undecayed besides the norms and biases (every 1-d parameter): the embeddings,
        as our GPT's (a tied output layer is the token embedding's parameter)."""
        return [f"{name}.*" for name, module in self.named_modules() if isinstance(module, nn.Embedding)]

    def save_pretrained(self, folder: Path, class_names: list[str]) -> None:
        """The transformers model in the Hugging Face format (config.json, model.safetensors), its labels named."""
        if class_names and not self.causal:
            self.model.config.id2label = dict(enumerate(class_names))
            self.model.config.label2id = {name: label for label, name in enumerate(class_names)}
        self.model.save_pretrained(folder, safe_serialization=True)


def head_of(task: str) -> str:
    """The head a task's `_target_` asks for: a causal LM for a language model, sequence classification for a
    classifier; a ConfigError for another task."""
    from trainkit.tasks.classification import Classification
    from trainkit.tasks.language_model import LanguageModel
    from trainkit.tasks.task import task_class

    try:
        found = task_class(task)
    except Exception:  # hydra raises several kinds for a path it cannot import; the config check says it
        found = None
    if isinstance(found, type) and issubclass(found, LanguageModel):
        return "causal_lm"
    if isinstance(found, type) and issubclass(found, Classification):
        return "sequence_classification"
    raise ConfigError(
        "model.task",
        f"is {task}, but model=hf has heads for task=classification (sequence classification) and "
        f"task=language_model (causal LM) alone; pick one of those tasks, or wrap the model yourself",
    )


def create_hf_model(
    task: str,
    num_labels: int,
    path: str | None = None,
    config: Mapping | None = None,
    vocab_size: int | None = None,
    pad_token_id: int | None = 0,
    gradient_checkpointing: bool = False,
) -> HuggingFaceModel:
    """The transformers model conf/model/hf.yaml describes, its head the task's (see the module docstring).

    `vocab_size`: null keeps a model.path model's own; from model.config, a language model's is `num_labels`
    (data.num_classes: its classes are its ids) and a classifier's the bytes and the padding id
    (trainkit.data.text.VOCABULARY). A number other than a loaded model's resizes its embeddings."""
    import transformers

    head = head_of(task)
    causal = head == "causal_lm"
    auto = getattr(transformers, HEADS[head])
    labels = {} if causal else {"num_labels": num_labels}
    if path is not None:
        folder = pretrained_folder(path)
        try:
            model = auto.from_pretrained(folder, local_files_only=True, ignore_mismatched_sizes=True, **labels)
        except ValueError as error:  # a model type without this head
            raise no_head_error("model.path", head, error) from error
    else:
        hf_config = config_of(config, vocab_size or (num_labels if causal else _byte_vocabulary()), labels)
        try:
            model = auto.from_config(hf_config)
        except ValueError as error:
            raise no_head_error("model.config", head, error) from error
    if vocab_size is not None and vocab_size != model.get_input_embeddings().num_embeddings:
        log.info(f"model.vocab_size={vocab_size}: resizing the token embeddings of {path}")
        model.resize_token_embeddings(vocab_size)
    if not causal:
        model.config.pad_token_id = pad_token_id  # what a decoder's classifier reads to find each text's last token
    if gradient_checkpointing:
        if not model.supports_gradient_checkpointing:
            raise ConfigError(
                "model.gradient_checkpointing",
                f"is true, but transformers' {type(model).__name__} has no gradient checkpointing; set it false",
            )
        if hasattr(model, "activation_checkpointing_enable"):  # its name since transformers 5.x; the old one warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return HuggingFaceModel(model, None if causal else pad_token_id, causal)


create_hf_model.example_input = token_ids  # type: ignore[attr-defined]  # what it takes (trainkit.models.examples)
# What the arguments may hold, and what they must agree on with each other and the data (the config check).
create_hf_model.config_rules = {  # type: ignore[attr-defined]
    "path": text(null=True),
    "vocab_size": integer(1, null=True),
    "pad_token_id": integer(0, null=True),
    "gradient_checkpointing": flag(),
}


def _config_problems(
    task: str, path: str | None, config: Any, vocab_size: int | None, data: Mapping
) -> Iterator[tuple[str, str]]:
    """One of model.path and model.config; a folder that holds a saved model; a config with a model_type and
    without the keys the data and the task decide; positions for the data's longest sequence; a head the task has."""
    example = "model.config='{model_type: bert, hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 2}'"
    if (path is None) == (config is None):
        which = "both are set" if path is not None else "neither is set"
        yield (
            "model.path",
            f"and model.config: {which}; give one: model.path=<a folder saved with save_pretrained> (fine-tune "
            f"it) or {example} (train from scratch), and set the other null",
        )
        return
    try:
        head_of(task)
    except ConfigError as error:
        yield error.key, error.message
    if path is not None:
        if not (Path(path).expanduser() / "config.json").is_file():
            yield "model.path", no_saved_model(path)
        return
    if not isinstance(config, Mapping) or not isinstance(config.get("model_type"), str):
        yield "model.config", f"must be a mapping with a model_type (a config class's, or its name), e.g. {example}"
        return
    for key, instead in SET_APART.items():
        if key in config:
            yield f"model.config.{key}", f"is set apart from the architecture: drop it and set {instead} instead"
    positions = next((config[key] for key in POSITION_KEYS if key in config), None)
    longest = data.get("block_size") or data.get("max_length")
    if isinstance(positions, int) and isinstance(longest, int) and positions < longest:
        which = "data.block_size" if data.get("block_size") else "data.max_length"
        key = next(key for key in POSITION_KEYS if key in config)
        yield (
            f"model.config.{key}",
            f"is {positions}, below {which}={longest}: the model has no position for the tokens beyond; raise it to "
            f"at least {longest}",
        )


create_hf_model.config_problems = _config_problems  # type: ignore[attr-defined]


def _byte_vocabulary() -> int:
    from trainkit.data.text import VOCABULARY

    return VOCABULARY


def pretrained_folder(path: str) -> Path:
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError("model.path", no_saved_model(path))
    return folder


def no_saved_model(path: str) -> str:
    return f"'{Path(path).expanduser()}' holds no config.json; give a folder a model was saved to with save_pretrained"


def config_of(config: Mapping | None, vocab_size: int, labels: dict) -> Any:
    """The transformers config model.config describes: its model_type (bert, gpt2, llama, ... or a class name,
    BertConfig) and the class's arguments, with the vocabulary and labels the data gives."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    assert config is not None, "the config check requires model.path or model.config"
    options = dict(config)
    kind = options.pop("model_type", None)
    found: Any = next((cls for cls in CONFIG_MAPPING.values() if cls.__name__ == kind), None) if kind else None
    if found is None and kind in CONFIG_MAPPING:
        found = CONFIG_MAPPING[kind]
    if found is None:
        close = difflib.get_close_matches(str(kind), list(CONFIG_MAPPING.keys()), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else "e.g. bert, gpt2, llama, modernbert"
        raise ConfigError("model.config.model_type", f"transformers has no model type {kind!r}; {hint}")
    try:
        return found(**options, vocab_size=vocab_size, **labels)
    except (TypeError, ValueError) as error:
        raise ConfigError("model.config", f"{found.__name__} refuses these arguments ({error})") from error


def no_head_error(key: str, head: str, error: Exception) -> ConfigError:
    reason = str(error).strip().splitlines()[0]
    return ConfigError(key, f"names a model with no {HEADS[head]} head ({reason}); pick a model type that has one")
