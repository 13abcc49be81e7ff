"""data.tokenizer=bytes: a token per byte, bits per byte, the one-line config errors (a BPE and a tokenizer folder:
test_tokenizer_library.py)."""

import math
from pathlib import Path

import pytest
import torch

from conftest import composed
from trainkit.config.validation import validate
from trainkit.data import build_data
from trainkit.data.tokenizing import ByteTokens
from trainkit.errors import ConfigError
from trainkit.tasks.language_model import LanguageModel

CPU = torch.device("cpu")
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon"]


@pytest.fixture
def corpus(tmp_path) -> Path:
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


def test_bytes_stay_the_tokens_they_were(corpus):
    data = build_data(text_config(corpus).data, CPU, seed=0)
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


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.vocabulary=0"], r"(^|also )data.vocabulary: must be a whole number >= 1 or null, got 0"),
        (["+data.saved_in=/tmp"], r"^data.saved_in: is not a key of \w+ \([\w.]+\), which takes (?!.*saved_in)"),
    ],
)
def test_a_tokenizer_that_cannot_be_is_one_line_before_anything_is_built(overrides, message):
    for option in (["data=stdlib_functions", "model=sequence"], ["experiment=stdlib_gpt"]):
        with pytest.raises(ConfigError, match=message):
            validate(composed(*option, *overrides))


def test_a_vocabulary_or_padding_other_than_the_tokenizers_is_refused(tmp_path):
    root = tmp_path / "texts"
    for label in ("a", "b"):
        (root / "train" / label).mkdir(parents=True)
        for k in range(5):
            (root / "train" / label / f"{k}.txt").write_text(label * (k + 1))
    base = ("data=textfolder", f"data.root={root}", "data.num_workers=0", "model=sequence", "data.val_fraction=0.2")
    with pytest.raises(ConfigError, match=r"^data.vocabulary: is 300, but data.tokenizer=bytes has 257 ids; set"):
        build_data(composed(*base, "data.vocabulary=300", "data.test_fraction=0.2").data, CPU, seed=0)
    with pytest.raises(ConfigError, match=r"^data.pad_id: is 3, but data.tokenizer=bytes pads with 0; set"):
        build_data(composed(*base, "data.pad_id=3", "data.test_fraction=0.2").data, CPU, seed=0)
