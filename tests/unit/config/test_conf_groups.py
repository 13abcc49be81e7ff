"""Config groups do what they say, whatever else is picked: precedence between the groups."""

import pytest

from conftest import ROOT, composed
from helpers import template_has


@pytest.mark.skipif(not template_has("experiment/stdlib_functions.yaml"), reason="no experiment of the core sets it")
@pytest.mark.parametrize("switch", ["regularization=none", "debug=overfit"])
def test_regularization_none_beats_the_experiments_weight_decay(switch):
    assert composed("experiment=stdlib_functions").optimizer.weight_decay == 0.01  # the experiment's own value
    cfg = composed("experiment=stdlib_functions", switch)
    assert cfg.optimizer.weight_decay == 0.0
    assert cfg.trainer.grad_clip is None
    assert cfg.regularization.label_smoothing == 0.0
    assert cfg.regularization.early_stopping.enabled is False


@pytest.mark.skipif(not template_has("experiment/finetune_imagefolder.yaml"), reason="trimmed from this clone")
def test_regularization_strong_sets_clipping_over_an_experiment():
    cfg = composed("experiment=finetune_imagefolder", "regularization=strong", "finetune.pretrained_path=w.pt")
    assert cfg.trainer.grad_clip == 1.0 and cfg.regularization.dropout == 0.3
    assert cfg.optimizer.weight_decay == 0.05  # strong leaves weight decay to the optimizer/experiment


def test_a_command_line_key_beats_every_group():
    cfg = composed("experiment=digits", "regularization=none", "optimizer.weight_decay=0.1")
    assert cfg.optimizer.weight_decay == 0.1


@pytest.mark.slow  # trains in this process (run_train)
def test_debug_overfit_trains_the_same_batches_until_the_loss_is_near_zero(run_train):
    run = run_train("debug=overfit", "trainer.max_epochs=30", "print_config=false")
    losses = [m["train/loss"] for m in run.epoch_metrics()]
    # The same 2 batches every epoch end near 0.005; 2 reshuffled batches an epoch end near 0.027.
    assert len(losses) == 30 and losses[-1] < 0.012 < 1.0 < losses[0]


def test_data_root_is_per_dataset_and_trainkit_data_sets_the_default_of_file_datasets(monkeypatch):
    """null for bundled or generated data, $TRAINKIT_DATA (else ./data) for the torchvision datasets,
    required (no default) for an image folder and a cache."""
    from omegaconf import OmegaConf

    kinds = {}  # data option -> bundled | required | environment
    for option in sorted(path.stem for path in (ROOT / "conf" / "data").glob("*.yaml")):
        data = composed(f"data={option}").data  # ${oc.env:...} is read when the key is read
        if "root" not in list(data.keys()):  # may be left out (README): the default, None (`in` says no for ???)
            kinds[option] = "bundled"
            continue
        if OmegaConf.is_missing(data, "root"):
            kinds[option] = "required"
            continue
        monkeypatch.delenv("TRAINKIT_DATA", raising=False)
        without_variable = data.root
        monkeypatch.setenv("TRAINKIT_DATA", "/datasets")
        if without_variable is None and data.root is None:
            kinds[option] = "bundled"
        else:
            assert (without_variable, data.root) == ("data", "/datasets"), option
            kinds[option] = "environment"
    assert kinds.get("imagefolder", "required") == "required"
    assert kinds["digits"] == kinds.get("synthetic", "bundled") == "bundled", kinds  # data=shapes: its config test
