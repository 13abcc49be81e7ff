"""k-fold cross-validation (data.folds, data.fold: trainkit.data.datasets.folded): the folds of the training pool
are disjoint, cover it, hold each class in proportion and follow data.split_seed; the test split is the one a
run without folds has; and every data option that carves its val split cuts its folds the same way."""

import ast
import logging
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from PIL import Image

from conftest import ROOT, composed
from helpers import (
    assert_one_config_error,
    has_file_data,
    needs_downloads,
    needs_image_folders,
    template_has,
    write_cifar,
)
from trainkit.cli import one_line
from trainkit.config.validation import problems, validate
from trainkit.data import Splits, make_data
from trainkit.data.datasets import carve
from trainkit.data.folds import folded
from trainkit.errors import ConfigError

# 37 + 41 + 22 samples listed class by class, as a folder is: no class divides evenly into the folds
LABELS = torch.tensor([0] * 37 + [1] * 41 + [2] * 22)


def test_the_folds_are_disjoint_cover_the_pool_and_hold_each_class_within_one():
    parts = carve(len(LABELS), {"test": 0.2, "val": 0.1}, seed=0, labels=LABELS)
    pool = torch.cat([parts["train"], parts["val"]]).sort().values
    vals, counts = [], []
    for fold in range(5):
        made = folded(parts, 5, fold, seed=0, labels=LABELS)
        assert torch.equal(made["test"], parts["test"])  # the test split is the one a run without folds has
        assert torch.equal(torch.cat([made["train"], made["val"]]).sort().values, pool)  # train is the other folds
        assert not set(made["train"].tolist()) & set(made["val"].tolist())
        vals.append(made["val"])
        counts.append(torch.bincount(LABELS[made["val"]], minlength=3))
    assert torch.equal(torch.cat(vals).sort().values, pool)  # each sample of the pool is in exactly one fold
    counts = torch.stack(counts)  # [fold, class]
    assert (counts.max(0).values - counts.min(0).values <= 1).all(), counts  # stratified: within one a class
    sizes = counts.sum(1)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == len(pool)


def test_the_same_seed_gives_the_same_folds_and_another_seed_others():
    parts = carve(len(LABELS), {"test": 0.2, "val": 0.1}, seed=0, labels=LABELS)
    first = folded(parts, 5, 2, seed=0, labels=LABELS)
    again = folded(parts, 5, 2, seed=0, labels=LABELS)
    assert all(torch.equal(first[name], again[name]) for name in parts)
    other = folded(parts, 5, 2, seed=1, labels=LABELS)
    assert not torch.equal(other["val"], first["val"]) and torch.equal(other["test"], first["test"])
    assert folded(parts, None, None, seed=0) is parts  # no folds: the carve as it was


# the two keys go together, the fold one of the folds (moved here from tests/unit/config/test_config.py)
MISTAKES = [
    (["data.folds=1", "data.fold=0"], "data.folds"),  # one fold would be the whole pool: nothing left to train on
    (["data.folds=5", "data.fold=-1"], "data.fold"),
    (["data.folds=5"], "data.fold"),
    (["data.fold=2"], "data.fold"),
    (["data.folds=5", "data.fold=5"], "data.fold"),
]


@pytest.mark.parametrize("overrides, key", MISTAKES, ids=[" ".join(overrides) for overrides, _ in MISTAKES])
def test_each_mistake_in_the_fold_keys_is_one_config_error_naming_its_key(overrides, key):
    assert_one_config_error(overrides, key)


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["data.folds=5"], ["data.fold=0..4", "-m data.folds=5 'data.fold=range(5)'"]),
        (["data.folds=5", "data.fold=5"], ["numbers the folds 0..4"]),
        (["data.fold=0"], ["data.folds=K (the number of folds, K >= 2)"]),  # one fold would be the whole pool
        (["data.fold=3"], ["data.folds=K (the number of folds, K >= 4)"]),
    ],
)
def test_the_messages_show_the_bad_value_and_the_way_out(overrides, fragments):
    key, message = next(iter(problems(composed(*overrides)).items()))
    message = f"{key}: {message}"
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_a_seed_cuts_the_folds_it_always_cut():
    """The samples of a fold, pinned: the same seed gives the same folds on every machine and in every version."""
    parts = carve(len(LABELS), {"test": 0.2, "val": 0.1}, seed=0, labels=LABELS)
    assert folded(parts, 5, 2, seed=0, labels=LABELS)["val"].tolist() == [
        2, 4, 7, 13, 17, 21, 41, 43, 52, 61, 64, 77, 83, 94, 96, 98
    ]  # fmt: skip
    unlabelled = carve(40, {"test": 0.2, "val": 0.1}, seed=3)
    assert folded(unlabelled, 4, 1, seed=3)["val"].tolist() == [3, 14, 17, 18, 30, 31, 34, 35]


