"""trainer.micro_batch_size=auto in train.py's run of a language model (sized data: the search counts tokens); the
search itself, its checks and its run on the default model: tests/unit/tuning/test_micro_batching.py."""

import pytest
import torch

# The language model's helpers: a clone trimmed of the language_model row has no run of one to size.
language_model = pytest.importorskip("test_language_model", reason="this clone has no language model (trimmed)")
stdlib_corpus, tiny = language_model.stdlib_corpus, language_model.tiny


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return stdlib_corpus(tmp_path_factory.mktemp("corpus"))


def test_auto_trains_a_language_model_in_parts_counted_in_tokens(run_train, corpus):
    # the cap: fewer than 8 blocks of 32 tokens a part
    run = run_train(*tiny(corpus, "trainer.micro_batch_size=auto", "trainer.micro_batch_memory_cap_mb=0.5"))
    assert run.summary["test"]["test/bpb"] < 8  # learning: ln(256) nats is 8 bits
    saved = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)["config"]["trainer"]
    assert isinstance(saved["micro_batch_size"], int) and saved["micro_batch_size"] < 8 * 32  # tokens, not auto
