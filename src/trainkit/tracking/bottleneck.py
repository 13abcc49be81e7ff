"""The bottleneck report: the epoch line's timing extras, and one warning per run when data is the limit.

The rule of thumb, the articles' (docs/speed.md#the-loader-rules): when loading takes more than a
third of the compute time (wait / (step - wait) > 1/3, that is train/data_wait_fraction > 1/4),
faster hardware or a bigger model would not train faster; the loader would. The warning names the
switches that help for the data option in use, with their current values, instead of generic
advice; the worker count it names follows the articles' steps: the cores, then 1.5x, at most 2x.
"""

import logging
import math

from omegaconf import DictConfig
from torch.utils.data import DataLoader

from trainkit.data.datasets import data_class
from trainkit.runtime import MAX_WORKERS_PER_CORE, RAISE, this_rank_cores
from trainkit.tracking.timing import LoopTimer

log = logging.getLogger("train")

GPU_STARVED = 0.5  # train/gpu_util below this: the GPU waits
LOADING_LIMIT = 1 / 3  # loading over compute time


def more_workers(workers: int, cores: int) -> int | None:
    """The next worker count up from `workers`: the cores, then 1.5x, at most 2x; None at the ceiling."""
    ceiling = MAX_WORKERS_PER_CORE * cores
    if workers >= ceiling:
        return None
    return cores if workers < cores else min(math.ceil(RAISE * workers), ceiling)


def loading_per_compute(wait_share: float) -> float:
    """Loading time over compute time, wait / (step - wait), from train/data_wait_fraction."""
    return wait_share / (1 - wait_share) if wait_share < 1 else math.inf


def data_bound(wait_share: float) -> bool:
    """Whether loading took over a third of the compute time."""
    return loading_per_compute(wait_share) > LOADING_LIMIT


def epoch_line_extras(metrics: dict) -> str:
    """e.g. `  data 12% of 3.1 ms/step  cpu 85%` or `  data 40% of 9.8 ms/step  gpu 55%  mem 12.3 GiB`:
    each part after two spaces, as in the rest of the epoch line; empty when nothing was measured."""
    parts = []
    if "train/data_wait_fraction" in metrics:
        profiled = metrics.get("train/profiled_steps")
        # The whole epoch's share; the profiler's line gives its window's, where recording slows the compute.
        over = f" (the epoch, {profiled:.0f} of its steps under the profiler)" if profiled else ""
        parts.append(f"data {metrics['train/data_wait_fraction']:.0%} of {metrics['train/step_ms']:.1f} ms/step{over}")
    if "train/gpu_util" in metrics:
        parts.append(f"gpu {metrics['train/gpu_util']:.0%}")
    if "train/peak_memory_gb" in metrics:
        parts.append(f"mem {metrics['train/peak_memory_gb']:.1f} GiB")
    if "train/cpu_util" in metrics:
        parts.append(f"cpu {metrics['train/cpu_util']:.0%}")
    return "".join(f"  {part}" for part in parts)


def data_bound_advice(loader: object, data: DictConfig, on_cuda: bool, gpu_util: float | None = None) -> list[str]:
    """The switches that shorten the wait for this data option, each with its current value;
    `gpu_util`: the epoch's train/gpu_util, where it was measured."""
    torch_loader = getattr(loader, "loader", None)  # a FileLoader's DataLoader
    if not isinstance(torch_loader, DataLoader):  # in memory: batches are slices of a tensor on the device
        advice = [
            f"{data.name} is held in memory on the device, so workers and pinned memory do not apply: the wait is "
            f"the per-batch gather, large next to a step this short; raise data.batch_size (now {data.batch_size})"
        ]
        from trainkit.data.cache import cache_advice  # feature: cache

        advice += cache_advice(data, in_memory=True)  # feature: cache
        return advice
    workers = torch_loader.num_workers
    advice = [worker_advice(workers, this_rank_cores(), on_cuda, gpu_util)]
    if workers > 0 and (torch_loader.prefetch_factor or 0) < 4:
        advice.append(f"data.prefetch_factor=4 (now {torch_loader.prefetch_factor}) evens out slow batches")
    if on_cuda and not torch_loader.pin_memory:
        advice.append("pinned memory: data.pin_memory=true (asynchronous host-to-device copies)")
    if getattr(data_class(data._target_), "decodes_images", False):  # text, or a data kind of yours: no images
        from trainkit.data.cache import cache_advice  # feature: cache

        advice += cache_advice(data, in_memory=False)  # feature: cache
        advice.append(f"a smaller data.image_size (now {data.image_size}): less to decode, resize and copy")
    return advice


def worker_advice(workers: int, cores: int, on_cuda: bool, gpu_util: float | None = None) -> str:
    """The articles' next worker count for a rank that may use `cores` cores: the cores while below
    them; on CUDA then 1.5x, never above 2x the cores. On the CPU the training itself needs the
    cores, so workers beyond them would only take time from the step."""
    more = more_workers(workers, cores)
    if more is not None and workers < cores:
        return (
            f"more decoding workers: data.num_workers={more} (now {workers}; the articles start at the cores: {more})"
        )
    if more is not None and on_cuda:
        raised = math.ceil(RAISE * workers)
        step = (
            "1.5x" if more == raised else f"not 1.5x ({raised}): 2x the cores ({cores}) is the most the articles go to"
        )
        starved = gpu_util is not None and gpu_util < GPU_STARVED
        why = f"the GPU was busy {gpu_util:.0%} of the time, under 50%" if starved else "loading is too slow"
        return f"more decoding workers: data.num_workers={more} (now {workers}, {step}; {why})"
    if on_cuda:
        return f"the {workers} workers are 2x the cores ({cores}) or more, the articles' ceiling: decoding is the limit"
    return (
        f"the {workers} workers are as many as the cores ({cores}) or more, and training on the CPU needs the cores "
        "too: decoding is the limit"
    )


def warn_if_data_bound(timer: LoopTimer, metrics: dict, loader: object, data: DictConfig) -> None:
    """Rank 0, after each epoch: the warning, the first time an epoch of the run waited too long."""
    fraction = metrics.get("train/data_wait_fraction", 0.0)
    if timer.warned_data_bound or not data_bound(fraction):
        return
    timer.warned_data_bound = True
    lines = data_bound_advice(loader, data, timer.cuda, metrics.get("train/gpu_util"))
    advice = "".join(f"\n  - {line}" for line in lines)
    log.warning(
        f"data-bound: loading took {loading_per_compute(fraction):.0%} of the compute time (the step waited for "
        f"its batch {fraction:.0%} of the time); rule of thumb: at most a third of the compute time, a quarter "
        f"of the step (train/data_wait_fraction in metrics.jsonl). What helps for data={data.name}:{advice}"
    )
