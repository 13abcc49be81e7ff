"""`model=signal`: a small classifier of 1-D signals of many lengths (audio clips, sensor series), for data whose
batches are dicts {"signal": [B, T] or [B, C, T] zero-padded to the batch's longest, "lengths": [B], "targets": [B]}:
the default task gives the model every key but "targets" (trainkit.tasks.task), so such a data option needs no task
of its own, and is batched by its size budget (Data.size_unit, trainkit.data.size_budget).

Conv1d blocks (GELU) with what lies past each signal's length set to zero before every block, the mean over its real
positions, a linear head. A signal's outputs do not depend on how much its batch pads it: neither on the batch it
lands in nor on how a batch is cut into micro-batches.
"""

import itertools
from typing import ClassVar

import torch
from torch import nn

from trainkit.config.schema import Check, integer


class SignalClassifier(nn.Module):
    config_rules: ClassVar[dict[str, Check]] = {  # what each argument may hold (the config check reads it)
        "in_channels": integer(1),
        "width": integer(1),
        "depth": integer(1),
        "kernel_size": integer(1),
    }

    def __init__(
        self,
        num_classes: int,
        in_channels: int = 1,
        width: int = 32,
        depth: int = 3,
        kernel_size: int = 5,
        dropout: float = 0.0,
    ):
        super().__init__()
        widths = [in_channels] + [width] * depth
        self.blocks = nn.ModuleList(nn.Conv1d(a, b, kernel_size, padding="same") for a, b in itertools.pairwise(widths))
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(width, num_classes))

    @staticmethod
    def example_input(in_channels: int = 1) -> dict[str, torch.Tensor]:  # what forward takes (docs/models.md)
        return {"signal": torch.zeros(1, in_channels, 8), "lengths": torch.tensor([5])}

    def forward(self, signal: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        x = signal.unsqueeze(1) if signal.dim() == 2 else signal  # [B, C, T]
        real = (torch.arange(x.shape[-1], device=x.device) < lengths[:, None]).unsqueeze(1).to(x.dtype)  # [B, 1, T]
        for conv in self.blocks:
            x = nn.functional.gelu(conv(x * real))
        pooled = (x * real).sum(-1) / real.sum(-1).clamp(min=1)  # the mean over the real positions
        return self.head(pooled)
