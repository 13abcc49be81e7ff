"""trainkit.data.file_data: file data read in DataLoader workers. The articles' loader rules (`auto` worker counts
and pinned memory), resuming mid-epoch, and what a sample draws, the same whatever worker reads it."""

import logging
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from test_fingerprint import refusal
from torch import nn

from helpers import needs_image_folders
from trainkit import runtime
from trainkit.data import Splits
from trainkit.data.file_data import (
    FileData,
    FileLoader,
    FileSplits,
    file_loader_settings,
    resolve_num_workers,
    resolve_pin_memory,
)
from trainkit.data.fingerprint import check_same_data, data_fingerprint
from trainkit.errors import ConfigError
from trainkit.runtime import available_cores

CONF = Path(__file__).resolve().parents[3] / "conf" / "data"


def test_auto_reads_the_affinity_mask_and_the_local_world_size(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 128)  # the machine's count is not what this process may use
    assert available_cores() == 12
    assert resolve_num_workers("auto") == 12  # 12 cores, 1 rank: 1x
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: 4 ranks on this node
    assert resolve_num_workers("auto") == 3  # 12 // 4
    assert resolve_num_workers(5) == 5 and resolve_num_workers(0) == 0  # explicit numbers are kept


def test_without_an_affinity_mask_auto_uses_the_cpu_count(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert available_cores() == 6 and resolve_num_workers("auto") == 6


def test_pin_memory_auto_is_on_with_cuda_only():
    assert resolve_pin_memory("auto", torch.device("cuda", 0)) is True
    assert resolve_pin_memory("auto", torch.device("cpu")) is False
    assert resolve_pin_memory(True, torch.device("cpu")) is True
    assert resolve_pin_memory(False, torch.device("cuda")) is False


@needs_image_folders
def test_the_imagefolder_defaults_resolve_reach_the_data_loader_and_are_logged(monkeypatch, caplog):
    monkeypatch.setattr(runtime, "available_cores", lambda: 4)
    cfg = OmegaConf.load(CONF / "imagefolder.yaml")
    assert cfg.num_workers == "auto" and cfg.pin_memory == "auto"
    with caplog.at_level(logging.INFO, logger="trainkit.data.file_data"):
        settings = file_loader_settings(cfg, torch.device("cpu"))
        file_loader_settings(cfg, torch.device("cuda"))  # only resolved: nothing is put on the device
    assert settings == {"num_workers": 4, "pin_memory": False, "prefetch_factor": 2}
    assert caplog.messages == [
        "data: 4 workers per rank, not pinned (data.num_workers=auto, data.pin_memory=auto)",
        "data: 4 workers per rank, pinned (data.num_workers=auto, data.pin_memory=auto)",
    ]
    loader = FileLoader(list(range(8)), 4, shuffle=False, **{**settings, "num_workers": 1, "prefetch_factor": 3})
    assert (loader.loader.num_workers, loader.loader.prefetch_factor, loader.loader.pin_memory) == (1, 3, False)
    # Without workers, prefetching means nothing (and torch refuses a prefetch_factor then).
    assert FileLoader(list(range(8)), 4, shuffle=False, num_workers=0, prefetch_factor=3).loader.prefetch_factor is None


def test_file_loader_skips_the_batches_already_trained(tmp_path):
    dataset = torch.utils.data.TensorDataset(torch.arange(30.0).view(30, 1), torch.arange(30))
    loader = FileLoader(dataset, 4, shuffle=True, seed=1)
    loader.set_epoch(2)
    whole = [batch_labels.tolist() for _, batch_labels in loader]
    loader.set_epoch(2, start_batch=3)
    assert [batch_labels.tolist() for _, batch_labels in loader] == whole[3:]


class Drawing(torch.utils.data.Dataset):
    """Sample i is i and what it draws from torch's, Python's and NumPy's global generators (a random caption or
    crop of one's own would draw so): [i, torch, random, numpy]."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([index, torch.rand(()).item(), random.random(), np.random.rand()], dtype=torch.float64)


def draws(workers: int, epoch: int = 1, start_batch: int = 0, rank: int = 0, world_size: int = 1) -> dict:
    """{sample index: its three draws} of one training epoch of Drawing, by 4s."""
    loader = FileLoader(Drawing(), 4, shuffle=True, seed=3, num_workers=workers, rank=rank, world_size=world_size)
    loader.set_epoch(epoch, start_batch)
    return {int(row[0]): row[1:].tolist() for batch in loader for row in batch}


def test_what_a_file_sample_draws_follows_from_seed_epoch_and_index_whatever_the_worker():
    streams = torch.get_rng_state(), random.getstate(), np.random.get_state()
    whole = draws(workers=0)
    # Read in this process, the sample leaves the training step's streams where they were.
    assert torch.equal(torch.get_rng_state(), streams[0]) and random.getstate() == streams[1]
    assert all(np.array_equal(now, before) for now, before in zip(np.random.get_state(), streams[2]))
    assert len(whole) == 24 and len({value for row in whole.values() for value in row}) == 72  # all different
    assert draws(workers=1) == whole and draws(workers=2) == whole
    resumed = draws(workers=2, start_batch=4)  # a resume after 4 of the epoch's 6 batches: the last 8 samples
    assert len(resumed) == 8 and all(whole[index] == row for index, row in resumed.items())
    assert {**draws(workers=1, rank=0, world_size=2), **draws(workers=0, rank=1, world_size=2)} == whole
    assert not set(map(tuple, draws(workers=0, epoch=2).values())) & set(map(tuple, whole.values()))  # a new epoch


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


# ---- the data fingerprint of files: what a resume compares (trainkit.data.fingerprint) ----


class Listed(torch.utils.data.Dataset):
    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)


def folder(root, train):
    """An image folder at `root`: train/ as given, one val/ image, no test/ image."""
    files = [(f"{root}/train/{name}", label) for name, label in train]
    return data_fingerprint(FileSplits(Listed(files), Listed([(f"{root}/val/a/0.png", 0)]), Listed([]), 2))


def test_file_data_is_the_same_wherever_it_lies_and_each_change_is_named():
    train = [("a/0.png", 0), ("b/0.png", 1)]
    saved = folder("/data/pets", train)
    check_same_data(saved, folder("/scratch/job-42/pets", train))  # copied to a node's disk: the same data
    assert refusal(saved, folder("/data/pets", train[:1])) == "data: 1 files removed from the train split"
    renamed = folder("/data/pets", [("a/0.png", 0), ("b/1.png", 1)])
    assert (
        refusal(saved, renamed)
        == "data: the train split holds other files (as many, renamed, relabelled or moved between splits)"
    )
    check_same_data(None, saved)  # a checkpoint from before fingerprints: not checked
    new_class = folder("/data/pets", [*train, ("c/0.png", 2)])
    assert refusal(saved, {**new_class, "classes": 3}) == (
        "data: 3 classes where there were 2; 1 files added to the train split"
    )


def test_file_data_whose_splits_are_tensors_is_one_line_naming_data_target():
    @dataclass(kw_only=True)
    class Mixed(FileData):
        def splits(self) -> Splits:
            split = (torch.zeros(4, 1), torch.zeros(4, dtype=torch.int64))
            return Splits(split, split, split, num_classes=2)

    option = Mixed(
        name="mixed", num_classes=2, batch_size=2, eval_batch_size=2, num_workers=0, drop_last=False, shuffle=False
    )
    shards = dict(batch_size=2, shuffle=False, seed=0, rank=0, world_size=1)
    with pytest.raises(ConfigError) as error:
        option.loaders(option.splits(), torch.device("cpu"), shards, shards)
    assert error.value.key == "data._target_"
    assert error.value.message.startswith("Mixed.splits() returned Splits, but the class reads files in workers")
