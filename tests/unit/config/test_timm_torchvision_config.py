"""The config check of model=timm, model=torchvision and experiment=finetune_imagefolder: what their factories
declare beside their code (trainkit.models.timm_torchvision), gathered as a model of yours would be."""

import pytest

from conftest import composed
from trainkit.config.validation import problems, validate
from trainkit.errors import ConfigError

FINETUNE = ["experiment=finetune_imagefolder", "data.root=/data/images"]
WEIGHTS_TWICE = ["model=timm", "model.pretrained=true", "finetune.pretrained_path=/weights/resnet18.pt"]


@pytest.fixture
def compose_config():
    return lambda overrides=(): composed(*overrides)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["model=timm", "model.name=3"], "model.name"),
        (["model=timm", "model.pretrained=yes"], "model.pretrained"),
        (["model=timm", "model.drop_path_rate=1"], "model.drop_path_rate"),
        (["model=torchvision", "model.name=3"], "model.name"),
        (
            ["model=timm", "model.pretrained=true", "finetune.pretrained_path=/weights/resnet18.pt"],
            "finetune.pretrained_path",
        ),
        (FINETUNE, "finetune.pretrained_path"),
    ],
    ids=" ".join,
)
def test_each_mistake_is_one_config_error_naming_its_key(compose_config, overrides, key):
    cfg = compose_config(overrides)
    assert list(problems(cfg)) == [key]
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert str(error.value).startswith(f"{key}: ") and "\n" not in str(error.value)


def test_the_finetune_experiment_says_how_to_pass_its_weights(compose_config):
    with pytest.raises(ConfigError) as error:
        validate(compose_config(FINETUNE))
    message = str(error.value)
    assert message.startswith("finetune.pretrained_path: is required; pass finetune.pretrained_path=...")
    assert "(or model.pretrained=true)" in message


def test_the_finetune_experiment_also_runs_on_timms_own_weights(compose_config):
    validate(compose_config([*FINETUNE, "model.pretrained=true"]))
