"""`data.tokenizer`, what every text option's tokens are: bytes (the default), or a BPE learned from the training
split or a local tokenizer folder (trainkit.data.tokenizer_library, reached from the lines marked hf;
docs/data.md#tokenizers-datatokenizer).
"""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import torch

from trainkit.config.schema import Check, integer, string
from trainkit.data.datasets import Data
from trainkit.data.tokenizer_library import library_tokenizer_problems, library_tokens  # feature: hf
from trainkit.errors import ConfigError

BYTES = "bytes"


class ByteTokens:
    """One token per byte: byte b is id b + `offset` (offset 1 leaves id 0 for padding)."""

    name = BYTES

    def __init__(self, offset: int):
        self.offset = offset
        self.vocabulary = 256 + offset
        self.pad_id = 0 if offset else None

    def encode(self, text: bytes) -> torch.Tensor:
        if not text:
            return torch.zeros(0, dtype=torch.int64)
        return torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.int64) + self.offset

    def encode_many(self, texts: list[bytes]) -> list[torch.Tensor]:
        return [self.encode(text) for text in texts]

    def encode_cut(self, texts: list[bytes], max_length: int) -> tuple[list[torch.Tensor], list[int]]:
        """Every text's first max_length ids, and each text's uncut length."""
        return [self.encode(text[:max_length]) for text in texts], [len(text) for text in texts]

    def decode(self, ids: list[int]) -> str:
        """The ids as text, padding left out; a cut character shows as U+FFFD."""
        return bytes(i - self.offset for i in ids if 0 <= i - self.offset < 256).decode("utf-8", errors="replace")

    def token_bytes(self) -> torch.Tensor:
        """The bytes each id stands for: 1, and 0 for padding."""
        counts = torch.ones(self.vocabulary)
        counts[: self.offset] = 0
        return counts

    def fingerprint(self) -> str | None:
        return None  # keeps the fingerprint of runs from before tokenizers


class Tokens(Protocol):
    """What a text option's tokenizer does: ByteTokens, or trainkit.data.tokenizer_library's TextTokens."""

    name: str
    vocabulary: int
    pad_id: int | None

    def encode(self, text: bytes) -> torch.Tensor: ...

    def encode_many(self, texts: list[bytes]) -> list[torch.Tensor]: ...

    def encode_cut(self, texts: list[bytes], max_length: int) -> tuple[list[torch.Tensor], list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...

    def token_bytes(self) -> torch.Tensor: ...

    def fingerprint(self) -> str | None: ...


def tokenizer_problems(tokenizer: str, vocab_size: int) -> Iterator[tuple[str, str]]:
    """What the config check asks of data.tokenizer and data.vocab_size: bytes, or what the lines marked hf add."""
    problems = [] if tokenizer == BYTES else [("data.tokenizer", f"is {tokenizer!r}; give bytes (a token per byte)")]
    problems = [] if tokenizer == BYTES else list(library_tokenizer_problems(tokenizer, vocab_size))  # feature: hf
    yield from problems


def text_tokenizer(
    spec: str,
    vocab_size: int,
    offset: int,
    training_texts: Callable[[], Iterable[bytes]] | None,
    saved_in: Path | None,
    needs_padding: bool,
) -> Tokens:
    """The tokenizer data.tokenizer names: bytes, or a BPE or tokenizer folder (trainkit.data.tokenizer_library)."""
    tokens: Tokens | None = ByteTokens(offset) if spec == BYTES else None
    tokens = tokens or library_tokens(spec, vocab_size, training_texts, saved_in, needs_padding)  # feature: hf
    if tokens is None:
        raise ConfigError("data.tokenizer", f"is {spec!r}; give bytes (a token per byte)")
    return tokens


@dataclass(kw_only=True)
class Tokenized(Data):
    """The keys of every text option's tokens and the tokenizer they make, which splits() builds."""

    tokenizer: str = BYTES  # bytes | bpe | a local tokenizer folder
    vocab_size: int = 8192  # tokenizer=bpe only
    vocabulary: int | None = None  # null: the tokenizer's
    tokens: Tokens | None = field(default=None, init=False, repr=False)
    saved_in: Path | None = field(default=None, init=False, repr=False)
    trains: bool = field(default=True, init=False, repr=False)  # eval.py: bpe is read back

    byte_offset: ClassVar[int] = 1  # bytes: byte b is id b + 1 (0 pads); data=text: 0
    pads: ClassVar[bool] = True
    config_rules: ClassVar[dict[str, Check]] = {
        "tokenizer": string(),
        "vocab_size": integer(1),
        "vocabulary": integer(1, null=True),
    }

    def make_tokenizer(self, training_texts: Callable[[], Iterable[bytes]]) -> Tokens:
        """data.tokenizer's tokenizer; a bpe learns from `training_texts()` unless it was saved."""
        self.tokens = text_tokenizer(
            self.tokenizer,
            self.vocab_size,
            self.byte_offset,
            training_texts if self.trains else None,
            self.saved_in,
            self.pads,
        )
        if self.vocabulary is not None and self.vocabulary != self.tokens.vocabulary:
            raise ConfigError(
                "data.vocabulary",
                f"is {self.vocabulary}, but data.tokenizer={self.tokenizer} has {self.tokens.vocabulary} ids; set "
                f"data.vocabulary=null (the tokenizer's)",
            )
        return self.tokens

    def learns_in(self, run_dir: Path | None, learns: bool = True) -> None:
        self.saved_in, self.trains = run_dir, learns

    def read_learned(self, run_dir: Path | None) -> None:
        self.learns_in(run_dir, learns=False)
        self.make_tokenizer(list)

    def learned(self) -> Tokens | None:
        return self.tokens

    def padding_id(self) -> int | None:
        """The id batches pad with (None: they do not pad)."""
        return self.tokens.pad_id if self.pads and self.tokens is not None else None
