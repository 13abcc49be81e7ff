"""The config check of augmentation=mixup, randaugment and trivialaugment: the rules and relations their
modules declare beside their code (trainkit.augment.mixing, trainkit.augment.sample_transforms), gathered
because the augmentation section names them (`_checks_`), and the core's checks of what an augmentation does
applied to their ops too."""

import logging

import pytest

from conftest import composed
from helpers import template_has
from trainkit.config.rules import RULES
from trainkit.config.schema import find_problems
from trainkit.config.validation import RELATIONS, fill_task_defaults, ignored_keys, problems, validate
from trainkit.errors import ConfigError

IMAGES = ["data=imagefolder", "data.root=/data/images"]
RANDAUGMENT = [*IMAGES, "augmentation=randaugment"]

# (overrides, the key the error names): each found by the recipes' own checks, none by the core's alone.
CASES = [
    (["augmentation=mixup", "augmentation.mixup_alpha=-1"], "augmentation.mixup_alpha"),
    (["augmentation=mixup", "augmentation.cutmix_alpha=lots"], "augmentation.cutmix_alpha"),
    ([*RANDAUGMENT, "augmentation.per_sample=crop"], "augmentation.per_sample"),
    (
        [*RANDAUGMENT, "augmentation.per_sample.random_resized_crop=[1.0,0.5]"],
        "augmentation.per_sample.random_resized_crop",
    ),
    ([*RANDAUGMENT, "augmentation.per_sample.horizontal_flip=2"], "augmentation.per_sample.horizontal_flip"),
    ([*RANDAUGMENT, "augmentation.per_sample.policy=autoaugment"], "augmentation.per_sample.policy"),
    ([*RANDAUGMENT, "augmentation.per_sample.num_ops=0"], "augmentation.per_sample.num_ops"),
    ([*RANDAUGMENT, "augmentation.per_sample.magnitude=31"], "augmentation.per_sample.magnitude"),
    ([*RANDAUGMENT, "+augmentation.per_sample.erase=0.2"], "augmentation.per_sample.erase"),
    (
        [*IMAGES, "data.mirror_changes_label=true", "augmentation=trivialaugment"],
        "augmentation.per_sample.horizontal_flip",
    ),
    (["augmentation=randaugment", "augmentation.per_sample.horizontal_flip=false"], "augmentation.per_sample"),
    (["task._target_=tasks_for_tests.Regression", "augmentation=mixup"], "augmentation.mixup_alpha"),
]


@pytest.mark.parametrize("overrides, key", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_each_mistake_is_one_config_error_naming_its_key_found_by_the_recipes_own_checks(overrides, key):
    cfg = composed(*overrides)
    fill_task_defaults(cfg)
    assert list(problems(cfg)) == [key]
    assert key not in find_problems(cfg, RULES, RELATIONS)  # nothing in trainkit.config finds it
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert str(error.value).startswith(f"{key}: ") and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["augmentation=mixup", "+augmentation.per_sample={policy: rand_augment}"], "unknown key"),  # not its key
        pytest.param(
            ["experiment=stdlib_functions", "augmentation=mixup"],
            "crop_padding, mixup_alpha, cutmix_alpha transform",
            marks=pytest.mark.skipif(not template_has("experiment/stdlib_functions.yaml"), reason="no text (trimmed)"),
        ),
        (
            ["task._target_=tasks_for_tests.PixelClasses", "augmentation=mixup", "augmentation.crop_padding=null"],
            "moves or mixes the image without its targets",  # a target per pixel, as a segmentation has
        ),
    ],
)
def test_the_core_checks_of_an_augmentation_see_the_recipes_ops(overrides, message):
    """Image ops on text, ops that move the image alone under a mask, keys of a feature the section does not
    name: the core's checks, applied to the ops the recipes' modules say they switch on."""
    found = problems(composed(*overrides))
    assert any(message in text for text in found.values()), found


def test_randaugment_s_strength_under_another_policy_is_one_warning(caplog):
    cfg = composed(*IMAGES, "augmentation=trivialaugment", "+augmentation.per_sample.magnitude=9")
    with caplog.at_level(logging.WARNING, logger="trainkit.config.validation"):
        validate(cfg)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("augmentation.per_sample.magnitude=9 is ignored"), warnings
    assert ignored_keys(composed(*RANDAUGMENT)) == []


def test_an_older_checkpoint_s_mixing_config_names_the_recipes_checks_and_its_task_no_longer_takes_it():
    from trainkit.checkpointing.files import upgrade_config

    config = {
        "task": {"_target_": "trainkit.tasks.classification.Classification", "num_classes": 10, "mixup_alpha": 0.8},
        "augmentation": {"name": "mixup", "mixup_alpha": 0.8, "cutmix_alpha": 1.0, "per_sample": None},
    }
    upgrade_config(config)
    assert "mixup_alpha" not in config["task"]
    assert config["augmentation"]["_checks_"] == {
        "mixing": "trainkit.augment.mixing",
        "sample_transforms": "trainkit.augment.sample_transforms",
    }