def test_more_folds_than_samples_is_one_line_naming_data_folds():
    parts = carve(10, {"test": 0.2, "val": 0.2}, seed=0)
    with pytest.raises(ConfigError, match=r"^data\.folds: is 9, but the training pool holds 8 samples; lower it$"):
        folded(parts, 9, 0, seed=0)


def test_more_folds_than_the_smallest_class_has_samples_is_one_line_naming_the_class_and_its_count():
    """A fold would validate without that class (and score it as absent): refused, for every data kind, in folded."""
    labels = torch.tensor([0] * 60 + [1] * 4)
    parts = {"train": torch.arange(56), "val": torch.arange(56, 64), "test": torch.tensor([], dtype=torch.int64)}
    with pytest.raises(ConfigError) as error:
        folded(parts, 5, 4, seed=0, labels=labels, names=["common", "rare"])
    assert str(error.value) == (
        "data.folds: is 5, but class 'rare' has 4 samples in the training pool (train and val together): 1 of the "
        "folds would validate without it; lower data.folds to 4 or fewer, or add samples of that class"
    )
    made = folded(parts, 4, 3, seed=0, labels=labels)  # as many folds as the class has samples: one in each
    assert set(labels[made["val"]].tolist()) == {0, 1}
    with pytest.raises(ConfigError, match=r"^data\.folds: is 5, but class 1 has 4 samples"):  # no names: its number
        folded(parts, 5, 0, seed=0, labels=labels)


@pytest.mark.skipif(not template_has("data/hf.yaml"), reason="this clone has no data=hf (trimmed)")
def test_an_hf_file_with_a_class_of_four_rows_refuses_five_folds(tmp_path):
    import json

    file = tmp_path / "rows.jsonl"
    rows = [{"text": f"common {k}", "label": "common"} for k in range(60)] + [
        {"text": f"rare {k}", "label": "rare"} for k in range(4)
    ]
    file.write_text("\n".join(json.dumps(row) for row in rows))
    cfg = option("hf", path=str(file), cache_dir=str(tmp_path / "cache"), num_workers=0, max_length=16)
    # one of its 4 rows went to the carved test split: 3 in the pool
    with pytest.raises(ConfigError, match=r"^data\.folds: is 5, but class 'rare' has 3 samples in the training pool"):
        splits_of(cfg, folds=5, fold=4)


def test_a_carved_val_split_that_lacks_a_class_training_has_is_a_warning_naming_it(caplog):
    """digits carve val unstratified: 0.3% of 1,797 samples is 5, which cannot hold 10 classes."""
    with caplog.at_level(logging.WARNING, logger="trainkit.data.datasets"):
        made = splits_of(option("digits", val_fraction=0.003))
    lacking = sorted(set(made.train[1].tolist()) - set(made.val[1].tolist()))
    assert len(lacking) >= 5
    named = ", ".join(f"class {label}" for label in lacking)
    assert (
        f"the val split (carved by data.val_fraction; raise it) holds no sample of {named}, which the training split "
        f"has: val metrics cover the other classes alone" in caplog.text
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainkit.data.datasets"):
        splits_of(option("digits"))  # the default carve holds every class
    assert "holds no sample" not in caplog.text


# ---- every data option that carves: a fold is the val split, the others train, test as without folds ----------


def items(split) -> Counter:
    """What a split holds, as a multiset: (path, label) of file data, (row bytes, label) of tensors."""
    if hasattr(split, "samples"):
        return Counter(map(tuple, split.samples))
    if isinstance(split, tuple):  # Splits: (inputs, targets)
        return Counter((row.numpy().tobytes(), float(label)) for row, label in zip(*split))
    # DigitSignals: a signal's length depends on its place in the split; its first 16 values do not
    return Counter((item["signal"][:16].numpy().tobytes(), int(item["label"])) for item in split)


def labels_of(split) -> list[int]:
    if hasattr(split, "samples"):
        return [label for _, label in split.samples]
    if isinstance(split, tuple):
        return split[1].tolist()
    return [int(item["label"]) for item in split]


def splits_of(cfg: dict, **keys) -> Splits | Any:
    return make_data(OmegaConf.create({**cfg, **keys})).splits()


def check_every_fold(cfg: dict, folds: int = 3, stratified: bool = True) -> None:
    plain = splits_of(cfg)
    pool = items(plain.train) + items(plain.val)
    vals: Counter = Counter()
    counts = []
    for fold in range(folds):
        made = splits_of(cfg, folds=folds, fold=fold)
        assert items(made.test) == items(plain.test)  # untouched
        assert items(made.train) + items(made.val) == pool  # the other folds train
        vals += items(made.val)
        counts.append(Counter(labels_of(made.val)))
    assert vals == pool  # disjoint folds that cover the pool
    if stratified:
        for label in set().union(*counts):
            per_fold = [count[label] for count in counts]
            assert max(per_fold) - min(per_fold) <= 1, (label, per_fold)


def option(name: str, **keys) -> dict:
    return {**OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "data" / f"{name}.yaml")), **keys}


