"""trainer.micro_batch_size=auto (feature micro_batch_auto, docs/features.md): the search settles on the largest
size that fits, on every rank alike; train.py trains in parts of that size, and a resume reuses it. (A fixed size's
parts and their gradients: tests/unit/tasks/test_batches.py.)"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from conftest import composed
from helpers import backward_step, config_check_tests, on_two_ranks, record_run
from trainkit.errors import ConfigError
from trainkit.models import build_model
from trainkit.models.small_cnn import SmallCNN
from trainkit.tuning import micro_batching
from trainkit.tuning.micro_batching import find_micro_batch_size
from trainkit.tuning.step_memory import measure_step_memory, training_step_probe

CPU = torch.device("cpu")


def batch(size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.rand(size, 1, 8, 8, generator=generator), torch.randint(0, 10, (size,), generator=generator)


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
    (["trainer.micro_batch_size=16", "trainer.micro_batch_memory_cap_mb=100"], "trainer.micro_batch_memory_cap_mb"),
]
test_a_bad_setting_is_found_by_its_own_check, test_every_check_has_a_case = config_check_tests(
    micro_batching, RULE_CASES, RELATION_CASES
)


def test_a_cap_without_auto_says_what_the_size_is():
    from trainkit.config.validation import problems

    key, message = next(iter(problems(composed("trainer.micro_batch_memory_cap_mb=100")).items()))
    assert "trainer.micro_batch_size is null, not auto" in f"{key}: {message}"


def test_auto_is_this_feature_s_alone_the_core_takes_a_size_or_null():
    from trainkit.config.rules import RULES
    from trainkit.config.schema import find_problems

    cfg = composed("trainer.micro_batch_size=auto")
    assert find_problems(cfg, RULES | micro_batching.CONFIG_RULES, []) == {}
    assert find_problems(cfg, RULES, [])["trainer.micro_batch_size"].startswith("must be ")  # once this is deleted


# ---- with one rank of two out of memory, both halve (a gloo group of two processes) ----------------------


def _agree_on_a_micro_batch_size(rank: int, port: int, results) -> None:
    """The search with a real allocator error on rank 1 above 16 samples."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tried = []

    def try_step(size: int) -> None:
        tried.append(size)
        if rank == 1 and size > 16:
            torch.empty(2**50)  # the CPU allocator's "can't allocate memory", at once

    try:
        results[rank] = (find_micro_batch_size(try_step, 64, CPU), tried)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_micro_batch_size_auto_with_one_rank_of_two_out_of_memory_halves_on_both():
    results = on_two_ranks(_agree_on_a_micro_batch_size)
    assert results[0] == results[1] == (16, [64, 32, 16])  # rank 0 fit at 64 and 32, but went on with rank 1


# ---- train.py: the size found is trained with, and a resume reuses it ------------------------------------

SHORT_RUN = ("device=cpu", "print_config=false", "data.batch_size=8", "data.eval_batch_size=128", "model.widths=[8,16]",
             "trainer.max_epochs=1", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1",
             "regularization=none", "scheduler=constant")  # fmt: skip


def test_auto_micro_batch_size_trains_with_the_size_under_the_cap_and_a_resume_reuses_it(tmp_path, monkeypatch):
    """The cap lies between the saved activations of a part of 4 and of 8 (the whole batch): the run trains in
    parts of 4, its checkpoint's config says 4, and a resume trains on in parts of 4 under a cap no part fits."""
    cfg = composed(*SHORT_RUN)
    model = build_model(cfg.model)
    with measure_step_memory("cpu") as whole_batch:
        F.cross_entropy(model(torch.rand(8, 1, 8, 8)), torch.zeros(8, dtype=torch.int64)).backward()
    cap = f"trainer.micro_batch_memory_cap_mb={0.75 * whole_batch.peak_bytes / 2**20}"
    recording = record_run(tmp_path, monkeypatch, *SHORT_RUN, "trainer.micro_batch_size=auto", cap)
    assert [len(forward.inputs) for forward in recording.training_forwards()] == [4, 4] * 3
    assert recording.run.cfg.trainer.micro_batch_size == 4  # what the loop read: the resolved config
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["config"]["trainer"]["micro_batch_size"] == 4
    (tmp_path / "resumed").mkdir()
    resumed = record_run(
        tmp_path / "resumed",
        monkeypatch,
        *SHORT_RUN,
        "trainer.max_epochs=2",
        f"resume={tmp_path}/checkpoints/last.pt",
        "trainer.micro_batch_size=auto",
        "trainer.micro_batch_memory_cap_mb=1e-9",  # a new search would fail
    )
    assert [len(forward.inputs) for forward in resumed.training_forwards()] == [4, 4] * 3
    assert resumed.run.resolved_config["trainer"]["micro_batch_size"] == 4  # and its checkpoints say so
