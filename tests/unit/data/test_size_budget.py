"""SizeBudgetBatches: the budget, every sample once, equal batch counts across ranks, an exact evaluation
split, a seeded shuffle, and the exact skip of a mid-epoch resume."""

import pytest
import torch

from trainkit.data.size_budget import SizeBudgetBatches
from trainkit.errors import ConfigError

LENGTHS = (torch.rand(3000, generator=torch.Generator().manual_seed(0)) ** 3 * 600 + 5).long()


def epoch(batches, number=0, start_batch=0):
    batches.set_epoch(number, start_batch=start_batch)
    return list(batches)


def test_every_batch_fits_the_budget_and_the_cap_and_pads_little():
    batches = epoch(SizeBudgetBatches(LENGTHS, 2048, 32, seed=0))
    padded = [len(batch) * int(LENGTHS[batch].max()) for batch in batches]
    assert max(padded) <= 2048 and max(len(batch) for batch in batches) == 32
    assert 1 - int(LENGTHS.sum()) / sum(padded) < 0.10  # length-bucketed: little padding


def test_one_rank_sees_every_sample_exactly_once_an_epoch():
    batches = SizeBudgetBatches(LENGTHS, 2048, 32, seed=0)
    for number in (0, 1):
        seen = sorted(i for batch in epoch(batches, number) for i in batch)
        assert seen == list(range(len(LENGTHS))) and batches.num_samples == len(LENGTHS)
        assert len(batches) == len(epoch(batches, number))


def test_training_ranks_get_as_many_batches_every_epoch_and_disjoint_ones():
    for number in range(3):
        shares = [epoch(SizeBudgetBatches(LENGTHS, 2048, 32, seed=4, rank=r, world_size=2), number) for r in (0, 1)]
        assert len(shares[0]) == len(shares[1]) == len(SizeBudgetBatches(LENGTHS, 2048, 32, world_size=2))
        first, second = ({i for batch in share for i in batch} for share in shares)
        assert not first & second and len(first | second) > 0.95 * len(LENGTHS)  # at most a batch trimmed


def test_evaluation_counts_every_sample_once_over_the_ranks():
    for world_size in (1, 2, 3):
        shares = [
            epoch(SizeBudgetBatches(LENGTHS, 2048, 64, shuffle=False, rank=r, world_size=world_size))
            for r in range(world_size)
        ]
        seen = sorted(i for share in shares for batch in share for i in batch)
        assert seen == list(range(len(LENGTHS)))


def test_a_limited_evaluation_is_a_seeded_sample_of_batches_the_same_every_epoch_disjoint_across_ranks():
    def evaluation(rank, seed=7):
        batches = SizeBudgetBatches(LENGTHS, 2048, 64, shuffle=False, seed=seed, rank=rank, world_size=2)
        batches.set_limit(3)
        return batches

    shares = [epoch(evaluation(rank)) for rank in (0, 1)]
    assert [len(share) for share in shares] == [3, 3] == [len(evaluation(rank)) for rank in (0, 1)]
    assert not {i for batch in shares[0] for i in batch} & {i for batch in shares[1] for i in batch}
    assert epoch(evaluation(0), 4) == shares[0] != epoch(evaluation(0, seed=8))  # the seed's, every epoch alike
    whole = evaluation(0)
    whole.set_limit(None)
    shortest_first = int(LENGTHS[[i for batch in epoch(whole)[:3] for i in batch]].max())
    assert max(int(LENGTHS[batch].max()) for batch in shares[0]) > shortest_first  # not the shortest texts alone
    assert max(len(batch) * int(LENGTHS[batch].max()) for batch in shares[0]) <= 2048
    everything = [SizeBudgetBatches(LENGTHS, 2048, 64, shuffle=False, seed=7, rank=r, world_size=2) for r in (0, 1)]
    for batches in everything:
        batches.set_limit(3)
        batches.set_limit(None)  # a whole evaluation again: every sample once, as before any limit
    assert sorted(i for batches in everything for batch in epoch(batches) for i in batch) == list(range(len(LENGTHS)))


def test_the_shuffle_is_the_seeds_and_differs_every_epoch():
    def make(seed):
        return SizeBudgetBatches(LENGTHS, 2048, 32, seed=seed)

    assert epoch(make(1), 0) == epoch(make(1), 0)
    assert epoch(make(1), 0) != epoch(make(1), 1) and epoch(make(1), 0) != epoch(make(2), 0)
    assert len(epoch(make(1), 0)) == len(epoch(make(1), 1))  # the count never depends on the shuffle
    # shuffled within buckets too: a batch of epoch 1 is not a batch of epoch 0 in another place
    assert {tuple(sorted(b)) for b in epoch(make(1), 0)} != {tuple(sorted(b)) for b in epoch(make(1), 1)}


def test_a_resume_skips_exactly_the_batches_trained():
    batches = SizeBudgetBatches(LENGTHS, 2048, 32, seed=3, rank=1, world_size=2)
    whole = epoch(batches, 2)
    assert epoch(batches, 2, start_batch=7) == whole[7:]
    assert len(batches) == len(whole)  # len is the whole epoch's, as the loaders' is


def test_drop_last_drops_the_short_batch_of_each_bucket():
    batches = SizeBudgetBatches(LENGTHS, 2048, 32, seed=0, drop_last=True)
    size_of = {int(i): size for indices, size in batches.buckets for i in indices}
    made = epoch(batches)
    assert len(made) == len(batches) and all(len(batch) == size_of[batch[0]] for batch in made)


def test_a_sequence_longer_than_the_budget_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"data\.max_tokens") as error:
        SizeBudgetBatches(torch.tensor([3, 700]), 512, 8)
    assert "700" in str(error.value) and "\n" not in str(error.value)


def test_fewer_budget_batches_than_training_ranks_name_the_budget_and_the_cap_that_makes_enough():
    """8 texts of a length fill one batch of 4096 tokens: cut to a multiple of 2 ranks, none is left. The cause is
    the budget (not data.drop_last, which is false) and the fix a cap that makes 2 batches."""
    with pytest.raises(ConfigError) as error:
        SizeBudgetBatches([100] * 8, 4096, 32, world_size=2, train=True)
    assert str(error.value) == (
        "data.max_tokens: 4096 tokens a batch (data.batch_size=32 sequences at most) make 1 training batch of the 8 "
        "sequences, fewer than the 2 processes: each trains as many batches, so the list is cut to a multiple of 2, "
        "which leaves none; make at least 2: data.batch_size=4 (the most sequences in one batch) or a lower "
        "data.max_tokens, or train with fewer processes"
    )
    assert len(SizeBudgetBatches([100] * 8, 4096, 4, world_size=2, train=True)) == 1  # the cap it names: one each
    assert len(SizeBudgetBatches([100] * 8, 4096, 32, world_size=2, train=False)) == 1  # evaluation cuts nothing
    with pytest.raises(ConfigError, match=r"make at least 2: train with fewer processes \(1 sequence cannot make 2"):
        SizeBudgetBatches([100], 4096, 32, world_size=2, train=True)
