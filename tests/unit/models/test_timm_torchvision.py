"""model=timm and model=torchvision (trainkit.models.timm_torchvision): the factories, their errors, the input
sizes they take, and fine-tuning them (freezing stages, their heads, weights of another shape).

timm and torchvision take seconds to import; Python imports them once for the whole file.
"""

import logging
import os
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_finetune import FINETUNE_KEYS, assert_only_the_head_learns, built, saved
from test_models import model_config
from torch import nn

from trainkit.errors import ConfigError
from trainkit.models.finetune import freeze, stages
from trainkit.models.input_size import resolve_input_size, runs_on
from trainkit.models.submodules import head_parameters
from trainkit.models.timm_torchvision import _did_you_mean, create_timm_model, create_torchvision_model
from trainkit.optim import param_groups

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # conftest sets it too; never reach for the hub
CONF = Path(__file__).resolve().parents[3] / "conf"


@pytest.fixture
def unreachable_hub(tmp_path, monkeypatch):
    """No HF_HUB_OFFLINE, an empty hub cache, and a hub address on this machine where nothing
    listens: what a laptop without network looks like to huggingface_hub, without touching one."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def model_and_finetune(group: str, channels: int = 1, image_size: int = 8, dropout: float = 0.0, **overrides):
    """fine_tune's two nodes: conf/model/<group>.yaml with `overrides` of its keys (regularization.dropout: `dropout`),
    and conf/config.yaml's finetune section with `overrides` of its keys (pretrained_path, freeze, freeze_bn,
    input_size)."""
    finetune = OmegaConf.load(CONF / "config.yaml").finetune
    for key in FINETUNE_KEYS:
        if key in overrides:
            finetune[key] = overrides.pop(key)
    return model_config(group, channels, image_size, dropout, **overrides), finetune


def test_timm_resnet18_on_one_channel_8x8_images():
    model, input_size = built(*model_and_finetune("timm", dropout=0.1, drop_path_rate=0.05), image_size=8)
    assert input_size == 8  # resnets take any size
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_timm_unknown_name_suggests_close_names():
    with pytest.raises(ConfigError) as error:
        create_timm_model("resnet_18", in_chans=1, num_classes=10)
    assert (
        error.value.key == "model.name" and "did you mean" in error.value.message and "resnet18" in error.value.message
    )


def test_timm_model_without_stochastic_depth_rejects_drop_path_rate():
    with pytest.raises(ConfigError) as error:  # VGG's constructor fails before building anything
        create_timm_model("vgg11", num_classes=10, drop_path_rate=0.1)
    assert error.value.key == "model.drop_path_rate"


def test_timm_pretrained_weights_offline_are_a_config_error():
    with pytest.raises(ConfigError) as error:
        create_timm_model("resnet18", pretrained=True, in_chans=1, num_classes=10)
    assert error.value.key == "model.pretrained" and "model.pretrained=false" in error.value.message


def test_pretrained_weights_not_cached_with_an_unreachable_hub_fail_at_once(unreachable_hub):
    start = time.monotonic()
    with pytest.raises(ConfigError) as error:
        create_timm_model("resnet18", pretrained=True, in_chans=1, num_classes=10)
    assert time.monotonic() - start < 5  # not a minute of hub retries
    assert error.value.key == "model.pretrained" and "does not answer" in error.value.message
    assert "not in the local cache" in error.value.message


def test_cached_pretrained_weights_load_without_asking_an_unreachable_hub(unreachable_hub):
    from huggingface_hub import constants
    from safetensors.torch import save_file

    weights = create_timm_model("resnet18").state_dict()  # stands in for the downloaded file
    snapshot = unreachable_hub / "models--timm--resnet18.a1_in1k" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    save_file(weights, str(snapshot / "model.safetensors"))
    (unreachable_hub / "models--timm--resnet18.a1_in1k" / "refs").mkdir()
    (unreachable_hub / "models--timm--resnet18.a1_in1k" / "refs" / "main").write_text("0" * 40)
    start = time.monotonic()
    model = create_timm_model("resnet18", pretrained=True, num_classes=10)
    assert time.monotonic() - start < 5
    assert torch.equal(model.conv1.weight, weights["conv1.weight"]) and model.fc.out_features == 10
    assert constants.HF_HUB_OFFLINE is False  # offline only while loading


def test_torchvision_resnet18_for_one_channel_with_dropout():
    model, input_size = built(*model_and_finetune("torchvision", dropout=0.2), image_size=8)
    assert input_size == 8
    assert model.conv1.in_channels == 1 and model.conv1.kernel_size == (7, 7) and model.conv1.stride == (2, 2)
    assert isinstance(model.fc, nn.Sequential) and model.fc[0].p == 0.2 and model.fc[1].out_features == 10
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_torchvision_googlenet_is_raised_to_its_minimum_and_returns_plain_logits():
    model, input_size = built(*model_and_finetune("torchvision", name="googlenet"), image_size=8)
    assert input_size == 15  # torchvision's metadata: googlenet needs at least 15x15
    assert model.train()(torch.randn(2, 1, 15, 15)).shape == (2, 10)  # no auxiliary-logits tuple


def test_torchvision_unknown_name_suggests_close_names():
    with pytest.raises(ConfigError) as error:
        create_torchvision_model("resnet_18", in_channels=1, num_classes=10)
    assert error.value.key == "model.name" and "resnet18" in error.value.message


def test_a_stem_too_big_for_digits_raises_the_input_size_from_the_built_model():
    # convnext_atto: no minimum in timm's metadata, but a 4x4 stem and 2x2 downsampling (stride 32 in all).
    model, input_size = built(*model_and_finetune("timm", name="convnext_atto"), image_size=8)
    assert input_size == 32  # 8, 16 fail; doubled until it runs
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 10)
    _, input_size = built(*model_and_finetune("timm", name="convnext_atto", input_size=64), image_size=8)
    assert input_size == 64  # an explicit size that runs is kept


def test_the_size_probe_leaves_weights_statistics_modes_and_rng_alone():
    model = create_torchvision_model("resnet18", in_channels=1, num_classes=10)
    model.train()
    state = {key: value.clone() for key, value in model.state_dict().items()}
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    assert runs_on(model, 8) is None and runs_on(model, 0) is not None
    assert torch.equal(torch.rand(3), expected)
    assert model.training and all(module.training for module in model.modules())
    assert all(torch.equal(state[key], value) for key, value in model.state_dict().items())


@pytest.mark.parametrize("too_small", [8, 16])
def test_an_explicit_input_size_the_model_cannot_take_is_a_one_line_error(too_small):
    with pytest.raises(ConfigError) as error:
        built(*model_and_finetune("timm", name="convnext_atto", input_size=too_small), image_size=8)
    assert error.value.key == "finetune.input_size" and "\n" not in error.value.message
    assert f"does not run on {too_small}x{too_small}" in error.value.message
    assert "set finetune.input_size=null or a size it runs on, e.g. 32" in error.value.message


def test_input_size_follows_the_model_without_building_it():
    vit = OmegaConf.to_container(model_config("timm", name="vit_tiny_patch16_224"), resolve=True)
    assert resolve_input_size(vit, image_size=8) == 224  # fixed-size ViT: 224 whatever the data
    assert resolve_input_size(vit, image_size=8, input_size=224) == 224
    with pytest.raises(ConfigError, match=r"finetune\.input_size"):
        resolve_input_size(vit, image_size=8, input_size=32)
    resnet = OmegaConf.to_container(model_config("timm"), resolve=True)
    assert resolve_input_size(resnet, image_size=8) == 8
    assert resolve_input_size(resnet, image_size=8, input_size=64) == 64  # explicit override
    torchvision_vit = OmegaConf.to_container(model_config("torchvision", name="vit_b_16"), resolve=True)
    assert resolve_input_size(torchvision_vit, image_size=32) == 224
    inception = OmegaConf.to_container(model_config("torchvision", name="inception_v3"), resolve=True)
    assert resolve_input_size(inception, image_size=299) == 299  # only raised, never lowered
    with pytest.raises(ConfigError, match="at least 75"):
        resolve_input_size(inception, image_size=8, input_size=32)


# ---- fine-tuning them (trainkit.models.finetune and .pretrained on timm's and torchvision's models) ------------

RESNET_STAGES = ["conv1, bn1", "layer1", "layer2", "layer3", "layer4"]  # the stem, then the four layers


def test_a_frozen_timm_backbone_is_bit_identical_after_training_and_only_the_head_learns():
    torch.manual_seed(0)
    model, _ = built(*model_and_finetune("timm", freeze="backbone"), image_size=8)
    assert_only_the_head_learns(model)


def test_the_head_of_timm_and_torchvision_models():
    timm_model, _ = built(*model_and_finetune("timm"), image_size=8)
    assert head_parameters(timm_model) == set(timm_model.fc.parameters())
    torchvision_model, _ = built(*model_and_finetune("torchvision", dropout=0.2), image_size=8)
    assert head_parameters(torchvision_model) == set(torchvision_model.fc[1].parameters())  # last Linear, after dropout


def test_freezing_n_stages_of_a_timm_resnet():
    model, _ = built(*model_and_finetune("timm"), image_size=8)
    assert [name for name, _ in stages(model)] == RESNET_STAGES  # from timm's feature_info
    assert freeze(model, 2) == ["conv1", "bn1", "layer1"]  # the stem and the first stage, not conv1 and bn1 alone
    assert not any(p.requires_grad for p in model.layer1.parameters())
    assert all(
        p.requires_grad for name in ("layer2", "layer3", "layer4", "fc") for p in getattr(model, name).parameters()
    )
    assert model.frozen_batchnorm_names == ["bn1", "layer1.0.bn1", "layer1.0.bn2", "layer1.1.bn1", "layer1.1.bn2"]
    model.train()
    assert not model.layer1[0].bn1.training and model.layer2[0].bn1.training
    with pytest.raises(ConfigError) as error:
        freeze(model, 6)
    assert error.value.key == "finetune.freeze" and "5 stages" in error.value.message


def test_freezing_n_stages_of_a_torchvision_resnet():
    model, _ = built(*model_and_finetune("torchvision", freeze=3), image_size=8)
    assert [name for name, _ in stages(model)] == RESNET_STAGES
    frozen = {name.split(".")[0] for name, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"conv1", "bn1", "layer1", "layer2"}
    assert all(p.requires_grad for name in ("layer3", "layer4", "fc") for p in getattr(model, name).parameters())
    share = sum(p.numel() for p in model.parameters() if not p.requires_grad) / sum(
        p.numel() for p in model.parameters()
    )
    assert 0.05 < share < 0.2  # stem + layer1 + layer2 of resnet18: ~6% of the weights, not conv1 + bn1's 0.09%


def test_timm_stages_come_from_feature_info_with_the_stem_in_the_first():
    model, _ = built(*model_and_finetune("timm", name="convnext_atto", channels=3), image_size=32)
    assert [name for name, _ in stages(model)] == ["stem, stages.0", "stages.1", "stages.2", "stages.3"]
    assert freeze(model, 1) == ["stem", "stages.0"]


def test_vit_parameters_held_by_the_model_itself_freeze_with_the_backbone():
    model, _ = built(
        *model_and_finetune("timm", name="vit_tiny_patch16_224", channels=3, freeze="backbone"), image_size=8
    )
    assert not model.cls_token.requires_grad and not model.pos_embed.requires_grad
    assert {id(p) for p in model.parameters() if p.requires_grad} == {id(p) for p in model.head.parameters()}
    names = [name for name, _ in stages(model)]
    assert names[:2] == ["patch_embed, blocks.0", "blocks.1"] and len(names) == 12  # one block a stage
    assert model.cls_token in stages(model)[0][1]  # the model's own parameters go with the first stage


def test_another_number_of_classes_drops_the_head_with_a_log_line(tmp_path, caplog):
    torch.manual_seed(0)
    source, _ = built(*model_and_finetune("timm", num_classes=1000), image_size=8)
    path = saved(source, tmp_path / "imagenet.pt")
    with caplog.at_level(logging.INFO, logger="trainkit.models.pretrained"):
        model, _ = built(*model_and_finetune("timm", num_classes=5, pretrained_path=str(path)), image_size=8)
    assert "dropped the classifier head" in caplog.text and "fc.weight (1000, 512) -> (5, 512)" in caplog.text
    assert "missing 2 (fc.weight, fc.bias), unexpected 0" in caplog.text
    assert model.fc.out_features == 5
    for key, value in source.state_dict().items():
        if not key.startswith("fc."):
            assert torch.equal(model.state_dict()[key], value), key


def test_one_channel_model_from_three_channel_weights(tmp_path):
    source, _ = built(*model_and_finetune("timm", channels=3), image_size=8)
    path = saved(source, tmp_path / "rgb.pt")
    model, _ = built(*model_and_finetune("timm", channels=1, pretrained_path=str(path)), image_size=8)
    assert model.conv1.weight.shape[1] == 1
    assert torch.allclose(model.conv1.weight, source.conv1.weight.sum(dim=1, keepdim=True))
    assert torch.equal(model.layer4[1].conv2.weight, source.layer4[1].conv2.weight)
    # Grey image in: the same response as the RGB model given that grey in all three channels.
    grey = torch.rand(2, 1, 8, 8)
    model.eval(), source.eval()
    assert torch.allclose(model(grey), source(grey.expand(-1, 3, -1, -1)), atol=1e-5)


def test_missing_weights_file_is_a_config_error_saying_how_to_get_one(tmp_path):
    with pytest.raises(ConfigError) as error:
        built(*model_and_finetune("timm", pretrained_path=str(tmp_path / "nope.pt")), image_size=8)
    assert error.value.key == "finetune.pretrained_path"
    assert f"no file at '{tmp_path / 'nope.pt'}'" in error.value.message
    assert "pretrained=True" in error.value.message and "finetune.pretrained_path" in error.value.message


def test_a_timm_vit_keeps_its_tokens_and_position_embedding_undecayed():
    import timm

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, img_size=32, patch_size=8)
    decay, no_decay = param_groups(model, weight_decay=0.05)
    assert {id(model.cls_token), id(model.pos_embed)} <= {id(p) for p in no_decay["params"]}
    assert all(p.ndim >= 2 for p in decay["params"])
    assert any(p is model.patch_embed.proj.weight for p in decay["params"])


def test_a_model_name_close_to_none_still_suggests_names():
    names = ["resnet18", "resnet50", "convnext_tiny", *(f"x{i}" for i in range(40))]
    assert _did_you_mean("resnet19", names) == "; did you mean resnet18, resnet50?"
    line = _did_you_mean("nosuchmodel", names, "python -c '...'")
    assert (
        line
        == "; none of its 43 names is close (e.g. resnet18, resnet50, convnext_tiny); list them with python -c '...'"
    )
    assert _did_you_mean("nosuchmodel", ["fcn_resnet50", "lraspp_mobilenet_v3_large"]) == (
        "; choose one of fcn_resnet50, lraspp_mobilenet_v3_large"
    )