def image_folder(root: Path, splits=("train",), per_class: int = 7) -> Path:
    """Three classes of distinct tiny PNGs (a colour an image) under root/<split>/<class>/."""
    for split in splits:
        for label in range(3):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.new("RGB", (6, 6), (40 * label, 10 * i, 99)).save(folder / f"{i}.png")
    return root


def text_folder(root: Path, per_class: int = 8) -> Path:
    for label in ("neg", "pos"):
        (root / "train" / label).mkdir(parents=True)
        for i in range(per_class + (label == "pos")):
            (root / "train" / label / f"{i}.txt").write_text(f"{label} {i} " * (i + 1))
    return root


def test_digits_fold_stratified_and_keep_the_test_split():
    check_every_fold(option("digits"), folds=5)


@needs_downloads
def test_mnist_and_cifar10_fold_the_official_training_set(tmp_path, monkeypatch):
    import torchvision.datasets.cifar
    from test_downloads import write_mnist

    # The files are ours, not the real ones, so their md5 sums differ: accept any file that exists.
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda path, md5=None: Path(path).is_file())
    write_mnist(tmp_path, num_train=60, num_test=20)
    check_every_fold(option("mnist", root=str(tmp_path)))
    write_cifar(tmp_path, per_batch=12, num_test=10)
    check_every_fold(option("cifar10", root=str(tmp_path)))


@needs_image_folders
def test_an_image_folder_folds_its_train_folder(tmp_path, caplog):
    root = image_folder(tmp_path)
    keys = dict(root=str(root), image_size=6, num_workers=0, val_fraction=0.2, test_fraction=0.2)
    check_every_fold(option("imagefolder", **keys))
    with caplog.at_level(logging.INFO, logger="trainkit.data"):
        splits_of(option("imagefolder", **keys), folds=3, fold=1)
    assert "val fold 1 of 3 (data.folds, data.fold): " in caplog.text and "by data.split_seed=0 (" in caplog.text


@needs_image_folders
def test_a_val_folder_of_its_own_refuses_folds_in_one_line(tmp_path):
    root = image_folder(tmp_path, splits=("train", "val"))
    cfg = option("imagefolder", root=str(root), image_size=6, num_workers=0)
    with pytest.raises(ConfigError) as error:
        splits_of(cfg, folds=3, fold=0)
    assert str(error.value) == (
        f"data.folds: is 3, but '{root / 'val'}' is a val split of its own: folds are cut from the training data "
        f"alone and one of them is val; remove data.folds, or move val/'s class folders into train/"
    )
    splits_of(cfg)  # without folds it is the val split


@pytest.mark.skipif(not template_has("data/textfolder.yaml"), reason="this clone has no data=textfolder (trimmed)")
def test_a_text_folder_folds_its_train_folder(tmp_path):
    cfg = option("textfolder", root=str(text_folder(tmp_path)), num_workers=0, val_fraction=0.2, test_fraction=0.2)
    check_every_fold(cfg, folds=4)


def test_data_of_your_own_folds_with_its_class(tmp_path):
    """tests/data_for_tests.py: a table (a regression: no classes to stratify by); tests/file_data_for_tests.py:
    signals read as file data."""
    table = {key: value for key, value in option("digits").items() if key not in ("channels", "image_size")}
    for key in ("mean", "std", "mirror_changes_label"):
        del table[key]
    check_every_fold({**table, "_target_": "data_for_tests.DigitsTable", "num_classes": None}, stratified=False)
    if has_file_data:
        check_every_fold({**table, "_target_": "file_data_for_tests.DigitSignals"})


