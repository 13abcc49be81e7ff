"""Where an epoch's time goes: waiting for the next batch vs the rest of the step, measured without a host-device
synchronisation per step; plus peak memory and CPU or GPU utilization.

    timer = LoopTimer()                    # once a run
    timer.start_epoch(device)              # before the loop
    for images, labels in loader:          # waiting: blocked in the loader's __next__ ...
        images = images.to(device, non_blocking=True)   # ... and the host-to-device copy
        timer.batch_ready()                # the waiting ends, the step begins
        ...                                # the rest of the step, in phases: timer.phase("backward"), ...
        timer.step_done()
    timer.epoch_metrics()                  # after the loop (which ends with a sync of its own)

Phases are not timed here: they are names for a timer that does more with them (trainkit.tracking.profiling).

On the CPU (and, approximately, MPS) the host's wall clock measures: from a step's end to the next batch on the device
is waiting. On CUDA the host runs ahead of the GPU, so two CUDA events per step are recorded (no sync): `ready` after
the copy, `done` at the step's end; done(i-1) -> ready(i) on the GPU's clock is the waiting. Events are summed as they
complete (Event.query()); the last is waited for at epoch end. The wait for an epoch's first batch (worker start-up) is
left out.

    train/data_wait_fraction = waiting / (waiting + step time)     (0..1)
    train/step_ms            = (waiting + step time) / steps       (milliseconds)
    train/peak_memory_gb     CUDA: torch.cuda.max_memory_allocated during the training pass, GiB
    train/gpu_util           CUDA with pynvml: torch.cuda.utilization() sampled about once a second, 0..1
    train/cpu_util           CPU: this process's CPU time (all its threads; DataLoader workers are other
                             processes and not counted) / wall time / cores available to it, 0..1
"""

import importlib.util
import time
from collections import deque

import torch

from trainkit.runtime import available_cores

GPU_UTIL_EVERY_SECONDS = 1.0  # NVML averages over its own sample period (1/6 s to 1 s)


def can_read_gpu_util() -> bool:
    """torch.cuda.utilization() asks NVML through pynvml (nvidia-ml-py), an optional package (on ROCm, amdsmi)."""
    return importlib.util.find_spec("amdsmi" if torch.version.hip else "pynvml") is not None


class LoopTimer:
    """The per-epoch measure above, for one run."""

    def __init__(self) -> None:
        self.warned_data_bound = False  # trainkit.tracking.bottleneck warns once a run
        self.read_gpu_util: bool | None = None  # known at the first CUDA epoch

    def start_epoch(self, device: torch.device, skip_first: bool = False) -> None:
        """Reset the sums; `skip_first`: leave the first step out (torch.compile compiles in it)."""
        self.device, self.cuda, self.skip_first = device, device.type == "cuda", skip_first
        self.first_batch = True
        if self.read_gpu_util is None:
            self.read_gpu_util = self.cuda and can_read_gpu_util()
        self.gpu_util_samples: list[float] = []
        self._restart()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def _restart(self) -> None:
        self.waiting = self.stepping = 0.0  # seconds
        self.steps = 0
        self.wall_start = self.last_sample = self.mark = time.perf_counter()
        self.cpu_start = time.process_time()
        self.events: deque[torch.cuda.Event] = deque()  # done(i-1), ready(i), done(i), ... not yet summed
        if self.cuda:
            self.events.append(self._record())

    def _record(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))  # the stream the step's work is queued on
        return event

    def batch_ready(self) -> None:
        """The step's batch is on the device (its copy queued): the waiting ends here."""
        first, self.first_batch = self.first_batch, False
        if first:  # the CPU use too is measured from the first batch on
            self.wall_start, self.cpu_start = time.perf_counter(), time.process_time()
        if self.cuda:
            ready = self._record()
            if first:  # start-up, not waiting: measure from here, with a wait of zero
                self.events = deque([ready])
            self.events.append(ready)
        else:
            now = time.perf_counter()
            self.waiting += 0.0 if first else now - self.mark
            self.mark = now

    def phase(self, name: str) -> None:
        """A phase of the step begins: not timed here (see the module docstring)."""

    def step_done(self) -> None:
        """Everything the step does is queued (or, off CUDA, done)."""
        if self.skip_first:  # compile + first step: measured from here on
            self.skip_first = False
            self._restart()
            return
        self.steps += 1
        if self.cuda:
            self.events.append(self._record())
            self._sum_finished_events()
            now = time.perf_counter()
            if self.read_gpu_util and now - self.last_sample >= GPU_UTIL_EVERY_SECONDS:
                self._sample_gpu_util()
                self.last_sample = now
        else:
            now = time.perf_counter()
            self.stepping += now - self.mark
            self.mark = now

    def not_waiting(self) -> None:
        """What ran since the step's end was no wait for data: the wait is measured from here."""
        if self.cuda:
            self.events[-1] = self._record()
        else:
            self.mark = time.perf_counter()

    def _sum_finished_events(self, wait: bool = False) -> None:
        events = self.events
        if wait and events:
            events[-1].synchronize()  # once an epoch
        while len(events) >= 3 and events[2].query():  # done(i-1), ready(i), done(i) all finished
            done_before, ready = events.popleft(), events.popleft()
            self.waiting += done_before.elapsed_time(ready) / 1000  # milliseconds on the GPU's clock
            self.stepping += ready.elapsed_time(events[0]) / 1000

    def _sample_gpu_util(self) -> None:
        try:
            self.gpu_util_samples.append(torch.cuda.utilization(self.device) / 100)
        except Exception:  # no NVML driver library, an unsupported device: omit the metric, train on
            self.read_gpu_util = False

    def epoch_metrics(self) -> dict[str, float]:
        """The epoch's measures under their metric names (see the module docstring)."""
        wall = time.perf_counter() - self.wall_start
        metrics = {}
        if self.cuda:
            self._sum_finished_events(wait=True)
            if self.read_gpu_util and not self.gpu_util_samples:  # an epoch shorter than the sampling interval
                self._sample_gpu_util()
            if self.gpu_util_samples:
                metrics["train/gpu_util"] = sum(self.gpu_util_samples) / len(self.gpu_util_samples)
            metrics["train/peak_memory_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        elif self.device.type == "cpu":
            metrics["train/cpu_util"] = (time.process_time() - self.cpu_start) / max(wall, 1e-9) / available_cores()
        total = self.waiting + self.stepping
        if self.steps == 0 or total <= 0:
            return metrics
        return {"train/data_wait_fraction": self.waiting / total, "train/step_ms": 1000 * total / self.steps, **metrics}
