"""The config check of data=synthetic: the rules Synthetic declares beside its code (`config_rules`: sample counts
and noise, which trainkit.config does not name), the class count it needs, the flips its random
prototypes allow and the workers in-memory data ignores. A file of the synthetic row of
docs/features.md."""

import logging

import pytest

from conftest import composed
from helpers import assert_one_config_error
from trainkit.config.rules import RULES
from trainkit.config.schema import find_problems
from trainkit.config.validation import RELATIONS, fill_task_defaults, ignored_keys, problems, validate

SYNTHETIC = "data=synthetic"

DECLARED = [  # Synthetic.config_rules
    ([SYNTHETIC, "data.num_samples=0"], "data.num_samples"),
    ([SYNTHETIC, "data.val_samples=0"], "data.val_samples"),
    ([SYNTHETIC, "data.test_samples=-5"], "data.test_samples"),
    ([SYNTHETIC, "data.noise=-1"], "data.noise"),
]
CASES = [
    *DECLARED,
    ([SYNTHETIC, "data.num_classes=null"], "data.num_classes"),  # it generates its classes: it needs their number
]


@pytest.mark.parametrize("overrides, key", CASES, ids=[" ".join(overrides) for overrides, _ in CASES])
def test_each_mistake_is_one_config_error_naming_its_key(overrides, key):
    assert_one_config_error(overrides, key)


@pytest.mark.parametrize("overrides, key", DECLARED, ids=[" ".join(overrides) for overrides, _ in DECLARED])
def test_the_sample_counts_and_noise_are_checked_beside_the_class_not_in_trainkit_config(overrides, key):
    cfg = composed(*overrides)
    fill_task_defaults(cfg)
    assert key not in RULES and key not in find_problems(cfg, RULES, RELATIONS)
    assert key in problems(cfg)


def test_the_messages_say_what_is_wrong_and_how_to_fix_it():
    assert problems(composed(SYNTHETIC, "data.num_samples=0")) == {
        "data.num_samples": "must be a whole number >= 1, got 0"
    }


def test_flips_are_allowed_on_random_prototypes():
    validate(composed(SYNTHETIC, "augmentation=basic"))


def test_workers_are_ignored_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="trainkit.config.validation"):
        validate(composed(SYNTHETIC, "data.num_workers=2"))
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("data.num_workers=2 is ignored"), warnings
    assert ignored_keys(composed(SYNTHETIC)) == []
