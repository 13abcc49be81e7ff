"""`model=hf`: any Hugging Face `transformers` model, from a local folder or from a config, on the template's loop.

    model.path=<folder>                         # saved with save_pretrained: from_pretrained, local files only
    model.config='{model_type: bert, hidden_size: 64, num_hidden_layers: 2, ...}'   # a config class, from scratch

The head follows the task (`model.task`, the task's `_target_`): task=classification gets the model's
`AutoModelForSequenceClassification` (data.num_classes labels), task=language_model its `AutoModelForCausalLM`.
`create_hf_model` wraps it in `HuggingFaceModel`, whose forward takes the batch's token ids as our own models do and
returns the logits alone, so every task, the finders, EMA, evaluation, sampling and eval.py take it unchanged: the
ModelOutput (a dict-like with logits, hidden states, a cache) stops here, at the one place that knows it is there. The
attention mask comes from the padding: a classifier's inputs are padded with `model.pad_token_id` (the data's padding
id, trainkit.data.text.PAD_ID for bytes), masked out of attention and pooling; a language model's blocks hold no
padding, and its causal attention never lets a real token see a later pad.

transformers is imported inside the functions that build, so `--help`, config errors and other models never pay for it.
"""

import difflib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hydra.utils import get_class
from torch import Tensor, nn

from trainkit.config.schema import flag, integer, string
from trainkit.errors import ConfigError
from trainkit.models.sequence import token_ids

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
        trained = dropouts(model.config)
        self.dropout_note = "dropout " + (", ".join(f"{key} {value:g}" for key, value in trained.items()) or "none")

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

    try:
        found = get_class(task)
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
    dropout: float = 0.0,
    config_overrides: Mapping | None = None,
    data_vocabulary: int | None = None,
) -> HuggingFaceModel:
    """The transformers model conf/model/hf.yaml describes, its head the task's (see the module docstring).

    `vocab_size`: null keeps a model.path model's own; from model.config, a language model's is `num_labels`
    (data.num_classes: its classes are its ids) and a classifier's the bytes and the padding id
    (trainkit.data.text.VOCABULARY). A number other than a loaded model's resizes its embeddings.
    `dropout` (regularization.dropout) is the classifier head's (transformers' classifier_dropout);
    `config_overrides` sets keys of the library's config (the folder's config.json or model.config's), e.g. the
    hidden and attention dropout. `data_vocabulary`: the ids the data's tokens take, which the model must embed."""
    import transformers

    head = head_of(task)
    causal = head == "causal_lm"
    auto = getattr(transformers, HEADS[head])
    labels = {} if causal else {"num_labels": num_labels}
    if path is not None:
        folder = pretrained_folder(path)
        hf_config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
        for key, value in labels.items():
            setattr(hf_config, key, value)
        overridden(hf_config, config_overrides, dropout, causal)
        try:
            model = auto.from_pretrained(folder, config=hf_config, local_files_only=True, ignore_mismatched_sizes=True)
        except ValueError as error:  # a model type without this head
            raise no_head_error("model.path", head, error) from error
    else:
        hf_config = config_of(config, vocab_size or (num_labels if causal else _byte_vocabulary()), labels)
        overridden(hf_config, config_overrides, dropout, causal)
        try:
            model = auto.from_config(hf_config)
        except ValueError as error:
            raise no_head_error("model.config", head, error) from error
    if vocab_size is not None and vocab_size != model.get_input_embeddings().num_embeddings:
        log.info(f"model.vocab_size={vocab_size}: resizing the token embeddings of {path}")
        model.resize_token_embeddings(vocab_size)
    embedded = model.get_input_embeddings().num_embeddings
    if data_vocabulary is not None and embedded < data_vocabulary:
        raise ConfigError(
            "model.vocab_size",
            f"is {'null' if vocab_size is None else vocab_size}: the model embeds {embedded} ids, but the data's "
            f"tokenizer gives ids up to {data_vocabulary - 1} (data.vocabulary={data_vocabulary}); set "
            f"model.vocab_size={data_vocabulary} (resizes the embeddings: the new rows start untrained), or use the "
            f"model's own tokenizer (data.tokenizer=<its folder>)",
        )
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


create_hf_model.example_input = token_ids  # type: ignore[attr-defined]  # what it takes (docs/models.md)
# What the arguments may hold, and what they must agree on with each other and the data (the config check).
create_hf_model.config_rules = {  # type: ignore[attr-defined]
    "path": string(null=True),
    "vocab_size": integer(1, null=True),
    "pad_token_id": integer(0, null=True),
    "gradient_checkpointing": flag(),
    "data_vocabulary": integer(1, null=True),
}


