"""Weight-decay parameter groups, optimizers built from conf/optimizer, and LR schedules counted in updates."""

import io
import itertools
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from trainkit.optim import build_optimizer, param_groups
from trainkit.schedules import build_scheduler, lr_schedule

CONF = Path(__file__).resolve().parents[2] / "conf"


def load_conf(group: str, name: str, **overrides):
    cfg = OmegaConf.load(CONF / group / f"{name}.yaml")
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def schedule_of(cfg, updates_per_epoch, total_updates):
    """The schedule `cfg` names as a function of the update index, with the notices it gives as `.notices`."""
    schedule, notices = lr_schedule(cfg, updates_per_epoch, total_updates)
    schedule.notices = notices
    return schedule


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)  # weight decayed, bias not
        self.norm = torch.nn.BatchNorm2d(4)  # scale and shift not decayed
        self.frozen = torch.nn.Linear(4, 4)  # excluded entirely
        self.head = torch.nn.Linear(4, 2)  # weight decayed, bias not
        self.frozen.requires_grad_(False)


def ids(params) -> set[int]:
    return {id(p) for p in params}


# ---- parameter groups -------------------------------------------------------------------------


def test_biases_and_norm_params_go_to_the_no_decay_group():
    model = SmallNet()
    decay, no_decay = param_groups(model, weight_decay=0.1)
    assert decay["weight_decay"] == 0.1
    assert no_decay["weight_decay"] == 0.0
    assert ids(decay["params"]) == ids([model.conv.weight, model.head.weight])
    assert ids(no_decay["params"]) == ids([model.conv.bias, model.norm.weight, model.norm.bias, model.head.bias])


def test_frozen_params_are_left_out_of_both_groups():
    model = SmallNet()
    groups = param_groups(model, weight_decay=0.1)
    grouped = ids(p for g in groups for p in g["params"])
    assert id(model.frozen.weight) not in grouped and id(model.frozen.bias) not in grouped
    assert grouped == ids(p for p in model.parameters() if p.requires_grad)


class TokenNet(torch.nn.Module):
    """Parameters a ViT has: tokens and position embeddings of ndim 3, named in no_weight_decay()."""

    def __init__(self):
        super().__init__()
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, 4))
        self.pos_embed = torch.nn.Parameter(torch.zeros(1, 5, 4))
        self.blocks = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        self.blocks[0].scale = torch.nn.Parameter(torch.ones(2, 4))  # named by a pattern
        self.head = torch.nn.Linear(4, 2)

    def no_weight_decay(self) -> set[str]:
        return {"cls_token", "pos_embed", "blocks.*.scale"}


def test_parameters_the_model_names_in_no_weight_decay_are_not_decayed():
    model = TokenNet()
    decay, no_decay = param_groups(model, weight_decay=0.1)
    assert ids(decay["params"]) == ids([model.blocks[0].weight, model.blocks[1].weight, model.head.weight])
    assert ids(no_decay["params"]) == ids(
        [
            model.cls_token,
            model.pos_embed,
            model.blocks[0].scale,
            model.blocks[0].bias,
            model.blocks[1].bias,
            model.head.bias,
        ]
    )
    compiled = param_groups(torch.compile(model), weight_decay=0.1)  # never run: just wrapped
    assert [ids(g["params"]) for g in compiled] == [ids(decay["params"]), ids(no_decay["params"])]


# ---- optimizers from conf/optimizer -----------------------------------------------------------


def test_sgd_config_reaches_the_optimizer():
    model = SmallNet()
    cfg = load_conf("optimizer", "sgd")
    optimizer = build_optimizer(model, cfg)
    assert isinstance(optimizer, torch.optim.SGD)
    decay, no_decay = optimizer.param_groups
    for group in (decay, no_decay):
        assert group["lr"] == cfg.lr
        assert group["momentum"] == cfg.momentum
        assert group["nesterov"] is cfg.nesterov is True
    assert decay["weight_decay"] == cfg.weight_decay > 0
    assert no_decay["weight_decay"] == 0.0


def test_adamw_config_reaches_the_optimizer():
    model = SmallNet()
    cfg = load_conf("optimizer", "adamw")
    optimizer = build_optimizer(model, cfg)
    assert isinstance(optimizer, torch.optim.AdamW)
    decay, no_decay = optimizer.param_groups
    assert decay["lr"] == no_decay["lr"] == cfg.lr
    assert tuple(decay["betas"]) == tuple(cfg.betas)
    assert decay["eps"] == cfg.eps
    assert decay["weight_decay"] == cfg.weight_decay > 0
    assert no_decay["weight_decay"] == 0.0


