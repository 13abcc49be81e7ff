"""The config tree (the config_tree row): groups first (with the option picked), every key shown, a plain-text copy
saved."""

import re
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from conftest import ROOT
from trainkit.tracking.config_tree import FILENAME, GROUPS, print_config_tree


@pytest.fixture
def cfg():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str((ROOT / "conf").resolve()), version_base=None):
        cfg = compose("config", overrides=["optimizer=adamw", "debug=fast"])
    GlobalHydra.instance().clear()
    return cfg


def as_hydra_job(overrides: list[str], **job_settings):
    """Compose as a Hydra job sees it: HydraConfig set (runtime.choices, and `job_settings` such as
    mode and job.num put into `hydra`), no `hydra` key in the config it yields."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str((ROOT / "conf").resolve()), version_base=None):
        full = compose("config", overrides=overrides, return_hydra_config=True)
    with open_dict(full):
        for key, value in job_settings.items():
            OmegaConf.update(full.hydra, key, value)
    HydraConfig.instance().set_config(full)
    with open_dict(full):
        del full["hydra"]
    yield full
    HydraConfig.instance().cfg = None
    GlobalHydra.instance().clear()


@pytest.fixture
def in_hydra_job():
    yield from as_hydra_job(["optimizer=adamw", "debug=fast"])


def branches(text: str) -> list:
    """The first-level labels of a printed tree."""
    return [m.group(1) for m in re.finditer(r"^[├└]── (.+?)\s*$", text, flags=re.M)]


def test_prints_every_group_first_then_the_rest_and_saves_the_same_text(cfg, tmp_path, capsys):
    print_config_tree(cfg, tmp_path)
    printed = capsys.readouterr().out
    saved = (tmp_path / FILENAME).read_text()
    labels = branches(saved)
    assert labels[: len(GROUPS)] == list(GROUPS)  # groups first, in the run's order
    sections = [key for key in cfg if OmegaConf.is_dict(cfg[key]) and key not in GROUPS]
    assert labels[len(GROUPS) :] == [*sections, "top level"]  # then the other sections, plain keys last
    assert "\x1b[" not in saved  # plain text, no colour codes
    for label in labels:
        assert label in printed
    for key in ("lr: 0.001", "limit_train_batches: 3", "optimized_metric: null", "seed: 0"):
        assert key in saved and key in printed
    assert printed.count("AdamW") == saved.count("AdamW") == 1


def test_labels_each_group_with_its_option_inside_a_hydra_job(in_hydra_job, tmp_path, capsys):
    print_config_tree(in_hydra_job, tmp_path / "tree.txt")
    saved = (tmp_path / "tree.txt").read_text()
    assert branches(saved)[:4] == ["data: digits", "task: classification", "model: cnn", "optimizer: adamw"]
    assert "logger: none" in branches(saved)
    assert saved.splitlines()[0] == "config  debug=fast"  # groups that override others, in the title
    assert "optimizer: adamw" in capsys.readouterr().out


def test_interpolations_are_shown_resolved(cfg, tmp_path, capsys):
    print_config_tree(cfg, tmp_path)
    assert "${" not in (tmp_path / FILENAME).read_text()
    # untouched: the interpolation is still there, unresolved (OmegaConf.resolve would replace it in place)
    assert OmegaConf.to_container(cfg.model, resolve=False)["num_classes"] == "${data.num_classes}"


def test_other_ranks_print_and_write_nothing(cfg, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    print_config_tree(cfg, tmp_path)
    assert capsys.readouterr().out == "" and not (tmp_path / FILENAME).exists()


@pytest.fixture(params=[3])
def in_multirun_job(request):
    """A job of a multirun: its number (default 3) and its overrides, as Hydra sets them."""
    overrides = ["optimizer.lr=0.03", "seed=2"]
    yield from as_hydra_job(overrides, **{"mode": "MULTIRUN", "job.num": request.param, "overrides.task": overrides})


def test_later_jobs_of_a_multirun_print_one_line_and_still_save_the_tree(in_multirun_job, tmp_path, capsys):
    print_config_tree(in_multirun_job, tmp_path)
    printed = capsys.readouterr().out
    assert printed.strip() == f"job 3: optimizer.lr=0.03 seed=2 (whole config: {tmp_path / FILENAME})"
    assert "lr: 0.03" in (tmp_path / FILENAME).read_text()


@pytest.mark.parametrize("in_multirun_job", [0], indirect=True)
def test_the_first_job_of_a_multirun_prints_the_whole_tree(in_multirun_job, tmp_path, capsys):
    print_config_tree(in_multirun_job, tmp_path)
    assert "lr: 0.03" in capsys.readouterr().out


def test_without_colour_the_tree_needs_no_syntax_highlighting_and_reads_the_same(cfg, tmp_path, capsys, monkeypatch):
    """A file, a log or a pipe shows no colour: the YAML goes in as plain text, not through pygments (its import
    and lexing were ~half of print_config_tree's time in a default run), and renders to the same characters."""
    import io

    from rich.console import Console

    from trainkit.tracking.config_tree import build_tree

    OmegaConf.update(cfg, "data.root", "/a/long/path/" * 12, force_add=True)  # wider than 80 columns: cropped

    def rendered(tree, **settings) -> str:
        text = io.StringIO()
        Console(file=text, color_system=None, **settings).print(tree)
        return text.getvalue()

    highlighted, plain = build_tree(cfg), build_tree(cfg, highlight=False)
    for settings in ({"width": 120, "soft_wrap": True}, {"width": 80}):  # the saved file's; a log's
        assert rendered(plain, **settings) == rendered(highlighted, **settings)
    monkeypatch.setitem(sys.modules, "rich.syntax", None)  # importing it now fails
    print_config_tree(cfg, tmp_path)  # capsys: stdout is no terminal
    assert capsys.readouterr().out == rendered(highlighted)


def test_a_run_prints_the_tree_and_saves_it_in_its_run_directory(run_train):
    run = run_train("debug=fast", "trainer.max_epochs=1", "trainer.progress_bar=false")
    saved = (run.run_dir / FILENAME).read_text()
    assert branches(saved)[:3] == ["data: digits", "task: classification", "model: cnn"]
    assert saved.splitlines()[0] == "config  debug=fast" and "optimizer: sgd" in run.stdout
