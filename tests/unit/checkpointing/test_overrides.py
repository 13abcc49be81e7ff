"""A checkpoint's config with the command line's overrides on top (resume and eval.py take it so)."""

import pytest

from conftest import composed
from trainkit.checkpointing.overrides import config_with_overrides
from trainkit.config import to_dict
from trainkit.errors import ConfigError

ON_TOP = "on top of a checkpoint's config"


def test_the_keys_and_groups_the_command_line_sets_replace_the_saved_ones():
    saved = to_dict(composed("trainer.max_epochs=3", "optimizer.lr=0.5", "data.batch_size=48"))
    overrides = ["optimizer=adamw", "data.channels=3", "trainer.channels_last=true", "~seed"]
    cfg = config_with_overrides(saved, composed(*overrides), overrides, when=ON_TOP)
    assert (cfg.optimizer._target_, cfg.optimizer.lr) == ("torch.optim.AdamW", 1e-3)  # the group, replaced
    assert "momentum" not in cfg.optimizer  # sgd's key went with the section it replaced
    assert (cfg.data.channels, cfg.data.batch_size) == (3, 48)
    assert cfg.trainer.channels_last and cfg.trainer.max_epochs == 3 and "seed" not in cfg
    assert cfg.model.in_channels == 3 and cfg.model.num_classes == 10  # linked to data.*, as the config links them


def test_what_the_command_line_does_not_set_stays_as_saved_and_new_keys_take_their_defaults():
    saved = to_dict(composed("data.batch_size=48"))  # e.g. what the batch-size finder chose
    del saved["trainer"]["channels_last"]  # a key the code added after the checkpoint was written
    cfg = config_with_overrides(saved, composed("optimizer.lr=0.5"), ["optimizer.lr=0.5"])
    assert (cfg.data.batch_size, cfg.optimizer.lr, cfg.trainer.channels_last) == (48, 0.5, False)


def test_a_global_group_is_refused_in_one_line_that_says_when():
    saved = to_dict(composed())
    with pytest.raises(ConfigError, match=rf"^experiment: {ON_TOP}, give the keys to change one by one"):
        config_with_overrides(saved, composed("experiment=digits"), ["experiment=digits"], when=ON_TOP)
