"""SpeedrunNet (model=speedrun): its size, and the checks it declares on its own arguments."""

import pytest
import torch

from conftest import composed
from trainkit.config.rules import RULES
from trainkit.config.schema import find_problems
from trainkit.config.validation import RELATIONS, fill_task_defaults, problems, validate
from trainkit.errors import ConfigError
from trainkit.models.speedrun_net import SpeedrunNet


def test_speedrun_net_has_about_two_million_parameters_and_takes_small_inputs():
    model = SpeedrunNet(in_channels=3, num_classes=10)
    assert 1.5e6 < sum(p.numel() for p in model.parameters()) < 3e6
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert SpeedrunNet(in_channels=1, num_classes=10, widths=(8, 16))(torch.randn(2, 1, 8, 8)).shape == (2, 10)


@pytest.mark.parametrize("key", ["model.stem_width", "model.logit_scale"])
def test_a_bad_speedrun_argument_is_one_config_error_from_the_check_it_declares(key):
    cfg = composed("model=speedrun", f"{key}=0")
    fill_task_defaults(cfg)
    assert key not in find_problems(cfg, RULES, RELATIONS)  # no check in trainkit.config finds it
    assert list(problems(cfg)) == [key]  # SpeedrunNet's own, gathered, and nothing else
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert str(error.value).startswith(f"{key}: ") and "\n" not in str(error.value)
