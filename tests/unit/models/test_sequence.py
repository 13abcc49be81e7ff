"""model=sequence (SequenceClassifier): what a text gets does not depend on the padding its batch adds."""

import torch

from trainkit.data.text import PAD_ID, pad_to_longest, tokens_of
from trainkit.models.sequence import SequenceClassifier


def model() -> SequenceClassifier:
    torch.manual_seed(0)
    return SequenceClassifier(vocabulary=257, num_classes=3, max_length=64, width=16, depth=2, heads=2).eval()


def test_a_text_gets_the_same_scores_alone_and_padded_in_a_batch_of_longer_ones():
    short, long = tokens_of(b"def f(): pass"), tokens_of(b"class A:\n    def g(self):\n        return 1\n")
    batch, _ = pad_to_longest([(short, 0), (long, 1)])
    assert (batch[0, len(short) :] == PAD_ID).all()
    with torch.no_grad():
        alone, padded = model()(short.unsqueeze(0)), model()(batch)
    assert padded.shape == (2, 3)
    torch.testing.assert_close(padded[0], alone[0], rtol=1e-5, atol=1e-5)  # the padding is masked and not averaged


def test_an_empty_text_scores_and_trains_without_nan():
    # An empty .txt file in a text folder: attention over no key at all was NaN, and the run stopped on its loss.
    batch, labels = pad_to_longest([(tokens_of(b""), 0), (tokens_of(b"x = 1"), 1)])
    with torch.no_grad():
        assert torch.isfinite(model()(batch)).all()
    training = model().train()
    torch.nn.functional.cross_entropy(training(batch), labels).backward()
    assert all(torch.isfinite(p.grad).all() for p in training.parameters() if p.grad is not None)


def test_its_config_check_wants_a_position_for_every_token_the_data_keeps():
    """SequenceClassifier.config_problems, gathered by the config check: model.max_length >= data.max_length."""
    from conftest import composed
    from trainkit.config.validation import problems

    assert problems(composed("experiment=stdlib_functions", "model.max_length=256")) == {
        "model.max_length": "is 256, below data.max_length=512: the model has no position for the tokens beyond; "
        "set model.max_length=${data.max_length}"
    }
