"""Text as token sequences: `data=textfolder` (your own text files, one class per folder) and TextData, what every
text classification option shares (the tokenizer, the padding id, the collate, data.max_length and max_tokens).

The listing reads every file once, so a file that is not UTF-8 stops the run before its first update, and the sizes
it finds are what the token budget batches by. A batch pads to its longest sequence: inputs int64 [B, T], labels
int64 [B]. The layout and the rules: docs/data.md#your-own-text-datatextfolder.
"""

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from omegaconf import ListConfig
from torch.utils.data import Dataset

from trainkit.config.schema import Check, flag, integer, show
from trainkit.data.class_folders import (
    _check_root,
    _check_same_classes,
    _class_folders,
    class_files,
    class_folder_splits,
)
from trainkit.data.file_data import BadFile, FileData, FileSplits
from trainkit.data.tokenizing import ByteTokens, Tokenized, Tokens, tokenizer_problems
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

PAD_ID = 0  # the padding token; byte b is token b + 1
VOCABULARY = 257  # 256 bytes and the padding token
TEXT_EXTENSIONS = (".txt",)


@dataclass(frozen=True)
class BadTextFile(BadFile):
    """A file that is not UTF-8 (or cannot be read), set aside in the worker like an unreadable image."""

    def error(self) -> ConfigError:
        return ConfigError(
            "data.root",
            f"cannot read text file '{self.path}' ({self.reason}); save it as UTF-8, remove it, "
            f"or pass data.skip_bad_files=true to skip it (counted in the log)",
        )


