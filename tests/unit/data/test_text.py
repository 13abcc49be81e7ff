"""Text as bytes: data=textfolder (listing, splits, the truncation line, its one-line errors, a file that is
not UTF-8) and data=stdlib_functions (split by file, labelled by package, the Python version in the fingerprint)."""

import logging
import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import composed
from trainkit.data import build_data
from trainkit.data.class_folders import walk_files
from trainkit.data.file_data import FileLoader, FileSplits
from trainkit.data.fingerprint import check_same_data, data_fingerprint
from trainkit.data.loaders import limited
from trainkit.data.text import PAD_ID, TEXT_EXTENSIONS, TextDataset, pad_to_longest, tokens_of
from trainkit.errors import ConfigError

CPU = torch.device("cpu")


def text_folder(root: Path, texts: dict[str, list[bytes]], split: str = "train") -> Path:
    for label, contents in texts.items():
        (root / split / label).mkdir(parents=True, exist_ok=True)
        for number, content in enumerate(contents):
            (root / split / label / f"{number:03}.txt").write_bytes(content)
    return root


def textfolder_data(root: Path, *overrides: str):
    cfg = composed("data=textfolder", f"data.root={root}", "data.num_workers=0", "model=sequence", *overrides)
    return build_data(cfg.data, CPU, seed=0)


def test_bytes_are_tokens_one_up_and_zero_pads():
    assert tokens_of(b"\x00ab").tolist() == [1, 98, 99]  # a NUL byte is a token, not padding
    inputs, labels = pad_to_longest([(tokens_of(b"abc"), 1), (tokens_of(b"a"), 0), (tokens_of(b""), 1)])
    assert inputs.tolist() == [[98, 99, 100], [98, PAD_ID, PAD_ID], [PAD_ID] * 3] and labels.tolist() == [1, 0, 1]


def test_a_text_folder_loads_carves_and_says_how_many_files_it_cuts(tmp_path, caplog):
    root = text_folder(
        tmp_path, {"neg": [b"bad " * n for n in range(1, 21)], "pos": [b"good " * n for n in range(1, 21)]}
    )
    text_folder(root, {"neg": [b"awful"], "pos": [b"great"]}, split="test")
    with caplog.at_level(logging.INFO, logger="trainkit.data.text"):
        data = textfolder_data(root, "data.max_length=16", "data.val_fraction=0.2")
    assert "33 of 42 texts are longer than data.max_length=16 bytes and are cut to it" in caplog.text
    assert "majority-class accuracy 0.500" in caplog.text
    assert data.kind == "tokens" and data.pad_id == 0 and data.num_classes == 2
    train, test = data.train.loader.dataset, data.test.loader.dataset
    assert len(train) == 32 and len(data.val.loader.dataset) == 8 and len(test) == 2  # test/ is its own
    assert int(train.lengths.max()) == 16 and [label for _, label in test.samples] == [0, 1]
    inputs, labels = next(iter(data.test))
    assert inputs.tolist()[1][:5] == [104, 115, 102, 98, 117] and labels.tolist() == [0, 1]  # "great" + 1
    assert {"classes", "train", "val", "test"} <= data.fingerprint.keys()  # (path, label) samples: fingerprinted


def test_class_folders_pick_the_labelled_ones(tmp_path):
    root = text_folder(tmp_path, {"neg": [b"a", b"b"], "pos": [b"c", b"d"], "unsup": [b"e", b"f"]})
    data = textfolder_data(root, "data.class_folders=[neg,pos]", "data.val_fraction=0.25", "data.test_fraction=0.25")
    assert data.num_classes == 2


def test_sub_folders_of_a_class_are_read_as_predict_reads_them_and_hidden_ones_are_not(tmp_path):
    root = text_folder(tmp_path, {"neg": [b"a", b"b", b"c"]})
    text_folder(root / "train", {"2019": [b"d", b"e"], "2020": [b"f"], ".drafts": [b"never"]}, split="pos")
    data = textfolder_data(root, "data.val_fraction=0.2", "data.test_fraction=0.2")
    samples = [sample for loader in (data.train, data.val, data.test) for sample in loader.loader.dataset.samples]
    positives = sorted(path for path, label in samples if label == 1)
    assert positives == [str(path) for path in walk_files(root / "train" / "pos", TEXT_EXTENSIONS)[0]]  # one rule
    assert [Path(path).relative_to(root / "train" / "pos").as_posix() for path in positives] == [
        "2019/000.txt",
        "2019/001.txt",
        "2020/000.txt",
    ]


