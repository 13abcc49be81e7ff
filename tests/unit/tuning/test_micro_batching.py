"""trainer.micro_batch_size: the parts' gradients sum to the whole batch's, and `auto` settles on the
largest size that fits, on every rank alike."""

import pytest
import torch
import torch.nn.functional as F

from helpers import backward_step, config_check_tests
from models_for_tests import NoNormCNN
from trainkit.errors import ConfigError
from trainkit.models.small_cnn import SmallCNN
from trainkit.tasks.weighting import micro_batches
from trainkit.tuning import micro_batching
from trainkit.tuning.batch_size_finder import measure_step_memory, training_step_probe
from trainkit.tuning.micro_batching import find_micro_batch_size

CPU = torch.device("cpu")


def batch(size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.rand(size, 1, 8, 8, generator=generator), torch.randint(0, 10, (size,), generator=generator)


def gradients(micro_batch_size: int | None) -> torch.Tensor:
    """The gradient of one batch's mean loss, the batch trained in parts as train.py's loop does."""
    torch.manual_seed(0)
    model = NoNormCNN(1, 10, widths=(8, 16))
    inputs, targets = batch()
    for (part_inputs, part_targets), share in micro_batches((inputs, targets), micro_batch_size):
        (F.cross_entropy(model(part_inputs), part_targets) / (1 / share)).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("size", [8, 12])  # 12: parts of 12, 12 and 8 weigh by their shares
def test_micro_batches_give_the_whole_batch_s_gradients(size):
    torch.testing.assert_close(gradients(size), gradients(None), rtol=0, atol=1e-6)
    assert len(micro_batches(batch(), size)) == -(-32 // size)


def test_no_size_or_one_not_below_the_batch_is_the_batch_itself():
    whole = batch()
    for size in (None, 32, 100):
        [(part, share)] = micro_batches(whole, size)
        assert part is whole and share == 1.0


def test_auto_under_a_memory_cap_settles_on_the_largest_size_that_fits_and_leaves_no_trace():
    torch.manual_seed(0)
    model = SmallCNN(1, 10, widths=(8, 16))  # with BatchNorm: its statistics must be put back after each try
    probe = training_step_probe(model, batch(), backward_step(model, F.cross_entropy))
    with measure_step_memory(CPU) as at_8:
        probe(8)
    # Saved activations grow with the part's size: a cap between 8's and 16's lets 8 fit, not 16.
    buffers = [buffer.clone() for buffer in model.buffers()]
    tried = []
    found = find_micro_batch_size(lambda size: tried.append(size) or probe(size), 32, CPU, int(at_8.peak_bytes * 1.5))
    assert found == 8 and tried == [32, 16, 8]
    assert all(p.grad is None for p in model.parameters())  # the failed tries' gradients are dropped
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), buffers, strict=True))


def test_auto_when_not_even_one_sample_fits_names_the_key():
    def try_step(size: int) -> None:
        torch.empty(2**50)  # the CPU allocator's "can't allocate memory", at once

    with pytest.raises(ConfigError) as error:
        find_micro_batch_size(try_step, 5, CPU)
    assert error.value.key == "trainer.micro_batch_size"


def test_auto_on_token_data_stops_halving_at_one_sequence_and_says_so():
    tried = []

    def try_step(size: int) -> None:
        tried.append(size)
        torch.empty(2**50)

    with pytest.raises(ConfigError, match=r"micro-batch of 1 sequence \(32 tokens\) does not fit.*shorter sequences"):
        find_micro_batch_size(try_step, 256, CPU, smallest=32)  # 8 sequences of 32 tokens: a part is whole sequences
    assert tried == [256, 128, 64, 32]  # not 16, 8, ... 1 tokens: each of those is the same one sequence again


# With one rank of two out of memory, both halve: tests/unit/distributed/test_distributed.py (one spawn for all).


def test_a_small_memory_cap_is_said_in_a_unit_that_shows_it(caplog):
    model = SmallCNN(1, 10, widths=(8, 16))
    probe = training_step_probe(model, batch(), backward_step(model, F.cross_entropy))
    with caplog.at_level("INFO", logger="trainkit.tuning.micro_batching"), pytest.raises(ConfigError):
        find_micro_batch_size(probe, 4, CPU, 2000)  # 2000 bytes: "0.0 MB" before
    said = [record.getMessage() for record in caplog.records if "does not fit" in record.getMessage()]
    assert said and all("KiB measured, above the cap of 1.95 KiB" in line for line in said), said


# ---- its config checks, beside its code (trainkit.config.validation gathers them) ------------------------

RULE_CASES = [
    (["trainer.micro_batch_size=0"], "trainer.micro_batch_size"),
    (["trainer.micro_batch_size=half"], "trainer.micro_batch_size"),
    (["trainer.micro_batch_size=auto", "trainer.micro_batch_memory_cap_mb=0"], "trainer.micro_batch_memory_cap_mb"),
]
RELATION_CASES = [
    (["data.batch_size=32", "trainer.micro_batch_size=48"], "trainer.micro_batch_size"),
    (["trainer.micro_batch_size=16", "trainer.micro_batch_memory_cap_mb=100"], "trainer.micro_batch_memory_cap_mb"),
]
test_a_bad_setting_is_found_by_its_own_check, test_every_check_has_a_case = config_check_tests(
    micro_batching, RULE_CASES, RELATION_CASES
)
