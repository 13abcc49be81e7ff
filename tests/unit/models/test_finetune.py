"""Fine-tuning tools: freezing (and frozen BatchNorm), local pretrained weights, a separate head LR,
the linear LR-scaling rule and warmup from a fraction of the LR."""

import copy
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from helpers import config_check_tests, record_run
from trainkit.checkpointing.files import upgrade_config
from trainkit.errors import ConfigError
from trainkit.models import finetune
from trainkit.models.build import build_model
from trainkit.models.finetune import fine_tune, freeze
from trainkit.models.pretrained import adapt_input_channels
from trainkit.models.small_cnn import SmallCNN
from trainkit.models.submodules import head_parameters
from trainkit.optim import build_optimizer, param_groups, scaled_lr
from trainkit.schedules import build_scheduler, lr_schedule

os.environ.setdefault("HF_HUB_OFFLINE", "1")
CONF = Path(__file__).resolve().parents[3] / "conf"


def model_config(group: str, channels: int = 1, num_classes: int = 10, **overrides):
    """conf/model/<group>.yaml inside a root config that its interpolations resolve against."""
    root = OmegaConf.create(
        {
            "data": {"channels": channels, "num_classes": num_classes},
            "regularization": {"dropout": 0.0},
            "model": OmegaConf.load(CONF / "model" / f"{group}.yaml"),
        }
    )
    for key, value in overrides.items():
        root.model[key] = value
    return root.model


FINETUNE_KEYS = ("pretrained_path", "freeze", "freeze_bn", "input_size")


def model_and_finetune(group: str, channels: int = 1, num_classes: int = 10, **overrides):
    """fine_tune's two nodes: conf/model/<group>.yaml with `overrides` of its keys, and conf/config.yaml's
    finetune section with `overrides` of its keys (pretrained_path, freeze, freeze_bn, input_size)."""
    finetune = OmegaConf.load(CONF / "config.yaml").finetune
    for key in FINETUNE_KEYS:
        if key in overrides:
            finetune[key] = overrides.pop(key)
    return model_config(group, channels, num_classes, **overrides), finetune


def built(model_cfg, finetune, image_size: int | None):
    """(the model, the side its batches are resized to), as train.py builds and fine-tunes it."""
    model = build_model(model_cfg)
    return model, fine_tune(model, model_cfg, finetune, image_size)


def optimizer_config(name: str = "sgd", **overrides):
    cfg = OmegaConf.load(CONF / "optimizer" / f"{name}.yaml")
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def batchnorms(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}


def train_a_few_steps(model, optimizer, channels=1, steps=3):
    """The loop of train.py in miniature: train mode (frozen BatchNorm stays in eval), SGD steps."""
    scheduler = build_scheduler(optimizer, OmegaConf.load(CONF / "scheduler" / "cosine.yaml"), 2, 20)
    torch.manual_seed(1)
    for _ in range(steps):
        model.train()
        images, labels = torch.randn(8, channels, 8, 8), torch.randint(0, 10, (8,))
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # keep zeros: frozen parameters must still have none
        scheduler.step()


# ---- freezing ---------------------------------------------------------------------------------


def test_frozen_backbone_is_bit_identical_after_training_and_only_the_head_learns():
    torch.manual_seed(0)
    model, _ = built(*model_and_finetune("cnn", freeze="backbone", widths=[4, 8, 8]), image_size=8)
    assert_only_the_head_learns(model)


def assert_only_the_head_learns(model: nn.Module) -> None:
    """A few steps of a model whose backbone is frozen: the backbone's parameters and BatchNorm statistics stay
    bit-identical and out of the optimizer, the head's parameters move."""
    head = head_parameters(model)
    frozen = {name: p.detach().clone() for name, p in model.named_parameters() if p not in head}
    head_before = {name: p.detach().clone() for name, p in model.named_parameters() if p in head}
    stats = {name: {k: v.clone() for k, v in m.state_dict().items()} for name, m in batchnorms(model).items()}
    assert frozen and head_before and stats

    optimizer = build_optimizer(model, optimizer_config(head_lr_scale=10.0))
    grouped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert grouped == {id(p) for p in head}  # frozen parameters are in no group: no update, no weight decay
    train_a_few_steps(model, optimizer)

    params = dict(model.named_parameters())
    for name, before in frozen.items():
        assert torch.equal(params[name], before), name
        assert params[name].grad is None and not params[name].requires_grad
    assert all(not torch.equal(params[name], before) for name, before in head_before.items())
    for name, module in batchnorms(model).items():  # frozen BatchNorm: eval mode, statistics untouched
        assert not module.training
        assert all(torch.equal(module.state_dict()[k], v) for k, v in stats[name].items()), name


