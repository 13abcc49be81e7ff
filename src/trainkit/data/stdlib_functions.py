"""`data=stdlib_functions`: every function of the Python standard library's own source is a sample, labelled
by its top-level package among the `data.packages` packages with the most functions (docs/data.md).

Files are split, not functions, a package at a time, so no file's functions are in two splits and every split holds
every class. Parsing the ~750 files takes a few seconds and is kept for the life of the process.
"""

import ast
import functools
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from trainkit.config.schema import Check, integer
from trainkit.data.file_data import FileSplits
from trainkit.data.stdlib_source import corpus_version, package_of, split_by_file, stdlib_files, stdlib_root
from trainkit.data.text import TextData, TextDataset, report_majority, report_truncated
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

Function = tuple[str, int, bytes]  # (file, line of its def, source text)


@dataclass(kw_only=True)
class StdlibFunctions(TextData):
    packages: int  # the classes: this many of the packages with the most functions
    val_fraction: float  # of the files
    test_fraction: float
    split_seed: int

    uses_root: ClassVar[bool] = False  # the running Python's own standard library
    config_rules: ClassVar[dict[str, Check]] = {**TextData.config_rules, "packages": integer(2)}

    def splits(self) -> FileSplits:
        chosen = self.class_names()
        label = {package: number for number, package in enumerate(chosen)}
        # Each package's files are split apart: every split holds every class, in about the same proportions.
        parts: dict[str, list[Path]] = {"train": [], "val": [], "test": []}
        every_file = stdlib_files()
        for package in chosen:
            files = [file for file in every_file if package_of(file) == package]
            for split, split_files in split_by_file(
                files, self.val_fraction, self.test_fraction, self.split_seed, self
            ).items():
                parts[split] += split_files
        kept = {split: list(_functions(tuple(sorted(split_files)))) for split, split_files in parts.items()}
        tokens = self.make_tokenizer(lambda: [text for _, _, text in kept["train"]])
        datasets = {}
        for split, functions in kept.items():
            datasets[split] = TextDataset(
                [text for _, _, text in functions],
                [(f"{file}:{line}", label[package_of(Path(file))]) for file, line, _ in functions],
                self.max_length,
                tokens,
            )
            if split == "train":
                train = datasets[split]
                report_truncated(train.full_lengths, self.max_length, f"{corpus_version()} train", train.unit)
        log.info(
            "%s: %s functions of %s (train/val/test), %d classes: %s",
            stdlib_root(),
            "/".join(str(len(datasets[s])) for s in ("train", "val", "test")),
            corpus_version(),
            len(chosen),
            ", ".join(chosen),
        )
        report_majority(datasets, chosen)
        return FileSplits(datasets["train"], datasets["val"], datasets["test"], num_classes=len(chosen))

    def source(self) -> str | None:
        """The corpus's Python (the data fingerprint keeps it: a resume under another Python is refused)."""
        return corpus_version()

    def class_names(self) -> list[str]:
        """The chosen packages in label order (sorted by name): what eval.py's predictions name."""
        counts = Counter(package_of(Path(file)) for file, _, _ in _functions(tuple(stdlib_files())))
        del counts[""]  # top-level modules belong to no package
        if self.packages > len(counts):
            raise ConfigError("data.packages", f"is {self.packages}, but the standard library has {len(counts)}")
        return sorted(package for package, _ in counts.most_common(self.packages))


def _functions(files: tuple[Path, ...]) -> list[Function]:
    return [function for file in files for function in _file_functions(file)]


@functools.cache
def _file_functions(file: Path) -> tuple[Function, ...]:
    """The functions of one file: module level and in class bodies, in source order."""
    source = file.read_bytes()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # not Python 3 (none outside the test folders today): no samples
        return ()
    lines = source.splitlines(keepends=True)
    found: list[Function] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.append((str(file), node.lineno, b"".join(lines[node.lineno - 1 : node.end_lineno])))
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(tree.body)
    return tuple(found)
