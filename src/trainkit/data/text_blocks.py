"""data=text: the bytes of a folder of text files (by default the Python standard library's), packed into blocks
of block_size + 1 tokens for a language model: a block's first block_size tokens are the inputs, its last the
targets. How the files are split and joined: docs/data.md#text-for-a-language-model-datatext.
"""

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

from trainkit.config.schema import Check, flag, integer, string
from trainkit.data.class_folders import is_hidden
from trainkit.data.datasets import Split, Splits
from trainkit.data.fingerprint import digest_of
from trainkit.data.stdlib_source import corpus_version, stdlib_files
from trainkit.data.text import BadTextFile, read_utf8
from trainkit.data.tokenizing import ByteTokens, Tokenized, Tokens, tokenizer_problems
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

SEPARATOR = b"\n\n"  # between two files of a split


@dataclass(kw_only=True)
class TextBlocks(Tokenized):
    block_size: int  # model.block_size
    pattern: str  # a recursive glob under data.root
    val_fraction: float  # of the bytes, in whole files
    test_fraction: float
    split_seed: int
    skip_bad_files: bool = False
    texts_read: dict = field(default_factory=dict, init=False, repr=False)

    kind: ClassVar[str] = "tokens"
    size_unit: ClassVar[str] = "tokens"
    byte_offset: ClassVar[int] = 0  # a byte is its own id
    pads: ClassVar[bool] = False
    suits: ClassVar[tuple[str, ...]] = ("model=gpt", "task=language_model")
    config_rules: ClassVar[dict[str, Check]] = {
        **Tokenized.config_rules,
        "block_size": integer(1),  # the model's context
        "pattern": string(),  # a recursive glob under data.root
        "skip_bad_files": flag(),
    }

    @staticmethod
    def config_problems(tokenizer: str, vocab_size: int) -> Iterator[tuple[str, str]]:
        yield from tokenizer_problems(tokenizer, vocab_size)

    def files(self) -> tuple[list[Path], int]:
        """The corpus's files, sorted, and how many hidden ones were left out."""
        if self.root is None:
            return stdlib_files(), 0
        root = Path(self.root).expanduser()
        if not root.is_dir():
            raise ConfigError("data.root", f"'{root}' is not a folder; point data.root at a folder of text files")
        matched = sorted(path for path in root.rglob(self.pattern) if path.is_file())
        files = [path for path in matched if not is_hidden(path, root)]
        if not files:
            raise ConfigError(
                "data.pattern",
                f"no file under '{root}' matches {self.pattern!r}"
                + (f" but {len(matched)} hidden one(s) (never read)" if matched else "")
                + "; set data.pattern (e.g. '*.txt')",
            )
        return files, len(matched) - len(files)

    def identity(self, made: Splits) -> dict:
        """The texts read, in no order, since another fold cuts other blocks from the same texts."""
        return {**self.texts_read, "classes": None}

    def source(self) -> str | None:
        """The Python version of the stdlib corpus, which changes with it."""
        return f"stdlib of {corpus_version()}" if self.root is None else None

    def splits(self) -> Splits:
        files, hidden = self.files()
        texts, skipped = self.read(files)
        self.texts_read = {
            "texts": len(texts),
            "digest": digest_of(sorted(hashlib.sha256(t).hexdigest() for t in texts)),
        }
        if len(texts) < 3:
            raise ConfigError(
                "data.root",
                f"'{self.root}' holds {len(texts)} readable file(s) matching {self.pattern!r}; the train/val/test "
                "split is by whole files and needs at least 3",
            )
        parts = split_by_bytes(
            [len(text) for text in texts], {"test": self.test_fraction, "val": self.val_fraction}, self.split_seed
        )
        folded = self.cut_val(
            {name: torch.tensor(indices, dtype=torch.int64) for name, indices in parts.items()}, self.split_seed
        )
        held = {name: [texts[i] for i in folded[name].tolist()] for name in ("train", "val", "test")}
        tokens = self.make_tokenizer(lambda: held["train"])
        made = {name: self.blocks(split_texts, name, tokens) for name, split_texts in held.items()}
        where = f"'{self.root}'" if self.root is not None else f"the {corpus_version()} standard library"
        left_out = f"; ignored {hidden} hidden files" if hidden else ""
        if skipped:
            named = ", ".join(skipped[:3]) + (", ..." if len(skipped) > 3 else "")
            left_out += f"; skipped {len(skipped)} files that are not UTF-8 (data.skip_bad_files=true): {named}"
        log.info(
            "text corpus %s, split by bytes (data.split_seed=%d): %s%s%s",
            where,
            self.split_seed,
            "; ".join(
                f"{name} {len(held[name])} files, {sum(map(len, held[name])):,} bytes, {len(made[name][0]):,} blocks"
                for name in made
            ),
            left_out,
            "" if isinstance(tokens, ByteTokens) else f"; blocks of {self.block_size} + 1 tokens of {tokens.name}",
        )
        return Splits(made["train"], made["val"], made["test"], num_classes=tokens.vocabulary)

    def read(self, files: list[Path]) -> tuple[list[bytes], list[str]]:
        """The bytes of each file that is UTF-8, in order, and the paths left out (data.skip_bad_files)."""
        texts, skipped = [], []
        for path in files:
            text = read_utf8(str(path), self.skip_bad_files)
            if not isinstance(text, BadTextFile):
                texts.append(text)
            elif text.skip:
                skipped.append(text.path)
            else:
                raise text.error()
        return texts, skipped

    def blocks(self, texts: list[bytes], split: str, tokens: Tokens) -> Split:
        """(inputs, targets) [N, block_size] each, from `texts` joined by SEPARATOR: uint8 bytes or int32 ids."""
        span = self.block_size + 1
        if isinstance(tokens, ByteTokens):
            joined = SEPARATOR.join(texts)
            count = len(joined) // span
            ids = torch.frombuffer(bytearray(joined[: count * span]), dtype=torch.uint8) if count else None
        else:
            separator, *files = tokens.encode_many([SEPARATOR, *texts])
            parts = [part for index, file in enumerate(files) for part in ((separator, file) if index else (file,))]
            every = torch.cat(parts).to(torch.int32)
            count = len(every) // span
            ids = every[: count * span]
        if ids is None or count == 0:
            more = f"raise data.{split}_fraction" if split != "train" else "lower data.val_fraction, test_fraction"
            unit = "bytes" if isinstance(tokens, ByteTokens) else "tokens"
            raise ConfigError(
                "data.block_size",
                f"{self.block_size} + 1 {unit} is more than the {split} split's {sum(map(len, texts))} bytes "
                f"({len(texts)} files) hold; lower data.block_size (and model.block_size) or {more}",
            )
        packed = ids.view(count, span)
        return packed[:, :-1].clone(), packed[:, 1:].clone()