def test_a_frozen_backbone_and_its_batchnorm_statistics_do_not_move_in_the_loop(tmp_path, monkeypatch):
    """finetune.freeze=backbone through train.py's loop: its model.train() every epoch leaves the frozen BatchNorm in
    eval mode, so the backbone's weights and statistics end as they started."""
    before = {}

    def backbone_now(run):
        before.update({name: tensor.clone() for name, tensor in run.model.features.state_dict().items()})

    short = ("device=cpu", "print_config=false", "data.batch_size=8", "model.widths=[8,16]", "regularization=none")
    limits = ("trainer.max_epochs=2", "trainer.limit_train_batches=3", "trainer.limit_val_batches=1")
    recording = record_run(tmp_path, monkeypatch, *short, *limits, "finetune.freeze=backbone", prepare=backbone_now)
    after = recording.run.model.features.state_dict()
    assert any("running_mean" in name for name in before)
    for name, tensor in before.items():  # weights and BatchNorm statistics
        assert torch.equal(after[name], tensor), name


def test_freeze_bn_false_lets_frozen_batchnorm_statistics_move():
    torch.manual_seed(0)
    model, _ = built(*model_and_finetune("cnn", freeze="backbone", freeze_bn=False, widths=[4, 8, 8]), image_size=8)
    bn = model.features[1]
    mean, weight = bn.running_mean.clone(), bn.weight.detach().clone()
    train_a_few_steps(model, build_optimizer(model, optimizer_config()))
    assert bn.training and not torch.equal(bn.running_mean, mean)  # statistics follow the new data
    assert torch.equal(bn.weight, weight)  # its affine parameters stay frozen


def test_freeze_specs_null_zero_and_bad_values():
    model = SmallCNN(1, 10, widths=(4, 8, 8))
    assert freeze(model, None) == [] and freeze(model, 0) == []
    assert all(p.requires_grad for p in model.parameters())
    for bad in ("head", -1, True, 1.5):
        with pytest.raises(
            ValueError, match="freeze: spec"
        ):  # the config's own check: tests/unit/config/test_config.py
            freeze(model, bad)
    assert freeze(model, 1) == ["features"]  # SmallCNN: one stage, its feature extractor


def test_head_of_each_model_kind():
    cnn = SmallCNN(1, 10, widths=(4, 8, 8))
    assert head_parameters(cnn) == set(cnn.head[3].parameters())


def test_frozen_batchnorm_stays_in_eval_through_every_train_call_syncbn_conversion_deepcopy_and_wrapping():
    """No call after model.train() to forget (the loop, the LR finder, the memory search): the model's own train()
    keeps its frozen BatchNorm in eval mode, also converted to SyncBatchNorm, deep-copied (EMA) and wrapped."""
    model = SmallCNN(1, 10, widths=(4, 8, 8))
    freeze(model, "backbone")
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(converted.features[1], nn.SyncBatchNorm)
    copied = copy.deepcopy(converted)
    wrapped = torch.optim.swa_utils.AveragedModel(converted)
    for candidate, inner in ((converted, converted), (copied, copied), (wrapped, wrapped.module)):
        assert candidate.train() is candidate and inner.training  # the rest of the model trains
        assert batchnorms(inner) and not any(m.training for m in batchnorms(inner).values())
        candidate.eval()
        assert not inner.training
    unfrozen = SmallCNN(1, 10, widths=(4, 8, 8)).train()
    assert all(m.training for m in batchnorms(unfrozen).values())


def test_the_input_size_is_the_data_size_or_finetune_input_size():
    assert built(*model_and_finetune("cnn"), image_size=8)[1] == 8
    assert built(*model_and_finetune("cnn", input_size=16), image_size=8)[1] == 16
    assert built(*model_and_finetune("cnn", input_size=16), image_size=None)[1] is None  # not images: no resize


# ---- local pretrained weights -----------------------------------------------------------------


def saved(model, path, transform=lambda state: state):
    torch.save(transform(model.state_dict()), path)
    return path


