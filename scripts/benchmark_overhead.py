"""How much does the template cost over a hand-written loop? Start-to-exit wall time, side by side.

Runs `python train.py` (the default run: digits, small CNN, 20 epochs, progress bar, metrics.jsonl,
checkpoints and summary.json all on) and scripts/handwritten_digits.py (the same work with nothing
else), interleaved so machine noise hits both alike, and prints the median times and their ratio.
Early stopping is switched off for train.py, so both do all 20 epochs: the same work, not less.

    python scripts/benchmark_overhead.py --repeats 5
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wall_time(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="extra overrides for train.py (the baseline ignores them)")
    args = parser.parse_args()
    times = {"handwritten": [], "train.py": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            times["handwritten"].append(wall_time([sys.executable, "scripts/handwritten_digits.py"]))
            run_dir = f"hydra.run.dir={tmp}/run{i}"
            same_work = "regularization.early_stopping.enabled=false"
            times["train.py"].append(wall_time([sys.executable, "train.py", run_dir, same_work, *args.overrides]))
            print(
                f"repeat {i + 1}/{args.repeats}: handwritten {times['handwritten'][-1]:.2f}s  "
                f"train.py {times['train.py'][-1]:.2f}s",
                flush=True,
            )
    baseline, ours = statistics.median(times["handwritten"]), statistics.median(times["train.py"])
    print(f"median handwritten loop: {baseline:.2f}s")
    print(f"median train.py:         {ours:.2f}s")
    print(f"ratio train.py / handwritten: {ours / baseline:.3f}  (target <= 1.15)")


if __name__ == "__main__":
    main()