@pytest.mark.skipif(not template_has("data/text.yaml"), reason="this clone has no data=text (trimmed)")
def test_a_text_corpus_folds_its_files(tmp_path):
    """data=text: val is whole files; a fold is a third of the train and val files (which file a block came from:
    its marker, each file's first bytes)."""
    for k in range(12):
        (tmp_path / f"{k:02}.txt").write_bytes(f"<{k:02}>".encode() + bytes([97 + k]) * 40)
    cfg = option("text", root=str(tmp_path), pattern="*.txt", block_size=8, val_fraction=0.2, test_fraction=0.2)

    def files(split) -> set[str]:
        inputs, targets = split
        joined = b"".join(bytes(row) + bytes(last[-1:]) for row, last in zip(inputs.tolist(), targets.tolist()))
        return {marker.decode() for marker in re.findall(rb"<\d\d>", joined)}

    plain = splits_of(cfg)
    pool = files(plain.train) | files(plain.val)
    vals = []
    for fold in range(3):
        made = splits_of(cfg, folds=3, fold=fold)
        assert files(made.test) == files(plain.test) and torch.equal(made.test[0], plain.test[0])
        assert files(made.train) | files(made.val) == pool and not files(made.train) & files(made.val)
        vals.append(files(made.val))
    assert (
        set().union(*vals) == pool and sum(map(len, vals)) == len(pool) and {len(v) for v in vals} == {3, 4}
    )  # 10 files


@pytest.mark.slow  # parses the standard library (a few seconds)
@pytest.mark.skipif(not template_has("data/stdlib_functions.yaml"), reason="no data=stdlib_functions (trimmed)")
def test_stdlib_functions_fold_each_packages_files():
    cfg = OmegaConf.to_container(composed("experiment=stdlib_functions").data)
    plain = make_data(cfg).splits()
    made = make_data({**cfg, "folds": 3, "fold": 1}).splits()

    def files(split) -> set[str]:
        return {path.rsplit(":", 1)[0] for path, _ in split.samples}

    assert files(made.test) == files(plain.test)
    assert files(made.train) | files(made.val) == files(plain.train) | files(plain.val)
    assert not files(made.train) & files(made.val) and made.num_classes == plain.num_classes
    assert {label for _, label in made.val.samples} == set(range(made.num_classes))  # each package in the fold
    assert np.isclose(len(files(made.val)), len(files(plain.train) | files(plain.val)) / 3, rtol=0.1)


def test_carve_refuses_float_labels_instead_of_making_each_value_a_class():
    targets = torch.linspace(25.0, 346.0, 100)  # a regression's: cast to int64, 100 values would be ~100 "classes"
    with pytest.raises(TypeError, match=r"takes a class index per sample, but got float32 values: pass labels=None"):
        carve(100, {"test": 0.2, "val": 0.1}, seed=0, labels=targets)
    bins = torch.bucketize(targets, targets.quantile(torch.tensor([0.25, 0.5, 0.75])))  # on purpose: quartiles
    parts = carve(100, {"test": 0.2, "val": 0.1}, seed=0, labels=bins)
    assert torch.bincount(bins[parts["test"]], minlength=4).tolist() == [5, 5, 5, 5]  # each quartile in its share


@pytest.mark.skipif(not template_has("data/synthetic.yaml"), reason="this clone has no data=synthetic (trimmed)")
def test_data_that_carves_no_val_split_refuses_the_fold_keys_in_one_line():
    """data.folds and data.fold are every data option's keys (conf/config.yaml): typed on data whose class carves no
    val split from training data, the config check says why they do not belong there, not "no such key"."""
    cfg = composed("data=synthetic", "data.folds=3", "data.fold=0")
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    line = one_line(error.value)
    assert line.startswith("data.folds: is k-fold cross-validation's, which Synthetic"), line
    assert "carves no val split" in line and "remove data.folds=... and data.fold=..." in line
    assert "no such key" not in line and "+data.folds" not in line
    assert "remove data.fold=... (" in problems(composed("data=synthetic", "data.fold=1"))["data.fold"]


@pytest.mark.parametrize("overrides", [["data.folds=3", "data.fold=1"], []])
def test_every_data_option_has_the_fold_keys_and_instantiates_with_them(overrides):
    """conf/config.yaml gives every data option data.folds and data.fold, and names this row's module for their
    checks outside the data section: `hydra.utils.instantiate(cfg.data)` makes the data option, the keys set."""
    cfg = composed(*overrides)
    assert cfg._checks_.folds == "trainkit.data.folds" and "_checks_" not in cfg.data
    data = instantiate(cfg.data)
    assert (data.folds, data.fold) == ((3, 1) if overrides else (None, None))


def test_folds_imports_nothing_of_datasets_at_module_level():
    """datasets.py imports trainkit.data.folds (its marked lines): folds.py may import datasets' names only inside
    the functions that need them (or for type checking), so the two modules import each other in no order."""
    tree = ast.parse((ROOT / "src" / "trainkit" / "data" / "folds.py").read_text(encoding="utf-8"))
    imported = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    assert "trainkit.data.datasets" not in imported
