"""Helpers that tests in several folders share (conftest holds the fixtures)."""

import hashlib
import importlib.util
import os
import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import ROOT, TrainRun, composed
from trainkit.tracking.loggers import Logger


def template_has(config: str) -> bool:
    """Whether this clone still holds a capability's config: a file of conf/ ("distributed/fsdp.yaml") or a key of
    conf/config.yaml ("regularization.ema"). A test of two capabilities skips once a trim took one of them away."""
    if config.endswith(".yaml"):
        return (ROOT / "conf" / config).is_file()
    return OmegaConf.select(OmegaConf.load(ROOT / "conf" / "config.yaml"), config) is not None


# A test of the core or of another capability that picks data=imagefolder: skipped once image_folders is trimmed.
needs_image_folders = pytest.mark.skipif(
    not template_has("data/imagefolder.yaml"), reason="this clone has no data=imagefolder (trimmed)"
)

# A test of another capability that also predicts with eval.py's predict=: skipped, or its predictions left out, once
# predict is trimmed.
has_predict = (ROOT / "src" / "trainkit" / "prediction.py").is_file()
needs_predict = pytest.mark.skipif(not has_predict, reason="this clone has no eval.py predict= (trimmed)")

# A test of the core or of another capability that also checks k-fold cross-validation (data.folds): those checks, or
# the whole test, are left out once folds is trimmed.
has_folds = template_has("_checks_.folds")
needs_folds = pytest.mark.skipif(not has_folds, reason="this clone has no data.folds (trimmed)")

# A test of the core or of another capability that reads its samples as file data (DataLoader workers, dict batches:
# tests/file_data_for_tests.py): skipped, or those checks left out, once file_data is trimmed.
has_file_data = (ROOT / "src" / "trainkit" / "data" / "file_data.py").is_file()
needs_file_data = pytest.mark.skipif(not has_file_data, reason="this clone has no file data (trimmed)")

# A test of the core that also checks where an epoch's time goes (train/data_wait_fraction, the epoch line's extras):
# those checks are left out once loop_timing is trimmed.
has_loop_timing = (ROOT / "src" / "trainkit" / "tracking" / "timing.py").is_file()

# A test that also checks that a refused call leaves the disk as it found it: those checks are left out once
# undo_refusals is trimmed (Hydra's record of the refused call then stays).
has_undo_refusals = (ROOT / "src" / "trainkit" / "checkpointing" / "refusal.py").is_file()


def is_hydras_record(relative: Path) -> bool:
    """Whether a file of a run directory records a call before it does any work: Hydra's .hydra/ and log file, the
    run's .lock, the config tree printed at the start."""
    return ".hydra" in relative.parts or relative.suffix == ".log" or relative.name in (".lock", "config_tree.txt")


def nothing_left(path: Path, nor_beside: bool = False) -> bool:
    """Whether a refused call left nothing at `path` (and, `nor_beside`, nothing else in its folder either); in a clone
    trimmed of undo_refusals, nothing at `path` but Hydra's record of the call."""
    if nor_beside and any(other != path for other in path.parent.iterdir()):
        return False
    if not path.exists():
        return True
    left = [file for file in path.rglob("*") if file.is_file() and file.stat().st_size]  # metrics.jsonl opened, empty
    return not has_undo_refusals and all(is_hydras_record(file.relative_to(path)) for file in left)


def unchanged_but_the_record(run_dir: Path, before: dict[str, str]) -> bool:
    """Every file of `run_dir` as `hashes_of_every_file` found it; in a clone trimmed of undo_refusals, all but
    Hydra's record of the refused call."""
    after = hashes_of_every_file(run_dir)
    if not has_undo_refusals:
        after, before = ({f: h for f, h in files.items() if not is_hydras_record(Path(f))} for files in (after, before))
    return after == before


# A test of another capability that has train.py start its DDP workers (exit code 75 on a stop, one line from the
# parent, refusals before any worker starts): skipped once local_launch is trimmed (torchrun starts them in the core).
has_local_launch = (ROOT / "src" / "trainkit" / "distributed" / "local_launch.py").is_file()
needs_local_launch = pytest.mark.skipif(not has_local_launch, reason="this clone has no local_launch (trimmed)")


# A test of the core or of another capability that picks data=mnist or data=cifar10: skipped once downloads is trimmed.
needs_downloads = pytest.mark.skipif(
    not template_has("data/mnist.yaml"), reason="this clone has no data=mnist or data=cifar10 (trimmed)"
)


def unless_trimmed(cases: list, override: str) -> list:
    """`cases` (tuples whose first item is a list of overrides) without those that pick `override`
    ("data=imagefolder") once a trim deleted its yaml: a list that parametrizes a test and is read as a whole too."""
    group, option = override.split("=")
    if template_has(f"{group}/{option}.yaml"):
        return cases
    return [case for case in cases if override not in case[0]]


