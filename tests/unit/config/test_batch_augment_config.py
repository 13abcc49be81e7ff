"""The config check of augmentation=strong: the rules and relations trainkit.augment.batch_augment
declares beside its code, gathered because the augmentation section names it (`_checks_`), and applied to the ops
of every augmentation module the section names."""

import logging

import pytest

from conftest import composed
from trainkit.augment import batch_augment
from trainkit.config.rules import RULES
from trainkit.config.schema import find_problems
from trainkit.config.validation import RELATIONS, fill_task_defaults, ignored_keys, problems, validate
from trainkit.errors import ConfigError

STRONG = ["augmentation=strong", "data.mirror_changes_label=false"]  # its flips on digits are the core's to refuse

# (overrides, the key the error names): one per rule of the module
RULE_CASES = [
    ([*STRONG, "augmentation.color_jitter=15"], "augmentation.color_jitter"),
    ([*STRONG, "augmentation.color_jitter.brightness=-1"], "augmentation.color_jitter.brightness"),
    ([*STRONG, "augmentation.color_jitter.contrast=abc"], "augmentation.color_jitter.contrast"),
    ([*STRONG, "augmentation.color_jitter.saturation=-0.1"], "augmentation.color_jitter.saturation"),
    ([*STRONG, "augmentation.affine=15"], "augmentation.affine"),
    ([*STRONG, "augmentation.affine.degrees=90"], "augmentation.affine.degrees"),
    ([*STRONG, "augmentation.affine.translate=2"], "augmentation.affine.translate"),
    ([*STRONG, "augmentation.affine.scale=1.1"], "augmentation.affine.scale"),
    ([*STRONG, "augmentation.affine.scale=[1.1,0.9]"], "augmentation.affine.scale"),
    ([*STRONG, "augmentation.affine.shear=-1"], "augmentation.affine.shear"),
    ([*STRONG, "augmentation.random_order=yes"], "augmentation.random_order"),
    ([*STRONG, "augmentation.random_erasing=1.5"], "augmentation.random_erasing"),
]
# (overrides, the key the error names): one or more per relation of the module
RELATION_CASES = [
    ([*STRONG, "+augmentation.color_jitter.hue=0.1"], "augmentation.color_jitter.hue"),
    ([*STRONG, "+augmentation.affine.rotate=10"], "augmentation.affine.rotate"),
]
CASES = RULE_CASES + RELATION_CASES


@pytest.mark.parametrize("overrides, key", CASES, ids=[" ".join(o) for o, _ in CASES])
def test_each_mistake_is_one_config_error_naming_its_key_found_by_the_module_s_own_checks(overrides, key):
    cfg = composed(*overrides)
    fill_task_defaults(cfg)
    assert list(problems(cfg)) == [key]  # exactly this one: nothing reported twice or as a knock-on
    # nothing in trainkit.config finds it (its relations read the module's ops, which only its rules find bad)
    assert key not in find_problems(cfg, RULES, [] if key in batch_augment.CONFIG_RULES else RELATIONS)
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert str(error.value).startswith(f"{key}: ") and "\n" not in str(error.value)


def test_every_rule_and_relation_of_the_module_has_a_case_that_only_it_finds():
    assert set(batch_augment.CONFIG_RULES) <= {key for _, key in RULE_CASES}
    for overrides, key in RULE_CASES:
        assert key in find_problems(composed(*overrides), {key: batch_augment.CONFIG_RULES[key]}, [])
    configs = [(composed(*overrides), key) for overrides, key in RELATION_CASES]
    for cfg, _ in configs:
        fill_task_defaults(cfg)
    for relation in batch_augment.CONFIG_RELATIONS:
        assert any(key in find_problems(cfg, {}, [relation]) for cfg, key in configs), relation


@pytest.mark.parametrize(
    "overrides",
    [
        ["augmentation=strong", "data.mirror_changes_label=false"],
        # a missing key, or null, means off (random_order then has only colour jitter to order: off too)
        [
            "data.mirror_changes_label=false",
            "augmentation=strong",
            "augmentation.affine=null",
            "~augmentation.random_order",
        ],
        ["data.mirror_changes_label=false", "augmentation=strong", "augmentation.color_jitter.contrast=null"],
    ],
)
def test_a_mirror_safe_strong_and_keys_left_off_are_accepted(overrides):
    cfg = composed(*overrides)
    validate(cfg)
    assert ignored_keys(cfg) == []


def test_random_order_without_both_ops_to_order_is_one_warning(caplog):
    cfg = composed("data.mirror_changes_label=false", "augmentation=strong", "augmentation.affine=null")
    with caplog.at_level(logging.WARNING, logger="trainkit.config.validation"):
        validate(cfg)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert warnings == [
        "augmentation.random_order=true is ignored: it orders color_jitter and affine, and they are not both on"
    ]
