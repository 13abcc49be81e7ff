"""The README's "Keys you will type every day" table states the defaults the config files have.

Each row's default cell is one of:
- a value (`0.1`, `null`, `true`, `val/acc`): the key's value in the default composition;
- values per option of the key's group, `64 (digits, imagefolder), 128 (mnist, ...)`: every
  option of the group must be listed once, and composing `group=option` gives that value;
- `key=value, ...` for a row `prefix.*`: each `prefix.key` in the default composition;
- `` `$VAR`, else value ``: the value when the environment variable is unset, in every option
  of the group that has the key.
A row that fits none of these gets a test of its own (`data.root`: `per dataset`), named in OWN_TEST.
"""

import re

import pytest
from omegaconf import OmegaConf

from conftest import ROOT, composed

README = ROOT / "README.md"
CONF = ROOT / "conf"
TITLE = "### Keys you will type every day"

OWN_TEST = {"data.root": "test_data_root_is_per_dataset_and_trainkit_data_sets_the_default_of_file_datasets"}


def table_rows() -> list[tuple[list[str], str]]:
    """(keys, default cell) of every row of the table under TITLE."""
    text = README.read_text(encoding="utf-8")
    assert TITLE in text, f"README.md has no '{TITLE}' section"
    lines = text.split(TITLE, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2 :]:  # after the header and the |---| line
        if not line.startswith("|"):
            break
        key_cell, default_cell = [cell.strip() for cell in line.strip().strip("|").split("|")][:2]
        rows.append((re.findall(r"`([^`]+)`", key_cell), default_cell))
    return rows


def parse_value(text: str):
    text = text.strip().strip("`")
    if text in ("null", "true", "false"):
        return {"null": None, "true": True, "false": False}[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def per_option(cell: str) -> list[tuple[str, list[str]]] | None:
    """`64 (digits, imagefolder), 128 (mnist)` -> [("64", ["digits", "imagefolder"]), ("128", ["mnist"])];
    None when the cell is not entirely of that form."""
    pairs = re.findall(r"\s*([^,()]+?)\s*\(([^)]*)\)\s*(?:,|$)", cell)
    rebuilt = ", ".join(f"{value} ({options})" for value, options in pairs)
    if not pairs or re.sub(r"\s", "", rebuilt) != re.sub(r"\s", "", cell):
        return None
    return [(value, [option.strip().strip("`") for option in options.split(",")]) for value, options in pairs]


def options_of(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


@pytest.fixture(scope="module")
def compose_config():
    return composed  # conftest's: each set of overrides composed once a session, a copy each call


def select(cfg, key: str):
    assert OmegaConf.select(cfg, key, default="<missing>") != "<missing>", f"README names {key}, which the config lacks"
    return OmegaConf.select(cfg, key)


ROWS = table_rows()


def test_the_table_is_there_and_names_the_keys_people_type_every_day():
    keys = {key for row_keys, _ in ROWS for key in row_keys}
    for key in (
        "seed",
        "trainer.max_epochs",
        "trainer.max_steps",
        "trainer.accumulate_grad_batches",
        "trainer.grad_clip",
        "data.batch_size",
        "data.num_workers",
        "data.root",
        "optimizer.lr",
        "optimizer.weight_decay",
        "regularization.label_smoothing",
        "distributed.nproc_per_node",
        "logger.mode",
        "resume",
        "optimized_metric",
    ):
        assert key in keys, key


@pytest.mark.parametrize("keys, cell", ROWS, ids=[", ".join(keys) for keys, _ in ROWS])
def test_readme_default_matches_the_config(compose_config, monkeypatch, keys, cell):
    if keys[0] in OWN_TEST:
        assert OWN_TEST[keys[0]] in globals(), OWN_TEST[keys[0]]
        return
    group = keys[0].split(".")[0]
    env_default = re.fullmatch(r"`\$(\w+)`, else (.+)", cell)
    pairs = per_option(cell)
    for key in keys:
        if key.endswith(".*"):  # enabled=true, monitor=val/loss, ...
            cfg = compose_config()
            for item in cell.split(","):
                name, _, value = item.strip().partition("=")
                assert select(cfg, f"{key[:-2]}.{name}") == parse_value(value), f"{key[:-2]}.{name}"
        elif env_default:
            variable, value = env_default.groups()
            monkeypatch.delenv(variable, raising=False)
            having = [
                option
                for option in options_of(group)
                if OmegaConf.select(compose_config(f"{group}={option}"), key, default="<missing>") != "<missing>"
            ]
            assert having, key
            for option in having:
                assert select(compose_config(f"{group}={option}"), key) == parse_value(value), (key, option)
                monkeypatch.setenv(variable, "online")
                assert select(compose_config(f"{group}={option}"), key) == "online", (key, option)
                monkeypatch.delenv(variable)
        elif pairs:
            listed = [option for _, options in pairs for option in options]
            assert sorted(listed) == options_of(group), f"{key}: list every option of {group} once, got {listed}"
            for value, options in pairs:
                for option in options:
                    assert select(compose_config(f"{group}={option}"), key) == parse_value(value), (key, option)
        else:
            assert select(compose_config(), key) == parse_value(cell), key


def test_data_root_is_per_dataset_and_trainkit_data_sets_the_default_of_file_datasets(compose_config, monkeypatch):
    """The README's row: `per dataset`, where MNIST/CIFAR-10 files or your image folder live, with
    TRAINKIT_DATA setting the default: null for bundled or generated data, $TRAINKIT_DATA (else ./data)
    for the torchvision datasets, required (no default) for an image folder and a cache."""
    (cell,) = [cell for keys, cell in ROWS if keys == ["data.root"]]
    assert cell == "per dataset"
    kinds = {}  # data option -> bundled | required | environment
    for option in options_of("data"):
        data = compose_config(f"data={option}").data  # ${oc.env:...} is read when the key is read
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
    assert kinds["mnist"] == kinds["cifar10"] == "environment" and kinds["imagefolder"] == "required", kinds
