"""How much does the template cost over a hand-written loop? Two ratios, side by side.

- steady state (in this process): epochs of train.py's own `train_one_epoch` on the default run
  (digits, small CNN; progress bar drawn, train/step_loss logged to metrics.jsonl every
  trainer.log_every_n_steps, then the epoch's metrics logged and checkpoints/last.pt + best.pt saved)
  alternate with epochs of a minimal loop over the same model, optimizer, schedule and batches
  (forward, loss, backward, step: nothing else). Alternating epoch by epoch lets machine noise hit
  both alike. Reported: the ratio of the median epoch times, i.e. of the time per step. Target 1.02.
- whole process (subprocesses): `python train.py` (the default run: 20 epochs, progress bar on a
  pseudo-terminal, metrics.jsonl, checkpoints, summary.json) against scripts/handwritten_digits.py
  (the same work with nothing else), start to exit, interleaved in ABBA order, medians. Early stopping is
  switched off for train.py, so both do all 20 epochs. Target 1.10.

    python scripts/benchmark_overhead.py --repeats 5 --epochs 30
"""

import argparse
import os
import pty
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_on_terminal(command: list[str]) -> None:
    """Run `command` with stderr on a pseudo-terminal (drained here), stdout discarded."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=terminal)
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


def wall_time(command: list[str], terminal: bool = False) -> float:
    started = time.perf_counter()
    if terminal:
        run_on_terminal(command)
    else:
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def steady_state(epochs: int, run_dir: Path) -> tuple[float, float]:
    """Median epoch seconds of (the minimal loop, train.py's epoch + its logging and checkpoints)."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from hydra import compose, initialize_config_dir

    sys.path.insert(0, str(ROOT))
    import train
    from trainkit.distributed import ProcessInfo
    from trainkit.loggers import build_loggers

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
        run.loggers.log({"epoch": run.epoch, "step": run.step, **metrics})
        train.save_checkpoints(run, improved=True)
        run.batches_done, run.epoch = 0, run.epoch + 1

    times: dict[str, list[float]] = {"minimal": [], "train.py": []}
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink):  # the progress bar draws here
        for epoch in range(epochs + 1):
            for name, function in (("minimal", minimal_epoch), ("train.py", train_py_epoch)):
                started = time.perf_counter()
                function()
                if epoch:  # the first epoch of each warms up
                    times[name].append(time.perf_counter() - started)
    return statistics.median(times["minimal"]), statistics.median(times["train.py"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="whole-process runs of each")
    parser.add_argument("--epochs", type=int, default=30, help="steady-state epochs of each")
    parser.add_argument("overrides", nargs="*", help="extra overrides for train.py (the baseline ignores them)")
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"handwritten": [], "train.py": []}
    with tempfile.TemporaryDirectory() as tmp:
        minimal, ours = steady_state(args.epochs, Path(tmp, "steady"))
        print(
            f"steady state: median epoch, minimal loop {minimal * 1000:.1f} ms, train.py {ours * 1000:.1f} ms; "
            f"time per step train.py / minimal: {ours / minimal:.3f}  (target <= 1.02)",
            flush=True,
        )
        for i in range(args.repeats):
            same_work = "regularization.early_stopping.enabled=false"
            command = [sys.executable, "train.py", f"hydra.run.dir={tmp}/run{i}", same_work, *args.overrides]
            runs = [
                ("handwritten", [sys.executable, "scripts/handwritten_digits.py"], False),
                ("train.py", command, True),
            ]
            for name, run_command, terminal in runs[:: 1 if i % 2 == 0 else -1]:  # ABBA: a drifting load hits both
                walls[name].append(wall_time(run_command, terminal))
            print(
                f"repeat {i + 1}/{args.repeats}: handwritten {walls['handwritten'][-1]:.2f}s  "
                f"train.py {walls['train.py'][-1]:.2f}s",
                flush=True,
            )
    baseline, ours = statistics.median(walls["handwritten"]), statistics.median(walls["train.py"])
    print(
        f"whole process: median handwritten {baseline:.2f}s, train.py {ours:.2f}s; "
        f"ratio {ours / baseline:.3f}  (target <= 1.10)"
    )


if __name__ == "__main__":
    main()
