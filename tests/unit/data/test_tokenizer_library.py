"""data.tokenizer=bpe, a BPE learned from the training split alone (saved in the run directory, read back, named in
the fingerprint), and a local tokenizer folder (trainkit.data.tokenizer_library); bits per byte on one scale; the
one-line config errors."""

import logging
import math
from pathlib import Path

import pytest
import torch
from test_text_blocks import CPU, WORDS, text_config, words_corpus

from conftest import composed
from trainkit.config.validation import validate
from trainkit.data import build_data
from trainkit.data.fingerprint import check_same_data
from trainkit.data.tokenizer_library import TextTokens, saved_tokenizer, train_bpe
from trainkit.errors import ConfigError
from trainkit.tasks.language_model import LanguageModel

__all__ = ["words_corpus"]  # test_text_blocks' fixture, used here


def test_bpe_learns_from_the_training_split_is_saved_and_read_back_and_named_in_the_fingerprint(
    words_corpus, tmp_path, caplog
):
    cfg = text_config(words_corpus, "data.tokenizer=bpe", "data.vocab_size=300")
    run_dir = tmp_path / "run"
    data = build_data(cfg.data, CPU, seed=0, run_dir=run_dir)
    saved = saved_tokenizer(run_dir)
    assert saved.is_file() and isinstance(data.tokenizer, TextTokens)
    tokenizer = data.tokenizer.tokenizer
    assert data.vocabulary == data.num_classes == tokenizer.get_vocab_size() <= 300 and data.pad_id is None
    assert tokenizer.token_to_id("<pad>") == 0 and tokenizer.token_to_id("Ġgamma") is not None  # a merged word
    held_out = torch.cat([data.val.images.flatten(), data.test.images.flatten()]).tolist()
    assert "zyzzyva" in data.tokenizer.decode(held_out) and "zyzzyva" not in data.tokenizer.decode(
        data.train.images.flatten().tolist()
    )
    assert tokenizer.token_to_id("Ġzyzzyva") is None  # learned from the training split alone
    assert data.train.images.dtype == torch.int32 and int(data.train.images.max()) < data.vocabulary
    assert data.fingerprint["tokenizer"].startswith("bpe sha256:")

    with caplog.at_level(logging.INFO, logger="trainkit.data.tokenizer_library"):
        again = build_data(cfg.data, CPU, seed=0, run_dir=run_dir, trains_tokenizer=False)  # a resume, eval.py
    assert f"{saved} (saved by the run)" in caplog.text
    assert again.fingerprint == data.fingerprint and torch.equal(again.train.images, data.train.images)
    bytes_data = build_data(text_config(words_corpus).data, CPU, seed=0)
    with pytest.raises(
        ConfigError,
        match=r"^data: the tokenizer is bytes, was bpe sha256:\w+ since the checkpoint: "
        r"the resumed run would read its data as other tokens than its weights learned; resume with",
    ):
        check_same_data(data.fingerprint, bytes_data.fingerprint)
    with pytest.raises(ConfigError, match=r"^data.tokenizer: is bpe, trained by the run .* there is no .*tokenizer"):
        build_data(cfg.data, CPU, seed=0, run_dir=tmp_path / "elsewhere", trains_tokenizer=False)


def test_bits_per_byte_divide_the_nats_by_the_bytes_the_tokens_stand_for():
    tokenizer = train_bpe(300, [" ".join(WORDS * 20)])
    tokens = TextTokens(tokenizer, "bpe", 0)
    ids = tokens.encode(b"alpha beta gamma delta")
    assert tokens.token_bytes()[ids].sum() == len(b"alpha beta gamma delta")  # every byte once
    task = LanguageModel()
    task.tokenizer = tokens
    logits = torch.randn(1, len(ids), tokens.vocabulary)
    nats = torch.nn.functional.cross_entropy(logits[0], ids, reduction="sum").item()
    metrics = task.metrics(task.metric_sums(logits, ids[None]))
    assert metrics["bpb"] == pytest.approx(nats / len(b"alpha beta gamma delta") / math.log(2), rel=1e-5)


def save_tokenizer_folder(folder: Path, texts: list[str], with_transformers: bool) -> TextTokens:
    """A BPE saved as transformers saves a tokenizer (tokenizer.json and tokenizer_config.json naming its pad token,
    here "[PAD]" at the end), or as tokenizers saves one (tokenizer.json alone, its padding switched on)."""
    tokenizer = train_bpe(300, texts)
    tokenizer.add_special_tokens(["[PAD]"])
    folder.mkdir(parents=True)
    if with_transformers:
        from transformers import PreTrainedTokenizerFast

        PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]").save_pretrained(str(folder))
    else:
        tokenizer.enable_padding(pad_id=tokenizer.token_to_id("[PAD]"), pad_token="[PAD]")
        tokenizer.save(str(folder / "tokenizer.json"))
    return TextTokens(tokenizer, str(folder), tokenizer.token_to_id("[PAD]"))


@pytest.mark.parametrize("with_transformers", [True, False])
def test_a_local_tokenizer_folder_gives_the_ids_the_vocabulary_and_the_padding(tmp_path, with_transformers):
    root = tmp_path / "texts"
    for label, word in (("a", "alpha"), ("b", "beta")):
        (root / "train" / label).mkdir(parents=True)
        for k in range(10):
            (root / "train" / label / f"{k}.txt").write_text(f"{word} " * (k + 1))
    expected = save_tokenizer_folder(tmp_path / "tok", [f"{w} " * 30 for w in WORDS], with_transformers)
    cfg = composed(
        "data=textfolder", f"data.root={root}", "data.num_workers=0", "model=sequence",
        f"data.tokenizer={tmp_path / 'tok'}", "data.max_length=4", "data.val_fraction=0.2", "data.test_fraction=0.2",
    )  # fmt: skip
    validate(cfg)
    data = build_data(cfg.data, CPU, seed=0)
    pad = expected.pad_id
    assert data.pad_id == pad == data.vocabulary - 1 and data.vocabulary == expected.vocabulary
    inputs, _ = next(iter(data.train))
    dataset = data.train.loader.dataset
    for index in range(len(dataset)):
        ids, _ = dataset[index]
        assert ids.tolist() == expected.encode(Path(dataset.samples[index][0]).read_bytes()).tolist()[:4]
    assert (inputs == pad).any() and int(inputs.max()) < data.vocabulary
    assert data.fingerprint["tokenizer"].startswith(f"{tmp_path / 'tok'} sha256:")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.tokenizer=nowhere"], r"^data.tokenizer: is 'nowhere': neither bytes, bpe nor a folder; give"),
        (["data.tokenizer=bpe", "data.vocab_size=200"], r"^data.vocab_size: is 200; a byte-level BPE holds <pad>"),
        (["data.tokenizer={empty}"], r"^data.tokenizer: '.*empty' holds no tokenizer.json or tokenizer_config.json"),
    ],
)
def test_a_tokenizer_that_cannot_be_is_one_line_before_anything_is_built(tmp_path, overrides, message):
    (tmp_path / "empty").mkdir()
    given = [override.format(empty=tmp_path / "empty") for override in overrides]
    for option in (["data=stdlib_functions", "model=sequence"], ["experiment=stdlib_gpt"]):
        with pytest.raises(ConfigError, match=message):
            validate(composed(*option, *given))
