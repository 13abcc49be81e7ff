"""`data=hf`: text classification from a Hugging Face `datasets` dataset, read from local files (or a hub name).

What it reads, how it carves and tokenizes, and which rows it refuses: docs/hf.md#hugging-face-datasets-datahf.
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

from trainkit.config.schema import Check, flag
from trainkit.data.class_folders import is_hidden
from trainkit.data.datasets import carve
from trainkit.data.file_data import FileSplits
from trainkit.data.text import TextData, report_majority, report_truncated
from trainkit.data.tokenizing import Tokens
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}
SPLIT_NAMES = {"train": ("train",), "val": ("validation", "val", "valid", "dev"), "test": ("test",)}


@dataclass(kw_only=True)
class HFText(TextData):
    """The `data=hf` option (conf/data/hf.yaml)."""

    path: str
    text_column: str = "text"
    label_column: str = "label"
    val_fraction: float  # where the dataset has no validation split
    test_fraction: float
    split_seed: int
    cache_dir: str | None = None
    skip_bad_rows: bool = False
    unlabelled_value: Any = None
    files: list[str] = field(default_factory=list, init=False, repr=False)
    classes: list[str] = field(default_factory=list, init=False, repr=False)
    _unlabelled_test: bool = field(default=False, init=False, repr=False)

    uses_root: ClassVar[bool] = False  # data.path names the data instead
    config_rules: ClassVar[dict[str, Check]] = {**TextData.config_rules, "skip_bad_rows": flag()}

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
        parts = self._usable_rows(parts, found)
        train = parts["train"]
        classes = class_names_of(train, self.label_column)
        label_of = {name: index for index, name in enumerate(classes)} if _plain_labels(train, self) else None
        if label_of is not None:
            log.info(
                "%d classes: the values of %r in the training split, sorted: %s%s",
                len(classes), self.label_column, ", ".join(classes[:10]), ", ..." if len(classes) > 10 else "",
            )  # fmt: skip
            self._check_known_classes(parts, found, label_of)
        wanted = ("val",) if self._unlabelled_test else ("val", "test")
        missing = {split: getattr(self, f"{split}_fraction") for split in wanted if split not in parts}
        if "val" in parts:
            self.own_val(f"the {found['val']} split of '{self.path}'", "pick a dataset without one")
        if missing:  # before a tokenizer learns from train alone
            rows = train[self.label_column]
            labels = rows if label_of is None else [label_of[str(value)] for value in rows]
            carved = self.cut_val(carve(len(train), missing, self.split_seed, labels), self.split_seed, labels, classes)
            parts |= {split: train.select(indices.tolist()) for split, indices in carved.items()}
            log.info(
                "no %s split in '%s': carved from its %d training rows by data.split_seed=%d (%s)",
                " or ".join(missing),
                self.path,
                len(train),
                self.split_seed,
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
        datasets = {split: TokenizedRows(rows, split) for split, rows in tokenized.items()}
        datasets.setdefault("test", datasets["val"])  # an unlabelled test split: the run tests on val
        report_majority(datasets, classes)
        self.classes = classes
        return FileSplits(datasets["train"], datasets["val"], datasets["test"], num_classes=len(classes))

    def class_names(self) -> list[str]:
        return self.classes or class_names_of(self._load()["train"], self.label_column, self.unlabelled_value)

    def _usable_rows(self, parts: dict[str, Any], found: dict[str, str | None]) -> dict[str, Any]:
        """Each split without the rows it cannot use; a row that must not be left out silently is refused."""
        usable, self._unlabelled_test = {}, False
        for split, rows in parts.items():
            where = f"the {found[split]} split ('{_split_file(Path(self.path).expanduser(), found[split])}')"
            no_text = _rows_without_text(rows, self.text_column)
            if no_text and not self.skip_bad_rows:
                row = no_text[0]
                raise ConfigError(
                    "data.text_column",
                    f"row {row} (from 0) of {where} holds {rows[row][self.text_column]!r}, not a text; fix or remove "
                    f"the row, or pass data.skip_bad_rows=true to leave such rows out (counted in the log)",
                )
            unlabelled = unlabelled_rows(rows, self.label_column, self.unlabelled_value)
            if unlabelled and split == "train" and not self.skip_bad_rows:
                row = unlabelled[0]
                raise ConfigError(
                    "data.label_column",
                    f"row {row} (from 0) of {where} is unlabelled (its {self.label_column!r} is "
                    f"{rows[row][self.label_column]!r}), and a training row needs a class; label or remove it, or "
                    f"pass data.skip_bad_rows=true to leave unlabelled training rows out (counted in the log)",
                )
            if no_text:
                log.warning(
                    "%s: left out %d of %d rows whose text is null or not a string (data.skip_bad_rows=true), "
                    "rows %s (from 0)",
                    where, len(no_text), len(rows), _first(no_text),
                )  # fmt: skip
            if unlabelled and len(unlabelled) == len(rows) and split == "test":
                self._unlabelled_test = True
                log.info(
                    "%s is unlabelled (all %d rows), as GLUE's test splits are: the run evaluates on the val split "
                    "(its test/ metrics are the val split's); its rows have no label to score (eval.py predict= "
                    "classifies texts)",
                    where, len(rows),
                )  # fmt: skip
                continue
            if unlabelled and len(unlabelled) == len(rows) and split == "val":
                log.info("%s is unlabelled (all %d rows): carving a val split from train instead", where, len(rows))
                continue
            if unlabelled:
                log.info(
                    "%s: left out %d of %d unlabelled rows (%s)%s, rows %s (from 0)",
                    where, len(unlabelled), len(rows), self._unlabelled_meaning(rows),
                    " (data.skip_bad_rows=true)" if split == "train" else " from its metrics", _first(unlabelled),
                )  # fmt: skip
            dropped = set(no_text) | set(unlabelled)
            kept = rows.select([row for row in range(len(rows)) if row not in dropped]) if dropped else rows
            empty = _empty_texts(kept, self.text_column)
            if empty:
                log.info("%s: %d of %d texts are empty (an empty sequence each)", where, empty, len(kept))
            usable[split] = kept
        if not len(usable["train"]):
            raise ConfigError("data.path", f"'{self.path}' has no training row with a text and a label")
        return usable

    def _unlabelled_meaning(self, rows: Any) -> str:
        if not _plain_labels(rows, self):
            return "a ClassLabel of -1 or null"
        return "null" if self.unlabelled_value is None else f"null or data.unlabelled_value={self.unlabelled_value!r}"

    def _check_known_classes(self, parts: dict[str, Any], found: dict[str, str | None], label_of: dict) -> None:
        """Refuses a val or test class that the training split lacks, which a classifier never learns."""
        for split in ("val", "test"):
            if split not in parts:
                continue
            unknown = sorted({str(value) for value in parts[split][self.label_column]} - set(label_of))
            if unknown:
                where = f"the {found[split]} split ('{_split_file(Path(self.path).expanduser(), found[split])}')"
                raise ConfigError(
                    "data.label_column",
                    f"{where} holds class {', '.join(map(repr, unknown[:5]))} that the training split lacks (its "
                    f"classes: {', '.join(label_of)}); a classifier never learns it: give the training split rows "
                    f"of it, or leave those rows out (data.unlabelled_value names a value that means unlabelled)",
                )

    def source(self) -> str | None:
        """The files read, each with its size (or the hub name), for the data fingerprint."""
        return f"hf: {', '.join(self.files)}"  # a copy elsewhere is the same data

    def identity(self, made: FileSplits) -> dict:
        """The files read, each with its size and a digest of its bytes, and the rows of every split."""
        from trainkit.data.file_digests import file_digest

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
        except ConnectionError as error:  # a hub name, and no network (or HF_HUB_OFFLINE=1 without a cached copy)
            offline = " (HF_HUB_OFFLINE=1 is set)" if os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") else ""
            raise ConfigError(
                "data.path",
                f"{self.path!r} is no local file or folder, and the hub could not be reached for it{offline}; give a "
                f"local data file or folder, or download the dataset once online (datasets caches it)",
            ) from error
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


def _split_file(given: Path, split: str | None) -> Path:
    """The file a split was read from where the path is a folder of split files; else the path itself."""
    if not given.is_dir() or split is None:
        return given
    return next((path for path in sorted(given.iterdir()) if path.name.split(".")[0] == split), given)


def _first(rows: list[int]) -> str:
    return ", ".join(map(str, rows[:5])) + (", ..." if len(rows) > 5 else "")


def _rows_without_text(rows: Any, text_column: str) -> list[int]:
    """The rows whose text is null or not a string (a column of numbers: every row)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = rows.with_format("arrow")[text_column]
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        return list(range(len(rows)))
    return pc.indices_nonzero(pc.is_null(texts)).to_pylist() if texts.null_count else []


