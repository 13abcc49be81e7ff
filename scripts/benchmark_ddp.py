"""DDP scaling: training throughput with 1 and with N processes on the same work.

Each configuration trains `train.py` on the digits for a few epochs (per-process batch fixed, so
N processes do N times the work per step) and reports the global samples/s of the last epoch,
read from metrics.jsonl, and the scaling efficiency = samples/s(N) / (N x samples/s(1)).
On a 2-core CPU machine two processes share two cores, so the number is informative only; on a
multi-GPU machine it is the number to quote.

    python scripts/benchmark_ddp.py --nproc 2
    python scripts/benchmark_ddp.py --nproc 8 model=timm model.name=resnet50 finetune.input_size=224   # on GPUs
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = [
    "finetune.input_size=16",  # the digits resized to 16x16 on the device: more work per sample than 8x8
    "data.batch_size=128",
    "trainer.max_epochs=2",
    "regularization.early_stopping.enabled=false",
    "trainer.progress_bar=false",
]


def samples_per_sec(run_dir: Path, nproc: int, overrides: list[str]) -> float:
    launch = ["distributed=ddp", f"distributed.nproc_per_node={nproc}"] if nproc > 1 else []
    subprocess.run(
        [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *WORK, *launch, *overrides],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in epochs if "train/samples_per_sec" in m][-1]["train/samples_per_sec"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides, e.g. model=timm")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one = samples_per_sec(Path(tmp) / "one", 1, args.overrides)
        many = samples_per_sec(Path(tmp) / "many", args.nproc, args.overrides)
    print(f"1 process:   {one:10,.0f} samples/s")
    print(f"{args.nproc} processes: {many:10,.0f} samples/s")
    print(f"speed-up {many / one:.2f}x, scaling efficiency {many / (args.nproc * one):.0%}")


if __name__ == "__main__":
    main()
