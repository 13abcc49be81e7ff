"""The downloads row (trainkit/data/downloads.py): torchvision's MNIST and CIFAR-10 read from tiny files in their real
formats, what a missing folder or a failed download says (and leaves behind), their data.root default and config
check, and a checkpoint written while the classes lived in trainkit.data.datasets."""

import copy
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from test_data import CPU, data_cfg, drain

from conftest import composed
from helpers import write_cifar
from trainkit.checkpointing.files import read_checkpoint, upgrade_fingerprint
from trainkit.config.validation import ignored_keys, problems
from trainkit.data import build_data, check_same_data
from trainkit.errors import ConfigError


def write_idx(path: Path, array: np.ndarray) -> None:
    # IDX: big-endian magic (0x08 = uint8 in byte 3, the number of dimensions in byte 4), then sizes.
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, num_train: int, num_test: int) -> None:
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, count in (("train", num_train), ("t10k", num_test)):
        # Image i is filled with i and labelled i % 10, so pairs can be checked after the split.
        images = np.broadcast_to(np.arange(count, dtype=np.uint8)[:, None, None], (count, 28, 28))
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.arange(count) % 10)


def test_mnist_from_idx_files(tmp_path):
    write_mnist(tmp_path, num_train=100, num_test=30)
    data = build_data(data_cfg("mnist", root=str(tmp_path)), CPU, seed=0)
    assert [loader.num_samples for loader in (data.train, data.val, data.test)] == [90, 10, 30]
    assert (data.channels, data.image_size, data.num_classes) == (1, 28, 10)
    train_images, train_labels = drain(data.train)
    val_images, val_labels = drain(data.val)
    assert train_images.dtype == torch.uint8 and train_images.shape == (90, 1, 28, 28)
    numbers = torch.cat([train_images, val_images])[:, 0, 5, 5].long()
    assert sorted(numbers.tolist()) == list(range(100))
    assert torch.equal(numbers % 10, torch.cat([train_labels, val_labels]))
    assert drain(data.test)[1].tolist() == [i % 10 for i in range(30)]


def test_cifar10_from_pickled_batches(tmp_path, monkeypatch):
    import torchvision.datasets.cifar

    # The files are ours, not the real ones, so their md5 sums differ: accept any file that exists.
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda path, md5=None: Path(path).is_file())
    write_cifar(tmp_path, per_batch=20, num_test=15)
    data = build_data(data_cfg("cifar10", root=str(tmp_path)), CPU, seed=0)
    assert [loader.num_samples for loader in (data.train, data.val, data.test)] == [90, 10, 15]
    assert (data.channels, data.image_size, data.num_classes) == (3, 32, 10)
    images, labels = drain(data.train)
    assert images.dtype == torch.uint8 and images.shape == (90, 3, 32, 32)
    assert (images[:, 1] == 1).all() and (images[:, 2] == 2).all()  # channels first, planes intact
    assert (images[:, 0] == images[:, 0, :1, :1]).all()
    assert torch.equal(images[:, 0, 0, 0].long() % 10, labels)


@pytest.mark.parametrize(("name", "folder"), [("mnist", "MNIST/raw/"), ("cifar10", "cifar-10-batches-py/")])
def test_missing_torchvision_files_name_data_root(tmp_path, name, folder):
    with pytest.raises(ConfigError) as error:
        build_data(data_cfg(name, root=str(tmp_path)), CPU, seed=0)
    assert error.value.key == "data.root"
    assert str(tmp_path) in error.value.message and folder in error.value.message
    assert "data.download=true" in error.value.message


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_a_failed_download_leaves_nothing_behind(tmp_path, monkeypatch, name):
    from torchvision.datasets import CIFAR10, MNIST

    # An address on this machine where nothing listens: the download fails at once, no network touched.
    monkeypatch.setattr(MNIST, "mirrors", ["http://127.0.0.1:9/"])
    monkeypatch.setattr(CIFAR10, "url", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    # A root that does not exist yet (the default ./data on a first run): it is removed again.
    missing = tmp_path / "new" / "data"
    with pytest.raises(ConfigError) as error:
        build_data(data_cfg(name, root=str(missing), download=True), CPU, seed=0)
    assert error.value.key == "data.download" and "\n" not in error.value.message
    assert not (tmp_path / "new").exists()
    # A root that exists: what was there stays, nothing new is left.
    root = tmp_path / "data"
    (root / "MNIST" / "raw").mkdir(parents=True)
    (root / "MNIST" / "raw" / "notes.txt").write_text("mine")
    (root / "other").mkdir()
    before = sorted(root.rglob("*"))
    with pytest.raises(ConfigError):
        build_data(data_cfg(name, root=str(root), download=True), CPU, seed=0)
    assert sorted(root.rglob("*")) == before
    assert (root / "MNIST" / "raw" / "notes.txt").read_text() == "mine"


def test_the_root_is_trainkit_data_or_else_data(monkeypatch):
    for name in ("mnist", "cifar10"):
        monkeypatch.delenv("TRAINKIT_DATA", raising=False)
        assert composed(f"data={name}").data.root == "data"
        monkeypatch.setenv("TRAINKIT_DATA", "/datasets")
        assert composed(f"data={name}").data.root == "/datasets"


@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_the_config_check_asks_for_a_root_and_takes_download_as_meant(name):
    assert problems(composed(f"data={name}", "data.root=null"))["data.root"].startswith(f"is required for {name};")
    assert ignored_keys(composed(f"data={name}")) == []
    assert ignored_keys(composed(f"data={name}", "data.download=true")) == []  # digits would warn of it


@pytest.mark.parametrize(("old", "now"), [("MNIST", "MNIST"), ("load_mnist", "MNIST"), ("load_cifar10", "CIFAR10")])
def test_a_checkpoint_from_before_the_move_names_the_class_where_it_is_now(tmp_path, old, now):
    """MNIST and CIFAR10 moved from trainkit.data.datasets (load_mnist and load_cifar10 before that) to
    trainkit.data.downloads: a checkpoint's config and data fingerprint naming the old place are moved as read."""
    write_mnist(tmp_path, num_train=20, num_test=10)
    fingerprint = build_data(data_cfg("mnist", root=str(tmp_path)), CPU, seed=0).fingerprint
    saved = copy.deepcopy(fingerprint)
    saved["identity"]["option"] = f"trainkit.data.datasets.{old}"
    state = {"model": {}, "optimizer": {}, "scheduler": {}, "epoch": 0, "step": 0, "batches_done": 0}
    torch.save(
        state | {"config": {"data": {"_target_": f"trainkit.data.datasets.{old}"}}, "data": saved}, tmp_path / "last.pt"
    )
    read = read_checkpoint(tmp_path / "last.pt")
    assert read["config"]["data"]["_target_"] == read["data"]["identity"]["option"] == f"trainkit.data.downloads.{now}"
    if now == "MNIST":
        check_same_data(upgrade_fingerprint(copy.deepcopy(saved)), fingerprint)
