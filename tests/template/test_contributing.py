"""The README's recipes, "Add your own model", "Add your own dataset" and "Add your own task", and those of
docs/recipes.md (an auxiliary loss, a data kind of variable-length signals, two views and a contrastive loss, images
and texts in one space), followed exactly as written on a copy of the repository.

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

from conftest import end_all, finish, torchrun
from helpers import has_file_data, has_predict, needs_file_data, nothing_left, template_has

ROOT = Path(__file__).resolve().parents[2]
FENCED_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
FILE_MARKER = re.compile(r"#\s*file:\s*(\S+)")
RECIPES = ("Add your own model", "Add your own dataset", "Add your own task")
DOCUMENTED = "docs/recipes.md"
SIGNALS = "A data kind of variable-length signals"
IMAGE_TEXT = "Images and texts in one space: a contrastive loss over every rank's batch"
# Each docs/recipes.md recipe: its section, and the micro-batch size its tests add (data=chirps: frames; None: its
# loss couples a batch's samples, and micro-batches are refused).
AUX_LOSS = "An auxiliary loss from an intermediate activation"
DOCUMENTED_RECIPES = {
    AUX_LOSS: 24,
    **({SIGNALS: 512} if (ROOT / "src/trainkit/models/signal.py").is_file() else {}),  # trimming `signal` takes it
    "Two augmented views of each image and a contrastive loss": 24,
    **({IMAGE_TEXT: None} if has_file_data else {}),  # its dict batches are file data's: trimming `file_data` takes it
}
# What an image recipe's model predicts for images, called directly: the main head; the image as both views.
MODEL_PREDICTS = {
    "An auxiliary loss from an intermediate activation": lambda model, images: model(images)[0],
    "Two augmented views of each image and a contrastive loss": lambda model, images: model(images, images)[0],
}


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


def recipe_copy(title: str, tmp_path: Path, document: str = "README.md") -> tuple[dict[str, str], Path, list[str]]:
    """A copy of the repository with the recipe's files written in: (the files, the copy, the arguments of the
    recipe's one `python train.py` line)."""
    files, commands = recipe(title, document)
    assert any(path.endswith(".py") for path in files), "the recipe writes no Python file"
    train_commands = [command for command in commands if command[:2] == ["python", "train.py"]]
    assert len(train_commands) == 1, f"expected one `python train.py ...` line in the recipe, got {commands}"

    repo = tmp_path / "repo"
    copy_repository(repo)
    for path, text in files.items():  # new files only: no registry, __init__.py or train.py edited
        assert not (repo / path).exists(), f"{path} already exists: the recipe would not be adding it"
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    return files, repo, train_commands[0][2:]


def run_script(
    repo: Path, script: str, *args: str, timeout: int = 300, processes: int = 0
) -> subprocess.CompletedProcess:
    """`python <script> <args>` in the copy, with the copy's src/ first: train.py must import the copy's trainkit,
    where the recipe put its files (and tests/, for the models that stop themselves). `processes`: that many, started
    by torchrun."""
    return finish(start_script(repo, script, *args, processes=processes, alone=True), timeout)


def start_script(repo: Path, script: str, *args: str, processes: int = 0, alone: bool = False) -> subprocess.Popen:
    """run_script's process, started and not waited for (`finish` waits): runs that need not wait for each other
    overlap, each in one thread (as torchrun gives its workers; `alone`: torch's own count), so that on a machine
    of few cores neither takes several times as long."""
    paths = [str(repo / "src"), str(ROOT / "tests"), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, paths))}
    if not alone:
        env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("WANDB_SERVICE", None)
    command = [*(torchrun(processes) if processes else [sys.executable]), script, *args]
    return subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def follow(title: str, config_group: str, tmp_path: Path, timeout: int = 300) -> tuple[dict[str, str], Path, Path]:
    """Write the recipe's files into a copy of the repository and run its one `python train.py`
    line there; the recipe's files, the copy and the run directory."""
    files, repo, arguments = recipe_copy(title, tmp_path)
    assert any(path.startswith(f"conf/{config_group}/") for path in files), f"no conf/{config_group}/ yaml"
    run_dir = tmp_path / "run"
    process = run_script(repo, "train.py", *arguments, f"hydra.run.dir={run_dir}", timeout=timeout)
    assert process.returncode == 0, f"python train.py {shlex.join(arguments)} failed:\n{process.stderr[-4000:]}"
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


