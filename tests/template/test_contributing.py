"""The README's recipes, "Add your own model", "Add your own dataset" and "Add your own task",
followed exactly as written on a copy of the repository.

A recipe's files are the code blocks whose first line is `# file: <path>`; its command is the
`python train.py ...` line of its bash blocks (a line may continue after a trailing backslash).
Edit a recipe and these tests check the new text.
"""

import importlib.util
import json
import math
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
RECIPES = ("Add your own model", "Add your own dataset", "Add your own task")


def section(markdown: str, title: str) -> str:
    """The text under the heading `## <title>`, up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", markdown, re.MULTILINE | re.DOTALL)
    assert match, f"no '## {title}' section"
    return match.group(1)


def recipe(title: str, document: str = "README.md") -> tuple[dict[str, str], list[list[str]]]:
    """The files ({path: text}) and the shell commands (argument lists) of a section of `document`."""
    files, commands = {}, []
    for language, body in FENCED_BLOCK.findall(section((ROOT / document).read_text(), title)):
        marker = FILE_MARKER.fullmatch(body.splitlines()[0].strip()) if body.strip() else None
        if marker:
            assert marker.group(1) not in files, f"two blocks write {marker.group(1)}"
            files[marker.group(1)] = body
        elif language == "bash":
            lines = body.replace("\\\n", " ").splitlines()  # a command continued over several lines is one
            commands += [shlex.split(line, comments=True) for line in lines]
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


def follow(title: str, config_group: str, tmp_path: Path, timeout: int = 300) -> tuple[dict[str, str], Path, Path]:
    """Write the recipe's files into a copy of the repository and run its one `python train.py`
    line there; the recipe's files, the copy and the run directory."""
    files, commands = recipe(title)
    assert any(path.endswith(".py") for path in files), "the recipe writes no Python file"
    assert any(path.startswith(f"conf/{config_group}/") for path in files), f"no conf/{config_group}/ yaml"
    train_commands = [command for command in commands if command[:2] == ["python", "train.py"]]
    assert len(train_commands) == 1, f"expected one `python train.py ...` line in the recipe, got {commands}"

    repo = tmp_path / "repo"
    copy_repository(repo)
    for path, text in files.items():  # new files only: no registry, __init__.py or train.py edited
        assert not (repo / path).exists(), f"{path} already exists: the recipe would not be adding it"
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)

    # The copy's src/ first: train.py must import the copy's trainkit, where the recipe put its file.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo / "src"), os.environ.get("PYTHONPATH")]))}
    run_dir = tmp_path / "run"
    command = [sys.executable, *train_commands[0][1:], f"hydra.run.dir={run_dir}"]
    process = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, timeout=timeout)
    assert process.returncode == 0, f"{shlex.join(train_commands[0])} failed:\n{process.stderr[-4000:]}"
    return files, repo, run_dir


def recipe_class(files: dict[str, str], repo: Path, target: str) -> type:
    """The class a `_target_` names, loaded from the file the recipe wrote (not from an installed trainkit)."""
    module_name, class_name = target.rsplit(".", 1)
    path = "src/" + module_name.replace(".", "/") + ".py"
    assert path in files, f"_target_ {target} points to {path}, which the recipe does not write"
    return getattr(load_module(repo / path), class_name)


def run_config(run_dir: Path) -> dict:
    return OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=True)


def test_add_your_own_model_recipe_trains_the_new_model(tmp_path):
    files, repo, run_dir = follow("Add your own model", "model", tmp_path)
    assert "test" in json.loads((run_dir / "summary.json").read_text())

    # The checkpoint holds the recipe's class, built with the yaml's keys, all of them its arguments:
    # same keys, same shapes.
    model_config = run_config(run_dir)["model"]
    model_class = recipe_class(files, repo, model_config.pop("_target_"))
    expected = model_class(**model_config).state_dict()
    trained = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["model"]
    assert {key: value.shape for key, value in trained.items()} == {key: value.shape for key, value in expected.items()}


@pytest.mark.parametrize("title", RECIPES)
def test_recipe_code_passes_lint_and_format(title):
    pytest.importorskip("ruff")
    files, _ = recipe(title)
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