def hashes_of_every_file(run_dir: Path) -> dict[str, str]:
    """Every file's SHA-256 and every folder, by its path in `run_dir`."""
    return {
        str(path.relative_to(run_dir)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "folder"
        for path in run_dir.rglob("*")
    }


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def loop_config(accumulate: int = 1, micro_batch_size: int | None = None):
    """The config train.py's loop reads, for a Run a test builds by hand (train.train_one_epoch, train_step)."""
    return OmegaConf.create(
        {
            "trainer": {
                "accumulate_grad_batches": accumulate,
                "micro_batch_size": micro_batch_size,
                "limit_train_batches": None,
                "max_steps": None,
                "grad_clip": None,
                "log_every_n_steps": 1000,
                "checkpoint_every_n_steps": None,
            },
            "precision": {"name": "fp32"},
        }
    )


def backward_step(model: torch.nn.Module, loss_fn: Callable, transform: Callable | None = None) -> Callable:
    """A finder's `step` for (inputs, targets) batches, as train.py's train_step in short: forward, `loss_fn`,
    backward; it returns (the loss, the batch's samples)."""

    def step(batch: Any) -> tuple[torch.Tensor, int]:
        inputs, targets = batch
        loss = loss_fn(model(inputs if transform is None else transform(inputs)), targets)
        loss.backward()
        return loss, len(inputs)

    return step


def cfg_for(metric="val/acc", **sweep):
    return OmegaConf.create(
        {"optimized_metric": metric, "sweep": {"catch_failures": True, "failed_trial_value": None, **sweep}}
    )


def sharded_checkpoint(directory: Path, rest: dict, metadata: bool = True) -> Path:
    """checkpoints/last/ as a strategy that shards the model writes it, its shards left out: state.pt (all but the
    weights and the optimizer state) and, once every shard is written, torch.distributed.checkpoint's .metadata."""
    from trainkit.checkpointing.files import CHECKPOINT_FORMAT, SHARDED_METADATA, SHARDED_REST

    directory.mkdir(parents=True, exist_ok=True)
    torch.save({"format": CHECKPOINT_FORMAT, **rest}, directory / SHARDED_REST)
    if metadata:
        (directory / SHARDED_METADATA).write_bytes(b"")
    return directory


def final_weights(run) -> dict:
    sharded = run.run_dir / "checkpoints" / "last"  # a sharded run's: every rank's shards, gathered into one file here
    if sharded.is_dir():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        dcp_to_torch_save(sharded, sharded.with_name("last_gathered.pt"))
        return torch.load(sharded.with_name("last_gathered.pt"), weights_only=True)["model"]
    return torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


def assert_same_training(resumed, straight):
    """The same last epoch (every val/ metric of the task, the LR, the step), test metrics and weights."""
    last = straight.epoch_metrics()[-1]
    keys = [key for key in last if key.startswith("val/")] + ["lr", "step"]
    assert len(keys) >= 4, keys  # val/loss and the task's metrics at least
    for key in keys:
        assert resumed.epoch_metrics()[-1][key] == pytest.approx(last[key], rel=1e-6), key
    assert resumed.summary["test"] == pytest.approx(straight.summary["test"], rel=1e-6)
    straight_weights, resumed_weights = final_weights(straight), final_weights(resumed)
    for name, tensor in straight_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, rtol=1e-6, atol=1e-7)


def write_cifar(root: Path, per_batch: int, num_test: int) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)

    def batch(start: int, count: int) -> dict:
        # Rows are 1,024 red, 1,024 green, 1,024 blue bytes: red = sample number, green 1, blue 2.
        numbers = np.arange(start, start + count)
        planes = np.stack([np.full((count, 1024), fill) for fill in (0, 1, 2)], axis=1)
        planes[:, 0] = numbers[:, None]
        return {"data": planes.reshape(count, 3072).astype(np.uint8), "labels": (numbers % 10).tolist()}

    for index in range(5):
        (folder / f"data_batch_{index + 1}").write_bytes(pickle.dumps(batch(index * per_batch, per_batch)))
    (folder / "test_batch").write_bytes(pickle.dumps(batch(0, num_test)))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))


# ---- watching train.py's loop from inside ----------------------------------------------------------
# Hooks on the pieces that train.py's build_run makes (forward hooks on the model, a step pre-hook on the
# optimizer, wrappers around the train transform and the task's loss): the loop itself runs unchanged.


@dataclass
class Forward:
    training: bool
    inputs: torch.Tensor  # as the model received them
    output_dtype: torch.dtype


