"""How much does the template cost over a hand-written loop? Two ratios, each as the median of
paired ratios with their spread, in process CPU time and in wall time.

- steady state (in this process): epochs of train.py's own `train_one_epoch` on the default run
  (digits, small CNN; progress bar drawn, train/step_loss logged to metrics.jsonl every
  trainer.log_every_n_steps, then the epoch's metrics logged and checkpoints/last.pt + best.pt saved)
  against epochs of a minimal loop over the same model, optimizer, schedule, batches and batch
  transform (forward, loss, backward, step: nothing else). A block is one epoch of each, in
  alternating order (AB, BA, ...), so a load that drifts hits both alike; the block's ratio is
  train.py / minimal. The ratio of the fastest epochs of each is shown too: machine noise only
  ever adds time, so the fastest epoch is the least disturbed one. Before timing, both start from
  the same state for one epoch and must end with the same weights after the same number of
  forward passes and optimizer updates (the same work).
  Target: median ratio <= 1.02.
- whole process (subprocesses): `python train.py` (the default run: 20 epochs, progress bar on a
  pseudo-terminal, metrics.jsonl, checkpoints, summary.json) against scripts/handwritten_digits.py
  (the same training with nothing else), start to exit, in ABBA pairs. Early stopping is switched
  off for train.py, so both train all 20 epochs. Target: median ratio <= 1.10. `--also <checkout>`
  times that checkout's train.py (with its own src/) in the same rotation, e.g. the main branch beside a
  change: on a busy machine, two ratios from separate runs differ by the load, not by the code. The load
  average is printed before and after.

CPU time (this process's, or the finished child's, user + system, all threads) moves far less
with other processes on the machine than wall time does, so it is the figure to trust on a shared
machine; wall time is shown beside it. Both sides run with one thread (OMP_NUM_THREADS=1,
torch.set_num_threads(1)), so CPU time is the time of the work, not of idle spinning threads.

    python scripts/benchmark_overhead.py --blocks 40 --repeats 6
    python scripts/benchmark_overhead.py --blocks 0 --repeats 6 --also ../main   # whole process, before and after
"""

import argparse
import contextlib
import copy
import os
import pty
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def spread(ratios: list[float]) -> str:
    """`median [lower quartile, upper quartile] (min-max, n)` of paired ratios."""
    if len(ratios) < 2:
        return f"{ratios[0]:.3f} (one pair)"
    low, _, high = statistics.quantiles(ratios, n=4)
    return (
        f"{statistics.median(ratios):.3f}  IQR [{low:.3f}, {high:.3f}]  "
        f"min-max {min(ratios):.3f}-{max(ratios):.3f}  ({len(ratios)} pairs)"
    )


def print_ratios(what: str, unit: str, cpu: dict, wall: dict, base: str, target: float, ours: str = "train.py") -> None:
    """One line each for CPU and wall time: both medians, the paired ratios' spread, the fastest ratio."""
    for label, seconds in (("CPU", cpu), ("wall", wall)):
        ratios = [mine / theirs for mine, theirs in zip(seconds[ours], seconds[base])]
        print(
            f"{what}, {label:>4}: median {unit} {base} {statistics.median(seconds[base]):.3f} s, "
            f"{ours} {statistics.median(seconds[ours]):.3f} s; {ours} / {base} per pair: "
            f"{spread(ratios)}; fastest {unit}s: {min(seconds[ours]) / min(seconds[base]):.3f}"
            f"  (target <= {target:.2f})",
            flush=True,
        )


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


def run_on_terminal(command: list[str], cwd: Path = ROOT, env: dict | None = None) -> None:
    """Run `command` with stderr on a pseudo-terminal (drained here), stdout discarded."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=terminal)
    os.close(terminal)
    try:
        while os.read(controller, 65536):
            pass
    except OSError:  # EIO: the process closed the terminal
        pass
    finally:
        os.close(controller)
    if process.wait():
        raise subprocess.CalledProcessError(process.returncode, command)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # children that ended and were waited for
    return usage.ru_utime + usage.ru_stime


def timed_process(
    command: list[str], terminal: bool = False, cwd: Path = ROOT, env: dict | None = None
) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of `command` (in `cwd`, with `env`), start to exit."""
    cpu, wall = children_cpu(), time.perf_counter()
    if terminal:
        run_on_terminal(command, cwd, env)
    else:
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return children_cpu() - cpu, time.perf_counter() - wall


def timed(function: Callable[[], object]) -> tuple[float, float]:
    """(CPU seconds of this process, all threads; wall seconds) of `function()`."""
    cpu, wall = time.process_time(), time.perf_counter()
    function()
    return time.process_time() - cpu, time.perf_counter() - wall