def test_add_your_own_dataset_recipe_trains_on_the_new_data(tmp_path):
    files, _, run_dir = follow("Add your own dataset", "data", tmp_path)
    assert "test" in json.loads((run_dir / "summary.json").read_text())

    # The run loaded the recipe's function, and the model saw its shapes (channels and classes).
    data_config = OmegaConf.load(run_dir / ".hydra" / "config.yaml").data
    module_name = data_config._target_.rsplit(".", 1)[0]
    assert "src/" + module_name.replace(".", "/") + ".py" in files, f"data._target_ is {data_config._target_}"
    trained = torch.load(run_dir / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)["model"]
    first_conv, head = trained["features.0.weight"], trained["head.3.weight"]
    assert (first_conv.shape[1], head.shape[0]) == (data_config.channels, data_config.num_classes)


@pytest.mark.slow  # 20 epochs of the recipe (~1 min on 2 idle cores): the full suite runs it
def test_add_your_own_task_recipe_trains_and_reports_the_task_metrics(tmp_path):
    from trainkit.augment import BatchTransform
    from trainkit.data import build_data
    from trainkit.models import build_model
    from trainkit.tasks import Task, higher_is_better

    # A real run (20 epochs of digits, as long as the default `python train.py`), not debug=fast: room for load.
    files, repo, run_dir = follow("Add your own task", "task", tmp_path, timeout=600)
    summary = json.loads((run_dir / "summary.json").read_text())
    config = run_config(run_dir)
    task_config = dict(config["task"])
    task_class = recipe_class(files, repo, task_config.pop("_target_"))
    assert issubclass(task_class, Task)
    task = task_class(**task_config)

    # summary.json holds the task's own test metrics, finite, and the metric the command optimized.
    names = ["loss", *task_class.metric_names]
    assert sorted(summary["test"]) == sorted(f"test/{name}" for name in names)
    assert all(math.isfinite(value) for value in summary["test"].values()), summary["test"]
    assert summary["optimized_metric"] in [f"val/{name}" for name in names]
    assert summary["optimized_value"] == summary["best"][summary["optimized_metric"]]

    # Recomputed here from best.pt on the test split, all samples at once: the task's metrics as the
    # summary states them (the loop summed them batch by batch), and better than the untrained model's.
    data = build_data(OmegaConf.create(config["data"]), device=torch.device("cpu"), seed=config["seed"])

    def test_metrics(weights: dict | None) -> dict[str, float]:
        torch.manual_seed(0)
        model, input_size = build_model(config["model"], config["finetune"], image_size=data.image_size)
        if weights is not None:
            model.load_state_dict(weights)
        transform = BatchTransform(data.mean, data.std, input_size)
        with torch.no_grad():
            outputs = torch.cat([model.eval()(transform(inputs)) for inputs, _ in test_batches])
        loss = task.evaluation_loss(outputs, test_targets).mean().item()
        metrics = task.metrics(task.metric_sums(outputs, test_targets))
        return {"test/loss": loss, **{f"test/{name}": value for name, value in metrics.items()}}

    test_batches = [task.to_device(batch, torch.device("cpu")) for batch in data.test]
    test_targets = torch.cat([targets for _, targets in test_batches])
    best = torch.load(run_dir / "checkpoints" / "best.pt", map_location="cpu", weights_only=True)["model"]
    trained, untrained = test_metrics(best), test_metrics(None)
    assert trained == pytest.approx(summary["test"], rel=1e-3, abs=1e-5)
    for name, value in trained.items():
        better = value > untrained[name] if higher_is_better(task, name) else value < untrained[name]
        assert better, f"{name}: {value} trained, {untrained[name]} untrained"
    if "mae" in task_class.metric_names:  # the README's regression: well within the best constant guess
        train_targets = torch.cat([task.targets(task.to_device(batch, torch.device("cpu"))) for batch in data.train])
        guess = (test_targets - train_targets.median()).abs().mean().item()
        assert trained["test/mae"] < guess / 2, f"test/mae {trained['test/mae']}, a constant guess {guess}"