def _empty_texts(rows: Any, text_column: str) -> int:
    import pyarrow.compute as pc

    return int(pc.sum(pc.equal(pc.utf8_length(rows.with_format("arrow")[text_column]), 0)).as_py() or 0)


def unlabelled_rows(rows: Any, label_column: str, unlabelled_value: Any = None) -> list[int]:
    """The rows without a class: a null label, a ClassLabel's -1, and a plain column's `unlabelled_value`
    (data.unlabelled_value; a plain -1 may be a real class, so no value means unlabelled unless named)."""
    from datasets import ClassLabel

    labels = rows[label_column]
    if isinstance(rows.features[label_column], ClassLabel):
        return [row for row, label in enumerate(labels) if label is None or label < 0]
    named = None if unlabelled_value is None else str(unlabelled_value)
    return [row for row, label in enumerate(labels) if label is None or str(label) == named]


def class_names_of(train: Any, label_column: str, unlabelled_value: Any = None) -> list[str]:
    """The classes in label order: a ClassLabel's names, else the sorted values of the training split's labels
    (unlabelled rows left out)."""
    from datasets import ClassLabel

    feature = train.features[label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    named = None if unlabelled_value is None else str(unlabelled_value)
    labels = {value for value in train[label_column] if value is not None and str(value) != named}
    values = sorted(labels, key=lambda value: (str(type(value)), value))
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
    """A batch of rows for `datasets.map`: ids cut at max_length, uncut lengths, labels. Module-level, with picklable
    arguments, so that map's cache finds it again."""
    ids, lengths = tokens.encode_cut([str(text).encode("utf-8") for text in rows[text_column]], max_length)
    labels = rows[label_column] if label_of is None else [label_of[str(value)] for value in rows[label_column]]
    return {
        "input_ids": [row.tolist() for row in ids],
        "full_length": lengths,
        "label": [int(label) for label in labels],
    }


class TokenizedRows(Dataset):
    """A tokenized split as `(int64 ids, label)` items, read in DataLoader workers from the memory-mapped table."""

    def __init__(self, rows: Any, split: str):
        self.rows = rows
        self.lengths = torch.tensor([len(ids) for ids in rows["input_ids"]], dtype=torch.int64)
        self.samples = [(f"/{split}/{index}", label) for index, label in enumerate(rows["label"])]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        row = self.rows[index]
        return torch.tensor(row["input_ids"], dtype=torch.int64), int(row["label"])
