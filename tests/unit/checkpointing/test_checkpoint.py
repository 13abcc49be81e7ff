"""Checkpoints: atomic writes, weights_only-loadable contents, unprefixed state dicts, what a resume restores
(the average of the weights a feature evaluates in their place, too)."""

import pickle
import socket

import pytest
import torch
import torch.distributed as dist
from torch.optim.swa_utils import AveragedModel

from conftest import run_record
from trainkit.checkpointing.checkpoint import averaged_weights, load_checkpoint, save_checkpoint, unwrap_model


def small_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- atomic save ------------------------------------------------------------------------------


def test_save_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "checkpoints" / "last.pt"  # the folder is created on demand
    save_checkpoint(path, {"epoch": 1})
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]


def test_save_replaces_an_existing_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"epoch": 1})
    save_checkpoint(path, {"epoch": 2})
    assert load_checkpoint(path, torch.device("cpu"))["epoch"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"epoch": 1})
    # A local lambda: AttributeError ("Can't pickle local object") up to Python 3.13, PicklingError after.
    with pytest.raises((pickle.PicklingError, AttributeError)):
        save_checkpoint(path, {"epoch": 2, "unpicklable": lambda: None})
    assert load_checkpoint(path, torch.device("cpu"))["epoch"] == 1


def test_checkpoint_of_plain_containers_loads_with_weights_only(tmp_path):
    model = small_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": 3,
        "history": [0.1, 0.2, None],
        "best_metric": None,
        "tensor": torch.arange(5),
        "nested": {"early_stopping": {"best": 0.9, "best_epoch": 2}},
    }
    save_checkpoint(tmp_path / "best.pt", state)
    loaded = torch.load(tmp_path / "best.pt", weights_only=True)
    assert loaded["epoch"] == 3 and loaded["history"] == [0.1, 0.2, None] and loaded["best_metric"] is None
    assert torch.equal(loaded["tensor"], torch.arange(5))
    assert loaded["nested"] == state["nested"]
    fresh = small_model()
    fresh.load_state_dict(loaded["model"])
    for a, b in zip(fresh.parameters(), model.parameters()):
        assert torch.equal(a, b)
    torch.optim.AdamW(fresh.parameters(), lr=1e-3).load_state_dict(loaded["optimizer"])


def test_load_checkpoint_maps_tensors_to_the_given_device(tmp_path):
    # Saved from the CPU, loaded onto another device: "meta" (shapes, no data) stands in for a GPU here.
    save_checkpoint(tmp_path / "last.pt", {"weight": torch.ones(2)})
    loaded = load_checkpoint(tmp_path / "last.pt", torch.device("meta"))["weight"]
    assert loaded.device.type == "meta" and loaded.shape == (2,)


# ---- unwrap_model -----------------------------------------------------------------------------


def test_unwrap_model_returns_a_plain_model_unchanged():
    model = small_model()
    assert unwrap_model(model) is model


