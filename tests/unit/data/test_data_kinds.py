"""Data of any shape: a Data option that is not images (tests/data_for_tests.DigitsTable), targets in their
own dtype, and the hooks file data has for batches made its own way (a batch sampler, a collate)."""

import torch
from omegaconf import OmegaConf
from torch import nn

from conftest import composed
from data_for_tests import DigitsTable
from trainkit.data import Data, FileSplits, build_data
from trainkit.data.datasets import ImageData
from trainkit.data.loaders import FileLoader, TensorLoader

CPU = torch.device("cpu")
TABLE = {
    "_target_": "data_for_tests.DigitsTable",
    "name": "digits_table",
    "num_classes": None,
    "val_fraction": 0.1,
    "test_fraction": 0.2,
    "split_seed": 0,
    "batch_size": 64,
    "eval_batch_size": 512,
    "num_workers": 0,
    "drop_last": False,
    "shuffle": True,
}


def test_a_table_builds_without_image_keys_keeps_float_targets_and_transforms_nothing():
    data = build_data(OmegaConf.create(TABLE), CPU, seed=0)
    features, targets = next(iter(data.train))
    assert features.shape == (64, 64) and targets.dtype == torch.float32
    assert (targets.frac() == 0.25).all()  # a cast to int64 would have cut the .25 off
    assert data.kind == "generic" and data.channels is None and data.mean is None and data.pad_id is None
    train_transform, eval_transform = data.transforms(None, None, False, CPU)
    assert isinstance(train_transform, nn.Identity) and isinstance(eval_transform, nn.Identity)


def test_the_image_option_owns_todays_batch_transform():
    data = build_data(composed().data, CPU, seed=0)
    train_transform, eval_transform = data.transforms(composed("augmentation=shift").augmentation, 8, False, CPU)
    assert type(train_transform).__name__ == "BatchTransform" and train_transform.training
    assert not eval_transform.training and eval_transform.padding == 0  # evaluation never augments
    assert issubclass(DigitsTable, Data) and not issubclass(DigitsTable, ImageData)


def test_tensor_loader_keeps_the_targets_dtype():
    for targets in (torch.rand(10), torch.arange(10, dtype=torch.uint8), torch.arange(10)):
        loader = TensorLoader(torch.rand(10, 3), targets, 4, shuffle=False)
        assert next(iter(loader))[1].dtype == targets.dtype


class LongestFirst:
    """A batch sampler of this test's own (the token budget's stand-in): batches of 1, 2 and 3 indices."""

    num_samples = 6

    def __init__(self):
        self.epochs = []

    def set_epoch(self, epoch, start_batch=0):
        self.epochs.append((epoch, start_batch))

    def __iter__(self):
        return iter([[5], [3, 4], [0, 1, 2]])

    def __len__(self):
        return 3


def pad_to_longest(items):
    longest = max(len(tokens) for tokens, _ in items)
    inputs = torch.stack([nn.functional.pad(tokens, (0, longest - len(tokens)), value=9) for tokens, _ in items])
    return inputs, torch.tensor([label for _, label in items])


def test_file_loader_takes_the_options_batch_sampler_and_collate():
    dataset = [(torch.arange(n + 1), n) for n in range(6)]
    sampler = LongestFirst()
    loader = FileLoader(dataset, 8, shuffle=True, collate=pad_to_longest, batch_sampler=sampler)
    loader.set_epoch(2, start_batch=1)
    assert sampler.epochs == [(2, 1)] and len(loader) == 3 and loader.num_samples == 6
    batches = list(loader)
    assert [inputs.shape for inputs, _ in batches] == [(1, 6), (2, 5), (3, 3)]
    assert batches[1][0].tolist() == [[0, 1, 2, 3, 9], [0, 1, 2, 3, 4]]


def test_a_data_option_with_max_tokens_asks_for_size_budget_batches(monkeypatch):
    """The textdata sampler's stand-in records how build_data's batch-sampler hook builds it."""
    import sys
    import types
    from dataclasses import dataclass

    made = {}

    class SizeBudgetBatches(LongestFirst):
        def __init__(self, sizes, budget, max_batch_size, **settings):
            super().__init__()
            made.setdefault("calls", []).append((sizes.tolist(), budget, max_batch_size, settings))

    module = types.ModuleType("trainkit.data.size_budget")
    module.SizeBudgetBatches = SizeBudgetBatches
    monkeypatch.setitem(sys.modules, "trainkit.data.size_budget", module)

    class Texts(torch.utils.data.Dataset):
        sizes = torch.tensor([1, 2, 3, 4, 5, 6])

        def __getitem__(self, i):
            return torch.arange(i + 1), i

        def __len__(self):
            return 6

    @dataclass(kw_only=True)
    class Budgeted(Data):
        max_tokens: int | None = 12
        in_memory = False
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
    from dataclasses import dataclass

    import pytest

    from trainkit.errors import ConfigError

    @dataclass(kw_only=True)
    class Clips(Data):
        max_frames: int | None = 120
        declared: bool = True
        in_memory = False
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
    assert str(error.value).startswith("data.max_frames: is set, but Signals declares no item sizes")
