"""Tests for trainkit.data: splits, sharding across ranks, and every dataset on tiny local files."""

import itertools
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from PIL import Image
from torch.utils.data import DistributedSampler

from helpers import needs_image_folders
from trainkit.data import DataBundle, build_data, datasets
from trainkit.data.datasets import carve
from trainkit.data.loaders import (
    EvaluationSampler,
    ResumableDistributedSampler,
    TensorLoader,
    limited,
)
from trainkit.errors import ConfigError

CONF = Path(__file__).resolve().parents[3] / "conf" / "data"
CPU = torch.device("cpu")


def data_cfg(dataset: str, /, **overrides):
    cfg = OmegaConf.load(CONF / f"{dataset}.yaml")
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def drain(loader) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*loader)
    return torch.cat(images), torch.cat(labels)


# --- sharding -------------------------------------------------------------------------------


def numbered(n: int, batch_size: int, **kwargs) -> TensorLoader:
    """A loader whose image i holds the number i, so batches show which samples they carry."""
    return TensorLoader(torch.arange(n).float().view(n, 1, 1, 1), torch.arange(n), batch_size, **kwargs)


def test_tensor_loader_counts_batches_and_samples():
    loader = numbered(101, 10, shuffle=True)
    assert (len(loader), loader.num_samples, loader.batch_size) == (11, 101, 10)
    assert sorted(drain(loader)[1].tolist()) == list(range(101))
    dropping = numbered(101, 10, shuffle=True, drop_last=True)
    assert (len(dropping), dropping.num_samples) == (10, 100)
    batches = list(dropping)
    assert len(batches) == 10 and all(len(labels) == 10 for _, labels in batches)


def test_tensor_loader_yields_matching_int64_pairs():
    images, labels = next(iter(numbered(20, 8, shuffle=True)))
    assert images.shape == (8, 1, 1, 1) and labels.dtype == torch.int64
    assert torch.equal(images.view(-1).long(), labels)


def test_set_epoch_reshuffles_deterministically():
    first, second = numbered(50, 50, shuffle=True, seed=3), numbered(50, 50, shuffle=True, seed=3)
    epoch0 = drain(first)[1]
    assert torch.equal(drain(first)[1], epoch0)  # no set_epoch: the same epoch again
    first.set_epoch(1)
    second.set_epoch(1)
    assert not torch.equal(drain(first)[1], epoch0)
    assert torch.equal(drain(first)[1], drain(second)[1])
    assert not torch.equal(drain(numbered(50, 50, shuffle=True, seed=4))[1], epoch0)


def test_eval_loader_keeps_order():
    loader = numbered(30, 7, shuffle=False)
    assert drain(loader)[1].tolist() == list(range(30))
    assert len(loader) == 5


def test_train_shards_are_disjoint_with_equal_batch_counts():
    ranks = [numbered(101, 8, shuffle=True, seed=0, rank=rank, world_size=2) for rank in range(2)]
    for loader in ranks:
        loader.set_epoch(2)
    shards = [set(drain(loader)[1].tolist()) for loader in ranks]
    assert len(ranks[0]) == len(ranks[1]) == 7
    assert ranks[0].num_samples == ranks[1].num_samples == 50
    assert len(shards[0]) == len(shards[1]) == 50 and not shards[0] & shards[1]


@pytest.mark.parametrize("epoch", [0, 5])
@pytest.mark.parametrize("shuffle", [True, False])
def test_train_sampler_is_torchs_distributed_sampler_that_can_skip_ahead(epoch, shuffle):
    for rank in range(3):
        ours = ResumableDistributedSampler(100, shuffle=shuffle, seed=7, rank=rank, world_size=3)
        torchs = DistributedSampler(range(100), num_replicas=3, rank=rank, shuffle=shuffle, seed=7, drop_last=True)
        assert isinstance(ours, DistributedSampler)
        ours.set_epoch(epoch)
        torchs.set_epoch(epoch)
        assert list(ours) == list(torchs) and len(ours) == len(torchs) == 33
        assert ours.epoch_indices().tolist() == list(torchs)
        ours.set_epoch(epoch, skip=10)
        assert list(ours) == list(torchs)[10:] and ours.epoch_indices().tolist() == list(torchs)[10:]
        assert len(ours) == 33  # len() is the whole epoch's share: the loaders count batches from it


