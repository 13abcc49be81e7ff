"""trainkit.config.declared: what a model or data option declares about its own arguments (config_rules,
config_problems, questions), read from the class `_target_` names without building it."""

from collections.abc import Iterator, Mapping
from typing import ClassVar

import torch
from omegaconf import OmegaConf

from conftest import composed
from models_for_tests import HalvingCNN, PixelCNN, RenamedWithoutItsCheck
from trainkit.config.declared import answer, arguments, declared, feature_checks
from trainkit.config.schema import find_problems, integer
from trainkit.config.validation import problems


class Heads(torch.nn.Module):
    """A model whose check reads two of its arguments and the data's section, as model=gpt's does."""

    config_rules: ClassVar[dict] = {"n_layer": integer(1), "n_head": integer(1), "n_embd": integer(1)}

    @staticmethod
    def config_problems(n_embd: int, n_head: int, block_size: int, data: Mapping) -> Iterator[tuple[str, str]]:
        if n_head > 0 and n_embd % n_head:
            yield "model.n_embd", f"is {n_embd}, not divisible by model.n_head={n_head}: each head takes an equal share"

    def __init__(self, n_embd: int, n_head: int, block_size: int, n_layer: int = 1):
        super().__init__()


def test_a_model_s_rules_go_under_its_group_and_its_check_reads_the_keys_it_names():
    rules, [relation] = declared({"model": Heads})
    assert set(rules) == {"model.n_layer", "model.n_head", "model.n_embd"}
    assert relation.reads == ("model._target_", "model.n_embd", "model.n_head", "model.block_size", "data")
    model = OmegaConf.create({"n_embd": 130, "n_head": 4, "block_size": 64})
    assert list(relation.check(OmegaConf.create({"model": model, "data": {"block_size": 64}}))) == [
        ("model.n_embd", "is 130, not divisible by model.n_head=4: each head takes an equal share")
    ]


def test_an_argument_the_option_leaves_out_is_the_owner_s_default():
    assert arguments(HalvingCNN, HalvingCNN.config_problems, OmegaConf.create({})) == {"widths": (16, 32)}
    assert answer(PixelCNN, "input_size_multiple", OmegaConf.create({"widths": [8, 16, 32, 64]})) == (None, 16)
    assert answer(PixelCNN, "no_such_question", OmegaConf.create({})) == (None, None)


def test_a_check_that_names_an_argument_its_model_does_not_take_is_refused_not_skipped():
    """An argument renamed without its check would otherwise have the check asked with a default: never run."""
    cfg = composed("model._target_=models_for_tests.RenamedWithoutItsCheck", "model.widths=[7,8]")
    assert problems(cfg) == {
        "model._target_": "RenamedWithoutItsCheck's config checks read widths, which RenamedWithoutItsCheck does "
        "not take; name them after its arguments (in_channels, num_classes, channels, dropout)"
    }
    _, [refusal] = declared({"model": RenamedWithoutItsCheck})
    assert refusal.reads == ("model._target_",)


def test_a_features_checks_are_gathered_from_the_module_its_section_names():
    """`_checks_` in a section (or {name: module} in a shared one) brings that module's CONFIG_RULES; a module
    that is gone (the feature deleted, its section kept) is one line naming the key."""
    cfg = OmegaConf.create({"sweep": {"switch": 2, "_checks_": {"switch": "models_for_tests"}}})
    rules, relations = feature_checks(cfg)
    assert set(rules) == {"sweep.switch"}
    assert find_problems(cfg, rules, relations) == {"sweep.switch": "must be true or false, got 2"}
    gone = OmegaConf.create({"ema": {"_checks_": "trainkit.no_such_feature"}})
    assert find_problems(gone, *feature_checks(gone)) == {
        "ema._checks_": "names 'trainkit.no_such_feature', which cannot be imported; remove the section of a "
        "feature you deleted"
    }
