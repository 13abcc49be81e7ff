"""`model=sequence`: a small classifier of token sequences (trainkit.data.text: bytes as tokens, 0 pads).

Embedding (padding_idx=pad_id) plus learned positions, a small Transformer encoder (nn.TransformerEncoder,
batch_first, pre-norm) that attends to the real tokens alone (src_key_padding_mask), the mean over the real
tokens of each sequence, a linear head. Inputs int64 [B, T]; outputs logits [B, num_classes]. Attention costs
T^2 a sequence, padding included: batches by a token budget (data.max_tokens) pad little and save most of it.
"""

from collections.abc import Iterator, Mapping
from typing import ClassVar

import torch
from torch import nn

from trainkit.config.schema import Check, integer


def token_ids() -> torch.Tensor:
    """One sequence of 8 token ids: what a model of token sequences takes (its `example_input`, docs/models.md)."""
    return torch.zeros(1, 8, dtype=torch.int64)


class SequenceClassifier(nn.Module):
    config_rules: ClassVar[dict[str, Check]] = {  # what each argument may hold (the config check reads it)
        "vocabulary": integer(2, null=True),  # null until the data's tokenizer fills data.vocabulary in
        "max_length": integer(1),
        "width": integer(1),
        "depth": integer(1),
        "heads": integer(1),
        "feedforward": integer(1),
        "pad_id": integer(0, null=True),  # likewise data.pad_id
    }

    @staticmethod
    def config_problems(max_length: int, data: Mapping) -> Iterator[tuple[str, str]]:
        """A position a token: the data's longest sequence (data.max_length) needs as many (the config check
        asks this, trainkit.config.validation, before any directory or model exists)."""
        if isinstance(data.get("max_length"), int) and max_length < data["max_length"]:
            yield (
                "model.max_length",
                f"is {max_length}, below data.max_length={data['max_length']}: the model has no position for the "
                f"tokens beyond; set model.max_length=${{data.max_length}}",
            )

    def __init__(
        self,
        vocabulary: int,
        num_classes: int,
        max_length: int,
        width: int = 64,
        depth: int = 2,
        heads: int = 4,
        feedforward: int = 128,
        dropout: float = 0.0,
        pad_id: int = 0,
    ):
        super().__init__()
        self.pad_id = pad_id
        self.embedding = nn.Embedding(vocabulary, width, padding_idx=pad_id)
        self.positions = nn.Parameter(torch.randn(max_length, width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            width, heads, feedforward, dropout, activation="gelu", batch_first=True, norm_first=True
        )
        # enable_nested_tensor=False: the same kernels with and without padding (a fair budget benchmark, no warning)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(width, num_classes))

    example_input = staticmethod(token_ids)  # what forward takes

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        padding = tokens == self.pad_id  # [B, T], True where there is no token
        x = self.embedding(tokens) + self.positions[: tokens.shape[1]]
        # An empty text masks every key, and attention over none is NaN (then the loss, and the run stops): its
        # first position attends to itself instead; the mean below still counts no token of it.
        attend = padding.clone()
        attend[:, 0] &= ~padding.all(dim=1)
        x = self.norm(self.encoder(x, src_key_padding_mask=attend))
        real = (~padding).unsqueeze(-1).to(x.dtype)
        pooled = (x * real).sum(1) / real.sum(1).clamp(min=1)  # the mean over real tokens (an empty text: zeros)
        return self.head(pooled)
