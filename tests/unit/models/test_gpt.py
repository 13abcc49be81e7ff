"""The byte-level GPT (model=gpt): its loss at init, that it learns, its shapes, what weight decay skips."""

import math

import pytest
import torch
import torch.nn.functional as F

from trainkit.models.gpt import GPT
from trainkit.optim import param_groups


def tiny(**sizes) -> GPT:
    torch.manual_seed(0)
    return GPT(**{"vocab_size": 256, "block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32, **sizes})


def test_logits_are_batch_by_time_by_vocabulary_and_the_output_layer_is_the_token_embedding():
    model = tiny()
    assert model(torch.randint(0, 256, (3, 20))).shape == (3, 20, 256)
    assert model.head.weight is model.token_embedding.weight
    with pytest.raises(ValueError, match=r"block_size=32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_the_loss_at_init_is_that_of_a_uniform_guess_over_the_bytes():
    model = tiny(n_layer=4, n_embd=128, n_head=4, block_size=128)
    tokens = torch.randint(0, 256, (8, 129), generator=torch.Generator().manual_seed(1))
    loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    assert abs(loss.item() - math.log(256)) < 0.1


def test_a_few_steps_on_one_repeated_block_overfit_it():
    model = tiny()
    block = torch.tensor(list(b"def fibonacci(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"[:33]))
    inputs, targets = block[:-1].repeat(8, 1), block[1:].repeat(8, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05
    assert (model(inputs[:1]).argmax(-1) == targets[:1]).all()


def test_the_causal_mask_hides_the_future():
    model = tiny().eval()
    tokens = torch.randint(0, 256, (1, 16))
    changed = tokens.clone()
    changed[0, 10] = (tokens[0, 10] + 1) % 256
    with torch.no_grad():
        assert torch.allclose(model(tokens)[0, :10], model(changed)[0, :10], atol=1e-6)


def test_weight_decay_falls_on_the_matrices_alone():
    model = tiny()
    decayed, undecayed = (group["params"] for group in param_groups(model, weight_decay=0.1)[:2])
    names = {id(param): name for name, param in model.named_parameters()}
    assert {names[id(p)] for p in decayed} == {
        name for name, p in model.named_parameters() if p.ndim == 2 and "embedding" not in name
    }
    assert {"token_embedding.weight", "position_embedding.weight", "norm.weight", "blocks.0.norm1.bias"} <= {
        names[id(p)] for p in undecayed
    }
    assert len(decayed) + len(undecayed) == len(list(model.parameters()))  # the tied matrix once


def test_residual_projections_start_small():
    model = GPT(n_layer=8, n_embd=128, n_head=4, block_size=64)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_a_copy_of_the_gpt_with_renamed_arguments_keeps_its_config_checks(tmp_path, monkeypatch):
    """The checks on the GPT's sizes are the class's own (GPT.config_rules, GPT.config_problems), not a reading of
    model.n_embd from trainkit.config: rename the arguments in a copy, and the copy's checks follow them."""
    from pathlib import Path

    from conftest import composed
    from trainkit.config.validation import problems
    from trainkit.models import gpt

    source = Path(gpt.__file__).read_text()
    for name, renamed in (("n_embd", "width"), ("n_head", "heads"), ("n_layer", "layers")):
        source = source.replace(name, renamed)
    (tmp_path / "renamed_gpt.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    renamed = ["experiment=stdlib_gpt", "model._target_=renamed_gpt.GPT", "~model.n_embd", "~model.n_head"]
    renamed += ["~model.n_layer", "+model.layers=2"]
    assert problems(composed(*renamed, "+model.width=130", "+model.heads=4")) == {
        "model.width": "is 130, not divisible by model.heads=4: each head takes an equal share"
    }
    assert problems(composed(*renamed, "+model.width=128", "+model.heads=4", "model.block_size=64")) == {
        "model.block_size": "is 64, but data.block_size is 128: the model's context is the data's block; "
        "set data.block_size=64 (model.block_size follows it)"
    }
    assert problems(composed(*renamed, "+model.width=128", "+model.heads=4", "model.layers=0")) == {
        "model.layers": "must be a whole number >= 1, got 0"
    }
    assert problems(composed(*renamed, "+model.width=128", "+model.heads=4")) == {}
