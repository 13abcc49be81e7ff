import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Tests never touch the network: no model hub, no W&B server.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# Under `pytest -n N` each worker is a process of its own: one torch thread in it and in the runs it starts (set
# before torch is imported), so that N workers use N cores rather than each spinning a thread per core.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


class TrainRun:
    """The outcome of one train.py run (its exit code and output) and its run directory."""

    def __init__(self, returncode: int, stdout: str, stderr: str, run_dir: Path):
        self.returncode, self.stdout, self.stderr, self.run_dir = returncode, stdout, stderr, run_dir

    @property
    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    @property
    def metrics(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "metrics.jsonl").read_text().splitlines()]

    def epoch_metrics(self) -> list[dict]:
        return [m for m in self.metrics if "val/loss" in m]


@pytest.fixture(autouse=True)
def stop_signals_as_they_were():
    """Each test leaves this process's stop signals as it found them. A run stopped in this process (run_here of
    a stopped sweep) ignores them from then on, as a real one must on its way out to exit 75, and the first
    run_here of train.py installs trainkit.startup's recorders: left so, every later subprocess would inherit
    the ignored signals (a W&B service that outlives its run, a worker that never takes SIGTERM) and a later run
    would take over a request kept for an earlier one (exit 75 out of nowhere)."""
    stop_signals = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
    before = {signum: signal.getsignal(signum) for signum in stop_signals}
    yield
    startup = sys.modules.get("trainkit.startup")
    if startup is not None:
        startup.take_over()  # drops a request kept while starting, puts back the handlers it replaced
    for signum, handler in before.items():
        if signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture
def run_train(tmp_path):
    """Run train.py with overrides in a fresh run directory; fail with its stderr if it fails.

    In this process, as `python train.py` would (Hydra, the one-line errors, the exit code): a
    subprocess would pay ~4 s of imports a run. `isolated=True`: in a subprocess, where the process itself is the
    point (a kill, a signal, the environment it starts with); runs of several processes (`distributed=` anything but
    none) always get one, since their workers are processes of their own: torchrun starts the
    `distributed.nproc_per_node=N` the overrides name, or (`self_launched=True`, local_launch's tests) train.py."""
    counter = iter(range(1000))

    def run(
        *overrides: str,
        check: bool = True,
        timeout: int = 300,
        run_dir: Path | None = None,
        isolated: bool = False,
        self_launched: bool = False,
    ) -> TrainRun:
        """`run_dir`: train there (e.g. resume=auto in an existing run), instead of a fresh directory."""
        run_dir = run_dir or tmp_path / f"run{next(counter)}"
        several = any(o.startswith("distributed=") and o != "distributed=none" for o in overrides)
        if isolated or self_launched or several:
            returncode, stdout, stderr = _train_in_a_subprocess(run_dir, overrides, timeout, self_launched)
        else:
            returncode, stdout, stderr = run_here("train.py", f"hydra.run.dir={run_dir}", *overrides)
        if check:
            assert returncode == 0, f"train.py {' '.join(overrides)} failed:\n{stderr[-4000:]}"
        return TrainRun(returncode, stdout, stderr, run_dir)

    return run


def _train_in_a_subprocess(
    run_dir: Path, overrides: tuple[str, ...], timeout: int, self_launched: bool = False
) -> tuple[int, str, str]:
    command = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run_dir}", *overrides]
    processes = [o.split("=", 1)[1] for o in overrides if o.startswith("distributed.nproc_per_node=")]
    if processes and not self_launched:
        command[1:1] = torchrun(int(processes[-1]))[1:]
    # Its own W&B service, as from a fresh shell: a W&B run earlier in this process set WANDB_SERVICE, and through
    # it a killed part's stream would outlive it in this process's service ("run ID ... is in use" on resume).
    environment = {key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"}
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=environment)
    return process.returncode, process.stdout, process.stderr


@pytest.fixture(scope="module")
def one_thread():
    """torch in one thread in this process while a module's tests run (`pytestmark =
    pytest.mark.usefixtures("one_thread")`): a run in this process would spin a thread per core, and beside other
    processes (its own workers, other jobs) take several times as long. One count for all of the module's runs,
    so that their float sums agree as they did."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def stop_handlers_back():
    """A clean stop leaves the stop signals ignored (the process is on its way out, exit 75): this
    test process gets its own handlers back."""

    from trainkit.checkpointing import signals

    before = {s: signal.getsignal(s) for s in signals.STOP_SIGNALS}
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


def torchrun(processes: int) -> list[str]:
    """The command that starts `processes` processes of the script after it on this machine, as torchrun does."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]


