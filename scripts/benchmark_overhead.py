"""How much does the template cost over a hand-written loop? Two ratios, side by side.

Runs `python train.py` (the default run: digits, small CNN, 20 epochs, progress bar, metrics.jsonl,
checkpoints and summary.json all on) and scripts/handwritten_digits.py (the same work with nothing
else), interleaved so machine noise hits both alike, and prints:

- steady state: time per training step, from each epoch's training samples/s after the first
  (train/samples_per_sec in metrics.jsonl; the baseline prints its own), median over epochs, then
  over repeats. train.py runs with its stderr on a pseudo-terminal, so the progress bar is drawn
  as in an interactive run (it is off when stderr is not a terminal). Target: within 2%.
- whole process: start-to-exit wall time, median over repeats: imports, Hydra, validation,
  per-epoch evaluation, logging and checkpoints, the test and summary.json. Target: within 1.10x.

Early stopping is switched off for train.py, so both do all 20 epochs: the same work, not less.

    python scripts/benchmark_overhead.py --repeats 5
"""

import argparse
import json
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


def handwritten() -> tuple[float, float]:
    """(wall seconds, median training samples/s over epochs after the first)."""
    started = time.perf_counter()
    output = subprocess.run(
        [sys.executable, "scripts/handwritten_digits.py"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    wall = time.perf_counter() - started
    rates = json.loads(output.strip().splitlines()[-1])["train/samples_per_sec"]
    return wall, statistics.median(rates[1:])


def train_py(run_dir: Path, overrides: list[str]) -> tuple[float, float]:
    command = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", "regularization.early_stopping.enabled=false"]
    started = time.perf_counter()
    run_on_terminal([*command, *overrides])
    wall = time.perf_counter() - started
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rates = [m["train/samples_per_sec"] for m in map(json.loads, lines) if "train/samples_per_sec" in m]
    return wall, statistics.median(rates[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="extra overrides for train.py (the baseline ignores them)")
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"handwritten": [], "train.py": []}
    rates: dict[str, list[float]] = {"handwritten": [], "train.py": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for name, result in (
                ("handwritten", handwritten()),
                ("train.py", train_py(Path(tmp, f"run{i}"), args.overrides)),
            ):
                walls[name].append(result[0])
                rates[name].append(result[1])
            print(
                f"repeat {i + 1}/{args.repeats}: wall handwritten {walls['handwritten'][-1]:.2f}s  "
                f"train.py {walls['train.py'][-1]:.2f}s;  samples/s handwritten {rates['handwritten'][-1]:,.0f}  "
                f"train.py {rates['train.py'][-1]:,.0f}",
                flush=True,
            )
    step_ratio = statistics.median(rates["handwritten"]) / statistics.median(rates["train.py"])
    per_repeat = [h / t for h, t in zip(rates["handwritten"], rates["train.py"])]
    wall_ratio = statistics.median(walls["train.py"]) / statistics.median(walls["handwritten"])
    print(
        f"steady state, time per step train.py / handwritten: {step_ratio:.3f} (per repeat: "
        f"{', '.join(f'{r:.3f}' for r in per_repeat)})  target <= 1.02"
    )
    print(
        f"whole process: median handwritten {statistics.median(walls['handwritten']):.2f}s, "
        f"train.py {statistics.median(walls['train.py']):.2f}s, ratio {wall_ratio:.3f}  target <= 1.10"
    )


if __name__ == "__main__":
    main()
