"""Tracks the best value of the monitored metric and decides when training has stopped improving."""

from dataclasses import dataclass, field

STATE = ("best", "best_epoch", "epochs_without_improvement")  # what a checkpoint keeps


@dataclass
class EarlyStopping:
    """Stop after `patience` epochs without an improvement larger than `min_delta`. It also decides which epoch is
    "best" (for checkpoints/best.pt), so it runs even when `enabled` is false; then it just never asks to stop."""

    monitor: str
    mode: str = "max"
    patience: int = 10
    min_delta: float = 0.0
    enabled: bool = True
    best: float | None = field(default=None, init=False)
    best_epoch: int | None = field(default=None, init=False)
    epochs_without_improvement: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {self.mode!r}")

    def update(self, value: float, epoch: int) -> bool:
        """Record this epoch's value; return True when it is the new best."""
        if self.best is None:
            improved = value == value  # NaN is never an improvement
        elif self.mode == "max":
            improved = value > self.best + self.min_delta
        else:
            improved = value < self.best - self.min_delta
        if improved:
            self.best, self.best_epoch, self.epochs_without_improvement = value, epoch, 0
        else:
            self.epochs_without_improvement += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.enabled and self.epochs_without_improvement >= self.patience

    def stop_line(self) -> str:
        """Why it stops, for the log: 'early stopping: val/acc has not improved for 3 epochs'."""
        epochs = "1 epoch" if self.patience == 1 else f"{self.patience} epochs"
        return f"early stopping: {self.monitor} has not improved for {epochs}"

    def state_dict(self) -> dict:
        return {key: getattr(self, key) for key in STATE}

    def load_state_dict(self, state: dict) -> None:
        for key in STATE:
            setattr(self, key, state[key])
