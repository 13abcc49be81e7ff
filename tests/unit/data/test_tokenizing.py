"""data.tokenizer=bytes: a token per byte, the one-line config errors (a BPE and a tokenizer folder:
test_tokenizer_library.py; data=text's bytes and bits per byte: test_text_blocks.py)."""

import pytest
import torch

from conftest import composed
from helpers import template_has
from trainkit.config.validation import validate
from trainkit.data import build_data
from trainkit.errors import ConfigError

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.vocabulary=0"], r"(^|also )data.vocabulary: must be a whole number >= 1 or null, got 0"),
        (["+data.saved_in=/tmp"], r"^data.saved_in: is not a key of \w+ \([\w.]+\), which takes (?!.*saved_in)"),
    ],
)
def test_a_tokenizer_that_cannot_be_is_one_line_before_anything_is_built(overrides, message):
    options = [["data=stdlib_functions", "model=sequence"]]
    options += [["experiment=stdlib_gpt"]] if template_has("experiment/stdlib_gpt.yaml") else []  # a trim removes it
    for option in options:
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