def test_weights_from_a_local_file_load_exactly(tmp_path):
    torch.manual_seed(0)
    source = SmallCNN(1, 10, widths=(4, 8, 8))
    path = saved(source, tmp_path / "weights.pt")
    torch.manual_seed(1)
    model, _ = built(*model_and_finetune("cnn", widths=[4, 8, 8], pretrained_path=str(path)), image_size=8)
    for key, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


@pytest.mark.parametrize("wrap", ["module", "compiled", "checkpoint", "safetensors"])
def test_prefixes_checkpoints_and_safetensors_are_understood(tmp_path, wrap):
    torch.manual_seed(0)
    source = SmallCNN(1, 10, widths=(4, 8, 8))
    state = source.state_dict()
    path = tmp_path / "weights.pt"
    if wrap == "module":
        torch.save({f"module.{k}": v for k, v in state.items()}, path)
    elif wrap == "compiled":
        torch.save({f"_orig_mod.module.{k}": v for k, v in state.items()}, path)
    elif wrap == "checkpoint":  # train.py's checkpoints/best.pt: the weights under "model"
        torch.save({"model": state, "epoch": 3, "config": {"seed": 0}}, path)
    else:
        from safetensors.torch import save_file

        path = tmp_path / "weights.safetensors"
        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    model, _ = built(*model_and_finetune("cnn", widths=[4, 8, 8], pretrained_path=str(path)), image_size=8)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_more_input_channels_repeat_and_rescale():
    weight = torch.randn(4, 3, 3, 3)
    adapted = adapt_input_channels(weight, 5)
    assert adapted.shape == (4, 5, 3, 3)
    assert torch.allclose(adapted[:, :3], weight * 3 / 5) and torch.allclose(adapted[:, 3:], weight[:, :2] * 3 / 5)


def test_weights_of_another_architecture_or_garbage_are_config_errors(tmp_path):
    other = saved(SmallCNN(1, 10, widths=(4, 8, 16)), tmp_path / "other.pt")  # a wider last block
    with pytest.raises(ConfigError, match="another architecture"):
        built(*model_and_finetune("cnn", widths=[4, 8, 8], pretrained_path=str(other)), image_size=8)
    unrelated = saved(nn.Linear(3, 3), tmp_path / "linear.pt")
    with pytest.raises(ConfigError, match="no tensor name"):
        built(*model_and_finetune("cnn", widths=[4, 8, 8], pretrained_path=str(unrelated)), image_size=8)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="could not read"):
        built(*model_and_finetune("cnn", widths=[4, 8, 8], pretrained_path=str(garbage)), image_size=8)
    # model.pretrained=true together with finetune.pretrained_path: a config error, tests/unit/config/test_config.py.


# ---- head LR, LR scaling, warmup from a fraction ----------------------------------------------


def test_head_lr_scale_makes_four_groups_with_the_right_lrs():
    model = SmallCNN(1, 10, widths=(4, 8, 8))
    optimizer = build_optimizer(model, optimizer_config(lr=0.01, head_lr_scale=10.0))
    backbone_decay, backbone_no_decay, head_decay, head_no_decay = optimizer.param_groups
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.01, 0.01, 0.1, 0.1])
    assert [g["lr_scale"] for g in optimizer.param_groups] == [1.0, 1.0, 10.0, 10.0]
    assert [g["params"] for g in (head_decay, head_no_decay)] == [[model.head[3].weight], [model.head[3].bias]]
    assert head_decay["weight_decay"] > 0 and head_no_decay["weight_decay"] == backbone_no_decay["weight_decay"] == 0
    assert len(backbone_decay["params"]) == 3  # the three convolutions
    # The schedule multiplies each group's own LR: the ratio holds at every update.
    scheduler = build_scheduler(optimizer, OmegaConf.load(CONF / "scheduler" / "cosine.yaml"), 4, 40)
    for _ in range(10):
        optimizer.step()
        scheduler.step()
        assert head_decay["lr"] == pytest.approx(10 * backbone_decay["lr"])
    assert len(build_optimizer(model, optimizer_config()).param_groups) == 2  # scale 1: the two decay groups


def test_head_lr_scale_with_a_frozen_backbone_keeps_empty_backbone_groups():
    model = SmallCNN(1, 10, widths=(4, 8, 8))
    freeze(model, "backbone")
    groups = param_groups(model, weight_decay=0.1, head_lr_scale=5.0, lr=0.2)
    assert [len(g["params"]) for g in groups] == [0, 0, 1, 1]
    assert [g["lr"] for g in groups] == pytest.approx([0.2, 0.2, 1.0, 1.0])