@dataclass(kw_only=True)
class TextData(FileData, Tokenized):
    """The keys and the collate of every text classification option."""

    max_length: int  # longer texts are cut, with a count in the log
    max_tokens: int | None = None  # null: batches of data.batch_size
    pad_id: int | None = None  # null: the tokenizer's

    kind: ClassVar[str] = "tokens"
    size_unit: ClassVar[str] = "tokens"
    suits: ClassVar[tuple[str, ...]] = ("model=sequence", "model=hf")
    prediction_files: ClassVar[tuple[str, ...]] = TEXT_EXTENSIONS
    config_rules: ClassVar[dict[str, Check]] = {
        **FileData.config_rules,
        **Tokenized.config_rules,
        "pad_id": integer(0, null=True),
        "max_length": integer(1),  # bytes (tokens) a sequence keeps
    }

    @staticmethod
    def config_problems(
        max_length: int, max_tokens: int | None, tokenizer: str, vocab_size: int
    ) -> Iterator[tuple[str, str]]:
        """A sequence cut at data.max_length must fit a batch of data.max_tokens; data.tokenizer must name one."""
        if max_tokens is not None and max_tokens < max_length:
            yield (
                "data.max_tokens",
                f"is {max_tokens}, below data.max_length={max_length}: a long sequence would fit no batch; "
                f"set data.max_tokens to at least {max_length}",
            )
        yield from tokenizer_problems(tokenizer, vocab_size)

    def make_tokenizer(self, training_texts: Callable[[], Iterable[bytes]]) -> Tokens:
        tokens = super().make_tokenizer(training_texts)
        if self.pad_id is not None and self.pad_id != tokens.pad_id:
            raise ConfigError(
                "data.pad_id",
                f"is {self.pad_id}, but data.tokenizer={self.tokenizer} pads with {tokens.pad_id}; set "
                f"data.pad_id=null (the tokenizer's)",
            )
        return tokens

    def collate(self, items: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.tokens is not None and self.tokens.pad_id is not None, "splits() made a tokenizer that pads"
        return pad_to_longest(items, self.tokens.pad_id)

    def item_sizes(self, dataset: Dataset) -> Sequence[int] | None:
        return getattr(dataset, "lengths", None)  # a text's tokens, cut at data.max_length

    def read_for_prediction(self, path: Path) -> list[torch.Tensor]:
        """A predict= file as one sample: its tokens cut at data.max_length, as the splits read a text (the tokenizer
        made first: eval.py's runs_data)."""
        assert self.tokens is not None, "read_learned() made the run's tokenizer"
        return [self.tokens.encode_cut([utf8_bytes(path)], self.max_length)[0][0]]

    def prediction_batch(self, samples: list[Any]) -> tuple[torch.Tensor, None]:
        """predict= texts padded to the longest, as a batch without targets."""
        inputs, _ = self.collate([(ids, 0) for ids in samples])
        return inputs, None

    def class_names(self) -> list[str]:
        """The class names in label order; [] where the data has none."""
        return []


def pad_to_longest(items: list[tuple[torch.Tensor, int]], pad_id: int = PAD_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """(int64 [B, longest] tokens padded with `pad_id`, int64 [B] labels) of (tokens, label) items."""
    longest = max(1, max(len(tokens) for tokens, _ in items))  # an empty text still makes a column
    inputs = torch.full((len(items), longest), pad_id, dtype=torch.int64)
    for row, (tokens, _) in enumerate(items):
        inputs[row, : len(tokens)] = tokens
    return inputs, torch.tensor([label for _, label in items], dtype=torch.int64)


def tokens_of(text: bytes) -> torch.Tensor:
    """Byte b as token b + 1 (int64): PAD_ID (0) never stands for a byte (data.tokenizer=bytes)."""
    return BYTE_TOKENS.encode(text)


BYTE_TOKENS = ByteTokens(offset=1)


def report_truncated(lengths: list[int], max_length: int, where: str, unit: str = "bytes") -> None:
    """Logs how many texts data.max_length cuts, so that no cut is silent."""
    cut = sum(length > max_length for length in lengths)
    if cut:
        log.info(
            "%s: %d of %d texts are longer than data.max_length=%d %s and are cut to it (longest: %d)",
            where,
            cut,
            len(lengths),
            max_length,
            unit,
            max(lengths),
        )


def token_lengths(tokens: Tokens, texts: list[bytes], max_length: int, where: str) -> list[int]:
    """Each text's tokens, cut at max_length; bytes are counted without encoding."""
    unit = "bytes" if isinstance(tokens, ByteTokens) else "tokens"
    lengths = [len(text) for text in texts] if unit == "bytes" else [len(ids) for ids in tokens.encode_many(texts)]
    report_truncated(lengths, max_length, where, unit)
    return [min(length, max_length) for length in lengths]


def report_majority(datasets: dict[str, Any], class_names: list[str]) -> None:
    """Logs the test split's majority-class accuracy, the bar a classifier must clear."""
    labels = torch.tensor([label for _, label in datasets["test"].samples], dtype=torch.int64)
    counts = torch.bincount(labels, minlength=len(class_names))
    log.info(
        "test split: majority class %s, %d of %d texts: majority-class accuracy %.3f (the bar to clear)",
        class_names[int(counts.argmax())],
        int(counts.max()),
        len(labels),
        float(counts.max()) / max(1, len(labels)),
    )


def utf8_bytes(path: str | Path) -> bytes:
    """The file's bytes; raises OSError or UnicodeDecodeError, since replacing bytes would change the text."""
    text = Path(path).read_bytes()
    text.decode("utf-8")
    return text


def read_utf8(path: str, skip: bool) -> bytes | BadTextFile:
    """The file's bytes, or a BadTextFile when they are not UTF-8 or cannot be read."""
    try:
        return utf8_bytes(path)
    except (OSError, UnicodeDecodeError) as error:
        return BadTextFile(path, f"{type(error).__name__}: {error}", skip)


class TextFileDataset(Dataset):
    """`(path, label)` samples that read as `(int64 tokens, label)`, or as a BadTextFile. `lengths` is what the
    token budget batches by."""

    def __init__(
        self, samples: list[tuple[str, int]], lengths: list[int], skip_bad_files: bool, tokens: Tokens = BYTE_TOKENS
    ):
        self.samples = samples
        self.lengths = torch.tensor(lengths, dtype=torch.int64)
        self.skip_bad_files = skip_bad_files
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int] | BadTextFile:
        path, label = self.samples[index]
        text = read_utf8(path, self.skip_bad_files)
        if isinstance(text, BadTextFile):
            return text
        # A file grown since the listing must still fit the batch it was budgeted for.
        length = int(self.lengths[index])
        if isinstance(self.tokens, ByteTokens):  # cut before encoding: the bytes are the tokens
            return self.tokens.encode(text[:length]), label
        return self.tokens.encode_cut([text], length)[0][0], label


def class_folder_list(value: object) -> str | None:
    """data.class_folders: null (every folder under train/) or at least two folder names, each once (a name twice
    would list its files under two labels). Whether they are folders of train/ is the data's to say."""
    if value is None:
        return None
    if isinstance(value, ListConfig) and len(value) >= 2 and all(isinstance(n, str) for n in value):
        repeated = sorted({name for name in value if list(value).count(name) > 1})
        if repeated:
            return f"names {', '.join(repeated)} more than once, got {show(value)}; name each class folder once"
        return None
    return f"must be null (every folder under train/) or a list of at least two folder names, got {show(value)}"


@dataclass(kw_only=True)
class TextFolder(TextData):
    """The `data=textfolder` option (conf/data/textfolder.yaml)."""

    val_fraction: float
    test_fraction: float
    split_seed: int
    class_folders: list[str] | None = None  # null: every folder under train/
    skip_bad_files: bool = False

    needs_root: ClassVar[str] = "a folder holding train/<class>/<files>.txt"
    config_rules: ClassVar[dict[str, Check]] = {
        **TextData.config_rules,
        "class_folders": class_folder_list,
        "skip_bad_files": flag(),
    }

    def splits(self) -> FileSplits:
        assert self.root is not None, "the config check requires data.root (needs_root)"
        root = _check_root(self.root, "<files>.txt")
        classes = self._classes(root / "train")
        listed = class_folder_splits(
            root,
            classes,
            lambda folder, allow_empty: _list_texts(folder, classes, allow_empty, self.skip_bad_files),
            None
            if self.class_folders is not None
            else lambda folder: _check_same_classes(folder, classes, "data.class_folders"),
            {"val": self.val_fraction, "test": self.test_fraction},
            self.split_seed,
            "files",
            self,
        )
        tokens = self.make_tokenizer(lambda: (Path(path).read_bytes() for path, _, _ in listed["train"]))
        every = [item for split in listed.values() for item in split]
        if isinstance(tokens, ByteTokens):  # the sizes listed are the tokens: no file read again
            lengths = [min(size, self.max_length) for _, _, size in every]
            report_truncated([size for _, _, size in every], self.max_length, str(root))
        else:
            lengths = token_lengths(
                tokens, [Path(path).read_bytes() for path, _, _ in every], self.max_length, str(root)
            )
        datasets, start = {}, 0
        for split, items in listed.items():
            split_lengths, start = lengths[start : start + len(items)], start + len(items)
            datasets[split] = TextFileDataset(
                [(path, label) for path, label, _ in items], split_lengths, self.skip_bad_files, tokens
            )
        report_majority(datasets, classes)
        return FileSplits(datasets["train"], datasets["val"], datasets["test"], num_classes=len(classes))

    def class_names(self) -> list[str]:
        assert self.root is not None, "the config check requires data.root (needs_root)"
        return self._classes(Path(self.root).expanduser() / "train")

    def _classes(self, train: Path) -> list[str]:
        found = _class_folders(train)
        classes = found if self.class_folders is None else list(self.class_folders)
        absent = [name for name in classes if name not in found]
        if absent:
            raise ConfigError(
                "data.class_folders",
                f"names {', '.join(absent)}, not a folder of '{train}' (its folders: {', '.join(found)}); "
                "name class folders of train/",
            )
        if len(classes) < 2:
            raise ConfigError(
                "data.root",
                f"'{train}' has {len(classes)} class folder(s) {classes}; classification needs at least two: "
                "put each class's text files in its own train/<class>/ folder",
            )
        return classes


def _list_texts(
    folder: Path, classes: list[str], allow_empty_classes: bool, skip_bad_files: bool
) -> list[tuple[str, int, int]]:
    """(path, label, size in bytes) of the text files in each class folder of `folder`, sorted per class, each file
    read once."""
    from tqdm import tqdm

    kind = ("text files", "non-text entries")
    listed = class_files(folder, classes, TEXT_EXTENSIONS, TEXT_EXTENSIONS, kind, allow_empty_classes)
    shown = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    texts, bad = [], []
    for path, label in tqdm(listed, f"checking {folder}", unit="file", delay=1, leave=False, disable=not shown):
        text = read_utf8(path, skip_bad_files)
        if isinstance(text, BadTextFile):
            if not skip_bad_files:
                raise text.error()
            bad.append(text)
        else:
            texts.append((path, label, len(text)))
    if bad:
        log.warning(
            f"'{folder}': skipped {len(bad)} of {len(listed)} text files that are not UTF-8 "
            f"(data.skip_bad_files=true), e.g. {', '.join(repr(file.path) for file in bad[:3])}; "
            f"first error: {bad[0].reason}"
        )
    lost = [classes[label] for label in sorted({label for _, label in listed} - {label for _, label, _ in texts})]
    if (lost and not allow_empty_classes) or not texts:  # a split that lacks a class otherwise: class_folder_splits
        raise ConfigError(
            "data.root", f"'{folder}': every text file of {', '.join(lost)} is not UTF-8 (skipped); save them as UTF-8"
        )
    return texts


class TextDataset(Dataset):
    """Texts held in memory with a label each, read as `(int64 tokens, label)` items cut at max_length."""

    def __init__(
        self, texts: list[bytes], samples: list[tuple[str, int]], max_length: int, tokens: Tokens = BYTE_TOKENS
    ):
        self.samples = samples
        self.tokens = tokens
        self.unit = "bytes" if isinstance(tokens, ByteTokens) else "tokens"
        self.texts: list
        if isinstance(tokens, ByteTokens):
            self.texts, self.full_lengths = [text[:max_length] for text in texts], [len(text) for text in texts]
        else:  # full_lengths: before the cut, report_truncated's
            self.texts, self.full_lengths = tokens.encode_cut(texts, max_length)
        self.lengths = torch.tensor([len(text) for text in self.texts], dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        text = self.texts[index]
        return self.tokens.encode(text) if isinstance(text, bytes) else text, self.samples[index][1]