def finish(process: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    """What a started process printed and its exit code, once it ended. Past `timeout` seconds it is ended: SIGTERM
    first (torchrun passes it on to its workers), SIGKILL 15 seconds later."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def end_all(processes: list[subprocess.Popen]) -> None:
    """Ends those of `processes` still running (a failed assertion or a timeout before their end) and closes their
    pipes, so that none outlives its test."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
        finish(process, timeout=60)  # those already read: a no-op


def run_here(script: str, *args: str, cwd: Path = ROOT) -> tuple[int, str, str]:
    """`python <script> <args>` in this process: (exit code, stdout, stderr). The script runs as
    `__main__` in `cwd`, as a subprocess would run it, without the seconds of
    imports a fresh interpreter pays. An uncaught error prints its traceback and gives exit code 1,
    as the interpreter does."""
    import contextlib
    import io
    import logging
    import runpy
    import traceback

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    saved_argv, saved_cwd, saved_hydra_config = sys.argv, os.getcwd(), HydraConfig.instance().cfg
    # cli.run writes these into os.environ; each run starts from the test's own values.
    environment = {
        key: os.environ.get(key)
        for key in ("TRAINKIT_LAUNCH_TIME", "HYDRA_FULL_ERROR", "TRAINKIT_SWEEP_ARGV", "TRAINKIT_CONTINUE_WITH")
    }
    # Hydra points the root logger at the run's train.log and this run's output: later tests log elsewhere.
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    stdout, stderr = io.StringIO(), io.StringIO()
    returncode = 0
    sys.argv = [str(ROOT / script), *args]
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                runpy.run_path(str(ROOT / script), run_name="__main__")
            except SystemExit as stop:
                returncode = stop.code if isinstance(stop.code, int) else 1
            except Exception:
                traceback.print_exc()
                returncode = 1
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = saved_hydra_config  # code that asks "inside a Hydra job?" is asked anew
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        for key, value in environment.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return returncode, stdout.getvalue(), stderr.getvalue()


_COMPOSED: dict = {}


def composed(*overrides: str):
    """Hydra's `compose("config", overrides)` against the real conf/, as a fresh copy each call.

    A composition costs 0.1-0.3 s, and the config tests compose hundreds of override sets that
    differ in one value. So the config-group choices (`data=cached`, `experiment=...`) are composed
    by Hydra once a session, and the value overrides (`optimizer.lr=-1`) are applied to a copy of
    that by Hydra's own code for them, which is what `compose` does after composing the groups.
    A composition that fails raises every time."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    values = [o for o in parsed if not _chooses_a_group(o.key_or_group) and not o.is_hydra_override()]
    groups = tuple(o.input_line for o in parsed if o not in values)
    cfg = copy.deepcopy(_composed_groups(groups))
    ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
    return cfg


def _chooses_a_group(key: str) -> bool:
    return "/" in key or "@" in key or (ROOT / "conf" / key).is_dir()


def _composed_groups(overrides: tuple[str, ...]):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if overrides not in _COMPOSED:
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str((ROOT / "conf").resolve()), version_base=None):
                _COMPOSED[overrides] = compose("config", overrides=list(overrides))
        finally:
            GlobalHydra.instance().clear()
    return _COMPOSED[overrides]


def options(group: str) -> list[str]:
    """The options of config group `group` in conf/: each yaml file's name."""
    return sorted(path.stem for path in (ROOT / "conf" / group).glob("*.yaml"))


def made_for(override: str) -> list[str]:
    """What `group=option` is composed with to make a run, read from the options themselves, not from a list
    here: a data option with the options its class says suit it (`Data.suits`, the first of each group) and a
    stand-in for each key it leaves to the command line (`???`: a folder, a file); a model or task option with
    the first data option whose class names it, and what that data brings. Nothing for the rest."""
    from omegaconf import OmegaConf

    from trainkit.data.datasets import data_class

    group, _, option = override.partition("=")
    suiting = {}
    for data in options("data"):
        node = OmegaConf.load(ROOT / "conf" / "data" / f"{data}.yaml")
        missing = [f"data.{key}=/nonexistent/{key}" for key in node if OmegaConf.is_missing(node, key)]
        chosen = {}
        for choice in data_class(node._target_).suits:  # the first option of each group
            chosen.setdefault(choice.partition("=")[0], choice)
        suiting[data] = (data_class(node._target_).suits, [*missing, *chosen.values()])
    if group == "data":
        return suiting[option][1]
    for data, (suits, brings) in suiting.items():
        if override in suits:
            return [f"data={data}", *(choice for choice in brings if not choice.startswith(f"{group}="))]
    return []


def run_record(model, seed: int, averaged=None):
    """train.py's Run around `model` (and `averaged`, an average of its weights: Run.averaged), with the pieces a
    checkpoint saves and restores and a 10-sample training split of 5 batches, for in-process checkpoint round trips."""
    import sys

    import torch
    from omegaconf import OmegaConf

    from trainkit.data import DataBundle, TensorLoader
    from trainkit.distributed.process_group import ProcessInfo
    from trainkit.early_stopping import EarlyStopping

    sys.path.insert(0, str(ROOT))
    import train

    # what load_state_dict reads: the end of the run, and the schedule it rebuilds
    trainer = {
        "limit_train_batches": None,
        "accumulate_grad_batches": 1,
        "max_epochs": 20,
        "max_steps": None,
        "micro_batch_size": None,
    }
    early_stopping = {"enabled": True, "patience": 10}
    cfg = OmegaConf.create(
        {
            "seed": seed,
            "trainer": trainer,
            "scheduler": {"_target_": "trainkit.schedules.constant"},
            "regularization": {"early_stopping": early_stopping},
        }
    )
    run = train.Run(cfg, Path("unused"), ProcessInfo(), torch.device("cpu"))
    loader = TensorLoader(torch.zeros(10, 1, 2, 2), torch.zeros(10, dtype=torch.long), 2, shuffle=False)
    run.data = DataBundle(loader, loader, loader, channels=1, image_size=2, num_classes=2, mean=(0.0,), std=(1.0,))
    run.model, run.averaged, run.resolved_config = model, averaged, {"seed": seed}
    run.optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    run.scheduler = torch.optim.lr_scheduler.LambdaLR(run.optimizer, lambda step: 1.0 / (step + 1))
    run.scaler = torch.amp.GradScaler("cpu", enabled=False)
    run.early_stopping = EarlyStopping("val/loss", "min")
    return run


def pytest_collection_modifyitems(items):
    """Everything under tests/template/ guards the template (README, CONTRIBUTING, style, imports), not
    training: a cloner who changed the model skips it with -m "not template"."""
    template = ROOT / "tests" / "template"
    for item in items:
        if template in Path(item.path).parents:
            item.add_marker(pytest.mark.template)