def test_built_optimizer_updates_the_model_own_parameters():
    # The groups pass through hydra.utils.instantiate: the optimizer must hold the model's tensors, not copies.
    model = SmallNet()
    optimizer = build_optimizer(model, load_conf("optimizer", "sgd"))
    assert ids(p for g in optimizer.param_groups for p in g["params"]) == ids(
        p for p in model.parameters() if p.requires_grad
    )
    before = model.head.weight.detach().clone()
    model.head(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    assert not torch.equal(model.head.weight, before)


# ---- LR schedules -----------------------------------------------------------------------------


def test_warmup_is_linear_and_reaches_one_at_the_end_of_warmup():
    schedule = schedule_of(load_conf("scheduler", "cosine", warmup_epochs=2), updates_per_epoch=5, total_updates=100)
    warmup = [schedule(u) for u in range(10)]
    assert warmup == pytest.approx([(u + 1) / 10 for u in range(10)])
    assert schedule(9) == pytest.approx(1.0)
    assert schedule(10) == pytest.approx(1.0)  # the first update after warmup starts the cosine at its peak
    assert schedule(11) < 1.0


def test_fractional_warmup_epochs_are_rounded_to_updates():
    schedule = schedule_of(load_conf("scheduler", "cosine", warmup_epochs=0.5), updates_per_epoch=8, total_updates=80)
    assert schedule(0) == pytest.approx(1 / 4)
    assert schedule(3) == pytest.approx(1.0)


@pytest.mark.parametrize("min_lr_ratio", [0.0, 0.1])
def test_cosine_decays_to_min_lr_ratio_at_total_updates(min_lr_ratio):
    cfg = load_conf("scheduler", "cosine", warmup_epochs=1, min_lr_ratio=min_lr_ratio)
    schedule = schedule_of(cfg, updates_per_epoch=10, total_updates=110)
    values = [schedule(u) for u in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(values))  # monotone after warmup
    assert schedule(60) == pytest.approx(min_lr_ratio + (1 - min_lr_ratio) * 0.5)  # half-way
    assert schedule(110) == pytest.approx(min_lr_ratio)
    assert schedule(500) == pytest.approx(min_lr_ratio)  # clamps past the end


def test_constant_is_flat():
    schedule = schedule_of(load_conf("scheduler", "constant"), updates_per_epoch=7, total_updates=70)
    assert {schedule(u) for u in range(200)} == {1.0}


def test_a_warmup_longer_than_half_the_run_is_cut_so_the_lr_reaches_its_peak():
    # trainer.max_steps=7 with cosine's one warmup epoch of 20 updates: uncut, all 7 updates would warm up.
    schedule = schedule_of(load_conf("scheduler", "cosine"), updates_per_epoch=20, total_updates=7)
    lrs = [schedule(u) for u in range(7)]
    assert lrs[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert max(lrs) == pytest.approx(1.0) and lrs[3:] == sorted(lrs[3:], reverse=True) and lrs[-1] < 0.2
    assert len(schedule.notices) == 1 and "is 20 updates" in schedule.notices[0]
    assert "warming up over 3 updates" in schedule.notices[0]


def test_a_warmup_within_half_the_run_is_kept_and_says_nothing():
    schedule = schedule_of(load_conf("scheduler", "cosine"), updates_per_epoch=20, total_updates=40)
    assert [schedule(u) for u in (0, 19, 20)] == pytest.approx([1 / 20, 1.0, 1.0]) and schedule.notices == []


# ---- the LambdaLR wrapper ---------------------------------------------------------------------


def make_optimizer_and_scheduler(scheduler_name="cosine", base_lr=0.5):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr)
    scheduler = build_scheduler(
        optimizer, load_conf("scheduler", scheduler_name), updates_per_epoch=4, total_updates=40
    )
    return model, optimizer, scheduler


@pytest.mark.parametrize("name", sorted(path.stem for path in (CONF / "scheduler").glob("*.yaml")))
def test_scheduler_stepped_n_times_gives_the_lr_of_update_n(name):
    _, optimizer, scheduler = make_optimizer_and_scheduler(name)
    schedule = schedule_of(load_conf("scheduler", name), updates_per_epoch=4, total_updates=40)
    for update in range(40):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * schedule(update))
        optimizer.step()
        scheduler.step()


def test_scheduler_state_dict_round_trip_resumes_exactly():
    _, optimizer, scheduler = make_optimizer_and_scheduler("cosine")
    for _ in range(13):
        optimizer.step()
        scheduler.step()

    # Through bytes, as a checkpoint would go: the state must load with weights_only=True.
    buffer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    _, resumed_optimizer, resumed_scheduler = make_optimizer_and_scheduler("cosine")
    resumed_optimizer.load_state_dict(saved["optimizer"])
    resumed_scheduler.load_state_dict(saved["scheduler"])

    assert resumed_scheduler.last_epoch == 13
    for _ in range(30):
        assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(optimizer.param_groups[0]["lr"])
        assert resumed_scheduler.get_last_lr() == pytest.approx(scheduler.get_last_lr())
        for opt, sched in ((optimizer, scheduler), (resumed_optimizer, resumed_scheduler)):
            opt.step()
            sched.step()
    assert math.isclose(optimizer.param_groups[0]["lr"], 0.0, abs_tol=1e-12)  # ran past the end of the cosine


def test_fused_auto_is_fused_on_cuda_only_and_true_asks_for_it_where_torch_has_it():
    from trainkit.errors import ConfigError
    from trainkit.optim import build_optimizer, implementation, implementation_options

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert implementation_options("auto", torch.optim.SGD, cuda) == {"fused": True}
    assert implementation_options("auto", torch.optim.AdamW, cpu) == {}  # torch's default on the CPU
    assert implementation_options("auto", torch.optim.RMSprop, cuda) == {}  # no fused RMSprop: foreach
    assert implementation_options(False, torch.optim.AdamW, cuda) == {}
    with pytest.raises(ConfigError, match="is true, but RMSprop has no fused implementation"):
        implementation_options(True, torch.optim.RMSprop, cpu)
    model = torch.nn.Linear(3, 2)
    options = {"_target_": "torch.optim.AdamW", "lr": 0.1, "weight_decay": 0.0}
    auto = build_optimizer(model, {**options, "fused": "auto"})
    assert not auto.defaults.get("fused") and implementation(auto, cpu) == "for-loop"
    fused = build_optimizer(model, {**options, "fused": True})  # torch 2.14 has fused AdamW for the CPU
    assert fused.defaults["fused"] is True and implementation(fused, cpu) == "fused"
    assert fused.state_dict()["param_groups"][0]["fused"] is True  # recorded in every checkpoint
    model(torch.randn(4, 3)).sum().backward()
    fused.step()
