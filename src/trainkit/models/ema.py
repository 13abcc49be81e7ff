"""An exponential moving average (EMA) of the weights, evaluated and tested in place of the raw ones.

torch's own `AveragedModel` holds the copy and does the averaging; this module only chooses its
averaging function. With `use_buffers=True` the BatchNorm running statistics are averaged too,
so the EMA model's statistics match its weights. `regularization.ema` in conf/regularization/:

    enabled: false   # evaluate, pick best.pt and test with the EMA weights
    decay: 0.999     # per optimizer update; the average spans about 1 / (1 - decay) updates
    warmup: true     # decay = min(decay, (1 + n) / (10 + n)) at the n-th update, so early weights fade fast

Warm-up goes through the library's hook: `AveragedModel` passes its update count `n_averaged` to
the averaging function, which turns it into that update's decay on the device (no host sync).
Without warm-up the function is torch's `get_ema_multi_avg_fn(decay)` itself. The first update
copies the weights (AveragedModel's rule), so the average starts from the first trained weights.

Order (DESIGN.md, distributed checklist): build the EMA on the device, from weights every rank
agrees on (rank 0's are broadcast first), before compile and the DDP wrap; update it after each
optimizer step from the bare model. Every rank then averages the same weights and holds the same
EMA; BatchNorm statistics, which differ per rank, are averaged across ranks each epoch like the
raw model's. Its `state_dict()` (the averaged model's weights as `module.<name>`, plus
`n_averaged`) goes into checkpoints under `ema`, so a resume continues the average exactly.

Cost on a GPU: AveragedModel keeps `n_averaged` on the CPU and copies it to the device at every
update, a small synchronous copy; the update itself is one foreach lerp over all weights.
"""

import logging
from collections.abc import Callable, Mapping

import torch
from torch import Tensor
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from trainkit.config.schema import flag, number
from trainkit.distributed.process_group import broadcast_weights

log = logging.getLogger(__name__)

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


def restore_ema(ema: AveragedModel | None, state: dict) -> None:
    """Put a checkpoint's EMA back. A checkpoint without one (EMA switched on at a resume) starts
    the average from the resumed weights; a checkpoint's EMA is dropped when EMA is now off."""
    if ema is None:
        if state.get("ema") is not None:
            log.info("regularization.ema.enabled=false: the checkpoint's EMA weights are not used")
        return
    if state.get("ema") is None:
        log.info("the checkpoint has no EMA weights: the EMA starts from the resumed weights")
        ema.module.load_state_dict(state["model"])
        ema.n_averaged.zero_()
        return
    ema.load_state_dict(state["ema"])


def ema_weights(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The bare model's state dict inside a checkpoint's `ema` entry: load it into a plain model,
    `model.load_state_dict(ema_weights(torch.load(path, weights_only=True)["ema"]))`."""
    return {key.removeprefix("module."): value for key, value in state.items() if key.startswith("module.")}
