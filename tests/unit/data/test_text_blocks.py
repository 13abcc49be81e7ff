"""data=text: split by bytes in whole files, packed into blocks of block_size + 1 bytes, what it reads and what it
leaves out (hidden files, files that are not UTF-8), and its one-line errors."""

import logging
import math
from pathlib import Path

import pytest
import torch

from conftest import composed
from trainkit.data import build_data
from trainkit.data.fingerprint import check_same_data, data_fingerprint
from trainkit.data.stdlib_source import corpus_version
from trainkit.data.text_blocks import SEPARATOR, TextBlocks, split_by_bytes
from trainkit.data.tokenizing import ByteTokens
from trainkit.errors import ConfigError
from trainkit.tasks.language_model import LanguageModel


def text_data(root, **keys) -> TextBlocks:
    options = dict(
        name="text",
        root=None if root is None else str(root),
        pattern="*.txt",
        num_classes=256,
        batch_size=4,
        eval_batch_size=4,
        num_workers=0,
        drop_last=True,
        shuffle=True,
        block_size=8,
        val_fraction=0.2,
        test_fraction=0.2,
        split_seed=0,
    )
    return TextBlocks(**{**options, **keys})


@pytest.fixture
def corpus(tmp_path):
    """Ten files, each one letter repeated (file k: chr(65 + k)), one in a sub-folder, and a file the pattern skips."""
    for k in range(10):
        folder = tmp_path / ("deep" if k == 9 else "")
        folder.mkdir(exist_ok=True)
        (folder / f"{k}.txt").write_bytes(bytes([65 + k]) * (50 + k))
    (tmp_path / "skip.py").write_bytes(b"z" * 500)
    return tmp_path


def letters(split) -> set[int]:
    inputs, targets = split
    return set(torch.cat([inputs.flatten(), targets.flatten()]).tolist()) - set(SEPARATOR)


def test_val_and_test_are_whole_files_never_seen_in_training(corpus):
    splits = text_data(corpus).splits()
    train, val, test = (letters(s) for s in (splits.train, splits.val, splits.test))
    assert not (train & val) and not (train & test) and not (val & test)
    assert len(val) == len(test) == 2 and len(train) == 6  # 545 bytes: val and test 2 whole files each (<= 109 bytes)
    assert ord("z") not in train | val | test  # the pattern's files only, found below sub-folders too
    assert ord("J") in train | val | test  # deep/9.txt
    assert splits.num_classes == 256


def test_the_split_is_by_bytes_so_one_big_file_is_never_a_held_out_split(tmp_path, caplog):
    """Thirty files of 100 bytes and one of 3,000 (02.txt, which the split by file count put in the test split: 3,500
    of its 6,000 bytes): val and test each take whole files up to 20% of the bytes, the big file trains, and the start
    line says what each split holds."""
    for k in range(31):
        (tmp_path / f"{k:02d}.txt").write_bytes(bytes([65 + k]) * (3000 if k == 2 else 100))
    with caplog.at_level(logging.INFO, logger="trainkit.data.text_blocks"):
        splits = text_data(tmp_path).splits()
    train, val, test = (letters(s) for s in (splits.train, splits.val, splits.test))
    assert ord("C") in train and len(val) == len(test) == 12 and len(train) == 7  # 1,200 bytes each: 12 files of 100
    assert len(splits.test[0]) == (12 * 100 + 11 * 2) // 9 == len(splits.val[0])  # joined by blank lines, 9-byte blocks
    assert caplog.messages == [
        f"text corpus '{tmp_path}', split by bytes (data.split_seed=0): train 7 files, 3,600 bytes, 401 blocks; "
        "val 12 files, 1,200 bytes, 135 blocks; test 12 files, 1,200 bytes, 135 blocks"
    ]


def test_split_by_bytes_fills_each_held_out_split_up_to_its_share_the_same_for_a_seed():
    sizes = [5, 40, 7, 300, 12, 9, 60, 3, 25, 11, 8, 20]  # 500 bytes
    parts = split_by_bytes(sizes, {"test": 0.1, "val": 0.2}, seed=3)
    assert parts == split_by_bytes(sizes, {"test": 0.1, "val": 0.2}, seed=3)
    assert sorted(parts["train"] + parts["val"] + parts["test"]) == list(range(12))
    assert 3 in parts["train"]  # 300 bytes fit neither 50 nor 100
    held = {name: sum(sizes[i] for i in parts[name]) for name in parts}
    assert held["test"] <= 50 and held["val"] <= 100 and held["train"] == 500 - held["test"] - held["val"]
    assert parts != split_by_bytes(sizes, {"test": 0.1, "val": 0.2}, seed=4)
    with pytest.raises(ConfigError, match=r"^data.test_fraction: 0.01 of the corpus's 500 bytes \(5\) holds no whole"):
        split_by_bytes([100, 200, 200], {"test": 0.01, "val": 0.2}, seed=0)


def test_hidden_files_are_never_read_and_are_counted(corpus, caplog):
    (corpus / ".hidden.txt").write_bytes(b"h" * 400)
    (corpus / ".git").mkdir()
    (corpus / ".git" / "x.txt").write_bytes(b"g" * 400)
    with caplog.at_level(logging.INFO, logger="trainkit.data.text_blocks"):
        splits = text_data(corpus).splits()
    assert not {ord("h"), ord("g")} & (letters(splits.train) | letters(splits.val) | letters(splits.test))
    assert caplog.messages[-1].endswith("blocks; ignored 2 hidden files")
    (corpus / ".notes.md").write_text("x")
    with pytest.raises(ConfigError, match=r"^data.pattern: no file under .* matches '\*.md' but 1 hidden one\(s\)"):
        text_data(corpus, pattern="*.md").splits()


