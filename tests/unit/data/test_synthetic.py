"""data=synthetic (trainkit/data/synthetic.py): class prototypes plus noise, any shape, no files; and a checkpoint
written while the class lived in trainkit.data.datasets still resumes."""

import copy

import pytest
import torch
from test_data import CPU, data_cfg, drain
from test_identity import built

from trainkit.checkpointing.files import RENAMED_DATA_TARGETS, read_checkpoint, upgrade_fingerprint
from trainkit.data import build_data, check_same_data
from trainkit.data.fingerprint import identity_changes
from trainkit.errors import ConfigError


def test_synthetic_shapes_dtypes_and_determinism():
    cfg = data_cfg("synthetic", num_samples=64, val_samples=32, test_samples=16, image_size=6, channels=2)
    data = build_data(cfg, CPU, seed=0)
    assert [loader.num_samples for loader in (data.train, data.val, data.test)] == [64, 32, 16]
    assert (data.channels, data.image_size, data.num_classes) == (2, 6, 10)
    assert data.mean == (0.5, 0.5)
    images, labels = drain(data.test)
    assert images.shape == (16, 2, 6, 6) and images.dtype == torch.float32 and labels.dtype == torch.int64
    assert images.min() >= 0 and images.max() <= 1
    assert torch.equal(drain(build_data(cfg, CPU, seed=0).test)[0], images)
    cfg.split_seed = 1
    assert not torch.equal(drain(build_data(cfg, CPU, seed=0).test)[0], images)


def test_synthetic_is_learnable():
    torch.manual_seed(0)
    data = build_data(data_cfg("synthetic", num_samples=1024, image_size=8), CPU, seed=0)
    model = torch.nn.Linear(3 * 8 * 8, 10)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(2):
        data.train.set_epoch(epoch)
        for images, labels in data.train:
            loss = torch.nn.functional.cross_entropy(model(images.flatten(1)), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    images, labels = drain(data.val)
    accuracy = (model(images.flatten(1)).argmax(1) == labels).float().mean()
    assert accuracy >= 0.9  # a linear model reaches 1.0 in 2 epochs; chance is 0.1


def test_fewer_training_samples_than_processes_name_the_processes_not_drop_last():
    cfg = data_cfg("synthetic", num_samples=1, val_samples=2, test_samples=2, image_size=4, drop_last=False)
    with pytest.raises(ConfigError) as error:
        build_data(cfg, CPU, seed=0, rank=0, world_size=2)
    assert str(error.value) == (
        "distributed.nproc_per_node: 1 training samples for 2 processes leave some without a sample (every process "
        "trains as many); train with fewer processes, or on more data"
    )


def test_a_checkpoint_from_before_the_move_names_the_class_where_it_is_now(tmp_path):
    """The class moved from trainkit.data.datasets to trainkit.data.synthetic: a checkpoint written before names the
    old place in its config and in its data's fingerprint, and both are moved as it is read, so a resume finds the
    same data option (not "the data option is ..., was ...")."""
    old = "trainkit.data.datasets.Synthetic"
    cfg = data_cfg("synthetic", num_samples=16, val_samples=8, test_samples=8, image_size=4)
    now = build_data(cfg, CPU, seed=0).fingerprint
    saved = copy.deepcopy(now)
    saved["identity"]["option"] = old
    with pytest.raises(ConfigError, match=f"the data option is trainkit.data.synthetic.Synthetic, was {old}"):
        check_same_data(copy.deepcopy(saved), now)
    check_same_data(upgrade_fingerprint(copy.deepcopy(saved)), now)  # what Run.load_state_dict compares
    state = {"model": {}, "optimizer": {}, "scheduler": {}, "epoch": 0, "step": 0, "batches_done": 0}
    torch.save(state | {"config": {"data": {"_target_": old}}, "data": saved}, tmp_path / "last.pt")
    read = read_checkpoint(tmp_path / "last.pt")
    assert read["config"]["data"]["_target_"] == read["data"]["identity"]["option"] == now["identity"]["option"]
    assert RENAMED_DATA_TARGETS["trainkit.data.datasets.make_synthetic"] == now["identity"]["option"]


def test_synthetic_data_is_other_data_than_the_digits_and_another_split_seed_other_samples():
    plain, synthetic = built().fingerprint["identity"], built("data=synthetic").fingerprint["identity"]
    assert identity_changes(plain, synthetic) == [
        "the data option is trainkit.data.synthetic.Synthetic, was trainkit.data.datasets.Digits",
        "3,072 samples where there were 1,797",
    ]
    reseeded = built("data=synthetic", "data.split_seed=1").fingerprint["identity"]  # generated from the seed
    assert identity_changes(synthetic, reseeded) == ["other samples (as many: another digest of their contents)"]
