"""CONTRIBUTING.md's "Add a model" and the README's "Add your own dataset" recipes, followed exactly
as written on a copy of the repository.

The recipe's files are the code blocks whose first line is `# file: <path>`; its command is the
`python train.py ...` line of its bash block. Edit the recipe and this test checks the new text.
"""

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
FENCED_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FILE_MARKER = re.compile(r"#\s*file:\s*(\S+)")
# Handled by trainkit.models.build.build_model itself, not passed to the model's _target_.
SHARED_MODEL_KEYS = ("input_size", "pretrained_path", "freeze", "freeze_bn")


def section(markdown: str, title: str) -> str:
    """The text under the heading `## <title>`, up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", markdown, re.MULTILINE | re.DOTALL)
    assert match, f"no '## {title}' section"
    return match.group(1)


def recipe(title: str, document: str = "CONTRIBUTING.md") -> tuple[dict[str, str], list[list[str]]]:
    """The files ({path: text}) and the shell commands (argument lists) of a section of `document`."""
    files, commands = {}, []
    for language, body in FENCED_BLOCK.findall(section((ROOT / document).read_text(), title)):
        marker = FILE_MARKER.fullmatch(body.splitlines()[0].strip()) if body.strip() else None
        if marker:
            assert marker.group(1) not in files, f"two blocks write {marker.group(1)}"
            files[marker.group(1)] = body
        elif language == "bash":
            commands += [shlex.split(line, comments=True) for line in body.splitlines()]
    return files, [command for command in commands if command]


def copy_repository(destination: Path) -> None:
    """The files git tracks (and new ones it doesn't ignore), as in a fresh clone with your edits."""
    try:
        git = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        listed = subprocess.run(git, cwd=ROOT, capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything but outputs and caches
        shutil.copytree(ROOT, destination, ignore=_outputs_and_caches)
        return
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, destination / name)


def _outputs_and_caches(folder: str, names: list[str]) -> set[str]:
    skipped = {name for name in names if name == "__pycache__" or name.endswith((".egg-info", "_cache"))}
    if Path(folder) == ROOT:
        skipped |= {".git", ".venv", "outputs", "multirun", "wandb", "data"} & set(names)
    return skipped


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"recipe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_add_a_model_recipe_trains_the_new_model(tmp_path):
    files, commands = recipe("Add a model")
    assert any(path.endswith(".py") for path in files), "the recipe writes no Python file"
    assert any(path.startswith("conf/model/") for path in files), "the recipe writes no conf/model/ yaml"
    train_commands = [command for command in commands if command[:2] == ["python", "train.py"]]
    assert len(train_commands) == 1, f"expected one `python train.py ...` line in the recipe, got {commands}"

    repo = tmp_path / "repo"
    copy_repository(repo)
    for path, text in files.items():
        assert not (repo / path).exists(), f"{path} already exists: the recipe would not be adding it"
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)

    # The copy's src/ first: train.py must import the copy's trainkit, where the recipe put the model.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo / "src"), os.environ.get("PYTHONPATH")]))}
    run_dir = tmp_path / "run"
    command = [sys.executable, *train_commands[0][1:], f"hydra.run.dir={run_dir}"]
    process = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, f"{shlex.join(train_commands[0])} failed:\n{process.stderr[-4000:]}"
    assert "test" in json.loads((run_dir / "summary.json").read_text())

    # The checkpoint holds the recipe's class, built with the yaml's arguments: same keys, same shapes.
    model_config = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True)["model"]
    module_name, class_name = model_config.pop("_target_").rsplit(".", 1)
    model_file = "src/" + module_name.replace(".", "/") + ".py"
    assert model_file in files, f"model._target_ points to {model_file}, which the recipe does not write"
    for key in SHARED_MODEL_KEYS:
        model_config.pop(key, None)
    expected = getattr(load_module(repo / model_file), class_name)(**model_config).state_dict()
    trained = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["model"]
    assert {key: value.shape for key, value in trained.items()} == {key: value.shape for key, value in expected.items()}


def test_add_a_model_recipe_passes_lint_and_format():
    pytest.importorskip("ruff")
    files, _ = recipe("Add a model")
    for path, text in files.items():
        if path.endswith(".py"):
            for check in (["check"], ["format", "--check"]):
                process = subprocess.run(
                    [sys.executable, "-m", "ruff", *check, "--stdin-filename", path, "-"],
                    cwd=ROOT,
                    input=text,
                    capture_output=True,
                    text=True,
                )
                assert process.returncode == 0, f"ruff {' '.join(check)} on {path}:\n{process.stdout}{process.stderr}"


def test_add_your_own_dataset_recipe_of_the_readme_trains_on_the_new_data(tmp_path):
    files, commands = recipe("Add your own dataset", "README.md")
    assert any(path.endswith(".py") for path in files), "the recipe writes no Python file"
    assert any(path.startswith("conf/data/") for path in files), "the recipe writes no conf/data/ yaml"
    train_commands = [command for command in commands if command[:2] == ["python", "train.py"]]
    assert len(train_commands) == 1, f"expected one `python train.py ...` line in the recipe, got {commands}"

    repo = tmp_path / "repo"
    copy_repository(repo)
    for path, text in files.items():  # new files only: no registry, data/__init__.py or train.py edited
        assert not (repo / path).exists(), f"{path} already exists: the recipe would not be adding it"
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo / "src"), os.environ.get("PYTHONPATH")]))}
    run_dir = tmp_path / "run"
    command = [sys.executable, *train_commands[0][1:], f"hydra.run.dir={run_dir}"]
    process = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, f"{shlex.join(train_commands[0])} failed:\n{process.stderr[-4000:]}"
    assert "test" in json.loads((run_dir / "summary.json").read_text())

    # The run loaded the recipe's function, and the model saw its shapes (channels and classes).
    data_config = OmegaConf.load(run_dir / ".hydra" / "config.yaml").data
    module_name = data_config._target_.rsplit(".", 1)[0]
    assert "src/" + module_name.replace(".", "/") + ".py" in files, f"data._target_ is {data_config._target_}"
    trained = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["model"]
    first_conv, head = trained["features.0.weight"], trained["head.3.weight"]
    assert (first_conv.shape[1], head.shape[0]) == (data_config.channels, data_config.num_classes)