@pytest.mark.parametrize(
    "title, document", [*((title, "README.md") for title in RECIPES), *((t, DOCUMENTED) for t in DOCUMENTED_RECIPES)]
)
def test_recipe_code_passes_lint_and_format(title, document):
    pytest.importorskip("ruff")
    files, _ = recipe(title, document)
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
    from trainkit.tasks import Task
    from trainkit.tasks.task import higher_is_better

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
        model = build_model(config["model"])
        if weights is not None:
            model.load_state_dict(weights)
        transform = BatchTransform(data.mean, data.std, data.image_size)
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


# ---- docs/recipes.md: each recipe trains micro-batched, eval.py agrees, and under DDP a SIGTERM resumes exactly ----


def eval_py_test_metrics(repo: Path, checkpoint: Path, out_dir: Path) -> dict:
    process = finish(start_script(repo, "eval.py", f"checkpoint={checkpoint}", f"hydra.run.dir={out_dir}"))
    assert process.returncode == 0, process.stderr[-4000:]
    return json.loads((out_dir / "metrics.json").read_text())


def assert_eval_py_gives_the_summary(repo: Path, run_dir: Path, out_dir: Path) -> None:
    test = json.loads((run_dir / "summary.json").read_text())["test"]
    assert sorted(test) == ["test/acc", "test/loss"] and math.isfinite(test["test/loss"])
    metrics = eval_py_test_metrics(repo, run_dir / "checkpoints" / "best.pt", out_dir)
    assert {key: metrics[key] for key in test} == pytest.approx(test, rel=1e-6)


def assert_eval_py_predicts_what_the_model_does(
    title: str, model_class: type, repo: Path, run_dir: Path, tmp_path: Path
):
    """eval.py predict= on a few digits saved as PNGs gives each the class and probability of the recipe's model
    (`model_class`, with its checkpoint's arguments and weights, the data's eval transform), called as the recipe's
    task calls it: through the task."""
    if not has_predict:
        return
    from PIL import Image

    from trainkit.data import make_data
    from trainkit.data.datasets import read_digits

    pixels, _ = read_digits()
    images = torch.from_numpy((pixels[:6].reshape(6, 1, 8, 8) * 255 / 16).round().astype("uint8"))
    (tmp_path / "images").mkdir()
    for i, image in enumerate(images):
        Image.fromarray(image[0].numpy(), mode="L").save(tmp_path / "images" / f"{i}.png")
    out_dir = tmp_path / "predicted"
    process = finish(
        start_script(
            repo, "eval.py", f"checkpoint={run_dir}", f"predict={tmp_path / 'images'}", f"hydra.run.dir={out_dir}"
        )
    )
    assert process.returncode == 0, process.stderr[-4000:]
    rows = sorted(line.split(",") for line in (out_dir / "predictions.csv").read_text().splitlines()[1:])
    config = run_config(run_dir)
    model = model_class(**{key: value for key, value in config["model"].items() if key not in NOT_THE_MODELS})
    model.load_state_dict(torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)["model"])
    transform = make_data(OmegaConf.create(config["data"])).batch_transform(None, None, False, train=False)
    with torch.no_grad():
        probability, label = MODEL_PREDICTS[title](model.eval(), transform(images)).softmax(dim=1).max(dim=1)
    assert [name for name, _, _ in rows] == [f"{i}.png" for i in range(6)]
    assert [int(predicted) for _, predicted, _ in rows] == label.tolist()
    assert [float(value) for _, _, value in rows] == pytest.approx(probability.tolist(), rel=1e-5)


def test_the_aux_loss_recipe_logs_its_term_per_step_and_its_epoch_mean_by_samples(tmp_path):
    """The recipe's task records its auxiliary loss (Task.record): each logging step's row holds it (and
    train/grad_norm), and the epoch's train/aux_loss is the steps' values weighed by their batches' samples (the
    epoch's last batch is short), computed here by hand."""
    _, repo, arguments = recipe_copy(AUX_LOSS, tmp_path, DOCUMENTED)
    run_dir = tmp_path / "run"
    one_epoch = ("trainer.max_epochs=1", "trainer.log_every_n_steps=1")
    process = run_script(repo, "train.py", *arguments, *one_epoch, f"hydra.run.dir={run_dir}")
    assert process.returncode == 0, process.stderr[-4000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "train/step_loss" in row]
    (epoch,) = [row for row in rows if "train/aux_loss" in row]
    train_samples = json.loads((run_dir / "summary.json").read_text())["split_sizes"]["train"]
    batch_size = OmegaConf.load(run_dir / ".hydra" / "config.yaml").data.batch_size
    sizes = [min(batch_size, train_samples - start) for start in range(0, train_samples, batch_size)]
    assert len(steps) == len(sizes) and sizes[-1] < batch_size
    assert all(row["train/grad_norm"] > 0 for row in steps)
    assert all(row["train/step_loss"] > 0.3 * row["train/step_aux_loss"] > 0 for row in steps)  # the loss holds it
    by_hand = sum(row["train/step_aux_loss"] * size for row, size in zip(steps, sizes)) / train_samples
    assert epoch["train/aux_loss"] == pytest.approx(by_hand, rel=1e-6)