@pytest.mark.parametrize("test_pos", ["missing", "empty"])
def test_a_test_split_that_lacks_a_named_class_is_one_warning_naming_both(tmp_path, caplog, test_pos):
    root = text_folder(tmp_path, {"neg": [b"a", b"b", b"c"], "pos": [b"d", b"e", b"f"], "unsup": [b"?"]})
    text_folder(root, {"neg": [b"g", b"h"], "unsup": [b"?"]}, split="test")
    if test_pos == "empty":
        (root / "test" / "pos").mkdir()
    with caplog.at_level(logging.WARNING, logger="trainkit.data.class_folders"):
        data = textfolder_data(root, "data.class_folders=[neg,pos]", "data.val_fraction=0.3")
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == [
        f"'{root / 'test'}' holds no file of class pos, which train/ has: its metrics cover neg alone "
        "(a model that always answers neg scores test/acc 1.0); add some to it"
    ]
    assert [label for _, label in data.test.loader.dataset.samples] == [0, 0]


def test_without_class_folders_an_empty_class_folder_warns_and_a_missing_one_is_refused(tmp_path, caplog):
    root = text_folder(tmp_path, {"neg": [b"a", b"b", b"c"], "pos": [b"d", b"e", b"f"]})
    text_folder(root, {"neg": [b"g", b"h"]}, split="test")
    (root / "test" / "pos").mkdir()  # the folders agree with train/'s: the split lacks pos's files
    with caplog.at_level(logging.WARNING, logger="trainkit.data.class_folders"):
        textfolder_data(root, "data.val_fraction=0.3")
    assert f"'{root / 'test'}' holds no file of class pos, which train/ has" in caplog.text
    (root / "test" / "pos").rmdir()  # train/'s folders declare the classes, and test/ disagrees: a layout mistake
    with pytest.raises(ConfigError) as error:
        textfolder_data(root, "data.val_fraction=0.3")
    assert str(error.value).endswith("(missing ['pos'], extra []); val/ and test/ need the same class folders as "
                                     "train/ (one may be empty: a warning)")  # fmt: skip
    text_folder(root, {"unsup": [b"i"]})
    (root / "test" / "pos").mkdir()
    with pytest.raises(ConfigError) as error:  # aclImdb's train/unsup/, which test/ lacks
        textfolder_data(root, "data.val_fraction=0.3")
    assert str(error.value).endswith("or name the classes to read: data.class_folders=[neg,pos]")


@pytest.mark.parametrize("names", ["[neg,nope]", "[neg,urls.txt]"])
def test_class_folders_that_are_not_folders_of_train_are_one_line(tmp_path, names):
    root = text_folder(tmp_path, {"neg": [b"a", b"b"], "pos": [b"c", b"d"]})
    (root / "train" / "urls.txt").write_text("http://example.com")
    with pytest.raises(ConfigError) as error:
        textfolder_data(root, f"data.class_folders={names}")
    assert error.value.key == "data.class_folders" and "\n" not in str(error.value)
    assert f"names {names[5:-1]}, not a folder of '{root / 'train'}' (its folders: neg, pos)" in str(error.value)


@pytest.mark.parametrize(
    ("layout", "fragment"),
    [
        (None, "does not exist"),
        ({}, "has no train/ folder"),
        ({"only": [b"x"]}, "has 1 class folder"),
        ({"neg": [b"x"], "pos": []}, "holds no text files"),
    ],
)
def test_a_bad_folder_is_one_line_naming_data_root(tmp_path, layout, fragment):
    root = tmp_path / "texts"
    if layout is not None:
        (root / "elsewhere").mkdir(parents=True)
        if layout:
            text_folder(root, layout)
            for name in layout:
                (root / "train" / name).mkdir(parents=True, exist_ok=True)
    with pytest.raises(ConfigError) as error:
        textfolder_data(root)
    assert error.value.key == "data.root" and fragment in str(error.value) and "\n" not in str(error.value)


