"""`data=hf`: text classification from a Hugging Face `datasets` dataset, read from local files.

    data=hf data.path=reviews.jsonl                 # one file: .csv, .json/.jsonl, .parquet (or .txt, with no labels)
    data=hf data.path=reviews/                      # a folder of such files: train.*, validation.*, test.* are splits
    data=hf data.path=saved/                        # a folder written by Dataset(Dict).save_to_disk
    data=hf data.path=imdb                          # a hub name: downloaded by `datasets` (online users only)

`data.text_column` holds the text, `data.label_column` the class: the names of a ClassLabel feature, else the
sorted values found (strings or numbers) are the classes in label order. The dataset's own train split, and its
validation (or val, valid, dev) and test splits where it has them; a missing one is carved from train by
data.val_fraction / data.test_fraction and data.split_seed, stratified by class (trainkit.data.datasets.carve, as a
text folder carves). Every split is tokenized by data.tokenizer (trainkit.data.tokenizing: bytes, a BPE learned
from the training split, a local tokenizer folder) with `datasets.map`, which caches the tokens beside the dataset's
cache (data.cache_dir): a second run with the same tokenizer reads them back. Texts are cut at data.max_length
tokens (the log says how many); DataLoader workers read the tokenized rows, batched by data.batch_size or a token
budget (data.max_tokens), padded to the longest with the tokenizer's padding id.

The data fingerprint names the files read (each with its size and a digest of its bytes, trainkit.data.identity) and
each split's rows and labels in order: a resume on other files, other words in them, or other rows, is refused.
`datasets` is imported in splits() alone, never by --help or a config error.
"""

import functools
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.utils.data import Dataset

from trainkit.data.datasets import FileSplits, Folds, Splits, carve
from trainkit.data.imagefolder import is_hidden
from trainkit.data.text import TextData, report_majority, report_truncated
from trainkit.data.tokenizing import Tokens
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}
SPLIT_NAMES = {"train": ("train",), "val": ("validation", "val", "valid", "dev"), "test": ("test",)}


