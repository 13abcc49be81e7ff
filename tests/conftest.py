import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Tests never touch the network: no model hub, no W&B server.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


class TrainRun:
    """The outcome of one `python train.py ...` subprocess and its run directory."""

    def __init__(self, process: subprocess.CompletedProcess, run_dir: Path):
        self.process, self.run_dir = process, run_dir
        self.returncode, self.stdout, self.stderr = process.returncode, process.stdout, process.stderr

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def metrics(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]

    def epoch_metrics(self) -> list[dict]:
        return [m for m in self.metrics if "val/loss" in m]


@pytest.fixture
def run_train(tmp_path):
    """Run train.py with overrides in a fresh run directory; fail with its stderr if it fails."""
    counter = iter(range(1000))

    def run(*overrides: str, check: bool = True, timeout: int = 300, run_dir: Path | None = None) -> TrainRun:
        """`run_dir`: train there (e.g. resume=auto in an existing run), instead of a fresh directory."""
        run_dir = run_dir or tmp_path / f"run{next(counter)}"
        command = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *overrides]
        process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if check:
            assert process.returncode == 0, f"train.py {' '.join(overrides)} failed:\n{process.stderr[-4000:]}"
        return TrainRun(process, run_dir)

    return run


_COMPOSED: dict = {}


def composed(*overrides: str):
    """Hydra's `compose("config", overrides)` against the real conf/, as a fresh copy each call.
    Each set of overrides is composed once a session (Hydra's global state cleared around it):
    a composition costs 0.1-0.3 s, and test_config and test_readme compose the same ones again and
    again. A composition that fails raises every time."""
    import copy

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if overrides not in _COMPOSED:
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str((ROOT / "conf").resolve()), version_base=None):
                _COMPOSED[overrides] = compose("config", overrides=list(overrides))
        finally:
            GlobalHydra.instance().clear()
    return copy.deepcopy(_COMPOSED[overrides])


def run_record(model, seed: int, ema=None):
    """The attributes of train.py's Run that a checkpoint saves and restores, around `model` (and
    its EMA), for in-process checkpoint round trips."""
    from types import SimpleNamespace

    import torch
    from omegaconf import OmegaConf

    from trainkit.distributed.process_group import ProcessInfo
    from trainkit.early_stopping import EarlyStopping
    from trainkit.tracking.loggers import Loggers

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return SimpleNamespace(
        cfg=OmegaConf.create({"seed": seed}),
        resolved_config={"seed": seed},
        proc=ProcessInfo(),
        model=model,
        ema=ema,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1)),
        scaler=torch.amp.GradScaler("cpu", enabled=False),
        early_stopping=EarlyStopping("val/loss", "min"),
        loggers=Loggers([]),
        epoch=0,
        step=0,
        batches_done=0,
        best_metrics={},
        wandb_run_id=None,
    )


def pytest_collection_modifyitems(items):
    """Everything under tests/template/ guards the template (README, CONTRIBUTING, style, imports), not
    training: a cloner who changed the model skips it with -m "not template"."""
    template = ROOT / "tests" / "template"
    for item in items:
        if template in Path(item.path).parents:
            item.add_marker(pytest.mark.template)