def split_by_bytes(sizes: list[int], fractions: dict[str, float], seed: int) -> dict[str, list[int]]:
    """Sorted indices of the files (of `sizes` bytes) of each split in `fractions`, and "train" for the rest.

    In an order drawn from `seed`, each file goes to the split with the most room left that it fits in, else to
    train, so that no split exceeds its share and one big file never becomes a split on its own."""
    order = torch.randperm(len(sizes), generator=torch.Generator().manual_seed(seed)).tolist()
    total = sum(sizes)
    room = {name: round(fraction * total) for name, fraction in fractions.items()}
    parts: dict[str, list[int]] = {name: [] for name in (*fractions, "train")}
    for index in order:
        fits = [name for name in fractions if sizes[index] <= room[name]]
        name = max(fits, key=lambda split: room[split] / fractions[split], default="train")
        parts[name].append(index)
        if name in room:
            room[name] -= sizes[index]
    for name, fraction in fractions.items():
        if not parts[name]:
            raise ConfigError(
                f"data.{name}_fraction",
                f"{fraction} of the corpus's {total:,} bytes ({round(fraction * total):,}) holds no whole file "
                f"(the smallest has {min(sizes):,} bytes; a split is whole files); raise it, or split the corpus "
                f"into smaller files",
            )
    return {name: sorted(indices) for name, indices in parts.items()}
