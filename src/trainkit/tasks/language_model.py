"""A language model on [B, T] token ids and the targets shifted by one: the loss is the mean over an update's real
tokens (not -100), reported in bits per byte (docs/data.md#tokenizers-datatokenizer); and sampling."""

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from hydra.utils import get_class
from torch import Tensor, nn

from trainkit.config.schema import Check, integer, number
from trainkit.tasks.task import Task

IGNORE = -100  # a target the loss and the metrics skip (padding)


class LanguageModel(Task):
    metric_names: ClassVar[tuple[str, ...]] = ("bpb", "token_acc")
    minimized_metrics: ClassVar[tuple[str, ...]] = ("bpb",)
    headline_metric: ClassVar[str] = "bpb"
    metric_ranges: ClassVar[dict[str, tuple[float | None, float | None]]] = {
        "bpb": (0, None),
        "token_acc": (0, 1),
        "loss": (0, None),
    }
    weighs: ClassVar[str] = "tokens"
    config_rules: ClassVar[dict[str, Check]] = {
        "sample_tokens": integer(0),  # 0: no sample
        "sample_temperature": number(0),  # 0: the most likely byte each time
        "sample_top_k": integer(1, null=True),  # null: from every byte
        "sample_seed": integer(0, 2**64 - 1),
        "prompt_bytes": integer(1),
    }

    def __init__(
        self,
        sample_tokens: int = 200,
        sample_temperature: float = 0.8,
        sample_top_k: int | None = 40,
        sample_seed: int = 0,
        prompt_bytes: int = 64,
    ) -> None:
        self.sample_tokens, self.sample_temperature, self.sample_top_k = sample_tokens, sample_temperature, sample_top_k
        self.sample_seed, self.prompt_bytes = sample_seed, prompt_bytes

    def to_device(self, batch: tuple[Tensor, Tensor], device: torch.device) -> tuple[Tensor, Tensor]:
        inputs, targets = super().to_device(batch, device)
        return inputs.long(), targets.long()

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)

    def evaluation_loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        real = targets.flatten() != IGNORE
        return F.cross_entropy(outputs.flatten(0, 1).float()[real], targets.flatten()[real], reduction="none")

    def empty_metric_sums(self, device: torch.device) -> Tensor:
        return torch.zeros(4, device=device)  # nats summed over real tokens, right predictions, real tokens, bytes

    def metric_sums(self, outputs: Tensor, targets: Tensor) -> Tensor:
        flat_outputs, flat_targets = outputs.flatten(0, 1).float(), targets.flatten()
        nats = F.cross_entropy(flat_outputs, flat_targets, ignore_index=IGNORE, reduction="sum")
        real = flat_targets != IGNORE
        right = ((flat_outputs.argmax(dim=-1) == flat_targets) & real).sum()
        count = real.sum().float()
        covered = count if self.tokenizer is None else self._token_bytes(targets.device)[flat_targets[real]].sum()
        return torch.stack([nats, right.float(), count, covered])

    def metrics(self, sums: Tensor) -> dict[str, float]:
        nats, right, count, covered = sums.tolist()
        return {"bpb": nats / max(covered, 1) / math.log(2), "token_acc": right / max(count, 1)}

    def _token_bytes(self, device: torch.device) -> Tensor:
        """The bytes each id stands for, on `device`, made once."""
        cached = getattr(self, "_bytes_of_ids", None)
        if cached is None or cached.device != device:
            self._bytes_of_ids = cached = self.tokenizer.token_bytes().to(device)
        return cached

    def predict(self, outputs: Tensor) -> dict[str, Tensor]:
        return {"next_token": outputs.argmax(dim=-1)}

    def sample_for_logging(self, model: nn.Module, shown: tuple[Tensor, Tensor]) -> tuple[str, str] | None:
        """(key, text) for the trackers after each validation: the start of the first validation block and a
        seeded continuation; None when no sample is asked for."""
        if not self.sample_tokens:
            return None
        prompt = shown[0][0, : self.prompt_bytes].tolist()
        continuation = generate(
            model, prompt, self.sample_tokens, self.sample_temperature, self.sample_top_k, self.sample_seed
        )
        return "val/sample", decode(prompt, self.tokenizer) + decode(continuation, self.tokenizer)


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    block_size: int | None = None,
) -> list[int]:
    """`max_new_tokens` ids that continue `prompt`, drawn one at a time (temperature 0: the most likely id).

    A generator seeded by `seed` draws them, so the same weights and seed give the same ids and the global random
    streams are left alone."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    limit = block_size or context_length(model)
    generator = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.tensor([prompt or [ord("\n")]], dtype=torch.long, device=device)  # an empty prompt: a newline
    start = tokens.shape[1]
    for _ in range(max_new_tokens):
        context = tokens if limit is None else tokens[:, -limit:]
        logits = model(context)[:, -1, :].float()
        if temperature <= 0:
            chosen = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                logits = logits.masked_fill(logits < kth, -math.inf)
            chosen = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
        tokens = torch.cat([tokens, chosen], dim=1)
    model.train(was_training)
    return tokens[0, start:].tolist()


def context_length(model: nn.Module) -> int | None:
    """The model's `block_size`, looked up through the wrappers that hide it (AveragedModel, DDP, compile)."""
    while not hasattr(model, "block_size") and isinstance(
        inner := getattr(model, "module", None) or getattr(model, "_orig_mod", None), nn.Module
    ):
        model = inner
    return getattr(model, "block_size", None)


def encode(text: str, tokenizer: Any = None) -> list[int]:
    """Text as the tokenizer's ids, or as its UTF-8 bytes when there is no tokenizer."""
    if tokenizer is None:
        return list(text.encode("utf-8"))
    return tokenizer.encode(text.encode("utf-8")).tolist()


def decode(ids: list[int], tokenizer: Any = None) -> str:
    """Ids as text; without a tokenizer, bytes that are not UTF-8 (a cut character) show as U+FFFD."""
    if tokenizer is None:
        return bytes(ids).decode("utf-8", errors="replace")
    return tokenizer.decode(ids)


def sample_text(
    model: nn.Module,
    prompt: str,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int,
    tokenizer: Any = None,
) -> str:
    """The continuation of `prompt` by `generate`, as text."""
    ids = generate(model, encode(prompt or "\n", tokenizer), max_new_tokens, temperature, top_k, seed)
    return decode(ids, tokenizer)


def writes_text(cfg: Mapping) -> bool:
    """Whether the run's task is a language model, so that eval.py's predict= is a text file to continue."""
    found = get_class(cfg["task"]["_target_"])
    return isinstance(found, type) and issubclass(found, LanguageModel)


def write_samples(model: nn.Module, prompt: str, sample: Mapping, path: Path, tokenizer: Any = None) -> str:
    """Writes the prompt and its seeded continuation to `path` and returns them (`sample`: eval.yaml's sample.*)."""
    continuation = sample_text(
        model, prompt, sample["max_new_tokens"], sample["temperature"], sample["top_k"], sample["seed"], tokenizer
    )
    path.write_text(prompt + continuation, encoding="utf-8")
    return prompt + continuation
