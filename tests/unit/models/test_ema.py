import json

import pytest
import torch
from omegaconf import OmegaConf
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from conftest import run_here, run_record
from helpers import assert_one_config_error, on_two_ranks
from template.test_readme import test_every_everyday_key_is_explained_by_a_comment_in_its_yaml as explained
from trainkit.checkpointing.checkpoint import averaged_weights, load_checkpoint, save_checkpoint
from trainkit.models.ema import build_ema, update_ema, warmup_decay
from trainkit.tasks import evaluate
from trainkit.tasks.classification import Classification

CLASSIFICATION = Classification(num_classes=10)  # evaluate's task: cross-entropy and accuracy


def bn_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, 3))


def train_steps(model, ema, optimizer, steps: int, seed: int = 0) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        inputs = torch.randn(8, 4, generator=generator)
        targets = torch.randint(0, 3, (8,), generator=generator)
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
        for average in ema if isinstance(ema, list) else [ema]:
            update_ema(average, model)  # as train.py does after each update


def ema_config(decay=0.9, warmup=True, enabled=True):
    return {"enabled": enabled, "decay": decay, "warmup": warmup}


def test_ema_is_off_unless_enabled():
    model = bn_model()
    assert build_ema(model, ema_config(enabled=False)) is None
    before = [tensor.clone() for tensor in model.state_dict().values()]
    update_ema(None, model)  # train.py's update line with none kept: nothing happens
    assert all(torch.equal(a, b) for a, b in zip(before, model.state_dict().values()))


def test_without_warmup_it_is_torchs_ema_of_weights_and_batchnorm_statistics():
    torch.manual_seed(0)
    model = bn_model()
    ema = build_ema(model, ema_config(decay=0.9, warmup=False))
    reference = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9), use_buffers=True)
    train_steps(model, [ema, reference], torch.optim.SGD(model.parameters(), lr=0.5), steps=6)
    averaged, raw = ema.module.state_dict(), model.state_dict()
    for name, tensor in reference.module.state_dict().items():
        assert torch.equal(averaged[name], tensor), name
    assert not torch.equal(averaged["0.weight"], raw["0.weight"])  # an average, not a copy
    assert not torch.equal(averaged["1.running_mean"], raw["1.running_mean"])  # statistics averaged too
    assert int(ema.n_averaged) == 6


def test_warmup_ramps_the_decay_with_the_update_count():
    torch.manual_seed(0)
    model = bn_model()
    ema = build_ema(model, ema_config(decay=0.95, warmup=True))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    expected = None
    for n in range(12):  # by hand: the first update copies, the n-th mixes in with weight 1 - decay_n
        train_steps(model, ema, optimizer, steps=1, seed=n)
        weight = model[0].weight.detach().clone()
        decay = min(0.95, (1 + n) / (10 + n))
        expected = weight if expected is None else decay * expected + (1 - decay) * weight
    torch.testing.assert_close(ema.module[0].weight, expected, rtol=1e-5, atol=1e-6)
    assert warmup_decay(0.95, 1) == 2 / 11 and warmup_decay(0.95, 1000) == 0.95
    assert float(warmup_decay(0.95, torch.tensor(1))) == pytest.approx(2 / 11)
    assert torch.equal(ema.module[1].num_batches_tracked, model[1].num_batches_tracked)  # counted, not averaged


def run_with_ema(seed: int):
    torch.manual_seed(seed)
    model = bn_model()
    return run_record(model, seed, averaged=build_ema(model, ema_config(decay=0.99)))


def test_a_checkpoint_keeps_the_ema_and_a_resume_continues_it_bit_for_bit(tmp_path):

    straight = run_with_ema(seed=1)
    train_steps(straight.model, straight.averaged, straight.optimizer, steps=4)
    save_checkpoint(tmp_path / "last.pt", straight.state_dict())
    train_steps(straight.model, straight.averaged, straight.optimizer, steps=3, seed=1)

    resumed = run_with_ema(seed=2)
    state = load_checkpoint(tmp_path / "last.pt", torch.device("cpu"))  # weights_only=True
    resumed.load_state_dict(state)
    assert int(resumed.averaged.n_averaged) == 4
    train_steps(resumed.model, resumed.averaged, resumed.optimizer, steps=3, seed=1)
    for name, tensor in straight.averaged.state_dict().items():
        assert torch.equal(resumed.averaged.state_dict()[name], tensor), name

    plain = bn_model()  # the EMA weights load into a bare model for inference
    plain.load_state_dict(averaged_weights(state["averaged"]))
    assert torch.equal(plain[0].weight, state["averaged"]["module.0.weight"])


