"""Models that only tests need, importable by `_target_` (the tests put this folder on PYTHONPATH)."""
import torch
from torch import nn

from trainkit.distributed import process_info


class NoNormCNN(nn.Module):
    """SmallCNN's shape without BatchNorm: its gradient does not depend on how a batch is split
    across ranks, so 2 processes x B/2 must match 1 process x B."""

    def __init__(self, in_channels: int, num_classes: int, widths=(16, 32), dropout: float = 0.0):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(widths[0], widths[1], 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(widths[1], num_classes))

    def forward(self, x):
        return self.body(x)


class CrashOnRankOne(NoNormCNN):
    """Raises on rank 1 after a few forward passes, as a bug or a lost GPU would."""

    def __init__(self, *args, crash_after: int = 3, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.crash_after = 0, crash_after

    def forward(self, x):
        self.calls += 1
        if process_info().rank == 1 and self.calls > self.crash_after:
            raise RuntimeError("simulated crash on rank 1")
        return super().forward(x)
