"""Model FLOPs utilization (train/mfu, CUDA only): the FLOPs a model's training needs for the tokens it
trained a second, over what the GPU can do at its peak bf16 rate (dense tensor cores), as nanoGPT reports it.

    metrics |= mfu_metrics(metrics, model, device)   # an epoch's, in EpochTotals.epoch_metrics (a marked line)
    mfu = model_flops_utilization(tokens_per_sec_per_gpu, flops_per_token(model), device)   # or None

A model says what a token costs with `flops_per_token()` (trainkit.models.gpt.GPT: 6N + 12 L H Q T);
a model without it, a CPU, or a GPU not in PEAK_BF16_FLOPS gets no train/mfu. A feature (docs/features.md):
delete this module and its marked lines, and runs report throughput without it.
"""

import torch
from torch import nn

# Dense bf16 tensor-core peaks, FLOP/s, by a name torch.cuda.get_device_name contains (first match wins).
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A10G": 70e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


def flops_per_token(model: nn.Module) -> float | None:
    """The model's training FLOPs a token, looked up through compile/DDP wrappers; None where it says nothing."""
    for inner in (model, getattr(model, "_orig_mod", None), getattr(model, "module", None)):
        if inner is not None and callable(count := getattr(inner, "flops_per_token", None)):
            return float(count())
    return None


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS.items() if key in name), None)


def model_flops_utilization(tokens_per_sec: float, per_token: float | None, device: torch.device) -> float | None:
    """The fraction of one GPU's peak bf16 FLOP/s that `tokens_per_sec` (this GPU's) of training uses."""
    peak = peak_flops(device)
    return None if per_token is None or peak is None else tokens_per_sec * per_token / peak


def mfu_metrics(metrics: dict, model: nn.Module | None, device: torch.device) -> dict[str, float]:
    """{"train/mfu": ...} for an epoch's `metrics` that hold train/tokens_per_sec (every rank's together), on a GPU
    in PEAK_BF16_FLOPS with a model that counts its FLOPs; {} otherwise."""
    if model is None or "train/tokens_per_sec" not in metrics or device.type != "cuda":
        return {}
    world_size = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    per_gpu = metrics["train/tokens_per_sec"] / world_size
    mfu = model_flops_utilization(per_gpu, flops_per_token(model), device)
    return {} if mfu is None else {"train/mfu": mfu}