def _config_problems(
    task: str, path: str | None, config: Any, vocab_size: int | None, data: Mapping, config_overrides: Any = None
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
    overrides = config_overrides if config_overrides is not None else {}
    if not isinstance(overrides, Mapping):
        yield "model.config_overrides", "must be a mapping of the library config's keys, e.g. {hidden_dropout_prob: 0}"
        return
    for key, instead in {**SET_APART, "model_type": "model.config or model.path"}.items():
        if key in overrides:
            yield f"model.config_overrides.{key}", f"has a key of its own: drop it and set {instead} instead"
    if path is not None:
        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            yield "model.path", no_saved_model(path)
            return
        try:
            saved = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            yield "model.path", f"'{folder / 'config.json'}' is not a JSON config ({error}); save the model again"
            return
        yield from _position_problems({**saved, **overrides}, data, f"the model in '{folder}'", overrides)
        return
    if not isinstance(config, Mapping) or not isinstance(config.get("model_type"), str):
        yield "model.config", f"must be a mapping with a model_type (a config class's, or its name), e.g. {example}"
        return
    for key, instead in SET_APART.items():
        if key in config:
            yield f"model.config.{key}", f"is set apart from the architecture: drop it and set {instead} instead"
    yield from _position_problems({**config, **overrides}, data, "model.config's", overrides)


def _position_problems(config: Mapping, data: Mapping, whose: str, overrides: Mapping) -> Iterator[tuple[str, str]]:
    """Positions for the data's longest sequence (data.block_size or data.max_length): a model with fewer has no
    position for the tokens beyond, and fails inside its forward."""
    key = next((key for key in POSITION_KEYS if key in config), None)
    positions = config.get(key) if key is not None else None
    longest = data.get("block_size") or data.get("max_length")
    if isinstance(positions, int) and isinstance(longest, int) and positions < longest:
        which = "data.block_size" if data.get("block_size") else "data.max_length"
        named = f"model.config_overrides.{key}" if key in overrides else f"model.config.{key}"
        if "model.config" in whose or key in overrides:
            yield (
                named,
                f"is {positions}, below {which}={longest}: the model has no position for the tokens beyond; raise "
                f"it to at least {longest}",
            )
        else:
            yield (
                which,
                f"is {longest}, but {whose} has {positions} positions ({key} in its config.json): it has no "
                f"position for the tokens beyond; set {which}={positions} or less, or give a model with more "
                f"positions",
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
    """Why model.path names no saved model: a folder without config.json, a file, or nothing there (a hub name
    among those: model=hf reads local folders alone)."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        return f"'{folder}' holds no config.json; give a folder a model was saved to with save_pretrained"
    if folder.exists():
        return f"'{folder}' is a file; give the folder a model was saved to with save_pretrained"
    if os.sep in path or path.startswith((".", "~")):
        return f"'{folder}' does not exist; give a folder a model was saved to with save_pretrained"
    offline = " (and HF_HUB_OFFLINE=1 is set)" if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") else ""
    return (
        f"'{path}' is no folder here, and model=hf downloads nothing{offline}: a hub name needs the network; save "
        f"the model once where there is one (AutoModel...from_pretrained({path!r}).save_pretrained(<folder>)) and "
        f"give that folder"
    )


HEAD_DROPOUT_KEYS = ("classifier_dropout", "seq_classif_dropout")  # a sequence classifier's dropout, by model


def overridden(hf_config: Any, overrides: Mapping | None, dropout: float, causal: bool) -> None:
    """`hf_config` with model.config_overrides set (each a key the config has: a misspelt one is refused, not ignored)
    and the classifier head's dropout regularization.dropout (a head without one: refused where it is not 0)."""
    for key, value in (overrides or {}).items():
        if not hasattr(hf_config, key):
            known = [name for name in hf_config.to_dict() if not name.startswith("_")]
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else f"its keys: {', '.join(known[:40])}"
            raise ConfigError(f"model.config_overrides.{key}", f"is not a key of {type(hf_config).__name__}; {hint}")
        setattr(hf_config, key, value)
    head = next((key for key in HEAD_DROPOUT_KEYS if hasattr(hf_config, key)), None)
    if not causal and head is not None:
        setattr(hf_config, head, dropout)
    elif dropout:
        others = ", ".join(f"{key}={value}" for key, value in dropouts(hf_config).items()) or "none"
        raise ConfigError(
            "regularization.dropout",
            f"is {dropout}, the classifier head's dropout, but transformers' {type(hf_config).__name__} has no "
            f"{'head dropout for a language model' if causal else 'classifier_dropout'}; set regularization.dropout=0 "
            f"and its own dropouts with model.config_overrides (now: {others})",
        )


def dropouts(hf_config: Any) -> dict[str, float]:
    """The config's dropout probabilities, by their names (hidden_dropout_prob, attn_pdrop, classifier_dropout...)."""
    return {
        key: value
        for key, value in hf_config.to_dict().items()
        if ("dropout" in key or "pdrop" in key) and isinstance(value, int | float) and not isinstance(value, bool)
    }


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