def evaluate_weights(state: dict, weights: dict) -> float:
    """val/loss of `weights` on the validation split of the run that saved `state`."""

    from trainkit.augment.batch_transform import BatchTransform
    from trainkit.data import build_data
    from trainkit.models.build import build_model

    cfg = OmegaConf.create(state["config"])
    data = build_data(cfg.data, device=torch.device("cpu"), seed=cfg.seed, rank=0, world_size=1)
    model = build_model(cfg.model)
    model.load_state_dict(weights)
    transform = BatchTransform(data.mean, data.std, data.image_size, None)
    metrics = evaluate(
        model, data.val, transform, CLASSIFICATION, "fp32", torch.device("cpu"), cfg.trainer.limit_val_batches
    )
    return metrics["loss"]


@pytest.mark.slow  # trains in this process (run_train)
def test_a_run_with_ema_validates_tests_with_it_and_resumes_it_exactly_and_eval_py_evaluates_it(run_train, tmp_path):
    overrides = [
        "regularization.ema.enabled=true",
        "regularization.ema.decay=0.9",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=6",
        "scheduler=constant",
        "trainer.progress_bar=false",
        "print_config=false",
        "regularization.early_stopping.enabled=false",
    ]
    straight = run_train(*overrides)
    stopped = run_train(*overrides, "trainer.max_steps=9")  # 6 updates an epoch: 3 batches into epoch 1
    # continues in the stopped run's directory; max_steps=null lifts the stop the first command set
    resumed = run_train(*overrides, "trainer.max_steps=null", f"resume={stopped.run_dir}", run_dir=stopped.run_dir)
    straight_state, resumed_state = (
        torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True) for run in (straight, resumed)
    )
    for name, tensor in straight_state["averaged"].items():
        assert torch.equal(resumed_state["averaged"][name], tensor), name
    assert resumed.epoch_metrics()[-1]["val/loss"] == straight.epoch_metrics()[-1]["val/loss"]
    assert resumed.summary["test"] == straight.summary["test"]
    # val/loss was measured with the EMA weights, not the raw ones
    logged = straight.epoch_metrics()[-1]["val/loss"]
    averaged = averaged_weights(straight_state["averaged"])
    assert evaluate_weights(straight_state, averaged) == pytest.approx(logged, rel=1e-6)
    assert evaluate_weights(straight_state, straight_state["model"]) != pytest.approx(logged, rel=1e-3)
    # eval.py evaluates the weights the run evaluated (best.pt's averaged ones): summary.json's numbers, exactly
    for split, summarized in (("test", straight.summary["test"]), ("val", straight.summary["best"])):
        out, checkpoint = tmp_path / split, f"checkpoint={straight.run_dir}"
        code, _, stderr = run_here("eval.py", f"hydra.run.dir={out}", checkpoint, f"split={split}")
        assert code == 0, stderr[-3000:]
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["weights"] == "averaged"
        keys = (f"{split}/loss", f"{split}/acc")
        assert {key: metrics[key] for key in keys} == {key: summarized[key] for key in keys}  # float equality


def _ema_under_ddp(rank: int, port: int, results) -> None:
    import torch.distributed as dist

    from trainkit.distributed.process_group import average_batchnorm_statistics, gather_objects

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(rank)  # as train.py: each rank builds different initial weights
        model = bn_model()
        ema = build_ema(model, ema_config(decay=0.9))  # rank 0's weights, broadcast first
        initial = ema.module[0].weight.detach().clone()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
        for _ in range(4):
            inputs, targets = torch.randn(8, 4, generator=generator), torch.randint(0, 3, (8,), generator=generator)
            torch.nn.functional.cross_entropy(ddp(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()
            update_ema(ema, model)
        average_batchnorm_statistics(ema)  # as train.py does after each epoch
        results[rank] = gather_objects((initial, {k: v.clone() for k, v in ema.state_dict().items()}))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_every_ddp_rank_holds_the_same_ema():
    results = on_two_ranks(_ema_under_ddp)
    (initial0, state0), (initial1, state1) = results[0]
    assert torch.equal(initial0, initial1)  # built from the same (rank 0's) weights
    for name, tensor in state0.items():
        assert torch.equal(state1[name], tensor), name


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["regularization.ema.enabled=maybe"], "regularization.ema.enabled"),
        (["regularization.ema.decay=1"], "regularization.ema.decay"),
        (["regularization.ema.warmup=2"], "regularization.ema.warmup"),
    ],
)
def test_the_ema_keys_are_checked_beside_its_code(overrides, key):
    assert_one_config_error(overrides, key)


@pytest.mark.parametrize("key", ["regularization.ema.enabled", "regularization.ema.decay", "regularization.ema.warmup"])
def test_the_ema_keys_are_explained_by_a_comment_in_conf_config_yaml(key):
    explained(key)  # as test_readme.py checks the everyday keys
