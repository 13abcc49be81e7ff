"""debug=profile: torch.profiler over a window of training steps, each step's phases labelled.

    python train.py debug=profile                  # -> <run dir>/profile/trace.json, top_ops.txt
    run.timer = profiled_timer(run)                # train.py: the loop's timer, its marks driving the profiler
    close_profiler(run.timer)                      # after the loop: the trace, if training ended in the window

The loop marks each phase of a step on its timer (LoopTimer); ProfiledTimer passes the marks on to a StepProfiler as
`record_function` ranges (rank 0 only). Phases: `data`, `forward`, `backward`, `optimizer_step`, `bookkeeping`. The
schedule skips `wait` steps, traces and drops `warmup` steps, then records `active` steps. Then, once:

- profile/trace.json: a Chrome trace; open it at https://ui.perfetto.dev (or chrome://tracing)
- profile/top_ops.txt: the operators that took the most time (key_averages().table), also logged
- one log line with each phase's share: `data` over a quarter of the step means the loader sets the pace, and the line
  names what helps for the data option (`advice`)

Its data share reads lower than the epoch line's (train/data_wait_fraction): the profiler slows forward and backward.
Off (the default), every call returns at its first line.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainkit.config.schema import Check, flag, integer
from trainkit.tracking.bottleneck import data_bound, data_bound_advice
from trainkit.tracking.timing import LoopTimer

if TYPE_CHECKING:
    from trainkit.run import Run

log = logging.getLogger(__name__)

PHASES = ("data", "forward", "backward", "optimizer_step", "bookkeeping")


class StepProfiler:
    """Profiles steps wait+warmup .. wait+warmup+active-1, counted over the whole run."""

    def __init__(
        self,
        cfg: Mapping | None = None,
        run_dir: Path | None = None,
        device: torch.device | None = None,
        advice: Sequence[str] = (),
    ):
        self.profile: torch.profiler.profile | None = None
        self.advice = list(advice)  # what helps for this data option, when the window is data-bound
        self._label: Any = None  # the open record_function of the current phase
        self.written = False
        if not cfg or not cfg["enabled"] or run_dir is None:
            return
        self.out = run_dir / "profile"
        self.row_limit = int(cfg["row_limit"])
        self.length = int(cfg["wait"]) + int(cfg["warmup"]) + int(cfg["active"])
        self.wait = int(cfg["wait"])
        self.window = (self.wait + int(cfg["warmup"]), self.length - 1)  # the recorded steps, from 0
        self.cuda = device is not None and device.type == "cuda"
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        else:  # a CUDA build of torch on a machine without a GPU: kineto would log a harmless ERROR line
            os.environ.setdefault("KINETO_LOG_LEVEL", "5")
        schedule = torch.profiler.schedule(wait=cfg["wait"], warmup=cfg["warmup"], active=cfg["active"], repeat=1)
        self.profile = torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=self._save)
        self.steps = 0
        self.profile.start()  # no phase yet: an epoch's first batch is start-up, not waiting (as for LoopTimer)

    def phase(self, name: str) -> None:
        """End the current phase and begin `name`."""
        if self.profile is None:
            return
        self._end_phase()
        self._label = torch.profiler.record_function(name)
        self._label.__enter__()

    @property
    def recording(self) -> bool:
        """In a warmup or active step: every operator is recorded, which slows the step's compute."""
        return self.profile is not None and self.steps >= self.wait

    def step(self) -> None:
        """The end of one training step (one batch)."""
        if self.profile is None:
            return
        self._end_phase()
        self.profile.step()
        self.steps += 1
        if self.steps >= self.length:
            self.close()
        else:
            self.phase("data")

    def pause(self) -> None:
        """The epoch's loop has ended: close the last "data" phase, so validation counts in no phase."""
        if self.profile is not None:
            self._end_phase()

    def close(self) -> None:
        """Stop profiling (the trace is written if the window was reached); call at the end of training."""
        if self.profile is None:
            return
        self._end_phase()
        profile, self.profile = self.profile, None
        profile.stop()
        if not self.written:
            log.warning(
                f"profiler: training ended after {self.steps} steps, before the profiled window "
                f"(profiler.wait + warmup + active = {self.length} steps) was complete; lower them or train longer"
            )

    def _end_phase(self) -> None:
        if self._label is not None:
            self._label.__exit__(None, None, None)
            self._label = None

    def _save(self, profile: torch.profiler.profile) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        trace = self.out / "trace.json"
        profile.export_chrome_trace(str(trace))
        averages = profile.key_averages()
        sort_by = "self_device_time_total" if self.cuda else "self_cpu_time_total"
        table = averages.table(sort_by=sort_by, row_limit=self.row_limit)
        (self.out / "top_ops.txt").write_text(table + "\n")
        shares = phase_shares({event.key: event.cpu_time_total for event in averages})
        (self.out / "phases.json").write_text(json.dumps(shares, indent=2) + "\n")
        self.written = True
        log.info(f"profiler: top operators by {sort_by}\n{table}")
        # The steps recorded: the window, or up to the last step when training ended inside it (close()).
        last = min(self.window[1], self.steps if self.profile is not None else self.steps - 1)
        log.info(f"profiler: {describe(shares, (self.window[0], last), self.advice)} -> {trace}")


