"""data=text: the bytes of a folder of text files, packed into blocks for a language model.

    data=text                                   # the Python standard library's own source (no download)
    data=text data.root=~/corpus data.pattern="*.txt"   # your files: every match below the folder (recursive)

The files are split by file (trainkit.data.stdlib_source.split_by_file: val and test are whole files no
training block comes from), each split's files read as bytes in path order and joined with SEPARATOR
between them (a blank line: a file's last line never runs into the next file's first), and the joined
bytes cut into non-overlapping blocks of `block_size + 1` bytes; the few bytes left at a split's end are
dropped. A block's first `block_size` bytes are the inputs, its last `block_size` the targets (the next
byte of each input): uint8 [N, block_size] both, cast to ids by the task. No padding (pad_id None): every
byte is a real token. The splits live in memory on the device (TensorLoader): each epoch a seeded
shuffle of the training blocks, sharded across ranks.

A stdlib corpus differs from one Python version to another: `source()` puts corpus_version() into the
run's data fingerprint, so a resume under another Python is refused in one line.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from trainkit.data.datasets import Data, Split, Splits
from trainkit.data.stdlib_source import corpus_version, split_by_file, stdlib_files
from trainkit.errors import ConfigError

SEPARATOR = b"\n\n"  # between two files of a split
VOCAB_SIZE = 256  # bytes


@dataclass(kw_only=True)
class TextBlocks(Data):
    block_size: int  # bytes a model sees at once (model.block_size): a block holds one more, the last target
    pattern: str  # which files under data.root (recursive glob); the stdlib default reads its .py files
    val_fraction: float  # of the files (not the bytes)
    test_fraction: float
    split_seed: int

    kind: ClassVar[str] = "tokens"

    def files(self) -> list[Path]:
        """The corpus's files, sorted: the standard library's (data.root null), or those matching data.pattern."""
        if self.root is None:
            return stdlib_files()
        root = Path(self.root).expanduser()
        if not root.is_dir():
            raise ConfigError("data.root", f"'{root}' is not a folder; point data.root at a folder of text files")
        files = sorted(path for path in root.rglob(self.pattern) if path.is_file())
        if not files:
            raise ConfigError(
                "data.pattern", f"no file under '{root}' matches {self.pattern!r}; set data.pattern (e.g. '*.txt')"
            )
        return files

    def source(self) -> str | None:
        """What the data fingerprint records besides the blocks: the Python version of the stdlib corpus."""
        return f"stdlib of {corpus_version()}" if self.root is None else None

    def splits(self) -> Splits:
        files = self.files()
        if len(files) < 3:
            raise ConfigError("data.root", f"holds {len(files)} matching files; the train/val/test split is by file")
        parts = split_by_file(files, self.val_fraction, self.test_fraction, self.split_seed)
        train, val, test = (self.blocks(parts[name], name) for name in ("train", "val", "test"))
        return Splits(train, val, test, num_classes=VOCAB_SIZE)

    def blocks(self, files: list[Path], split: str) -> Split:
        """(inputs, targets), uint8 [N, block_size] each, from `files` joined by SEPARATOR."""
        joined = SEPARATOR.join(path.read_bytes() for path in files)
        span = self.block_size + 1
        count = len(joined) // span
        if count == 0:
            more = f"raise data.{split}_fraction" if split != "train" else "lower data.val_fraction, test_fraction"
            raise ConfigError(
                "data.block_size",
                f"{self.block_size} + 1 bytes is more than the {split} split's {len(joined)} bytes "
                f"({len(files)} files); lower data.block_size (and model.block_size) or {more}",
            )
        packed = torch.frombuffer(bytearray(joined[: count * span]), dtype=torch.uint8).view(count, span)
        return packed[:, :-1].clone(), packed[:, 1:].clone()
