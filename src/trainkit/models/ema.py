"""An exponential moving average (EMA) of the weights, evaluated and tested in place of the raw ones.

A feature (docs/features.md): train.py's lines marked `# feature: ema` build it as `Run.averaged` and update it after
each optimizer step; the core evaluates `Run.averaged` where it exists and keeps it in checkpoints, without naming EMA.
Delete this module, its tests and `regularization.ema`, and the run evaluates its own weights.

torch's own `AveragedModel` holds the copy and does the averaging; this module only chooses its averaging function. With
`use_buffers=True` the BatchNorm running statistics are averaged too, so the EMA model's statistics match its weights.
Its keys (enabled, decay, warmup) are `regularization.ema` in conf/config.yaml, each explained there.

Warm-up goes through the library's hook: `AveragedModel` passes its update count `n_averaged` to the averaging function,
which turns it into that update's decay on the device (no host sync). Without warm-up the function is torch's
`get_ema_multi_avg_fn(decay)` itself. The first update copies the weights (AveragedModel's rule), so the average starts
from the first trained weights.

Order (DESIGN.md, distributed checklist): build the EMA on the device, from weights every rank agrees on (rank 0's are
broadcast first), before compile and the DDP wrap; update it after each optimizer step from the bare model. Every rank
then averages the same weights and holds the same EMA; BatchNorm statistics, which differ per rank, are averaged across
ranks each epoch like the raw model's. Its `state_dict()` (the averaged model's weights as `module.<name>`, plus
`n_averaged`) goes into checkpoints under `averaged` (trainkit/run.py), so a resume continues the average exactly, and
eval.py evaluates those weights (trainkit.checkpointing.averaged_weights).

Cost on a GPU: AveragedModel keeps `n_averaged` on the CPU and copies it to the device at every update, a small
synchronous copy; the update itself is one foreach lerp over all weights.
"""

from collections.abc import Callable, Mapping

import torch
from torch import Tensor
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from trainkit.config.schema import flag, number
from trainkit.distributed.process_group import broadcast_weights

CONFIG_RULES = {  # gathered by the config check: conf/config.yaml's regularization.ema._checks_
    "regularization.ema.enabled": flag(),
    "regularization.ema.decay": number(above=0, below=1),
    "regularization.ema.warmup": flag(),
}


ParamList = tuple[Tensor, ...] | list[Tensor]
MultiAvgFn = Callable[[ParamList, ParamList, Tensor | int], None]


def warmup_decay(decay: float, updates: Tensor | int) -> Tensor | float:
    """The decay of the update after `updates` averaged ones: min(decay, (1 + n) / (10 + n))."""
    if isinstance(updates, Tensor):
        return ((1 + updates) / (10 + updates)).clamp(max=decay)
    return min(decay, (1 + updates) / (10 + updates))


def ema_multi_avg_fn(decay: float, warmup: bool) -> MultiAvgFn:
    """The `multi_avg_fn` for AveragedModel: torch's EMA function, or with `warmup` one whose decay
    ramps up with the update count AveragedModel passes in (a tensor on the weights' device: the
    decay stays a tensor too, since a Python number would wait for the device)."""
    if not warmup:
        return get_ema_multi_avg_fn(decay)

    @torch.no_grad()
    def ema_update(averaged: ParamList, current: ParamList, updates: Tensor | int) -> None:
        if not (torch.is_floating_point(averaged[0]) or torch.is_complex(averaged[0])):
            torch._foreach_copy_(averaged, current)  # integer buffers (BatchNorm's batch count): no average
            return
        weight = 1 - torch.as_tensor(warmup_decay(decay, updates), device=averaged[0].device)
        steps = torch._foreach_sub(current, averaged)  # average += (1 - decay_n) * (current - average)
        torch._foreach_mul_(steps, weight.to(averaged[0].dtype))
        torch._foreach_add_(averaged, steps)

    return ema_update


def build_ema(model: torch.nn.Module, cfg: Mapping) -> AveragedModel | None:
    """The EMA of `model` (bare, already on its device), or None when `cfg.enabled` is false.
    Every rank calls it: rank 0's weights are broadcast first, so all ranks start alike."""
    if not cfg["enabled"]:
        return None
    broadcast_weights(model)  # a no-op in one process; DDP would broadcast them again, harmlessly
    fn = ema_multi_avg_fn(float(cfg["decay"]), bool(cfg["warmup"]))
    return AveragedModel(model, multi_avg_fn=fn, use_buffers=True)


def update_ema(ema: AveragedModel | None, model: torch.nn.Module) -> None:
    """After each optimizer update: the average takes in the bare model's new weights (none kept: nothing)."""
    if ema is not None:
        ema.update_parameters(model)