def test_unshuffled_training_keeps_one_order_and_equal_shards():
    ranks = [numbered(101, 8, shuffle=False, train=True, rank=rank, world_size=2) for rank in range(2)]
    orders = [drain(loader)[1].tolist() for loader in ranks]
    assert orders == [list(range(0, 100, 2)), list(range(1, 100, 2))]  # trimmed to 100: 50 samples each
    assert [len(loader) for loader in ranks] == [7, 7] and [loader.num_samples for loader in ranks] == [50, 50]
    for loader in ranks:
        loader.set_epoch(3)
    assert [drain(loader)[1].tolist() for loader in ranks] == orders  # the same order every epoch
    ranks[1].set_epoch(4, start_batch=2)
    assert drain(ranks[1])[1].tolist() == orders[1][16:]


def test_epoch_batches_lists_an_epochs_batches_from_its_first_and_leaves_the_loader_as_it_was():
    loader = numbered(50, 8, shuffle=True, seed=3, drop_last=True)
    loader.set_epoch(2, start_batch=4)  # a resumed epoch, 4 batches in
    skipped = [labels.tolist() for _, labels in loader]
    assert loader.epoch_batches(2)[4:] == skipped and len(loader.epoch_batches(2)) == 6  # 50 // 8
    assert all(len(batch) == 8 for batch in loader.epoch_batches(2))
    assert loader.epoch_batches(0) != loader.epoch_batches(2)  # another epoch, another shuffle
    assert [labels.tolist() for _, labels in loader] == skipped  # still set to epoch 2, from batch 4


def test_an_evaluation_loader_does_not_shuffle():
    assert isinstance(numbered(10, 4, shuffle=False).sampler, EvaluationSampler)
    assert isinstance(numbered(10, 4, shuffle=True).sampler, ResumableDistributedSampler)
    with pytest.raises(ValueError, match="shuffle=False"):
        numbered(10, 4, shuffle=True, train=False)


def test_eval_shards_count_every_sample_once():
    ranks = [numbered(101, 16, shuffle=False, rank=rank, world_size=2) for rank in range(2)]
    seen = torch.cat([drain(loader)[1] for loader in ranks]).tolist()
    assert sorted(seen) == list(range(101))
    assert [loader.num_samples for loader in ranks] == [51, 50]


def test_a_limited_evaluation_is_a_seeded_sample_the_same_every_time_disjoint_across_ranks():
    ranks = [numbered(100, 10, shuffle=False, seed=5, rank=rank, world_size=2) for rank in range(2)]
    samples = [drain(limited(loader, 2))[1].tolist() for loader in ranks]
    assert [len(sample) for sample in samples] == [20, 20] and not set(samples[0]) & set(samples[1])
    order = torch.randperm(100, generator=torch.Generator().manual_seed(5)).tolist()  # the run seed's, every epoch
    assert samples == [order[0::2][:20], order[1::2][:20]]
    assert [drain(limited(loader, 2))[1].tolist() for loader in ranks] == samples  # the next epoch's: the same
    assert sorted(drain(ranks[0])[1].tolist() + drain(ranks[1])[1].tolist()) == list(range(100))  # whole, after
    assert drain(limited(ranks[0], 99))[1].tolist() == order[0::2]  # more batches than there are: the whole share
    assert drain(limited(numbered(100, 10, shuffle=True), 2))[1].tolist() != samples[0]  # training: its first


