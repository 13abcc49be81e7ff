"""SizeBudgetBatches: the budget, every sample once, equal batch counts across ranks, an exact evaluation
split, a seeded shuffle, and the exact skip of a mid-epoch resume; the data option's hook that asks for them
(Data.batch_sampler), and the check of the budget's key, beside this code."""

import ast
from dataclasses import dataclass

import pytest
import torch
from test_data_kinds import CPU
from test_file_data import LongestFirst, pad_to_longest

from conftest import ROOT, composed
from file_data_for_tests import SIZED_SIGNALS
from helpers import template_has
from trainkit.config.declared import declared
from trainkit.config.rules import RULES
from trainkit.config.schema import find_problems, integer
from trainkit.config.validation import RELATIONS, configured_data_class, fill_task_defaults, problems
from trainkit.data import build_data, size_budget
from trainkit.data.file_data import FileData, FileSplits
from trainkit.data.size_budget import SizeBudgetBatches, config_rules
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


def test_a_data_option_with_max_tokens_asks_for_size_budget_batches(monkeypatch):
    """The sampler's stand-in records how build_data's batch-sampler hook builds it."""
    made = {}

    class Recorded(LongestFirst):
        def __init__(self, sizes, budget, max_batch_size, **settings):
            super().__init__()
            made.setdefault("calls", []).append((sizes.tolist(), budget, max_batch_size, settings))

    monkeypatch.setattr("trainkit.data.size_budget.SizeBudgetBatches", Recorded)

    class Texts(torch.utils.data.Dataset):
        sizes = torch.tensor([1, 2, 3, 4, 5, 6])

        def __getitem__(self, i):
            return torch.arange(i + 1), i

        def __len__(self):
            return 6

    @dataclass(kw_only=True)
    class Budgeted(FileData):
        max_tokens: int | None = 12
        size_unit = "tokens"

        def splits(self):
            return FileSplits(Texts(), Texts(), Texts(), num_classes=6)

        def collate(self, items):
            return pad_to_longest(items)

    option = Budgeted(
        name="texts", num_classes=6, batch_size=4, eval_batch_size=8, num_workers=0, drop_last=False, shuffle=True
    )
    monkeypatch.setattr("trainkit.data.make_data", lambda cfg: option)
    data = build_data({}, CPU, seed=3, rank=0, world_size=1)
    train_call, val_call, _ = made["calls"]
    assert train_call == (
        [1, 2, 3, 4, 5, 6],
        12,
        4,
        dict(shuffle=True, seed=3, rank=0, world_size=1, drop_last=False, train=True, unit="tokens"),
    )
    assert val_call[2] == 8 and val_call[3]["shuffle"] is False
    assert [inputs.shape for inputs, _ in data.train] == [(1, 6), (2, 5), (3, 3)]  # the option's collate


class Signals(torch.utils.data.Dataset):
    """1-D signals of 3 to 40 values: their sizes declared, as the size budget asks."""

    def __init__(self, count: int, declared: bool = True):
        generator = torch.Generator().manual_seed(count)
        self.signals = [torch.rand(int(n)) for n in torch.randint(3, 41, (count,), generator=generator)]
        if declared:
            self.sizes = [len(signal) for signal in self.signals]

    def __getitem__(self, i):
        return self.signals[i], i % 2

    def __len__(self):
        return len(self.signals)


def test_a_data_kind_that_declares_its_item_sizes_is_batched_by_its_own_size_budget(monkeypatch):
    """Not text: audio-like signals whose unit is frames. Declaring size_unit, a max_frames key and the datasets'
    sizes is all it takes: padded batches within the budget, as many batches on every rank, and micro-batches
    that count frames (DataBundle.size_unit); without sizes, one line naming the budget."""

    @dataclass(kw_only=True)
    class Clips(FileData):
        max_frames: int | None = 120
        declared: bool = True
        size_unit = "frames"

        def splits(self):
            return FileSplits(*(Signals(n, self.declared) for n in (60, 20, 20)), num_classes=2)

        def collate(self, items):
            signals, labels = zip(*items)
            padded = torch.nn.utils.rnn.pad_sequence(list(signals), batch_first=True)
            return {"signal": padded, "lengths": torch.tensor([len(s) for s in signals]), "label": torch.tensor(labels)}

    keys = dict(name="clips", num_classes=2, batch_size=16, eval_batch_size=16, num_workers=0, shuffle=True)
    monkeypatch.setattr("trainkit.data.make_data", lambda cfg: Clips(**keys, drop_last=False, declared=cfg["sizes"]))
    for world_size in (1, 2):
        shards = [build_data({"sizes": True}, CPU, seed=0, rank=r, world_size=world_size) for r in range(world_size)]
        assert len({len(data.train) for data in shards}) == 1  # every rank as many batches
    data = build_data({"sizes": True}, CPU, seed=0)
    assert data.size_unit == "frames" and data.longest == max(Signals(60).sizes)
    batches = list(data.train)
    assert all(batch["signal"].numel() <= 120 for batch in batches)
    assert max(len(batch["lengths"]) for batch in batches) > 120 // 40  # short signals share a batch ...
    assert {len(batch["lengths"]) for batch in batches} != {len(batches[0]["lengths"])}  # ... long ones fewer
    assert sum(len(batch["label"]) for batch in data.val) == 20  # evaluation: each sample once

    with pytest.raises(ConfigError) as error:
        build_data({"sizes": False}, CPU, seed=0)
    assert str(error.value) == (
        "data.max_frames: is set, but Signals declares no item sizes to batch by; give it `sizes` (one number per "
        "item, in frames) or set data.max_frames=null"
    )