@dataclass
class Recording:
    """What one run did, seen from the model, the train transform, the task's loss and the optimizer."""

    run: Any = None  # train.py's Run record: as build_run made it, and as the run left it
    forwards: list[Forward] = field(default_factory=list)  # every forward of the trained model, in order
    transformed: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)  # train transform: in, out
    losses: list[tuple[torch.Tensor, ...]] = field(default_factory=list)  # each training loss: outputs, targets, loss
    grad_norms: list[float] = field(default_factory=list)  # the gradients' global norm just before each step
    lrs: list[list[float]] = field(default_factory=list)  # every group's LR at each step
    summary: dict = field(default_factory=dict)

    def training_forwards(self) -> list[Forward]:
        return [forward for forward in self.forwards if forward.training]

    def eval_forwards(self) -> list[Forward]:
        return [forward for forward in self.forwards if not forward.training]


def record_run(tmp_path: Path, monkeypatch, *overrides: str, prepare: Callable | None = None) -> Recording:
    """train.py's train(cfg) in this process, on the CPU, the config composed from `overrides`, recording
    what the loop does (tests/e2e/test_wiring.py). `prepare(run)` changes the Run after build_run, before
    training. `tmp_path` is the run directory."""
    from trainkit.config.validation import validate
    from trainkit.distributed.process_group import ProcessInfo

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import train

    cfg = composed(*overrides)
    validate(cfg)
    recording = Recording()
    build_run = train.build_run

    def build_and_watch(*args, **kwargs):
        run = recording.run = build_run(*args, **kwargs)
        if prepare:
            prepare(run)

        def on_forward(module, args, output):
            recording.forwards.append(Forward(module.training, args[0].detach().clone(), output.dtype))

        def on_step(optimizer, args, kwargs):
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            recording.grad_norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())
            recording.lrs.append([group["lr"] for group in optimizer.param_groups])

        train_transform, task_loss = run.train_transform, run.task.loss

        def transform(images):
            transformed = train_transform(images)
            recording.transformed.append((images.clone(), transformed.detach().clone()))
            return transformed

        def loss(outputs, targets):
            value = task_loss(outputs, targets)
            if run.model.training:  # evaluation's task.step scores its batches too; val/ is evaluation_loss's
                recording.losses.append((outputs.detach().clone(), targets.clone(), value.detach().clone()))
            return value

        run.model.register_forward_hook(on_forward)
        run.optimizer.register_step_pre_hook(on_step)
        run.train_transform, run.task.loss = transform, loss  # the loop calls them as before
        return run

    monkeypatch.setattr(train, "build_run", build_and_watch)
    recording.summary = train.train(cfg, tmp_path, ProcessInfo(), torch.device("cpu"))
    return recording