@needs_image_folders
def test_a_limited_evaluation_of_a_file_split_listed_class_by_class_holds_every_class(tmp_path):
    write_folder(tmp_path, {"train": 2, "val": 8})  # val/ listed class by class: 8 birds, 8 cats, 8 dogs
    data = build_data(folder_cfg(tmp_path, eval_batch_size=8, num_workers=1), CPU, seed=0)
    assert drain(itertools.islice(data.val, 1))[1].tolist() == [0] * 8  # the first batch: one class
    sampled = drain(limited(data.val, 1))[1]
    assert len(sampled) == 8 and len(set(sampled.tolist())) > 1
    assert torch.equal(drain(limited(data.val, 1))[1], sampled)


def test_carving_with_labels_gives_each_split_each_class_in_its_fraction():
    labels = [0] * 40 + [1] * 40 + [2] * 20  # listed class by class, as a folder is
    parts = carve(100, {"val": 0.1, "test": 0.2}, seed=0, labels=labels)
    counts = {name: torch.bincount(torch.tensor(labels)[parts[name]], minlength=3).tolist() for name in parts}
    assert counts == {"val": [4, 4, 2], "test": [8, 8, 4], "train": [28, 28, 14]}
    assert sorted(torch.cat(list(parts.values())).tolist()) == list(range(100))
    again = carve(100, {"val": 0.1, "test": 0.2}, seed=0, labels=labels)
    assert all(torch.equal(parts[name], again[name]) for name in parts)
    assert not torch.equal(carve(100, {"val": 0.1, "test": 0.2}, seed=1, labels=labels)["val"], parts["val"])


# --- digits ---------------------------------------------------------------------------------


def test_digits_are_read_from_scikit_learns_file_exactly_as_its_load_digits_gives_them(monkeypatch):
    from sklearn.datasets import load_digits

    expected = load_digits()
    for where in ("its file", "its load_digits"):  # the file read directly; where it is missing, sklearn's API
        pixels, labels = datasets.read_digits()
        assert pixels.shape == (1797, 64) and labels.dtype == np.int64, where
        np.testing.assert_array_equal(pixels, expected.data)
        np.testing.assert_array_equal(labels, expected.target)
        monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)


def test_digits_split_sizes_ranges_and_reproducibility():
    data = build_data(data_cfg("digits"), CPU, seed=0)
    assert isinstance(data, DataBundle)
    sizes = [loader.num_samples for loader in (data.train, data.val, data.test)]
    assert sum(sizes) == 1797 and sizes == [1258, 180, 359]
    assert (data.channels, data.image_size, data.num_classes) == (1, 8, 10)
    assert data.mean == (0.305,) and data.std == (0.376,)
    images, labels = drain(data.val)
    assert images.dtype == torch.float32 and images.shape == (180, 1, 8, 8)
    assert images.min() >= 0 and images.max() <= 1 and images.max() > 0.9
    assert labels.dtype == torch.int64 and set(labels.tolist()) <= set(range(10))
    again = build_data(data_cfg("digits"), CPU, seed=123)
    assert torch.equal(drain(again.val)[0], images)  # the split depends on split_seed, not seed
    other = build_data(data_cfg("digits", split_seed=1), CPU, seed=0)
    assert not torch.equal(drain(other.val)[0], images)


def test_carve_is_disjoint_complete_and_reproducible():
    parts = carve(1797, {"test": 0.2, "val": 0.1}, seed=0)
    assert [len(parts[name]) for name in ("train", "val", "test")] == [1258, 180, 359]
    assert sorted(torch.cat(list(parts.values())).tolist()) == list(range(1797))
    again = carve(1797, {"test": 0.2, "val": 0.1}, seed=0)
    assert all(torch.equal(parts[name], again[name]) for name in parts)


def test_carve_rejects_a_fraction_that_rounds_a_split_to_nothing():
    # Fractions outside (0, 1) are the schema's to report (tests/unit/config/test_config.py); whether a valid
    # one leaves any sample depends on the dataset's size, known only here.
    with pytest.raises(ConfigError) as error:
        build_data(data_cfg("digits", val_fraction=1e-4), CPU, seed=0)
    assert error.value.key == "data.val_fraction" and "empty" in error.value.message


