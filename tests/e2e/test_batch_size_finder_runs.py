"""The batch-size finder (batch_size_finder.enabled) in train.py's run of a text classifier (model=sequence; a
Hugging Face model: test_hf.py); the search itself and its run on the default model:
tests/unit/tuning/test_batch_size_finder.py."""

import re

import pytest
import torch

# The run trains a text classifier: skipped once the text row is trimmed from this clone.
text_classification = pytest.importorskip("test_text_classification", reason="no text classification (trimmed)")
tiny, write_texts = text_classification.tiny, text_classification.write_texts


@pytest.fixture(scope="module")
def texts_corpus(tmp_path_factory):
    """train/<class>/*.txt, 45 files a class of three byte patterns (test_text_classification's)."""
    return write_texts(tmp_path_factory.mktemp("texts") / "train", 45, seed=0).parent


def test_the_batch_size_finder_runs_on_a_text_classifier(run_train, texts_corpus):
    overrides = ["batch_size_finder.enabled=true", "batch_size_finder.max_batch_size=16", "data.max_tokens=null"]
    run = run_train(*tiny(texts_corpus, "trainer.max_epochs=1", *overrides))  # max_tokens: fixed batches
    found = re.search(r"batch size finder: data\.batch_size=(\d+) per process", run.stdout + run.stderr)
    assert found and 1 <= int(found[1]) <= 16  # searched, within batch_size_finder.max_batch_size
    config = torch.load(run.run_dir / "checkpoints" / "best.pt", weights_only=True)["config"]
    assert config["data"]["batch_size"] == int(found[1])  # what every checkpoint holds: the size it trained with