def steady_state(blocks: int, run_dir: Path) -> None:
    import torch
    import torch.nn.functional as F
    from hydra import compose, initialize_config_dir

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    import train
    from trainkit.distributed.process_group import ProcessInfo
    from trainkit.tracking.loggers import build_loggers

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["trainer.max_epochs=1000"])
    torch.manual_seed(0)
    run = train.build_run(cfg, run_dir, ProcessInfo(), torch.device("cpu"))
    run_dir.mkdir(parents=True)
    run.loggers = build_loggers(cfg.logger, run_dir)
    smoothing = cfg.regularization.label_smoothing

    def minimal_epoch() -> None:
        run.model.train()
        for images, labels in run.data.train:
            loss = F.cross_entropy(run.model(run.train_transform(images)), labels, label_smoothing=smoothing)
            run.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            run.optimizer.step()
            run.scheduler.step()

    def train_py_epoch() -> None:
        metrics = train.train_one_epoch(run, show_progress=True)
        run.loggers.log({"epoch": run.state.epoch, "step": run.state.step, **metrics})
        train.save_checkpoints(run, improved=True)
        run.state.batches_done, run.state.epoch = 0, run.state.epoch + 1

    def work(epoch: Callable[[], None]) -> tuple[int, int, list[torch.Tensor]]:
        """(forward passes, optimizer updates, weights after) of one epoch from the same start."""
        calls = {"forward": 0, "update": 0}
        hooks = [
            run.model.register_forward_hook(lambda *_: calls.__setitem__("forward", calls["forward"] + 1)),
            run.optimizer.register_step_post_hook(lambda *_: calls.__setitem__("update", calls["update"] + 1)),
        ]
        run.optimizer.zero_grad(set_to_none=True)  # no gradients left over from the other loop
        epoch()
        for hook in hooks:
            hook.remove()
        return calls["forward"], calls["update"], [p.detach().clone() for p in run.model.parameters()]

    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):  # the progress bar draws here
        start = copy.deepcopy((run.model.state_dict(), run.optimizer.state_dict(), run.scheduler.state_dict()))
        minimal_work = work(minimal_epoch)
        run.model.load_state_dict(start[0])
        run.optimizer.load_state_dict(start[1])
        run.scheduler.load_state_dict(start[2])
        train_work = work(train_py_epoch)
        difference = max((a - b).abs().max().item() for a, b in zip(minimal_work[2], train_work[2]))
        print(
            f"same work, one epoch from the same state: forward passes {minimal_work[0]} / {train_work[0]}, "
            f"updates {minimal_work[1]} / {train_work[1]}, largest weight difference after {difference:.1e}",
            flush=True,
        )
        if minimal_work[:2] != train_work[:2] or difference > 1e-6:
            sys.exit("the two loops do different work: the comparison would mean nothing")

        cpu: dict[str, list[float]] = {"minimal": [], "train.py": []}
        wall: dict[str, list[float]] = {"minimal": [], "train.py": []}
        sides = [("minimal", minimal_epoch), ("train.py", train_py_epoch)]
        for block in range(blocks + 1):
            for name, epoch in sides[:: 1 if block % 2 == 0 else -1]:
                run.optimizer.zero_grad(set_to_none=True)  # the minimal loop leaves its last gradients
                cpu_seconds, wall_seconds = timed(epoch)
                if block:  # the first block warms up
                    cpu[name].append(cpu_seconds)
                    wall[name].append(wall_seconds)
    print_ratios("steady state", "epoch", cpu, wall, base="minimal", target=1.02)


def whole_process(repeats: int, tmp: str, overrides: list[str], also: list[Path]) -> None:
    """ABBA pairs of the hand-written loop and train.py (and each `also` checkout's train.py, in the same rotation)."""
    checkouts = {"train.py": ROOT, **{f"{path.name}/train.py": path for path in also}}
    cpu: dict[str, list[float]] = {name: [] for name in ["handwritten", *checkouts]}
    wall: dict[str, list[float]] = {name: [] for name in ["handwritten", *checkouts]}
    print(f"whole process, {repeats} rounds: {load()}", flush=True)
    for i in range(repeats):
        same_work = "regularization.early_stopping.enabled=false"
        runs = [("handwritten", [sys.executable, "scripts/handwritten_digits.py"], ROOT, False)]
        for name, checkout in checkouts.items():
            command = [sys.executable, "train.py", f"hydra.run.dir={tmp}/run{i}-{len(runs)}", same_work, *overrides]
            runs.append((name, command, checkout, True))
        for name, command, checkout, terminal in runs[:: 1 if i % 2 == 0 else -1]:  # ABBA: a drifting load hits all
            env = {**os.environ, "PYTHONPATH": str(checkout / "src")}  # each checkout its own trainkit
            cpu_seconds, wall_seconds = timed_process(command, terminal, checkout, env)
            cpu[name].append(cpu_seconds)
            wall[name].append(wall_seconds)
        print(
            f"round {i + 1}/{repeats}: "
            + "  ".join(f"{name} CPU {cpu[name][-1]:.2f}s wall {wall[name][-1]:.2f}s" for name in cpu),
            flush=True,
        )
    for name in checkouts:
        print_ratios("whole process", "run", cpu, wall, base="handwritten", target=1.10, ours=name)
    print(f"whole process, after: {load()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=40, help="steady-state blocks (one epoch of each side)")
    parser.add_argument("--repeats", type=int, default=6, help="whole-process pairs (0: steady state only)")
    parser.add_argument("--also", type=Path, action="append", default=[], help="another checkout's train.py too")
    parser.add_argument("overrides", nargs="*", help="extra overrides for train.py (the baseline ignores them)")
    args = parser.parse_args()
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # before torch is imported, here and in every child
    with tempfile.TemporaryDirectory() as tmp:
        if args.blocks:
            steady_state(args.blocks, Path(tmp, "steady"))
        if args.repeats:
            whole_process(args.repeats, tmp, args.overrides, [path.resolve() for path in args.also])


if __name__ == "__main__":
    main()