@needs_file_data
def test_the_image_text_recipe_refuses_micro_batches_in_one_line(tmp_path):
    """Its loss couples the samples of a batch (couples_batch): a fixed micro-batch size and auto are refused by the
    config check, in one line naming the key and the way out, and no run directory is left."""
    _, repo, arguments = recipe_copy(IMAGE_TEXT, tmp_path, DOCUMENTED)
    for size in ("16", "auto") if template_has("trainer._checks_.micro_batch_auto") else ("16",):
        run_dir = tmp_path / f"run_{size}"
        process = run_script(
            repo, "train.py", *arguments, f"trainer.micro_batch_size={size}", f"hydra.run.dir={run_dir}"
        )
        assert process.returncode == 1 and nothing_left(run_dir)
        assert process.stderr.strip() == (
            f"error: trainer.micro_batch_size: is {size}, but ImageText's loss couples the samples of a batch "
            f"(couples_batch: each sample's loss reads the others), so micro-batches would train on another loss; set "
            f"trainer.micro_batch_size=null (a smaller data.batch_size or precision=bf16 saves memory)"
        )


GATHERED = """import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from helpers import on_two_ranks
from trainkit.data.digit_names import name_ids
from trainkit.models.image_text import ImageTextEncoder
from trainkit.tasks.image_text import ImageText

PARTS = (slice(0, 8), slice(8, 13))  # rank 1 holds a short last batch


def global_batch() -> dict:
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (13,), generator=generator)
    return {"image": torch.rand(13, 1, 8, 8, generator=generator), "text": name_ids(labels), "targets": labels}


def loss_and_gradients(model, batch) -> tuple[float, list]:
    loss, _ = ImageText(10).step(model, batch)
    loss.backward()
    return loss.item(), [parameter.grad.flatten().tolist() for parameter in model.parameters()]


def model():
    torch.manual_seed(0)
    return ImageTextEncoder(1).eval()  # BatchNorm's running statistics: the same forward on any split of the batch


def on_a_rank(rank, port, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        part = {key: value[PARTS[rank]] for key, value in global_batch().items()}
        results[rank] = loss_and_gradients(DistributedDataParallel(model()), part)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    batch = global_batch()
    ranks = on_two_ranks(on_a_rank)
    alone = [ImageText(10).step(model(), {key: value[part] for key, value in batch.items()})[0] for part in PARTS]
    per_rank = sum(len(range(13)[part]) * loss.item() for part, loss in zip(PARTS, alone)) / 13
    print(json.dumps({"one_process": loss_and_gradients(model(), batch), "ranks": ranks, "per_rank": per_rank}))
"""


@needs_file_data
def test_the_image_text_recipe_under_two_processes_gives_the_one_process_loss_and_gradients(tmp_path):
    """The recipe's task gathers every rank's embeddings with their gradients: two processes (gloo, DDP) holding 8
    and 5 samples (a short last batch) give the loss of one process on the 13 to 1e-6, and its gradients to float32's
    rounding (summed in another order); each rank's own negatives alone (the mean of its batch's losses) would give
    another loss."""
    _, repo, _ = recipe_copy(IMAGE_TEXT, tmp_path, DOCUMENTED)
    (repo / "gathered_check.py").write_text(GATHERED)
    process = run_script(repo, "gathered_check.py")
    assert process.returncode == 0, process.stderr[-4000:]
    found = json.loads(process.stdout.splitlines()[-1])
    loss, gradients = found["one_process"]
    assert len(found["ranks"]) == 2
    for rank_loss, rank_gradients in found["ranks"].values():  # each rank's loss is the global batch's
        assert abs(rank_loss - loss) < 1e-6, (rank_loss, loss)
        for rank_gradient, gradient in zip(rank_gradients, gradients, strict=True):
            torch.testing.assert_close(torch.tensor(rank_gradient), torch.tensor(gradient), rtol=1e-4, atol=1e-6)
    assert abs(found["per_rank"] - loss) > 0.05  # the negatives of each rank's batch alone: another loss
    differences = [abs(rank_loss - loss) for rank_loss, _ in found["ranks"].values()]
    print(f"loss: one process {loss}, two ranks gathered {differences} apart, each rank alone {found['per_rank']}")


