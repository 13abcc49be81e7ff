"""A task that weighs tokens: an update's loss is the mean over every real token of it, however the tokens
fall into micro-batches, accumulated batches and ranks (train.py's loop; tasks.task.mean_over_update_tokens)."""

import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from helpers import loop_config, spawn_ranks
from models_for_tests import TokenTagger
from tasks_for_tests import TokenTagging
from trainkit.data import DataBundle
from trainkit.distributed.parallel import DDP
from trainkit.distributed.process_group import ProcessInfo
from trainkit.tasks.evaluation import evaluate

sys.path.insert(0, str(ROOT))
import train

PAD, VOCAB, CLASSES = 0, 11, 3
LENGTHS = [[3, 1, 2], [5, 5], [2], [7, 1, 4, 6]]  # four batches of sequences of uneven lengths


def sequences(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(1, VOCAB, (n,), generator=generator), torch.randint(0, CLASSES, (n,), generator=generator))
        for batch in LENGTHS
        for n in batch
    ]


def padded(items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch padded to its longest: tokens with PAD, targets with -100 (ignored)."""
    longest = max(len(tokens) for tokens, _ in items)
    inputs = torch.full((len(items), longest), PAD, dtype=torch.int64)
    targets = torch.full((len(items), longest), -100, dtype=torch.int64)
    for row, (tokens, labels) in enumerate(items):
        inputs[row, : len(tokens)], targets[row, : len(labels)] = tokens, labels
    return inputs, targets


def batches_of(items, sizes):
    out, start = [], 0
    for size in sizes:
        out.append(padded(items[start : start + size]))
        start += size
    return out


def make_run(batches, accumulate: int, micro_batch_size: int | None = None) -> train.Run:
    cfg = loop_config(accumulate, micro_batch_size)
    run = train.Run(cfg, Path("unused"), ProcessInfo(), torch.device("cpu"))
    run.data = DataBundle(batches, batches, batches, num_classes=CLASSES, kind="tokens", pad_id=PAD, size_unit="tokens")
    torch.manual_seed(0)
    run.model = run.trained_model = TokenTagger(VOCAB, CLASSES)
    run.train_transform = run.eval_transform = torch.nn.Identity()
    run.task = TokenTagging()
    run.optimizer = torch.optim.SGD(run.model.parameters(), lr=1.0)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda step: 1.0)
    run.scaler = torch.amp.GradScaler("cpu", enabled=False)
    return run


def weights_after_one_update(batches, accumulate: int, micro_batch_size: int | None = None):
    run = make_run(batches, accumulate, micro_batch_size)
    metrics = train.train_one_epoch(run, show_progress=False)
    assert run.state.step == 1
    return torch.cat([p.detach().flatten() for p in run.model.parameters()]), metrics


def test_four_accumulated_batches_of_uneven_tokens_update_as_one_batch_holding_them_all():
    items = sequences()
    whole, whole_metrics = weights_after_one_update([padded(items)], accumulate=1)
    parts, parts_metrics = weights_after_one_update(batches_of(items, [len(b) for b in LENGTHS]), accumulate=4)
    torch.testing.assert_close(parts, whole, rtol=0, atol=1e-6)
    # a mean of the batches' means would weigh the one-token batch as much as the 18-token one
    assert parts_metrics["train/loss"] == pytest.approx(whole_metrics["train/loss"], abs=1e-6)


def test_micro_batches_of_a_token_batch_are_cut_by_tokens_and_weigh_their_tokens():
    items = sequences(1)
    batch = [padded(items)]  # 10 sequences x 7 tokens
    whole, _ = weights_after_one_update(batch, accumulate=1)
    assert [len(p[0][0]) for p in train.micro_batches(batch[0], 21, sized=True)] == [3, 3, 3, 1]  # 21 tokens: 3 rows
    split, _ = weights_after_one_update(batch, accumulate=1, micro_batch_size=21)
    torch.testing.assert_close(split, whole, rtol=0, atol=1e-6)


def test_token_data_reports_tokens_per_second_and_the_padding_fraction():
    items = sequences()
    batches = batches_of(items, [len(b) for b in LENGTHS])
    _, metrics = weights_after_one_update(batches, accumulate=4)
    real = sum(len(tokens) for tokens, _ in items)
    slots = sum(inputs.numel() for inputs, _ in batches)
    assert metrics["train/padding_fraction"] == pytest.approx(1 - real / slots)
    assert metrics["train/tokens_per_sec"] > 0


def test_val_loss_of_a_tokens_task_is_the_mean_over_real_tokens():
    items = sequences()
    batches = batches_of(items, [len(b) for b in LENGTHS])
    run = make_run(batches, 1)
    result = evaluate(run.model, batches, run.eval_transform, run.task, "fp32", run.device)
    inputs, targets = padded(items)
    with torch.no_grad():
        expected = run.task.loss(run.model(inputs), targets).item()  # one batch: the mean over its real tokens
    assert result["loss"] == pytest.approx(expected, abs=1e-6)
    assert result["samples"] == len(items)


def _two_rank_update(rank: int, world_size: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)  # OpenMP's threads do not survive a fork: one thread, as a DataLoader's worker has
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        items = sequences()
        batches = batches_of(items, [len(b) for b in LENGTHS])
        mine = batches[rank::2]  # rank 0: 9 real tokens, rank 1: 28: as uneven as ranks get
        run = make_run(mine, accumulate=2)
        run.proc = ProcessInfo(rank=rank, world_size=world_size)
        run.parallel = DDP("fp32", rank == 0, torch.device("cpu"))
        run.trained_model = run.parallel.wrap(run.model)
        train.train_one_epoch(run, show_progress=False)
        if rank == 0:
            torch.save(torch.cat([p.detach().flatten() for p in run.model.parameters()]), out)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_with_uneven_tokens_update_as_one_batch_holding_them_all(tmp_path):
    out = tmp_path / "weights.pt"
    # Forked, the ranks start with this process's imports (train.py's), where spawned ones pay seconds for their own;
    # but where a GPU is, PyTorch refuses autograd in a child forked after autograd ran here: spawned there.
    forked = not (torch.cuda.is_available() or torch.backends.mps.is_available())
    spawn_ranks(_two_rank_update, 2, str(tmp_path / "init"), str(out), start_method="fork" if forked else "spawn")
    whole, _ = weights_after_one_update([padded(sequences())], accumulate=1)
    torch.testing.assert_close(torch.load(out), whole, rtol=0, atol=1e-6)
