"""task=language_model: per-token loss, bits per byte, token accuracy, and seeded sampling."""

import math

import pytest
import torch
import torch.nn.functional as F

from trainkit.models.gpt import GPT
from trainkit.tasks.language_model import LanguageModel, decode, encode, generate, sample_text
from trainkit.tasks.task import higher_is_better


def test_bits_per_byte_are_the_loss_in_bits_over_real_tokens_and_ignored_targets_count_for_nothing():
    task = LanguageModel()
    outputs = torch.randn(2, 5, 256, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 256, (2, 5))
    targets[1, 3:] = -100
    real = targets != -100
    nats = F.cross_entropy(outputs[real], targets[real])
    assert task.loss(outputs, targets).item() == pytest.approx(nats.item(), rel=1e-5)
    assert task.evaluation_loss(outputs, targets).shape == (8,)
    metrics = task.metrics(task.metric_sums(outputs, targets))
    assert metrics["bpb"] == pytest.approx(nats.item() / math.log(2), rel=1e-5)
    assert metrics["token_acc"] == pytest.approx((outputs.argmax(-1)[real] == targets[real]).float().mean().item())
    assert task.weight((torch.zeros_like(targets), targets)).item() == 8
    assert not higher_is_better(LanguageModel, "val/bpb") and higher_is_better(LanguageModel, "val/token_acc")


def test_bytes_arrive_as_uint8_and_become_ids():
    inputs, targets = LanguageModel().to_device(
        (torch.tensor([[1, 2]], dtype=torch.uint8), torch.tensor([[2, 3]], dtype=torch.uint8)), torch.device("cpu")
    )
    assert inputs.dtype == targets.dtype == torch.int64


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GPT(block_size=16, n_layer=1, n_head=2, n_embd=16)


def test_a_seeded_sample_is_reproducible_within_the_vocabulary_and_leaves_the_global_rng_alone(model):
    state = torch.random.get_rng_state()
    prompt = encode("def fibonacci(n):")  # longer than block_size: the context is cropped
    first = generate(model, prompt, 40, temperature=1.0, top_k=None, seed=3)
    assert first == generate(model, prompt, 40, temperature=1.0, top_k=None, seed=3)
    assert first != generate(model, prompt, 40, temperature=1.0, top_k=None, seed=4)
    assert len(first) == 40 and all(0 <= token < 256 for token in first)
    assert torch.equal(state, torch.random.get_rng_state())
    assert model.training is False or model.training is True  # put back as it was
    greedy = generate(model, prompt, 5, temperature=0.0)
    assert greedy == generate(model, prompt, 5, temperature=0.0, seed=99)


def test_top_k_one_is_greedy_and_text_decodes_with_replacement(model):
    prompt = encode("x = ")
    assert generate(model, prompt, 8, temperature=1.0, top_k=1, seed=0) == generate(model, prompt, 8, temperature=0)
    assert decode([0xE2, 0x82]) == "\ufffd"  # a cut character
    assert isinstance(sample_text(model, "", 4, 0.8, 40, 0), str)  # an empty prompt starts from a newline


def test_the_trackers_sample_continues_the_first_validation_block(model):
    task = LanguageModel(sample_tokens=10, prompt_bytes=4)
    shown = (torch.tensor([list(b"import os\n")]), torch.zeros(1, 10, dtype=torch.long))
    key, text = task.sample_for_logging(model, shown)
    assert key == "val/sample" and text.startswith("impo")
    assert LanguageModel(sample_tokens=0).sample_for_logging(model, shown) is None