# The budget's key is named after the data's unit: text's data.max_tokens, the tests' signals' data.max_values.
BUDGET_CASES = [
    (["data=textfolder", "data.root=/data/texts", "model=sequence", "data.max_tokens=0"], "data.max_tokens"),
    (["data=textfolder", "data.root=/data/texts", "model=sequence", "data.max_tokens=many"], "data.max_tokens"),
    ([*SIZED_SIGNALS, "+data.max_values=0"], "data.max_values"),
]


@pytest.mark.parametrize("overrides, key", BUDGET_CASES, ids=[" ".join(o) for o, _ in BUDGET_CASES])
def test_the_budget_is_checked_beside_its_code_by_the_rule_it_always_had(overrides, key):
    """config_rules gives the option's budget key its rule; nothing of the core checks it, and the config check
    gathers it from conf/config.yaml's `_checks_.size_budget`: the same one-line message as ever."""
    if key == "data.max_tokens" and configured_data_class(composed(*overrides[:3])) is None:
        pytest.skip("no text classification (trimmed)")
    cfg = composed(*overrides)
    fill_task_defaults(cfg)
    own_rules, _ = declared({"data": configured_data_class(cfg)})  # the data class's own rules
    assert key not in find_problems(cfg, RULES | own_rules, RELATIONS)
    assert list(config_rules(cfg)) == [key]
    assert problems(cfg)[key] == integer(1, null=True)(cfg.data[key.removeprefix("data.")])


def test_without_its_checks_section_the_core_checks_no_budget():
    """The rule goes with `_checks_.size_budget`: a config without it (this row trimmed) leaves data.max_values to
    the data's own checks, and a data option without a budget key gets no rule at all."""
    assert "data.max_values" not in problems(composed(*SIZED_SIGNALS, "+data.max_values=0", "~_checks_.size_budget"))
    assert config_rules(composed()) == {}  # the digits: no size_unit, no budget


@pytest.mark.skipif(not template_has("batch_size_finder.enabled"), reason="this clone has no batch size finder")
def test_a_budget_refuses_the_batch_size_search_in_one_line_beside_its_code():
    """Under a budget data.batch_size only caps a batch's items: searching it would size nothing. The relation is
    this module's; the core and the finder's own checks do not find it."""
    from trainkit.tuning import batch_size_finder

    cfg = composed(*SIZED_SIGNALS, "+data.max_values=512", "batch_size_finder.enabled=true")
    fill_task_defaults(cfg)
    assert "batch_size_finder.enabled" not in find_problems(
        cfg, RULES, [*RELATIONS, *batch_size_finder.CONFIG_RELATIONS]
    )
    assert "batch_size_finder.enabled" in find_problems(cfg, {}, size_budget.CONFIG_RELATIONS)
    assert problems(cfg)["batch_size_finder.enabled"].startswith("searches data.batch_size, but data.max_values=512")
    assert "batch_size_finder.enabled" not in problems(composed(*SIZED_SIGNALS, "batch_size_finder.enabled=true"))


def test_size_budget_imports_nothing_of_the_data_classes_at_module_level():
    """file_data.py imports trainkit.data.size_budget (its marked lines): size_budget.py names Data and FileData for
    type checking only, so the modules import each other in no order."""
    tree = ast.parse((ROOT / "src" / "trainkit" / "data" / "size_budget.py").read_text(encoding="utf-8"))
    imported = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert not imported & {"trainkit.data.datasets", "trainkit.data.file_data"}