def test_scaled_lr_is_the_linear_rule_over_the_global_batch():
    assert scaled_lr(0.1, batch_size=64, world_size=4, accumulate=2, reference=256) == pytest.approx(0.2)
    assert scaled_lr(0.1, batch_size=256) == pytest.approx(0.1)
    assert scaled_lr(1e-3, batch_size=32, world_size=1, accumulate=1, reference=256) == pytest.approx(1.25e-4)
    with pytest.raises(ValueError):
        scaled_lr(0.1, batch_size=0)
    model = SmallCNN(1, 10, widths=(4, 8, 8))
    cfg = optimizer_config(lr=0.1, scale_lr_with_batch=True, reference_batch_size=256, head_lr_scale=2.0)
    optimizer = build_optimizer(model, cfg, batch_size=128, world_size=2, accumulate=4)  # global batch 1024
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.4, 0.4, 0.8, 0.8])
    assert build_optimizer(model, optimizer_config(lr=0.1), batch_size=128, world_size=2).param_groups[0]["lr"] == 0.1


def test_warmup_start_factor_warms_up_linearly_from_the_fraction():
    cfg = OmegaConf.load(CONF / "scheduler" / "cosine.yaml")
    cfg.warmup_epochs = 2
    default, _ = lr_schedule(cfg, updates_per_epoch=5, total_updates=100)
    assert [default(u) for u in range(10)] == pytest.approx([(u + 1) / 10 for u in range(10)])  # unchanged
    cfg.warmup_start_factor = 0.1
    schedule, _ = lr_schedule(cfg, updates_per_epoch=5, total_updates=100)
    assert [schedule(u) for u in range(11)] == pytest.approx([0.1 + 0.9 * u / 10 for u in range(10)] + [1.0])
    assert schedule(10) == pytest.approx(1.0) and schedule(11) < 1.0  # then the cosine, as before
    # Bad optimizer keys and a warmup_start_factor outside [0, 1] are the schema's: tests/unit/config/test_config.py.


def test_a_checkpoint_from_before_the_finetune_section_has_its_model_keys_moved_there():
    old = {"model": {"_target_": "trainkit.models.small_cnn.SmallCNN", "input_size": 16, "pretrained_path": None}}
    old["model"] |= {"freeze": "backbone", "freeze_bn": False}
    upgrade_config(old)
    assert old["model"] == {"_target_": "trainkit.models.small_cnn.SmallCNN"}  # constructor arguments alone
    assert old["finetune"] == {"input_size": 16, "pretrained_path": None, "freeze": "backbone", "freeze_bn": False}


# ---- its config checks (conf/config.yaml's finetune._checks_) ---------------------------------------------

# The digits as a table (tests/data_for_tests.py): data that is not images.
TABLE = [
    "data._target_=data_for_tests.DigitsTable",
    *(f"~data.{key}" for key in ("channels", "image_size", "mean", "std", "mirror_changes_label")),
    "model.in_channels=64",  # model=cnn reads data.channels, which a table has not
]
RULE_CASES = [
    (["finetune.pretrained_path=3"], "finetune.pretrained_path"),
    (["finetune.input_size=0"], "finetune.input_size"),
    (["finetune.input_size=abc"], "finetune.input_size"),
    (["finetune.freeze=head"], "finetune.freeze"),
    (["finetune.freeze=-1"], "finetune.freeze"),
    (["finetune.freeze_bn=1"], "finetune.freeze_bn"),
]
RELATION_CASES = [
    # a model that loads weights of its own (models_for_tests.DownloadingCNN declares own_weights)
    (
        [
            "model._target_=models_for_tests.DownloadingCNN",
            "+model.pretrained=true",
            "finetune.pretrained_path=/weights/resnet18.pt",
        ],
        "finetune.pretrained_path",
    ),
    # a resize would not move a target per pixel, and resizes nothing on data that is not images
    (["task._target_=tasks_for_tests.PixelClasses", "finetune.input_size=16"], "finetune.input_size"),
    ([*TABLE, "finetune.input_size=16"], "finetune.input_size"),
]
test_a_bad_setting_is_found_by_its_own_check, test_every_check_has_a_case = config_check_tests(
    finetune, RULE_CASES, RELATION_CASES
)
