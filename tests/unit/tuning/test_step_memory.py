"""trainkit.tuning.step_memory, what both size searches (batch_size_finder, trainer.micro_batch_size=auto) measure
with: which errors mean out of memory, what a step's memory is on a CPU, and a probe that leaves the model as it was."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import backward_step
from trainkit.models.small_cnn import SmallCNN
from trainkit.tuning.step_memory import MemoryCapExceeded, is_out_of_memory, measure_step_memory, training_step_probe


def out_of_memory_errors() -> list[BaseException]:
    """Every kind of error a size search (trainkit.tuning.step_memory.is_out_of_memory) reads as out of memory."""
    return [
        torch.cuda.OutOfMemoryError("CUDA out of memory."),
        RuntimeError("MPS backend out of memory"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1GB"),
        MemoryCapExceeded("over the cap"),
    ]


@pytest.mark.parametrize("error", out_of_memory_errors())
def test_every_kind_of_out_of_memory_error_is_one(error):
    assert is_out_of_memory(error)


def test_other_errors_are_not():
    assert not is_out_of_memory(RuntimeError("expected scalar type Float"))
    assert not is_out_of_memory(ValueError("out of memory"))  # a RuntimeError only


def probe_of_an_mlp():
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    images, labels = torch.randn(8, 256), torch.randint(0, 10, (8,))
    probe = training_step_probe(model, (images, labels), backward_step(model, F.cross_entropy))

    def measured(batch_size: int) -> int:
        with measure_step_memory("cpu") as measurement:
            probe(batch_size)
        return measurement.peak_bytes

    return measured


def test_cpu_measurement_counts_the_activations_and_grows_with_the_batch():
    measured = probe_of_an_mlp()
    # Saved for backward per sample: the input (256 floats), the hidden layer (512: ReLU's output,
    # which the second linear keeps too, counted once), the log-softmax (10) and the label (int64);
    # plus one scalar. The weights (or their transposed views) are parameters, not counted.
    for batch_size in (1, 10, 100):
        assert measured(batch_size) == batch_size * ((256 + 512 + 10) * 4 + 8) + 4


def test_the_probe_leaves_model_buffers_gradients_modes_and_rng_untouched():
    torch.manual_seed(0)
    model = SmallCNN(1, 10, widths=(4, 8, 8), dropout=0.5).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    images, labels = torch.randint(0, 256, (5, 1, 8, 8), dtype=torch.uint8), torch.randint(0, 10, (5,))
    probe = training_step_probe(
        model, (images, labels), backward_step(model, F.cross_entropy, lambda x: x.float() / 255)
    )
    rng = torch.get_rng_state()
    probe(12)  # dropout draws random numbers, BatchNorm updates its statistics in train mode
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    assert not any(m.training for m in model.modules())
    assert torch.equal(torch.get_rng_state(), rng)
