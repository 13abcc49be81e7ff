"""The baseline for scripts/benchmark_overhead.py: a minimal hand-written loop doing the same work as
`python train.py` with no arguments (digits split 70/10/20, 3-conv CNN with BatchNorm, batch 64,
SGD + Nesterov, 1-epoch warmup then cosine, label smoothing 0.1, 20 epochs, validation every epoch,
test at the end). No framework, no logging, no checkpoints: the floor we compare against.
The digits are read from the file scikit-learn ships, as train.py reads them (trainkit.data.datasets.read_digits):
`sklearn.datasets.load_digits()` would add scikit-learn's import (about 1.2 s of CPU) to this side alone.
"""

import importlib.util
import math
import time
from pathlib import Path

started = time.perf_counter()
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.manual_seed(0)
sklearn = importlib.util.find_spec("sklearn")  # where the package is, without importing it
table = np.loadtxt(Path(sklearn.submodule_search_locations[0], "datasets", "data", "digits.csv.gz"), delimiter=",")
images = torch.tensor(table[:, :-1], dtype=torch.float32).reshape(-1, 1, 8, 8) / 16  # a row: 64 pixels, the label
labels = torch.tensor(table[:, -1]).long()
order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
n_test, n_val = round(0.2 * len(labels)), round(0.1 * len(labels))
test_idx, val_idx, train_idx = order[:n_test], order[n_test : n_test + n_val], order[n_test + n_val :]
images = (images - 0.305) / 0.376


def block(c_in, c_out):
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]


model = nn.Sequential(
    *block(1, 32),
    *block(32, 64),
    nn.MaxPool2d(2),
    *block(64, 128),
    nn.AdaptiveAvgPool2d(1),
    nn.Flatten(),
    nn.Linear(128, 10),
)
decay = [p for p in model.parameters() if p.ndim >= 2]
no_decay = [p for p in model.parameters() if p.ndim < 2]
optimizer = torch.optim.SGD(
    [{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0}],
    lr=0.1,
    momentum=0.9,
    nesterov=True,
)
epochs, batch = 20, 64
steps_per_epoch = math.ceil(len(train_idx) / batch)
total, warmup = epochs * steps_per_epoch, steps_per_epoch
schedule = lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup)))  # noqa: E731
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def evaluate(idx):
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model(images[idx[i : i + 512]]) for i in range(0, len(idx), 512)])
    return (logits.argmax(1) == labels[idx]).float().mean().item()


for _epoch in range(epochs):
    model.train()
    perm = train_idx[torch.randperm(len(train_idx))]
    for i in range(0, len(perm), batch):
        idx = perm[i : i + batch]
        loss = F.cross_entropy(model(images[idx]), labels[idx], label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
    val_acc = evaluate(val_idx)
print(f"val/acc {val_acc:.4f} test/acc {evaluate(test_idx):.4f} in {time.perf_counter() - started:.1f}s")
