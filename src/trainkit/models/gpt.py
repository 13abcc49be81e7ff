"""A small decoder-only Transformer (GPT) over bytes, written for the template, nanoGPT-style.

    model = GPT(vocab_size=256, block_size=128, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    logits = model(tokens)                  # tokens [B, T] int (T <= block_size) -> logits [B, T, vocab_size]

Pre-norm blocks (LayerNorm, causal self-attention through F.scaled_dot_product_attention with is_causal=True: flash or
memory-efficient kernels where the device has them; LayerNorm, a 4x GELU MLP), learned position embeddings, and the
output layer tied to the token embedding. Weights start at N(0, 0.02), the residual projections (attention and MLP
outputs) at 0.02 / sqrt(2 * n_layer) so the residual stream does not grow with depth (GPT-2). `no_weight_decay()` names
the embeddings, norms and biases for trainkit.optim's groups: AdamW decays the matrices alone. FSDP shards one `Block` a
unit (distributed.blocks=[Block]).
"""

import math
from collections.abc import Iterator, Mapping
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trainkit.config.schema import Check, integer


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.proj = nn.Linear(n_embd, n_embd, bias=bias)  # a residual projection: initialized small
        self.proj_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = (
            part.view(batch, length, self.n_head, width // self.n_head).transpose(1, 2)
            for part in self.qkv(x).split(width, dim=2)
        )
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self.proj_dropout(self.proj(y.transpose(1, 2).reshape(batch, length, width)))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.proj = nn.Linear(4 * n_embd, n_embd, bias=bias)  # a residual projection: initialized small
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """x + attention(norm(x)), then x + mlp(norm(x)): one FSDP shard unit."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(n_embd, bias=bias)
        self.attention = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.norm2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    # What each argument may hold, and below what they must agree on: the config check (trainkit.config.validation)
    # reads both from the class, before any directory or model exists.
    config_rules: ClassVar[dict[str, Check]] = {"n_layer": integer(1), "n_head": integer(1), "n_embd": integer(1)}

    @staticmethod
    def config_problems(n_embd: int, n_head: int, block_size: int, data: Mapping) -> Iterator[tuple[str, str]]:
        """Its width splits into equal heads, and its context is data=text's block (block_size follows
        data.block_size unless set apart): the config check asks this (trainkit.config.validation) with
        the model option's values, before any directory or model exists."""
        if n_head > 0 and n_embd % n_head:
            yield "model.n_embd", f"is {n_embd}, not divisible by model.n_head={n_head}: each head takes an equal share"
        if isinstance(data.get("block_size"), int) and block_size != data["block_size"]:
            yield (
                "model.block_size",
                f"is {block_size}, but data.block_size is {data['block_size']}: the model's context is the data's "
                f"block; set data.block_size={block_size} (model.block_size follows it)",
            )

    def __init__(
        self,
        vocab_size: int = 256,
        block_size: int = 128,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"GPT: n_embd={n_embd} is not divisible by n_head={n_head}")
        self.vocab_size, self.block_size, self.n_layer, self.n_head, self.n_embd = (
            vocab_size,
            block_size,
            n_layer,
            n_head,
            n_embd,
        )
        self.token_embedding = nn.Embedding(vocab_size, n_embd)
        self.position_embedding = nn.Embedding(block_size, n_embd)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.norm = nn.LayerNorm(n_embd, bias=bias)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # tied: one matrix reads and writes bytes
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("proj.weight"):  # the residual projections (GPT-2)
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    @staticmethod
    def example_input(block_size: int) -> Tensor:  # what forward takes (docs/models.md): ids
        return torch.zeros(1, min(8, block_size), dtype=torch.int64)

    def forward(self, tokens: Tensor) -> Tensor:
        length = tokens.shape[1]
        if length > self.block_size:
            raise ValueError(f"GPT: a sequence of {length} tokens is longer than model.block_size={self.block_size}")
        positions = torch.arange(length, device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def no_weight_decay(self) -> list[str]:
        """Names (fnmatch patterns) trainkit.optim leaves undecayed: the embeddings (the tied output layer
        is the token embedding's parameter), every norm and every bias."""
        return ["token_embedding.*", "position_embedding.*", "*norm*", "*.bias"]

    def num_parameters(self, non_embedding: bool = True) -> int:
        """Parameters, the tied output layer once; without the position embedding (nanoGPT's count for FLOPs)."""
        total = sum(param.numel() for param in self.parameters())
        return total - self.position_embedding.weight.numel() if non_embedding else total

    def flops_per_token(self) -> float:
        """Training FLOPs a token (forward and backward), nanoGPT's estimate (PaLM, appendix B):
        6 N for the weights and 12 L H Q T for attention, at the full block length T."""
        head_width = self.n_embd // self.n_head
        return 6 * self.num_parameters() + 12 * self.n_layer * self.n_head * head_width * self.block_size
