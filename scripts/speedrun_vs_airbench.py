"""One epoch of experiment=cifar10_speedrun next to one epoch of airbench94's training loop, on one GPU.

Both train on the same CIFAR-shaped data: random uint8 images and labels (50,000 train, 10,000 test)
unless --cifar-root names a folder holding the real cifar-10-batches-py/. Reported per 50,000
training samples, so the two epochs compare the same work (train.py keeps data.val_fraction of the
train set for validation):

- train.py: `experiment=cifar10_speedrun` for --epochs epochs; the epoch time is 50,000 / the median
  train/samples_per_sec of the epochs after the first (warm-up: cuDNN autotuning, allocator).
- airbench94: `airbench.train94(epochs=1)` and `(epochs=1 + --epochs)` after a warm-up call, timed
  with the GPU synchronized; their difference over --epochs is the epoch time, so the set-up both
  calls share (loading the data onto the GPU, building the network, whitening) cancels.

    python scripts/speedrun_vs_airbench.py                 # prints both epoch times and their ratio
    python scripts/speedrun_vs_airbench.py --cifar-root data trainer.compile=true

Needs a CUDA GPU and the `airbench` package (pip install airbench==0.1.8; it imports torchvision).
The goal: train.py's epoch within 1.3x airbench94's. Accuracy is not compared: random data.
"""

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = 50_000
# torchvision checks the real files' md5 sums; the random files pass if they exist.
PATCHED_TRAIN = (
    "import os, runpy, sys, torchvision.datasets.cifar as cifar; "
    "cifar.check_integrity = lambda path, md5=None: os.path.isfile(path); "
    "sys.argv = ['train.py', *sys.argv[1:]]; runpy.run_path('train.py', run_name='__main__')"
)
AIRBENCH = """
import sys, time, torch, airbench
epochs = int(sys.argv[1])
def timed(n):
    torch.cuda.synchronize(); started = time.perf_counter()
    airbench.train94(epochs=n, verbose=False)
    torch.cuda.synchronize(); return time.perf_counter() - started
timed(1)  # warm-up: cuDNN autotuning, allocator
print((timed(1 + epochs) - timed(1)) / epochs)
"""


def write_random_cifar(root: Path, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """cifar-10-batches-py/ under `root` (torchvision's layout) with random pixels and labels."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (SAMPLES + 10_000, 3072), dtype=np.uint8)
    labels = rng.integers(0, 10, SAMPLES + 10_000)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = [f"data_batch_{i + 1}" for i in range(5)] + ["test_batch"]
    for index, name in enumerate(names):
        part = slice(index * 10_000, (index + 1) * 10_000)
        batch = {"data": images[part], "labels": labels[part].tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))
    nhwc = images.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return nhwc[:SAMPLES], labels[:SAMPLES], nhwc[SAMPLES:], labels[SAMPLES:]


def read_cifar(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from torchvision.datasets import CIFAR10

    train, test = CIFAR10(str(root), train=True), CIFAR10(str(root), train=False)
    return train.data, np.array(train.targets), test.data, np.array(test.targets)


def write_airbench_data(folder: Path, arrays: tuple[np.ndarray, ...]) -> None:
    """airbench's CifarLoader reads ./cifar10/{train,test}.pt (it downloads them when missing)."""
    import torch

    folder.mkdir(parents=True)
    classes = [f"class{i}" for i in range(10)]
    for name, images, labels in (("train", arrays[0], arrays[1]), ("test", arrays[2], arrays[3])):
        data = {"images": torch.from_numpy(np.ascontiguousarray(images)), "labels": torch.from_numpy(labels)}
        torch.save({**data, "classes": classes}, folder / f"{name}.pt")


def train_py_epoch_seconds(tmp: Path, data_root: Path, real: bool, epochs: int, overrides: list[str]) -> float:
    run_dir = tmp / "train_py"
    command = [sys.executable, "train.py"] if real else [sys.executable, "-c", PATCHED_TRAIN]
    command += [
        f"hydra.run.dir={run_dir}",
        "experiment=cifar10_speedrun",
        f"data.root={data_root}",
        f"trainer.max_epochs={epochs + 1}",
        "regularization.early_stopping.enabled=false",
        "trainer.progress_bar=false",
        "print_config=false",
        *overrides,
    ]
    subprocess.run(command, cwd=ROOT, check=True)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rates = [m["train/samples_per_sec"] for m in map(json.loads, lines) if "train/samples_per_sec" in m]
    return SAMPLES / statistics.median(rates[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs (after one warm-up epoch)")
    parser.add_argument("--cifar-root", type=Path, help="a folder holding the real cifar-10-batches-py/")
    parser.add_argument("overrides", nargs="*", help="extra train.py overrides, e.g. trainer.compile=true")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("error: no CUDA GPU visible: this compares GPU epoch times (airbench94 runs on CUDA only)")
    try:
        import airbench  # noqa: F401
    except ImportError:
        sys.exit("error: the airbench package is not installed: pip install airbench==0.1.8")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if args.cifar_root:
            data_root, arrays = args.cifar_root.resolve(), read_cifar(args.cifar_root)
        else:
            data_root = tmp / "data"
            arrays = write_random_cifar(data_root)
        write_airbench_data(tmp / "cifar10", arrays)
        ours = train_py_epoch_seconds(tmp, data_root, args.cifar_root is not None, args.epochs, args.overrides)
        started = time.perf_counter()
        output = subprocess.run(
            [sys.executable, "-c", AIRBENCH, str(args.epochs)], cwd=tmp, check=True, capture_output=True, text=True
        )
        theirs = float(output.stdout.strip().splitlines()[-1])
        print(f"airbench94 runs took {time.perf_counter() - started:.1f}s in all")
    print(f"epoch of {SAMPLES:,} samples on {torch.cuda.get_device_name(0)}:")
    print(f"  airbench94 (train94, fp16, its loop):     {theirs:.3f}s")
    print(f"  train.py experiment=cifar10_speedrun:     {ours:.3f}s")
    print(f"  ratio train.py / airbench94: {ours / theirs:.2f}  (goal <= 1.3)")


if __name__ == "__main__":
    main()
