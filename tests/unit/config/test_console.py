"""The config printed as YAML at the start of a run: what a clone that dropped the config tree (docs/features.md's
config_tree row) prints."""

import pytest
from omegaconf import OmegaConf

from conftest import composed
from trainkit.config.printing import print_config


@pytest.fixture
def cfg():
    return composed("optimizer=adamw", "debug=fast")


def test_interpolations_are_shown_resolved(cfg, tmp_path, capsys):
    print_config(cfg, tmp_path)
    printed = capsys.readouterr().out
    assert "${" not in printed and "limit_train_batches: 3" in printed and "lr: 0.001" in printed
    assert list(tmp_path.iterdir()) == []  # the YAML is printed, not saved
    # untouched: the interpolation is still there, unresolved (OmegaConf.resolve would replace it in place)
    assert OmegaConf.to_container(cfg.model, resolve=False)["num_classes"] == "${data.num_classes}"


def test_other_ranks_print_nothing(cfg, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    print_config(cfg)
    assert capsys.readouterr().out == ""
