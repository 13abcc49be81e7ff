"""data_identity (trainkit.data.fingerprint): what a run read before any split (the same for every fold and split
seed, other for other contents)."""

import hashlib
import json
import logging

import pytest
import torch

from conftest import composed
from helpers import has_folds, template_has
from trainkit.config.validation import validate
from trainkit.data import build_data
from trainkit.data.fingerprint import check_same_data, identity_changes
from trainkit.errors import ConfigError

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def built(*overrides: str):
    cfg = composed(*overrides)
    validate(cfg)
    return build_data(cfg.data, CPU, seed=0)


def reviews(path, last_word: str) -> None:
    """80 rows of two classes; `last_word` (4 letters) ends every text: the same size and labels, other words."""
    rows = [{"text": ("great " if k % 2 else "awful ") * (1 + k % 7) + last_word, "label": k % 2} for k in range(80)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(row) for row in rows))


def hf(tmp_path, path, *overrides: str):
    return built(
        "data=hf", f"data.path={path}", "model=sequence", "data.num_workers=0", "data.max_length=16",
        f"data.cache_dir={tmp_path / 'cache'}", *overrides,
    )  # fmt: skip


def test_the_identity_is_the_same_for_every_fold_and_split_seed():
    plain = built().fingerprint["identity"]
    assert plain == {
        "option": "trainkit.data.datasets.Digits",
        "classes": 10,
        "samples": 1797,
        "digest": plain["digest"],
    }
    folds = [["data.folds=3", "data.fold=2"]] if has_folds else []
    for overrides in (*folds, ["data.split_seed=7", "data.val_fraction=0.2"]):
        assert built(*overrides).fingerprint["identity"] == plain, overrides  # settings, not other data


@pytest.mark.skipif(not template_has("data/hf.yaml"), reason="this clone has no data=hf (trimmed)")
def test_hf_files_of_the_same_name_and_size_with_other_words_are_other_data(tmp_path, caplog):
    first, second = tmp_path / "a" / "reviews.jsonl", tmp_path / "b" / "reviews.jsonl"
    reviews(first, "fine")
    reviews(second, "okay")
    assert first.stat().st_size == second.stat().st_size
    a, b = hf(tmp_path, first), hf(tmp_path, second)
    assert a.fingerprint["source"] == b.fingerprint["source"]  # names and sizes: all that was compared before
    assert (
        a.fingerprint["identity"]["files"]["reviews.jsonl"]["sha256"] == hashlib.sha256(first.read_bytes()).hexdigest()
    )
    if has_folds:
        assert hf(tmp_path, first, "data.folds=4", "data.fold=1").fingerprint["identity"] == a.fingerprint["identity"]
    with pytest.raises(ConfigError) as error:
        check_same_data(a.fingerprint, b.fingerprint)
    digests = [hashlib.sha256(path.read_bytes()).hexdigest()[:12] for path in (second, first)]
    assert str(error.value).startswith(
        f"data: the contents of reviews.jsonl differ (the same name and size; sha256 {digests[0]}, was {digests[1]}) "
        "since the checkpoint:"
    )
    older = {key: value for key, value in a.fingerprint.items() if key != "identity"}  # a checkpoint from before
    with caplog.at_level(logging.WARNING, logger="trainkit.data.fingerprint"):
        check_same_data(older, b.fingerprint)  # nothing to compare the contents with: accepted, and said so
    assert "records no digest of its data files' contents (saved before digests were recorded)" in caplog.text


@pytest.mark.skipif(not template_has("data/text.yaml"), reason="this clone has no data=text (trimmed)")
def test_a_text_corpus_is_the_texts_it_read_whatever_the_fold(tmp_path):
    """data=text cuts blocks per split: another fold gives other blocks, of the same texts."""
    for k in range(12):
        (tmp_path / f"{k:02}.txt").write_bytes(f"<{k:02}>".encode() + bytes([97 + k]) * 40)
    keys = (
        "data=text",
        "model=gpt",
        f"data.root={tmp_path}",
        "data.pattern=*.txt",
        "data.block_size=8",
        "data.val_fraction=0.2",
        "data.test_fraction=0.2",
    )
    plain = built(*keys).fingerprint["identity"]
    assert plain["texts"] == 12 and plain["classes"] is None
    if has_folds:
        assert built(*keys, "data.folds=3", "data.fold=1").fingerprint["identity"] == plain
    (tmp_path / "05.txt").write_bytes(b"<05>" + b"z" * 40)
    assert identity_changes(plain, built(*keys).fingerprint["identity"]) == [
        "other texts (as many: another digest of their contents)"
    ]
