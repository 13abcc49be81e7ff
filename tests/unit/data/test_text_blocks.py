"""data=text: split by file, packed into blocks of block_size + 1 bytes, and its one-line errors."""

import pytest
import torch

from trainkit.data.fingerprint import check_same_data, data_fingerprint
from trainkit.data.stdlib_source import corpus_version
from trainkit.data.text_blocks import SEPARATOR, TextBlocks
from trainkit.errors import ConfigError


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
    assert len(val) == len(test) == 2 and len(train) == 6  # 10 files: 2 + 2 held out
    assert ord("z") not in train | val | test  # the pattern's files only, found below sub-folders too
    assert ord("J") in train | val | test  # deep/9.txt
    assert splits.num_classes == 256


def test_blocks_are_non_overlapping_inputs_and_their_next_bytes(corpus):
    data = text_data(corpus)
    inputs, targets = data.splits().train
    assert inputs.dtype == torch.uint8 and inputs.shape == targets.shape and inputs.shape[1] == 8
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    files = sorted(corpus.rglob("*.txt"))
    from trainkit.data.stdlib_source import split_by_file

    joined = SEPARATOR.join(p.read_bytes() for p in split_by_file(files, 0.2, 0.2, 0)["train"])
    count = len(joined) // 9
    assert len(inputs) == count
    packed = torch.tensor(list(joined[: count * 9])).view(count, 9)
    assert torch.equal(inputs, packed[:, :-1].to(torch.uint8)) and torch.equal(targets, packed[:, 1:].to(torch.uint8))


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