def test_unwrap_model_strips_torch_compile():
    model = small_model()
    compiled = torch.compile(model)  # never called, so nothing is compiled
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    assert unwrap_model(compiled) is model
    assert list(unwrap_model(compiled).state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_unwrap_model_strips_ddp_and_compile_under_ddp():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = small_model()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        assert all(k.startswith("module.") for k in ddp.state_dict())
        assert unwrap_model(ddp) is model

        # The order the design prescribes: compile, then wrap in DDP.
        inner = small_model()
        ddp_of_compiled = torch.nn.parallel.DistributedDataParallel(torch.compile(inner))
        assert all(k.startswith("module._orig_mod.") for k in ddp_of_compiled.state_dict())
        assert unwrap_model(ddp_of_compiled) is inner
        assert not any(k.startswith(("module.", "_orig_mod.")) for k in unwrap_model(ddp_of_compiled).state_dict())
    finally:
        dist.destroy_process_group()


def test_copy_checkpoint_is_a_complete_atomic_copy(tmp_path):
    from trainkit.checkpointing.checkpoint import copy_checkpoint

    save_checkpoint(tmp_path / "last.pt", {"epoch": 3, "weights": torch.arange(5.0)})
    (tmp_path / "best.pt").write_bytes(b"old")
    copy_checkpoint(tmp_path / "last.pt", tmp_path / "best.pt")
    copied = torch.load(tmp_path / "best.pt", weights_only=True)
    assert copied["epoch"] == 3 and torch.equal(copied["weights"], torch.arange(5.0))
    assert not list(tmp_path.glob("*.tmp"))


# ---- what a checkpoint holds: train.py's Run.state_dict <-> Run.load_state_dict ---------------


def _run_like(seed: int):
    torch.manual_seed(seed)
    return run_record(small_model(), seed)


def test_a_saved_training_state_restores_every_piece_and_the_position(tmp_path):
    trained = _run_like(seed=1)
    trained.model(torch.randn(5, 3)).sum().backward()
    trained.optimizer.step()
    trained.scheduler.step()
    trained.early_stopping.update(0.5, epoch=3)
    trained.state.epoch, trained.state.step, trained.state.best_metrics = 3, 7, {"epoch": 3, "val/loss": 0.5}
    trained.state.batches_done = 4  # of the epoch's 5
    save_checkpoint(tmp_path / "last.pt", trained.state_dict())
    expected_draw = torch.rand(3)  # what the restored RNG must draw next

    fresh = _run_like(seed=2)
    fresh.load_state_dict(load_checkpoint(tmp_path / "last.pt", torch.device("cpu")))
    for a, b in zip(fresh.model.state_dict().values(), trained.model.state_dict().values()):
        assert torch.equal(a, b)
    assert fresh.optimizer.state_dict()["state"][0]["momentum_buffer"].equal(
        trained.optimizer.state_dict()["state"][0]["momentum_buffer"]
    )
    assert fresh.scheduler.last_epoch == 1 and fresh.early_stopping.best == 0.5
    assert (fresh.state.epoch, fresh.state.step, fresh.state.batches_done) == (3, 7, 4)  # unfinished epoch 3: inside it
    assert fresh.state.best_metrics == {"epoch": 3, "val/loss": 0.5}
    assert torch.equal(torch.rand(3), expected_draw)


def test_a_checkpoint_of_a_finished_epoch_resumes_with_the_next_one(tmp_path):
    trained = _run_like(seed=1)
    trained.state.epoch, trained.state.batches_done = 5, 5  # all 5 batches: the epoch is done
    fresh = _run_like(seed=2)
    fresh.load_state_dict(trained.state_dict())
    assert (fresh.state.epoch, fresh.state.batches_done) == (6, 0)


def test_build_run_resolves_the_config_once_read_only_and_every_checkpoint_holds_that(tmp_path):
    """Resolving the config at each save cost more than writing the weights: build_run resolves it
    once, when it is complete, into run.cfg, read-only; the config as composed is left as it was."""
    import sys

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from omegaconf.errors import ReadonlyConfigError

    from conftest import ROOT
    from trainkit.config.schema import to_dict
    from trainkit.config.validation import validate
    from trainkit.distributed.process_group import ProcessInfo

    sys.path.insert(0, str(ROOT))
    import train

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config")
    validate(cfg)  # as every run: the task's defaults (the early-stopping monitor and mode) filled in
    composed = to_dict(cfg)
    run = train.build_run(cfg, tmp_path, ProcessInfo(), torch.device("cpu"))
    config = run.resolved_config
    assert config == to_dict(run.cfg) == composed and to_dict(cfg) == composed  # nothing found: as composed
    assert run.cfg.model.dropout == 0.0 and "${" not in str(OmegaConf.to_container(run.cfg))  # resolved once
    with pytest.raises(ReadonlyConfigError):
        run.cfg.data.batch_size = 16  # a write after the run is built fails at once
    assert run.state_dict()["config"] is config


# ---- an average of the weights a feature evaluates in their place (Run.averaged) -------------------


def _run_with_average(seed: int):
    torch.manual_seed(seed)
    model = small_model()
    return run_record(model, seed, averaged=AveragedModel(model, use_buffers=True))  # torch's, an equal average


def _train(run, steps: int, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        run.model(torch.randn(5, 3, generator=generator)).square().mean().backward()
        run.optimizer.step()
        run.optimizer.zero_grad()
        if run.averaged is not None:
            run.averaged.update_parameters(run.model)


def test_a_checkpoint_keeps_the_average_of_the_weights_and_a_resume_continues_it_bit_for_bit(tmp_path):
    straight = _run_with_average(seed=1)
    _train(straight, steps=3)
    save_checkpoint(tmp_path / "last.pt", straight.state_dict())
    _train(straight, steps=2, seed=1)

    resumed = _run_with_average(seed=2)
    state = load_checkpoint(tmp_path / "last.pt", torch.device("cpu"))  # weights_only=True
    resumed.load_state_dict(state)
    assert int(resumed.averaged.n_averaged) == 3
    _train(resumed, steps=2, seed=1)
    for name, tensor in straight.averaged.state_dict().items():
        assert torch.equal(resumed.averaged.state_dict()[name], tensor), name
    plain = small_model()  # what eval.py evaluates: the averaged weights, in a bare model
    plain.load_state_dict(averaged_weights(state["averaged"]))
    assert torch.equal(plain[0].weight, state["averaged"]["module.0.weight"])
    assert not torch.equal(plain[0].weight, state["model"]["0.weight"])  # an average, not the trained weights


def test_resuming_a_checkpoint_without_an_average_starts_it_from_its_weights():
    without = _run_with_average(seed=1)
    without.averaged = None  # the feature was off in the checkpoint's run
    _train(without, steps=2)
    assert without.state_dict()["averaged"] is None
    resumed = _run_with_average(seed=2)
    resumed.load_state_dict(without.state_dict())
    assert torch.equal(resumed.averaged.module[0].weight, without.model[0].weight)
    assert int(resumed.averaged.n_averaged) == 0


def test_an_average_this_run_does_not_keep_is_left_in_the_checkpoint():
    averaging = _run_with_average(seed=1)
    _train(averaging, steps=2)
    resumed = _run_with_average(seed=2)
    resumed.averaged = None  # the feature is off now: the trained weights resume, and are evaluated
    resumed.load_state_dict(averaging.state_dict())
    assert torch.equal(resumed.model[0].weight, averaging.model[0].weight)
    assert resumed.state_dict()["averaged"] is None