def test_a_root_that_is_the_train_folder_itself_says_text_and_names_its_parent(tmp_path):
    root = text_folder(tmp_path / "aclImdb", {"neg": [b"a"], "pos": [b"b"]})
    with pytest.raises(ConfigError) as error:
        textfolder_data(root / "train")
    assert str(error.value) == (
        f"data.root: folder '{root / 'train'}' has no train/ folder; expected "
        f"{root / 'train'}/train/<class>/<files>.txt; it looks like a split's folder itself: set data.root={root}"
    )
    reviews = text_folder(tmp_path, {"neg": [b"a"], "pos": [b"b"]}, split="reviews") / "reviews"
    with pytest.raises(ConfigError) as error:  # class folders straight under data.root, in no split's folder
        textfolder_data(reviews)
    assert str(error.value).endswith(
        f"<files>.txt; if its folders (neg, pos) are the classes, move them into {reviews}/train/"
    )


@pytest.mark.parametrize("split", ["train", "test"])
def test_a_file_that_is_not_utf8_in_any_split_is_refused_at_start_naming_it_or_skipped(tmp_path, caplog, split):
    root = text_folder(tmp_path, {"neg": [b"fine"] * 5, "pos": [b"good"] * 5})
    text_folder(root, {"neg": [b"fine"] * 2, "pos": [b"good"] * 2}, split="test")
    bad = root / split / "neg" / "cp1252.txt"
    bad.write_bytes("caf\u00e9 \u201cquoted\u201d".encode("cp1252"))
    with pytest.raises(ConfigError) as error:  # building the data reads every file: before any update
        textfolder_data(root, "data.val_fraction=0.2")
    assert str(error.value).startswith(f"data.root: cannot read text file '{bad}' (UnicodeDecodeError: 'utf-8' codec")
    assert str(error.value).endswith("save it as UTF-8, remove it, or pass data.skip_bad_files=true to skip it "
                                     "(counted in the log)")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="trainkit.data.text"):
        skipping = textfolder_data(root, "data.val_fraction=0.2", "data.skip_bad_files=true")
    assert (
        f"'{root / split}': skipped 1 of {11 if split == 'train' else 5} text files that are not UTF-8" in caplog.text
    )
    listed = [
        path for loader in (skipping.train, skipping.val, skipping.test) for path, _ in loader.loader.dataset.samples
    ]
    assert len(listed) == 14 and str(bad) not in listed
    for path in list((root / "train" / "neg").iterdir()):
        path.write_bytes(b"\xe9")  # every training file of a class: nothing of it is left to learn
    with pytest.raises(ConfigError, match=re.escape(f"'{root / 'train'}': every text file of neg is not UTF-8")):
        textfolder_data(root, "data.val_fraction=0.2", "data.skip_bad_files=true")


def test_a_file_changed_after_the_start_is_refused_when_read_or_skipped(tmp_path):
    root = text_folder(tmp_path, {"neg": [b"fine"] * 10, "pos": [b"good"] * 10})
    data = textfolder_data(root, "data.val_fraction=0.2", "data.test_fraction=0.2", "data.shuffle=false")
    bad = Path(data.train.loader.dataset.samples[1][0])
    bad.write_bytes(b"caf\xe9 latin-1")
    with pytest.raises(ConfigError, match=rf"cannot read text file '{re.escape(str(bad))}'.*save it as UTF-8"):
        for _ in data.train:
            pass


def test_token_budget_batches_of_a_text_folder_fit_the_budget(tmp_path):
    root = text_folder(tmp_path, {"neg": [b"n" * n for n in range(1, 80)], "pos": [b"p" * n for n in range(1, 80)]})
    data = textfolder_data(root, "data.max_length=64", "data.max_tokens=256", "data.batch_size=16")
    assert isinstance(data.train, FileLoader) and data.train.batch_sampler is not None
    data.train.set_epoch(0)
    shapes = [inputs.shape for inputs, _ in data.train]
    assert all(rows * longest <= 256 and rows <= 16 for rows, longest in shapes)
    assert sum(rows for rows, _ in shapes) == data.train.num_samples == len(data.train.loader.dataset)
    assert data.longest == 64  # the longest training text, cut at data.max_length: what micro-batches of tokens hold


