"""The composed config validates, bad values name their key, and cli.one_line makes any config error one line."""
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import InstantiationException, MissingConfigException

from trainkit.cli import one_line
from trainkit.config import validate
from trainkit.errors import ConfigError

CONF = Path(__file__).parents[1] / "conf"


@pytest.fixture
def compose_config():
    """compose(overrides) against the real conf/, with Hydra's global state fresh for each test."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF.resolve()), version_base=None):
        yield lambda overrides=(): compose("config", overrides=list(overrides))
    GlobalHydra.instance().clear()


def test_default_config_validates(compose_config):
    cfg = compose_config()
    validate(cfg)
    assert cfg.data.name == "digits"  # the no-download default


def group_options() -> list[str]:
    return [
        f"{group.name}={option.stem}"
        for group in sorted(CONF.iterdir())
        if group.is_dir() and group.name != "hydra"
        for option in sorted(group.glob("*.yaml"))
    ]


@pytest.mark.parametrize("override", group_options())
def test_every_group_option_composes_and_validates(compose_config, override):
    validate(compose_config([override]))


@pytest.mark.parametrize(
    "override, key",
    [
        ("optimizer.lr=0", "optimizer.lr"),
        ("optimizer.lr=-1", "optimizer.lr"),
        ("optimizer.lr=abc", "optimizer.lr"),
        ("data.batch_size=0", "data.batch_size"),
        ("trainer.max_epochs=abc", "trainer.max_epochs"),
        ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches"),
        ("regularization.label_smoothing=1.5", "regularization.label_smoothing"),
        ("precision.name=fp8", "precision.name"),
        ("optimized_metric=foo", "optimized_metric"),
        ("data.mean=[0.1,0.2]", "data.mean"),
    ],
)
def test_bad_value_raises_config_error_naming_the_key(compose_config, override, key):
    cfg = compose_config([override])
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert error.value.key == key
    assert str(error.value).startswith(f"{key}: ")
    assert "\n" not in str(error.value)


def test_one_mean_per_channel_or_one_for_all_is_accepted(compose_config):
    validate(compose_config(["data.mean=[0.5]"]))
    validate(compose_config(["data=cifar10", "data.mean=[0.5]", "data.std=[0.25]"]))


def test_integer_keys_reject_floats(compose_config):
    with pytest.raises(ConfigError) as error:
        validate(compose_config(["data.batch_size=1.5"]))
    assert error.value.key == "data.batch_size"


# ---- cli.one_line -----------------------------------------------------------------------------

def test_unknown_group_option_is_one_line_listing_the_options(compose_config):
    with pytest.raises(MissingConfigException) as error:
        compose_config(["data=nope"])
    line = one_line(error.value)
    assert "\n" not in line
    assert line.startswith("data=nope: ")
    for option in (p.stem for p in (CONF / "data").glob("*.yaml")):
        assert option in line


def test_misspelt_key_is_one_line_with_a_suggestion(compose_config):
    with pytest.raises(Exception) as error:
        compose_config(["optimizer.lrr=0.1"])
    line = one_line(error.value)
    assert "\n" not in line
    assert line.startswith("optimizer.lrr: ")
    assert "did you mean optimizer.lr?" in line
    assert "+optimizer.lrr=" in line  # and how to add a key on purpose


def test_misspelt_top_level_key_suggests_the_real_one(compose_config):
    with pytest.raises(Exception) as error:
        compose_config(["sed=1"])
    line = one_line(error.value)
    assert "\n" not in line and "sed" in line and "did you mean seed?" in line


def test_config_error_wrapped_by_instantiation_exception_gives_its_own_text():
    config_error = ConfigError("model.name", "unknown model 'resnet9000'; choose one of cnn, timm, torchvision")
    try:
        try:
            raise config_error
        except ConfigError as cause:
            raise InstantiationException("Error in call to target 'trainkit.models.build':\nmore\ndetail") from cause
    except InstantiationException as wrapped:
        assert one_line(wrapped) == str(config_error)


def test_config_error_is_returned_as_is():
    assert one_line(ConfigError("optimizer.lr", "must be > 0, got 0")) == "optimizer.lr: must be > 0, got 0"


def test_any_other_multiline_error_is_flattened_to_one_line():
    try:
        try:
            raise ValueError("first line\n\n   second line")
        except ValueError as cause:
            raise RuntimeError("outer\nproblem") from cause
    except RuntimeError as error:
        line = one_line(error)
    assert "\n" not in line
    assert line == "outer problem first line second line"


def test_a_config_error_is_recognized_through_the_wrappers_around_it():
    from hydra.errors import InstantiationException

    from trainkit.errors import caused_by_config_error

    try:
        try:
            raise ConfigError("model.name", "no such model")
        except ConfigError as inner:
            raise InstantiationException("Error in call to target") from inner
    except InstantiationException as wrapped:
        assert caused_by_config_error(wrapped)
    assert not caused_by_config_error(RuntimeError("a bug"))