# --- image folders --------------------------------------------------------------------------

CLASSES = ["bird", "cat", "dog"]
COLOURS = {"bird": (200, 0, 0), "cat": (0, 200, 0), "dog": (0, 0, 200)}


def write_folder(root: Path, counts: dict[str, int]) -> None:
    """`root/<split>/<class>/<n>.png`, each image one colour per class and of varying shape."""
    for split, count in counts.items():
        for name in CLASSES:
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(count):
                size = (12 + index % 3 * 4, 10 + index % 2 * 6)
                Image.new("RGB", size, COLOURS[name]).save(folder / f"{index}.png")


def folder_cfg(root: Path, **overrides):
    return data_cfg(
        "imagefolder", **{"root": str(root), "image_size": 8, "num_workers": 0, "batch_size": 4, **overrides}
    )


@needs_image_folders
def test_imagefolder_with_val_and_test_folders(tmp_path):
    write_folder(tmp_path, {"train": 6, "val": 2, "test": 3})
    data = build_data(folder_cfg(tmp_path), CPU, seed=0)
    assert [loader.num_samples for loader in (data.train, data.val, data.test)] == [18, 6, 9]
    assert (data.channels, data.image_size, data.num_classes) == (3, 8, 3)
    assert len(data.train) == 5 and data.train.batch_size == 4
    images, labels = drain(data.train)
    assert images.shape == (18, 3, 8, 8) and images.dtype == torch.uint8 and labels.dtype == torch.int64
    colours = torch.tensor([COLOURS[name] for name in CLASSES], dtype=torch.uint8)
    assert torch.equal(images[:, :, 4, 4], colours[labels])  # class index = sorted folder name
    assert drain(data.test)[1].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]


@needs_image_folders
def test_imagefolder_carves_missing_val_and_test(tmp_path, caplog):
    write_folder(tmp_path, {"train": 10})
    cfg = folder_cfg(tmp_path, channels=1, mean=[0.5], std=[0.25])
    with caplog.at_level(logging.INFO, logger="trainkit.data"):
        data = build_data(cfg, CPU, seed=0)
    assert "carved" in caplog.text and "val/" in caplog.text
    assert [loader.num_samples for loader in (data.train, data.val, data.test)] == [24, 3, 3]
    assert drain(data.val)[0].shape == (3, 1, 8, 8)
    paths = [{path for path, _ in loader.loader.dataset.samples} for loader in (data.train, data.val, data.test)]
    assert len(set.union(*paths)) == 30 and sum(map(len, paths)) == 30
    again = build_data(cfg, CPU, seed=0)
    assert again.val.loader.dataset.samples == data.val.loader.dataset.samples


@needs_image_folders
def test_imagefolder_carves_only_the_missing_split(tmp_path):
    write_folder(tmp_path, {"train": 10, "test": 2})
    data = build_data(folder_cfg(tmp_path), CPU, seed=0)
    assert [loader.num_samples for loader in (data.train, data.val, data.test)] == [27, 3, 6]


@needs_image_folders
def test_imagefolder_ranks_and_workers(tmp_path):
    write_folder(tmp_path, {"train": 5, "val": 2, "test": 1})
    ranks = [build_data(folder_cfg(tmp_path, num_workers=2), CPU, seed=0, rank=r, world_size=2) for r in range(2)]
    for data in ranks:
        data.train.set_epoch(1)
    assert len(ranks[0].train) == len(ranks[1].train) == 2  # 15 images -> 7 a rank -> 2 batches of 4
    assert sum(data.val.num_samples for data in ranks) == 6
    assert [len(drain(data.train)[1]) for data in ranks] == [7, 7]