PREEMPTED = """from models_for_tests import PreemptedAt
from {module} import {name}


class Preempted(PreemptedAt, {name}):
    pass
"""


# The keys of a run's `model` that build no recipe model: the class, and what the stopping wrapper takes.
NOT_THE_MODELS = ("_target_", "preempt_at")


@pytest.mark.slow  # three runs of two processes each, and eval.py
@pytest.mark.parametrize("title", DOCUMENTED_RECIPES)
def test_a_documented_recipe_under_ddp_in_micro_batches_resumes_exactly_after_sigterm_and_eval_py_agrees(
    title, tmp_path
):
    """The recipe's command under DDP (2 processes, gloo) in micro-batches (where its loss allows them): straight,
    and stopped by a SIGTERM inside its first epoch then resumed, give the same epochs, test metrics and weights.
    The straight run also shows what the recipe's own run in micro-batches must: eval.py gives its summary; eval.py
    predict= gives an image recipe's model's predictions (through its task); the signals' epochs report their frames
    a second (Data.size_unit). (One run for both: DDP hides none of them, and a test of micro-batches alone paid for
    a run of its own.)"""
    from conftest import TrainRun
    from helpers import assert_same_training

    files, repo, arguments = recipe_copy(title, tmp_path, DOCUMENTED)
    option = next(argument.split("=", 1)[1] for argument in arguments if argument.startswith("model="))
    model = OmegaConf.load(repo / "conf" / "model" / f"{option}.yaml")._target_
    module, name = model.rsplit(".", 1)  # the recipe's model (or the one it names), stopping itself on rank 0
    (repo / "src" / "preempted_recipe.py").write_text(PREEMPTED.format(module=module, name=name))
    size = DOCUMENTED_RECIPES[title]
    micro = () if size is None else (f"trainer.micro_batch_size={size}",)
    shared = (
        *arguments,
        "distributed=ddp",
        *micro,
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=6",
        "regularization.early_stopping.enabled=false",
        "trainer.log_every_n_steps=1",  # under DDP the ranks agree on a stop at logging steps
        "model._target_=preempted_recipe.Preempted",
    )

    # The straight run and the stopped one overlap, and eval.py runs while the resumed one trains: none reads
    # another's directory until it ended.
    started: list[subprocess.Popen] = []

    def start(run_dir: Path, *more: str) -> tuple[subprocess.Popen, Path]:
        started.append(start_script(repo, "train.py", *shared, *more, f"hydra.run.dir={run_dir}", processes=2))
        return started[-1], run_dir

    def train(process: subprocess.Popen, run_dir: Path) -> TrainRun:
        ended = finish(process, timeout=600)
        return TrainRun(ended.returncode, ended.stdout, ended.stderr, run_dir)

    try:
        straight_run = start(tmp_path / "straight", "+model.preempt_at=0")
        preempted_run = start(tmp_path / "preempted", "+model.preempt_at=5")  # rank 0's 5th forward: a few updates in
        preempted = train(*preempted_run)
        # Each worker exits 75 after saving; torchrun then reports them as failed in its own way.
        assert "stopped by SIGTERM" in preempted.stdout + preempted.stderr, preempted.stderr[-4000:]
        resumed_run = start(preempted.run_dir, "resume=auto", "+model.preempt_at=0")

        straight = train(*straight_run)
        assert straight.returncode == 0, straight.stderr[-4000:]
        assert straight.summary["world_size"] == 2
        output = straight.stdout + straight.stderr
        assert ("in micro-batches of" in output) == bool(micro)  # the start line: batches cut
        if title == IMAGE_TEXT:  # the start line: the loss couples every rank's batch
            assert "the loss couples all 2 ranks' batches of 64 (gathered" in output
        assert_eval_py_gives_the_summary(repo, straight.run_dir, tmp_path / "eval")
        if title in MODEL_PREDICTS:
            model_class = recipe_class(files, repo, model)
            assert_eval_py_predicts_what_the_model_does(title, model_class, repo, straight.run_dir, tmp_path)
        elif title == SIGNALS:
            trained = [epoch for epoch in straight.metrics if "train/samples_per_sec" in epoch]
            assert trained and all(epoch["train/frames_per_sec"] > epoch["train/samples_per_sec"] for epoch in trained)
            assert re.search(r"epoch +0 .* [\d,]+ frames/s", output)  # the epoch line's rate

        resumed = train(*resumed_run)
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        assert re.search(r"at epoch 0, batch [1-9]\d*, step [1-9]", resumed.stdout + resumed.stderr)  # inside epoch 0
        assert_same_training(resumed, straight)
    finally:
        end_all(started)