@dataclass(kw_only=True)
class HFText(Folds, TextData):
    """The `data=hf` option (conf/data/hf.yaml): see the module docstring."""

    path: str  # a local file or folder (or a save_to_disk folder), or a hub name
    text_column: str = "text"
    label_column: str = "label"
    val_fraction: float  # carved from train where the dataset has no validation split
    test_fraction: float
    split_seed: int
    cache_dir: str | None = None  # where datasets keeps its arrow files and the tokens (null: its own, ~/.cache/...)
    prefetch_factor: int = 2
    pin_memory: bool | str = "auto"
    files: list[str] = field(default_factory=list, init=False, repr=False)  # what splits() read, for the fingerprint
    classes: list[str] = field(default_factory=list, init=False, repr=False)  # splits()'s, in label order

    uses_root: ClassVar[bool] = False  # data.path names the data

    def splits(self) -> FileSplits:
        loaded = self._load()
        found = {split: next((name for name in names if name in loaded), None) for split, names in SPLIT_NAMES.items()}
        if found["train"] is None:
            raise ConfigError(
                "data.path", f"'{self.path}' has splits {', '.join(loaded)} but no train split; name one train"
            )
        parts = {split: loaded[name] for split, name in found.items() if name is not None}
        train = parts["train"]
        for column in (self.text_column, self.label_column):
            if column not in train.column_names:
                key = "data.text_column" if column == self.text_column else "data.label_column"
                raise ConfigError(
                    key,
                    f"is {column!r}, not a column of '{self.path}' (its columns: {', '.join(train.column_names)}); "
                    f"name the column that holds the {'text' if key == 'data.text_column' else 'class'}",
                )
        classes = class_names_of(train, self.label_column)
        label_of = {name: index for index, name in enumerate(classes)} if _plain_labels(train, self) else None
        missing = {split: getattr(self, f"{split}_fraction") for split in ("val", "test") if split not in parts}
        if self.folds is not None and "val" in parts:
            raise ConfigError(
                "data.folds",
                f"is {self.folds}, but '{self.path}' has a {found['val']} split of its own, which is the val split: "
                "there is no training pool to cut into folds; remove data.folds and data.fold",
            )
        if missing or self.folds is not None:  # carved (and folded) before the tokenizer learns from train alone
            rows = train[self.label_column]
            labels = rows if label_of is None else [label_of[str(value)] for value in rows]
            carved = self.folded(carve(len(train), missing, self.split_seed, labels), self.split_seed, labels, classes)
            parts |= {split: train.select(indices.tolist()) for split, indices in carved.items()}
            log.info(
                "no %s split in '%s': carved from its %d training rows by data.split_seed=%d%s (%s)",
                " or ".join(missing),
                self.path,
                len(train),
                self.split_seed,
                f", val {self.fold_name()} of the train and val rows" if self.folds is not None else "",
                ", ".join(f"{split}: {len(parts[split])}" for split in ("train", *missing)),
            )
        tokens = self.make_tokenizer(lambda: (str(text).encode("utf-8") for text in parts["train"][self.text_column]))
        encode = functools.partial(
            encode_rows,
            tokens=tokens,
            text_column=self.text_column,
            label_column=self.label_column,
            label_of=label_of,
            max_length=self.max_length,
        )
        tokenized = {
            split: rows.map(encode, batched=True, remove_columns=rows.column_names, desc=f"tokenizing {split}")
            for split, rows in parts.items()
        }
        report_truncated(tokenized["train"]["full_length"], self.max_length, f"{self.path} train", "tokens")
        datasets = {split: TokenizedRows(tokenized[split], split) for split in ("train", "val", "test")}
        report_majority(datasets, classes)
        self.classes = classes
        return FileSplits(datasets["train"], datasets["val"], datasets["test"], num_classes=len(classes))

    def class_names(self) -> list[str]:
        return self.classes or class_names_of(self._load()["train"], self.label_column)

    def source(self) -> str | None:
        """The files read, each with its size (a hub name: the name): the data fingerprint keeps them."""
        return f"hf: {', '.join(self.files)}"  # names, not where they are: a copy elsewhere is the same data

    def identity(self, made: Splits | FileSplits) -> dict:
        """The files read, each with its size and a digest of its bytes (trainkit.data.identity.file_digest: cached,
        so a large file is read once), and the rows of every split: the same for every fold and carve (a hub name:
        its name, in source(), and the rows)."""
        from trainkit.data.identity import file_digest

        splits = (made.train, made.val, made.test)
        rows = {"rows": sum(len(split) for split in splits if isinstance(split, TokenizedRows))}
        given = Path(self.path).expanduser()
        if not given.exists():
            return rows
        files = {name: {"bytes": path.stat().st_size, "sha256": file_digest(path)} for name, path in _data_files(given)}
        return {"files": files, **rows}

    def _load(self) -> Any:
        """The dataset as a DatasetDict (one file or a Dataset: its train split), and the files it was read from."""
        import datasets

        datasets.disable_progress_bars()
        given = Path(self.path).expanduser()
        cache = None if self.cache_dir is None else str(Path(self.cache_dir).expanduser())
        try:
            if given.is_dir() and any((given / name).is_file() for name in ("dataset_dict.json", "state.json")):
                loaded = datasets.load_from_disk(str(given))
            elif given.is_file():
                if given.suffix.lower() not in BUILDERS:
                    raise ConfigError(
                        "data.path", f"'{given}' is not {', '.join(BUILDERS)}; give one of those, or a folder of them"
                    )
                builder = BUILDERS[given.suffix.lower()]
                loaded = datasets.load_dataset(builder, data_files=str(given), cache_dir=cache)
            elif given.is_dir():
                loaded = datasets.load_dataset(str(given), cache_dir=cache)
            elif os.sep in self.path or self.path.startswith((".", "~")):
                raise ConfigError("data.path", f"'{given}' does not exist; give a data file or folder")
            else:  # a hub name: the datasets library downloads it (HF_HUB_OFFLINE=1: its cache alone)
                loaded = datasets.load_dataset(self.path, cache_dir=cache)
        except ConfigError:
            raise
        except (FileNotFoundError, ValueError, datasets.exceptions.DatasetNotFoundError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError("data.path", f"cannot read a dataset from {self.path!r} ({reason})") from error
        self.files = _files_read(given) if given.exists() else [self.path]
        return datasets.DatasetDict({"train": loaded}) if isinstance(loaded, datasets.Dataset) else loaded


def _files_read(given: Path) -> list[str]:
    """The data's files, each with its size; not the cache files datasets.map writes beside a save_to_disk folder."""
    return [f"{name} ({path.stat().st_size} bytes)" for name, path in _data_files(given)]


def _data_files(given: Path) -> list[tuple[str, Path]]:
    """The data's files as (name relative to data.path's folder, path), in name order."""
    listed = [] if given.is_file() else sorted(p for p in given.rglob("*") if p.is_file() and not is_hidden(p, given))
    files = [given] if given.is_file() else [path for path in listed if not path.name.startswith("cache-")]
    top = given.parent if given.is_file() else given
    return [(str(path.relative_to(top)), path) for path in files]


def _plain_labels(train: Any, data: HFText) -> bool:
    """Whether the labels are values to number (strings, numbers), not a ClassLabel's numbers already."""
    from datasets import ClassLabel

    return not isinstance(train.features[data.label_column], ClassLabel)


def class_names_of(train: Any, label_column: str) -> list[str]:
    """The classes in label order: a ClassLabel's names, else the sorted values of the training split's labels."""
    from datasets import ClassLabel

    feature = train.features[label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    values = sorted(set(train[label_column]), key=lambda value: (str(type(value)), value))
    if len(values) < 2:
        raise ConfigError(
            "data.label_column", f"{label_column!r} holds {len(values)} value(s) {values}; classification needs two"
        )
    return [str(value) for value in values]


def encode_rows(
    rows: dict[str, list],
    tokens: Tokens,
    text_column: str,
    label_column: str,
    label_of: dict[str, int] | None,
    max_length: int,
) -> dict[str, list]:
    """A batch of rows as `datasets.map` gives it: the texts' ids cut at max_length, their uncut lengths, the labels'
    numbers. A module-level function of picklable arguments, so map's cache finds it again."""
    ids = tokens.encode_many([str(text).encode("utf-8") for text in rows[text_column]])
    labels = rows[label_column] if label_of is None else [label_of[str(value)] for value in rows[label_column]]
    return {
        "input_ids": [row[:max_length].tolist() for row in ids],
        "full_length": [len(row) for row in ids],
        "label": [int(label) for label in labels],
    }


class TokenizedRows(Dataset):
    """A tokenized split as `(int64 ids, label)` items, read in DataLoader workers (the arrow table is memory-mapped
    where datasets cached it). `lengths`: each row's ids (the token budget's); `samples`: (row, label), in order,
    for the data fingerprint."""

    def __init__(self, rows: Any, split: str):
        self.rows = rows
        self.lengths = torch.tensor([len(ids) for ids in rows["input_ids"]], dtype=torch.int64)
        self.samples = [(f"/{split}/{index}", label) for index, label in enumerate(rows["label"])]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        row = self.rows[index]
        return torch.tensor(row["input_ids"], dtype=torch.int64), int(row["label"])
