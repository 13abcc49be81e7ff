"""Tracks the best value of the monitored metric and decides when training has stopped improving."""


class EarlyStopping:
    """Stop after `patience` epochs without an improvement larger than `min_delta`.

    It also decides which epoch is "best" (for checkpoints/best.pt), so it runs even when
    `enabled` is false; then it just never asks to stop.
    """

    def __init__(
        self, monitor: str, mode: str = "max", patience: int = 10, min_delta: float = 0.0, enabled: bool = True
    ):
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.monitor, self.mode, self.patience, self.min_delta, self.enabled = (
            monitor,
            mode,
            patience,
            min_delta,
            enabled,
        )
        self.best: float | None = None
        self.best_epoch: int | None = None
        self.epochs_without_improvement = 0

    def is_improvement(self, value: float) -> bool:
        if self.best is None:
            return value == value  # NaN is never an improvement
        if self.mode == "max":
            return value > self.best + self.min_delta
        return value < self.best - self.min_delta

    def update(self, value: float, epoch: int) -> bool:
        """Record this epoch's value; return True when it is the new best."""
        improved = self.is_improvement(value)
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
        return {
            "best": self.best,
            "best_epoch": self.best_epoch,
            "epochs_without_improvement": self.epochs_without_improvement,
        }

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_epoch = state["best"], state["best_epoch"]
        self.epochs_without_improvement = state["epochs_without_improvement"]