# ---- docs/recipes.md's regression on a table: new files only, and every quick test that reads the options ----

REGRESSION = "A regression on a table"
# The quick tests that read every option of conf/ (their example inputs, what suits them, their keys' comments).
READ_EVERY_OPTION = ("tests/unit/config/test_instantiate.py", "tests/unit/config/test_config.py",
                     "tests/template/test_readme.py")  # fmt: skip


def test_a_regression_on_a_table_stops_on_its_headline_metric_and_the_quick_tests_take_its_options(tmp_path):
    _, repo, arguments = recipe_copy(REGRESSION, tmp_path, DOCUMENTED)
    run_dir = tmp_path / "run"
    # The run, the refused one and the quick tests overlap: none reads what another writes.
    selected = " or ".join(("diabetes", "table_mlp", "squared_error", "data_keys"))
    paths = os.pathsep.join([str(repo / "src"), str(repo / "tests")])
    started = [
        start_script(repo, "train.py", *arguments, f"hydra.run.dir={run_dir}"),
        start_script(repo, "train.py", "data=diabetes", "model=table_mlp", f"hydra.run.dir={tmp_path / 'no'}"),
        subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", "-k", selected,
             *READ_EVERY_OPTION],
            cwd=repo, env={**os.environ, "PYTHONPATH": paths, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        ),
    ]  # fmt: skip
    try:
        process = finish(started[0])
        assert process.returncode == 0, f"python train.py {shlex.join(arguments)} failed:\n{process.stderr[-4000:]}"
        summary = json.loads((run_dir / "summary.json").read_text())
        config = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["config"]  # the run's, filled in
        stopping = config["regularization"]["early_stopping"]
        # No monitor named: early stopping follows the task's headline metric and its direction, as optimized_metric.
        assert (stopping["monitor"], stopping["mode"]) == ("val/r2", "max")
        assert summary["optimized_metric"] == "val/r2" and summary["higher_is_better"]["r2"] is True
        assert sorted(summary["test"]) == ["test/loss", "test/r2", "test/rmse"]
        assert summary["test"]["test/r2"] > 0.3, summary["test"]  # the mean of the training targets scores about 0
        if summary["stop_reason"] == "early_stopping":
            assert "early stopping: val/r2 has not improved" in process.stdout + process.stderr

        if has_predict:  # predict= on a CSV of rows, as the data reads them
            from sklearn.datasets import load_diabetes

            rows = load_diabetes().data[:5]  # the first five patients, as the data reads them
            table = tmp_path / "rows.csv"
            header = ",".join(f"f{i}" for i in range(10))
            body = [",".join(str(float(value)) for value in row) for row in rows]
            table.write_text("\n".join([header, *body]))
            out = tmp_path / "predicted"
            predicted = finish(
                start_script(repo, "eval.py", f"hydra.run.dir={out}", f"checkpoint={run_dir}", f"predict={table}")
            )
            assert predicted.returncode == 0, predicted.stderr[-4000:]
            lines = (out / "predictions.csv").read_text().splitlines()  # predict= on a CSV of rows, as read
            assert lines[0] == "file,row,value"
            assert [line.split(",")[1] for line in lines[1:]] == ["0", "1", "2", "3", "4"]

        refused = finish(started[1])
        assert refused.returncode == 1 and nothing_left(tmp_path / "no")  # the default task: one line, no directory
        assert refused.stderr.strip().splitlines() == [
            "error: task._target_: is Classification, which takes a class index per sample, but the data's targets "
            "are float32 numbers: they suit a regression task (a loss on numbers, as docs/recipes.md's regression on "
            "a table); choose it with task=<its option>"
        ]

        quick = finish(started[2], timeout=600)
        assert quick.returncode == 0, quick.stdout[-4000:]
        assert re.search(r"\b(\d+) passed", quick.stdout) and int(re.search(r"\b(\d+) passed", quick.stdout)[1]) >= 6
    finally:
        end_all(started)