class TrackerCalls(Logger):
    """A tracker that keeps every call the loggers make on it, in order, as (method, arguments): what train.py hands
    each tracker, seen without one (each tracker's own tests read back what it makes of them)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def log(self, metrics: dict) -> None:
        self.calls.append(("log", (metrics,)))

    def log_image(self, key: str, image: object, step: int) -> None:
        self.calls.append(("log_image", (key, image, step)))

    def log_masks(self, key, images, true_masks, predicted_masks, class_names, step) -> None:
        self.calls.append(("log_masks", (key, images, true_masks, predicted_masks, class_names, step)))

    def log_text(self, key: str, text: str, step: int) -> None:
        self.calls.append(("log_text", (key, text, step)))

    def summary(self, values: dict) -> None:
        self.calls.append(("summary", (values,)))

    def finish(self, failed: bool = False) -> None:
        self.calls.append(("finish", (failed,)))


def killed_and_resumed(run_train: Callable, monkeypatch, *overrides: str) -> tuple[TrainRun, TrainRun, list]:
    """A run with `overrides` (its trackers) killed by SIGKILL (no handler, no `finally`) two updates after epoch 1's
    checkpoint, then resumed: (the killed run, the resumed one, every (metric, step) of metrics.jsonl with a value),
    which each tracker's test finds in its files once, however little of the killed part the tracker had written."""
    tiny = ("trainer.limit_val_batches=1", "trainer.progress_bar=false")
    per_epoch = ("trainer.limit_train_batches=4", "trainer.log_every_n_steps=1", "trainer.max_epochs=3")
    killer = ("model._target_=models_for_tests.KilledCNN", "+model.kill_at=11")  # the 3rd update of epoch 2
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    killed = run_train(*tiny, *per_epoch, *overrides, "print_config=false", *killer, isolated=True, check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert max(m["step"] for m in killed.metrics) == 10  # steps 9 and 10 logged after epoch 1's checkpoint (step 8)
    resumed = run_train(f"resume={killed.run_dir}", run_dir=killed.run_dir, isolated=True)
    expected = sorted(
        {
            (key, m["step"])
            for m in resumed.metrics
            for key, value in m.items()
            if key not in ("epoch", "step") and value is not None
        }
    )  # a set: metrics.jsonl has `lr` in an epoch's last step line and again in its epoch line
    assert max(step for _, step in expected) == 12
    return killed, resumed, expected


def config_check_tests(feature: Any, rule_cases: list, relation_cases: list) -> tuple[Callable, Callable]:
    """The tests of an optional feature's config checks, declared beside its code (module `feature`: its
    CONFIG_RULES and CONFIG_RELATIONS), for its test file to name test_*: each bad setting is found by the
    feature's own check (a rule case by the rule of its key; a relation case by a relation and no single-key
    rule), by no check in trainkit.config (but where a feature widens a core key's rule: a size, or auto), and by
    the config check, which gathers the feature's; every rule has
    a case, and every relation a case that it alone finds."""
    from trainkit.config.declared import feature_checks
    from trainkit.config.rules import RULES
    from trainkit.config.schema import find_problems
    from trainkit.config.validation import RELATIONS, fill_task_defaults, problems

    @pytest.mark.parametrize("overrides, key", rule_cases + relation_cases, ids=str)
    def found_by_its_own_check(overrides: list, key: str) -> None:
        cfg = composed(*overrides)
        fill_task_defaults(cfg)
        rules = RULES | feature_checks(cfg)[0]  # the core's, widened by the features the config declares
        widened = key in RULES and rules[key] is not RULES[key]  # a core key whose rule a feature widens (auto)
        assert widened or key not in find_problems(cfg, RULES, RELATIONS)  # trainkit.config reads no feature key
        if (overrides, key) in rule_cases:
            assert key in find_problems(cfg, {key: feature.CONFIG_RULES[key]}, [])
        else:
            assert key not in find_problems(cfg, rules | feature.CONFIG_RULES, [])  # no single-key rule finds it
            assert key in find_problems(cfg, {}, feature.CONFIG_RELATIONS)
        assert key in problems(cfg)  # gathered

    def every_check_has_a_case() -> None:
        assert set(feature.CONFIG_RULES) <= {key for _, key in rule_cases}
        configs = [(composed(*overrides), key) for overrides, key in relation_cases]
        for relation in feature.CONFIG_RELATIONS:
            assert any(key in find_problems(cfg, {}, [relation]) for cfg, key in configs), relation

    return found_by_its_own_check, every_check_has_a_case


def assert_one_config_error(overrides: list[str], key: str) -> None:
    """The config composed with `overrides` has one problem, at `key`, raised by the config check as one line:
    what tests/unit/config/test_config.py asserts of the core's keys, for a feature's keys in its own tests."""
    from trainkit.config.validation import problems, validate
    from trainkit.errors import ConfigError

    cfg = composed(*overrides)
    assert list(problems(cfg)) == [key]
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert str(error.value).startswith(f"{key}: ") and "\n" not in str(error.value)


def _run_then_leave_at_once(rank: int, worker: Callable, *args: Any) -> None:
    from trainkit.distributed import process_group

    worker(rank, *args)
    process_group._joined_a_process_group = True  # the worker joined its group itself, without trainkit
    process_group.exit_now_if_a_process_group_was_joined(0)


def spawn_ranks(worker: Callable, *args: Any, nprocs: int = 2, start_method: str = "spawn") -> None:
    """Run `worker(rank, *args)` in `nprocs` processes and wait for them; an exception in one fails the caller.
    A rank that returned leaves at once, as train.py's ranks do (exit_now_if_a_process_group_was_joined): the gloo
    threads DDP leaves behind can abort a normal exit (SIGABRT, "terminate called without an active exception")."""
    import torch.multiprocessing as mp

    mp.start_processes(_run_then_leave_at_once, args=(worker, *args), nprocs=nprocs, start_method=start_method)


def on_two_ranks(worker: Callable, *args: Any) -> dict:
    """{rank: what `worker(rank, port, results, *args)` put in results[rank]}, run in 2 spawned processes that may
    form a gloo group at tcp://127.0.0.1:port (a free port)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    results = mp.Manager().dict()
    spawn_ranks(worker, port, results, *args)
    return dict(results)


def sigterm_in_job(monkeypatch, job: int) -> None:
    """Sweep job `job` receives SIGTERM at its first update, as a preempted sweep would: it saves and stops the
    sweep (exit 75). `monkeypatch.undo()` lets the rerun continue."""
    import signal

    from hydra.core.hydra_config import HydraConfig

    from trainkit import checkpointing

    original = checkpointing.stop_signal

    def stop_signal(device, agree):
        if HydraConfig.get().job.num == job:
            signal.raise_signal(signal.SIGTERM)  # the handler of trainkit.checkpointing.signals records it
        return original(device, agree)

    monkeypatch.setattr(checkpointing, "stop_signal", stop_signal)  # train.py imports it from here when it runs