@needs_image_folders
def test_imagefolder_class_folders_must_match(tmp_path):
    write_folder(tmp_path, {"train": 2, "val": 1})
    (tmp_path / "val" / "cat").rename(tmp_path / "val" / "kitten")
    with pytest.raises(ConfigError) as error:
        build_data(folder_cfg(tmp_path), CPU, seed=0)
    assert error.value.key == "data.root" and "kitten" in error.value.message


@needs_image_folders
def test_imagefolder_num_classes_must_match(tmp_path):
    write_folder(tmp_path, {"train": 2})
    with pytest.raises(ConfigError) as error:
        build_data(folder_cfg(tmp_path, num_classes=5, val_fraction=0.2, test_fraction=0.2), CPU, seed=0)
    assert error.value.key == "data.num_classes" and "3" in error.value.message


@needs_image_folders
def test_imagefolder_missing_root_names_data_root(tmp_path):
    for root in (tmp_path / "nowhere", tmp_path):  # no folder; a folder without train/
        with pytest.raises(ConfigError) as error:
            build_data(folder_cfg(root), CPU, seed=0)
        assert error.value.key == "data.root" and str(root) in error.value.message
    # A root never set (`???` or null) is the schema's to report: tests/unit/config/test_config.py.


@needs_image_folders
def test_imagefolder_empty_class_folder(tmp_path):
    write_folder(tmp_path, {"train": 2})
    for path in (tmp_path / "train" / "dog").iterdir():
        path.unlink()
    (tmp_path / "train" / "dog" / "notes.txt").write_text("not an image")
    with pytest.raises(ConfigError, match="dog"):
        build_data(folder_cfg(tmp_path), CPU, seed=0)


# --- what only the data can tell (the config alone is checked in tests/unit/config/test_config.py) -------


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"channels": 3}, "data.channels"),
        ({"num_classes": 5}, "data.num_classes"),
        ({"batch_size": 2000, "drop_last": True}, "data.batch_size"),
    ],
)
def test_settings_the_data_contradicts_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as error:
        build_data(data_cfg("digits", **overrides), CPU, seed=0)
    assert error.value.key == key


def test_splits_of_another_kind_than_the_class_loads_are_one_line_naming_data_target(monkeypatch):
    monkeypatch.setattr(datasets.Digits, "splits", lambda self: [])
    with pytest.raises(ConfigError, match=r"Digits.splits\(\) returned list, but the class loads in-memory tensors"):
        build_data(data_cfg("digits"), CPU, seed=0)


def test_a_data_target_that_is_no_dataclass_of_the_template_is_one_line():
    with pytest.raises(ConfigError) as error:
        build_data(data_cfg("digits", _target_="trainkit.data.datasets.read_digits"), CPU, seed=0)
    assert error.value.key == "data._target_" and "trainkit.data.Data" in error.value.message


@pytest.mark.parametrize("drop_last", [False, True])
def test_set_epoch_with_start_batch_yields_the_rest_of_that_epoch(drop_last):
    images, labels = torch.arange(100.0).view(100, 1, 1, 1), torch.arange(100)
    loader = TensorLoader(images, labels, 8, shuffle=True, drop_last=drop_last, seed=3)
    loader.set_epoch(4)
    whole = [batch_labels.tolist() for _, batch_labels in loader]
    loader.set_epoch(4, start_batch=5)
    assert [batch_labels.tolist() for _, batch_labels in loader] == whole[5:]
    loader.set_epoch(5)  # the next epoch starts from its first batch again
    assert len(list(loader)) == len(loader)


def test_each_rank_resumes_at_its_own_next_batch():
    images, labels = torch.arange(100.0).view(100, 1, 1, 1), torch.arange(100)
    for rank in range(3):
        loader = TensorLoader(images, labels, 4, shuffle=True, seed=5, rank=rank, world_size=3)
        loader.set_epoch(2)
        whole = [batch_labels.tolist() for _, batch_labels in loader]
        assert len(whole) == len(loader) == 9  # 33 samples a rank
        loader.set_epoch(2, start_batch=4)
        assert [batch_labels.tolist() for _, batch_labels in loader] == whole[4:]
