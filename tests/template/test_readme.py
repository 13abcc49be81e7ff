"""The README is a map, not a reference: short, and with no copy of the config's defaults to go
stale. What a key means is said once, by a comment beside it in its yaml file (`python train.py
--cfg job` shows the values); these tests check that the keys people type every day have one.
"""

import re
from pathlib import Path

import pytest

from conftest import ROOT

README = ROOT / "README.md"
CONF = ROOT / "conf"
MAX_README_LINES = 400

# The keys people type every day (the public contract), and the others the README used to tabulate.
KEYS = (
    "seed",
    "device",
    "resume",
    "optimized_metric",
    "trainer.max_epochs",
    "trainer.max_steps",
    "trainer.accumulate_grad_batches",
    "trainer.grad_clip",
    "trainer.log_every_n_steps",
    "trainer.checkpoint_every_n_steps",
    "trainer.limit_train_batches",
    "trainer.limit_val_batches",
    "trainer.channels_last",
    "trainer.compile",
    "trainer.cudnn_benchmark",
    "trainer.progress_bar",
    "optimizer.lr",
    "optimizer.weight_decay",
    "optimizer.fused",
    "precision.tf32",
    "scheduler.warmup_epochs",
    "regularization.label_smoothing",
    "regularization.dropout",
    "regularization.early_stopping.enabled",
    "regularization.early_stopping.monitor",
    "regularization.early_stopping.mode",
    "regularization.early_stopping.patience",
    "regularization.early_stopping.min_delta",
    "distributed.nproc_per_node",
    "logger.trackers",
    "logger.mode",
)
# The data options' keys are described once, in docs/data.md's table (each option sets its own values).
DATA_KEYS = ("data.batch_size", "data.eval_batch_size", "data.num_workers", "data.root", "data.download",
             "data.mirror_changes_label", "data.shuffle")  # fmt: skip
IMAGE_KEYS = ("data.mirror_changes_label",)  # keys of image options alone (those with `channels`; ImageData's)


def commented_keys(path: Path) -> dict[str, bool]:
    """{dotted key: whether a comment explains it} for every key a yaml file sets: a comment on the
    key's line, or a line of comment right above it. A `# @package _global_` file's keys are
    absolute; the others' are inside their group (conf/optimizer/sgd.yaml's `lr` is optimizer.lr)."""
    text = path.read_text(encoding="utf-8")
    group = path.parent.name
    prefix = [] if path.parent == CONF or "# @package _global_" in text else [group]
    found, parents, comment_above = {}, [], False
    for line in text.splitlines():
        match = re.match(r"^(\s*)([\w.]+):(.*)$", line)
        if not match:
            comment_above = line.strip().startswith("#")
            continue
        indent, key, rest = len(match.group(1)), match.group(2), match.group(3)
        parents = [(level, name) for level, name in parents if level < indent]
        dotted = ".".join([*prefix, *(name for _, name in parents), key])
        found[dotted] = "#" in rest or comment_above
        parents.append((indent, key))
        comment_above = False
    return found


def homes(key: str) -> list[Path]:
    """The yaml files where a key lives: conf/config.yaml for top-level keys and sections (a feature's own
    section inside a group, as regularization.ema, too), and the options of its group (experiments, sweeps and
    debug presets override keys, they are not their home)."""
    options = sorted((CONF / key.split(".")[0]).glob("*.yaml"))
    in_config = key in commented_keys(CONF / "config.yaml")
    return [*options, CONF / "config.yaml"] if in_config or not options else options


def test_the_readme_is_a_map_of_at_most_400_lines():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move reference material to docs/"


def test_the_readme_says_how_to_see_every_key_and_its_default():
    text = README.read_text(encoding="utf-8")
    assert "python train.py --cfg job" in text and "conf/config.yaml" in text


@pytest.mark.parametrize("key", KEYS)
def test_every_everyday_key_is_explained_by_a_comment_in_its_yaml(key):
    if not any(key in commented_keys(path) for path in CONF.rglob("*.yaml")):
        # A deleted feature's key (logger.mode goes with wandb): skipped, and said, not failed.
        pytest.skip(f"{key}: no option in conf/ sets it: its feature was deleted")
    files = {path: commented_keys(path) for path in homes(key)}
    setting = [path for path, keys in files.items() if key in keys]
    assert setting, f"{key} is set in none of {[str(path.relative_to(ROOT)) for path in files]}"
    assert any(files[path][key] for path in setting), f"{key}: explain it in a comment in one of {setting}"


def test_the_data_keys_are_described_in_docs_data():
    table = (ROOT / "docs" / "data.md").read_text(encoding="utf-8").split("## The data keys", 1)[1]
    for key in DATA_KEYS:
        assert f"| `{key}` |" in table, key
        if key.split(".", 1)[1] in optional_data_keys():
            continue  # the README: an option may leave it out (Data's default)
        options = [path for path in homes(key) if key not in IMAGE_KEYS or "\nchannels:" in path.read_text()]
        assert all(key in commented_keys(path) for path in options), f"a data option lacks {key}"


def optional_data_keys() -> set[str]:
    """The keys every data option has that its yaml may leave out: the fields of trainkit.data.Data with a default."""
    import dataclasses

    from trainkit.data import Data

    return {field.name for field in dataclasses.fields(Data) if field.default is not dataclasses.MISSING}