@pytest.mark.parametrize("budget", [[], ["data.max_tokens=256"]])
def test_a_limited_validation_is_a_seeded_sample_of_both_classes_and_carved_splits_are_stratified(tmp_path, budget):
    from trainkit.tasks import evaluate
    from trainkit.tasks.classification import Classification

    class AlwaysNeg(torch.nn.Module):
        def forward(self, inputs):
            return torch.tensor([[1.0, 0.0]]).expand(len(inputs), 2)

    # Texts of one length: one bucket, ordered as listed (class by class), and a val split carved from train/.
    root = text_folder(tmp_path, {"neg": [b"n%09d" % i for i in range(40)], "pos": [b"p%09d" % i for i in range(40)]})
    data = textfolder_data(root, "data.val_fraction=0.4", "data.test_fraction=0.1", "data.eval_batch_size=8", *budget)
    val_labels = [label for _, label in data.val.loader.dataset.samples]
    test_labels = [label for _, label in data.test.loader.dataset.samples]
    assert (val_labels.count(0), val_labels.count(1), test_labels.count(0), test_labels.count(1)) == (16, 16, 4, 4)
    assert next(iter(data.val))[1].tolist() == [0] * 8  # the whole split's first batch: neg alone
    sampled = torch.cat([labels for _, labels in limited(data.val, 2)])
    assert len(sampled) == 16 and 0 < int(sampled.sum()) < 16
    task = Classification(num_classes=2)
    for _ in range(2):  # two epochs' validations: the same sample
        metrics = evaluate(AlwaysNeg(), data.val, lambda x: x, task, "fp32", CPU, limit=2)
        assert metrics["samples"] == 16 and metrics["acc"] == pytest.approx(float((sampled == 0).float().mean()))
    assert evaluate(AlwaysNeg(), data.val, lambda x: x, task, "fp32", CPU)["acc"] == 0.5  # whole: each text once


def test_a_changed_corpus_source_refuses_the_resume():
    dataset = TextDataset([b"def f(): pass"], [("/lib/a.py:1", 0)], 64)
    splits = FileSplits(dataset, dataset, dataset, num_classes=1)

    saved = data_fingerprint(splits, "CPython 3.11.7")
    assert saved["source"] == "CPython 3.11.7"
    check_same_data(saved, data_fingerprint(splits, "CPython 3.11.7"))
    with pytest.raises(ConfigError, match=re.escape("from CPython 3.12.1, the run's came from CPython 3.11.7")):
        check_same_data(saved, data_fingerprint(splits, "CPython 3.12.1"))


def test_stdlib_functions_are_split_by_file_and_record_the_python_version(monkeypatch):
    from trainkit.data import make_data
    from trainkit.data.stdlib_source import corpus_version

    option = make_data(OmegaConf.to_container(composed("experiment=stdlib_functions").data))
    made = option.splits()
    files = {
        name: {path.rsplit(":", 1)[0] for path, _ in getattr(made, name).samples} for name in ("train", "val", "test")
    }
    assert not files["train"] & files["val"] and not files["train"] & files["test"] and not files["val"] & files["test"]
    assert made.num_classes == 8 == len(option.class_names()) and option.source() == corpus_version()
    lengths = made.train.lengths
    assert int(lengths.max()) == option.max_length and int(lengths.min()) < 64  # long-tailed, cut at max_length
    first_text, first_label = made.train[0]
    assert first_text.dtype == torch.int64 and (first_text > 0).all() and 0 <= first_label < 8
    monkeypatch.setattr("trainkit.data.stdlib_functions.corpus_version", lambda: "CPython 3.99.0")
    with pytest.raises(ConfigError, match=re.escape("CPython 3.99.0")):
        check_same_data(data_fingerprint(made, corpus_version()), data_fingerprint(made, option.source()))
