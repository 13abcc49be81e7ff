"""Models: the small CNN, timm and torchvision factories, input sizes, weight-decay groups.

timm and torchvision take seconds to import; Python imports them once for the whole file.
"""

import os
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from trainkit.errors import ConfigError
from trainkit.models.build import build_model, create_timm_model, create_torchvision_model
from trainkit.models.input_size import resolve_input_size, runs_on
from trainkit.models.small_cnn import SmallCNN

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # conftest sets it too; never reach for the hub
CONF = Path(__file__).resolve().parents[3] / "conf"


def model_config(group: str, channels: int = 1, image_size: int = 8, dropout: float = 0.0, **overrides):
    """conf/model/<group>.yaml inside a root config that its interpolations resolve against."""
    root = OmegaConf.create(
        {
            "data": {"channels": channels, "num_classes": 10, "image_size": image_size},
            "regularization": {"dropout": dropout},
            "model": OmegaConf.load(CONF / "model" / f"{group}.yaml"),
        }
    )
    for key, value in overrides.items():
        root.model[key] = value
    return root.model


FINETUNE_KEYS = ("pretrained_path", "freeze", "freeze_bn", "input_size")


def model_and_finetune(group: str, channels: int = 1, image_size: int = 8, dropout: float = 0.0, **overrides):
    """build_model's two nodes: conf/model/<group>.yaml with `overrides` of its keys, and conf/config.yaml's
    finetune section with `overrides` of its keys (pretrained_path, freeze, freeze_bn, input_size)."""
    finetune = OmegaConf.load(CONF / "config.yaml").finetune
    for key in FINETUNE_KEYS:
        if key in overrides:
            finetune[key] = overrides.pop(key)
    return model_config(group, channels, image_size, dropout, **overrides), finetune


@pytest.mark.parametrize(("channels", "size"), [(1, 8), (1, 28), (3, 32), (3, 1)])
def test_small_cnn_takes_digits_mnist_and_cifar_sizes(channels, size):
    model = SmallCNN(in_channels=channels, num_classes=10, widths=(8, 16, 32), dropout=0.25)
    assert model(torch.randn(4, channels, size, size)).shape == (4, 10)
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.25]


def test_build_model_from_the_cnn_config_uses_the_data_size():
    model, input_size = build_model(*model_and_finetune("cnn", dropout=0.1), image_size=8)
    assert isinstance(model, SmallCNN) and input_size == 8
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.1]
    model, input_size = build_model(*model_and_finetune("cnn", input_size=16), image_size=8)
    assert input_size == 16


def test_timm_resnet18_on_one_channel_8x8_images():
    model, input_size = build_model(*model_and_finetune("timm", dropout=0.1, drop_path_rate=0.05), image_size=8)
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


@pytest.fixture
def unreachable_hub(tmp_path, monkeypatch):
    """No HF_HUB_OFFLINE, an empty hub cache, and a hub address on this machine where nothing
    listens: what a laptop without network looks like to huggingface_hub, without touching one."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


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
    model, input_size = build_model(*model_and_finetune("torchvision", dropout=0.2), image_size=8)
    assert input_size == 8
    assert model.conv1.in_channels == 1 and model.conv1.kernel_size == (7, 7) and model.conv1.stride == (2, 2)
    assert isinstance(model.fc, nn.Sequential) and model.fc[0].p == 0.2 and model.fc[1].out_features == 10
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_torchvision_googlenet_is_raised_to_its_minimum_and_returns_plain_logits():
    model, input_size = build_model(*model_and_finetune("torchvision", name="googlenet"), image_size=8)
    assert input_size == 15  # torchvision's metadata: googlenet needs at least 15x15
    assert model.train()(torch.randn(2, 1, 15, 15)).shape == (2, 10)  # no auxiliary-logits tuple


def test_torchvision_unknown_name_suggests_close_names():
    with pytest.raises(ConfigError) as error:
        create_torchvision_model("resnet_18", in_channels=1, num_classes=10)
    assert error.value.key == "model.name" and "resnet18" in error.value.message


def test_a_stem_too_big_for_digits_raises_the_input_size_from_the_built_model():
    # convnext_atto: no minimum in timm's metadata, but a 4x4 stem and 2x2 downsampling (stride 32 in all).
    model, input_size = build_model(*model_and_finetune("timm", name="convnext_atto"), image_size=8)
    assert input_size == 32  # 8, 16 fail; doubled until it runs
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 10)
    _, input_size = build_model(*model_and_finetune("timm", name="convnext_atto", input_size=64), image_size=8)
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
        build_model(*model_and_finetune("timm", name="convnext_atto", input_size=too_small), image_size=8)
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


def test_a_model_name_close_to_none_still_suggests_names():
    from trainkit.models.build import _did_you_mean

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