@pytest.mark.parametrize(
    "text", ["café au lait".encode("latin-1"), bytes(range(128, 256)) * 3], ids=["latin1", "bytes"]
)
def test_a_file_that_is_not_utf8_is_refused_naming_it_or_skipped_and_counted(corpus, caplog, text):
    bad = corpus / "deep" / "latin.txt"
    bad.write_bytes(text)
    with pytest.raises(ConfigError) as refused:
        text_data(corpus).splits()
    assert str(refused.value).startswith(f"data.root: cannot read text file '{bad}' (UnicodeDecodeError: 'utf-8' codec")
    assert str(refused.value).endswith("or pass data.skip_bad_files=true to skip it (counted in the log)")
    assert "\n" not in str(refused.value)
    with caplog.at_level(logging.INFO, logger="trainkit.data.text_blocks"):
        skipped = text_data(corpus, skip_bad_files=True).splits()
    assert caplog.messages[-1].endswith(f"blocks; skipped 1 files that are not UTF-8 (data.skip_bad_files=true): {bad}")
    bad.unlink()
    kept = text_data(corpus).splits()  # the same corpus without it
    assert all(
        torch.equal(a[0], b[0])
        for a, b in zip((skipped.train, skipped.val, skipped.test), (kept.train, kept.val, kept.test))
    )


def test_a_missing_root_no_matching_file_and_a_split_shorter_than_a_block_are_one_line_each(corpus, tmp_path):
    with pytest.raises(ConfigError, match=r"^data.root: .* is not a folder"):
        text_data(tmp_path / "nowhere").splits()
    with pytest.raises(ConfigError, match=r"^data.pattern: no file under .* matches '\*.md'"):
        text_data(corpus, pattern="*.md").splits()
    with pytest.raises(ConfigError, match=r"^data.block_size: 200 \+ 1 bytes is more than the (val|test) split's"):
        text_data(corpus, block_size=200).splits()


def test_the_stdlib_corpus_is_named_by_its_python_version_in_the_fingerprint(corpus):
    stdlib = text_data(None)
    assert stdlib.source() == f"stdlib of {corpus_version()}" and text_data(corpus).source() is None
    splits = text_data(corpus).splits()
    now = data_fingerprint(splits, "stdlib of CPython 3.11.7")
    check_same_data(now, data_fingerprint(splits, "stdlib of CPython 3.11.7"))
    with pytest.raises(ConfigError, match=r"^data: the data comes from stdlib of CPython 3\.12\.1, the run's came"):
        check_same_data(now, data_fingerprint(splits, "stdlib of CPython 3.12.1"))


def test_a_resume_on_another_split_is_refused_by_the_fingerprint_of_its_blocks(corpus):
    saved = data_fingerprint(text_data(corpus).splits())
    check_same_data(saved, data_fingerprint(text_data(corpus).splits()))
    with pytest.raises(ConfigError, match=r"^data: the train split holds other values .* the test split holds other"):
        check_same_data(saved, data_fingerprint(text_data(corpus, split_seed=1).splits()))


# data=text's bytes as tokens and bits per byte (data.tokenizer=bytes: test_tokenizing.py)
CPU = torch.device("cpu")
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon"]


@pytest.fixture
def words_corpus(tmp_path) -> Path:
    """Twelve text files of common words; one file alone says 'zyzzyva' (in whichever split it falls)."""
    root = tmp_path / "corpus"
    root.mkdir()
    for k in range(12):
        words = [WORDS[(k + i) % len(WORDS)] for i in range(200)]
        (root / f"{k:02}.txt").write_text(" ".join(words) + ("zyzzyva " * 50 if k == 5 else ""))
    return root


def text_config(corpus: Path, *overrides: str):
    return composed(
        "experiment=stdlib_gpt", f"data.root={corpus}", "data.pattern=*.txt", "data.block_size=8",
        "data.val_fraction=0.2", "data.test_fraction=0.2", *overrides,
    )  # fmt: skip


def test_bytes_stay_the_tokens_they_were(words_corpus):
    data = build_data(text_config(words_corpus).data, CPU, seed=0)
    assert isinstance(data.tokenizer, ByteTokens) and data.vocabulary == data.num_classes == 256
    assert data.train.images.dtype == torch.uint8 and "tokenizer" not in data.fingerprint
    assert data.tokenizer.decode(data.val.images[0].tolist()).encode() == bytes(data.val.images[0].tolist())


def test_bits_per_byte_of_bytes_are_the_loss_in_bits():
    task = LanguageModel()
    task.tokenizer = ByteTokens(offset=0)
    byte_ids = torch.tensor([list(b"abc")])
    byte_logits = torch.randn(1, 3, 256)
    loss = torch.nn.functional.cross_entropy(byte_logits[0], byte_ids[0]).item()
    assert task.metrics(task.metric_sums(byte_logits, byte_ids))["bpb"] == pytest.approx(loss / math.log(2))