class ProfiledTimer(LoopTimer):
    """The loop's timer, its marks also driving `profiler` (the epoch's metrics count train/profiled_steps)."""

    def __init__(self, profiler: StepProfiler) -> None:
        super().__init__()
        self.profiler = profiler
        self.profiled_steps = 0  # steps of this epoch inside the profiler's window

    def start_epoch(self, device: torch.device, skip_first: bool = False) -> None:
        super().start_epoch(device, skip_first)
        self.profiled_steps = 0

    def batch_ready(self) -> None:
        super().batch_ready()
        self.profiler.phase("forward")  # the profiler's phase so far: "data" (waiting for the batch, moving it)

    def phase(self, name: str) -> None:
        super().phase(name)
        self.profiler.phase(name)

    def step_done(self) -> None:
        super().step_done()
        if self.profiler.profile is None:
            return
        self.profiled_steps += self.profiler.recording
        self.profiler.step()
        # The profiler's own work here is no wait for data: the next wait is measured from here.
        self.not_waiting()

    def epoch_metrics(self) -> dict[str, float]:
        self.profiler.pause()  # after the loop: what follows (validation) is no phase of a step
        metrics = super().epoch_metrics()
        if self.profiled_steps and "train/data_wait_fraction" in metrics:  # the epoch line names them: the
            metrics["train/profiled_steps"] = self.profiled_steps  # profiler slows these steps' compute
        return metrics

    def close(self) -> None:
        """The end of training: the trace is written if the window was reached (else one warning)."""
        self.profiler.close()


def profiled_timer(run: Run) -> LoopTimer:
    """With profiler.enabled, on rank 0, a ProfiledTimer around the run's; otherwise the run's own timer."""
    cfg = run.cfg
    if not (cfg.profiler.enabled and run.proc.is_main):
        return run.timer
    advice = data_bound_advice(run.data.train, cfg.data, run.device.type == "cuda")
    return ProfiledTimer(StepProfiler(cfg.profiler, run.run_dir, run.device, advice))


def close_profiler(timer: LoopTimer) -> None:
    """train.py's, after the loop: the trace is written if training ended in the window (else one warning)."""
    if isinstance(timer, ProfiledTimer):
        timer.close()


def phase_shares(times: Mapping[str, float]) -> dict[str, float]:
    """Each phase's share of the profiled steps' CPU wall time, from record_function totals by name."""
    total = sum(times.get(name, 0.0) for name in PHASES)
    return {name: times.get(name, 0.0) / total if total else 0.0 for name in PHASES}


def describe(shares: Mapping[str, float], window: tuple[int, int] | None = None, advice: Sequence[str] = ()) -> str:
    """One line: each phase's share in the steps `window` (first, last), the bottleneck with `advice`."""
    steps = f"steps {window[0]}-{window[1]}" if window else "the profiled steps"
    parts = "  ".join(f"{name} {share:.0%}" for name, share in shares.items())
    helps = "; ".join(advice) or "see docs/speed.md#where-the-time-goes"
    verdict = (
        f"data loading is the bottleneck (over a third of the compute time): {helps}"
        if data_bound(shares.get("data", 0.0))
        else "compute-bound (data loading at most a third of the compute time)"
    )
    return (
        f"share of {steps} under the profiler: {parts}; {verdict} (the profiler's per-op recording slows "
        "forward and backward, so data's share reads lower here than on the epoch line, which is the whole epoch)"
    )


# ---- its config checks (gathered by the config check: conf/config.yaml's profiler._checks_) ----

CONFIG_RULES: dict[str, Check] = {
    "profiler.enabled": flag(),
    "profiler.wait": integer(0),
    "profiler.warmup": integer(0),
    "profiler.active": integer(1),
    "profiler.row_limit": integer(1),
}
CONFIG_RELATIONS = ()
