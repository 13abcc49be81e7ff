"""Models that only tests need, importable by `_target_` (the tests put this folder on PYTHONPATH)."""

import json
import os
import signal
import time
from pathlib import Path

import torch
from torch import nn

from trainkit.checkpointing import signals
from trainkit.config.schema import flag
from trainkit.distributed.process_group import process_info
from trainkit.models.small_cnn import SmallCNN

CONFIG_RULES = {"sweep.switch": flag()}  # a feature's checks, as `_checks_: models_for_tests` names them


class NoNormCNN(nn.Module):
    """SmallCNN's shape without BatchNorm: its gradient does not depend on how a batch is split
    across ranks, so 2 processes x B/2 must match 1 process x B."""

    def __init__(self, in_channels: int, num_classes: int, widths=(16, 32), dropout: float = 0.0):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(widths[0], widths[1], 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(widths[1], num_classes),
        )

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


class NanOnRankOne(NoNormCNN):
    """Returns NaN logits on rank 1 only (or on `nan_rank`), at its `nan_at`-th training forward
    pass: a problem that one rank alone sees first (a bad batch, a flaky GPU)."""

    def __init__(self, *args, nan_at: int = 4, nan_rank: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_calls, self.nan_at, self.nan_rank = 0, nan_at, nan_rank

    def forward(self, x):
        logits = super().forward(x)
        if self.training:
            self.train_calls += 1
            if process_info().rank == self.nan_rank and self.train_calls == self.nan_at:
                return logits * float("nan")
        return logits


class HangOnRankOne(NoNormCNN):
    """Stops answering on rank 1 (sleeps `hang_seconds`) at its `hang_at`-th training forward
    pass, as a deadlocked data loader or a stuck GPU would, after writing the time it started
    to `<record_dir>/hang_started`; the other rank then waits in the gradient all-reduce. The
    sleep is finite, so a test that fails leaves no process behind for long, and it ends early
    once a stop is requested (the elastic agent's SIGTERM after rank 0 failed): the job then ends
    without also waiting out the agent's 30 s grace before its SIGKILL."""

    def __init__(self, *args, record_dir: str, hang_at: int = 3, hang_seconds: float = 90.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_calls, self.hang_at, self.hang_seconds = 0, hang_at, hang_seconds
        self.record_dir = Path(record_dir)

    def forward(self, x):
        if self.training:
            self.train_calls += 1
            if process_info().rank == 1 and self.train_calls == self.hang_at:
                (self.record_dir / "hang_started").write_text(str(time.time()))
                deadline = time.monotonic() + self.hang_seconds
                while time.monotonic() < deadline and signals.requested() is None:
                    time.sleep(0.05)
        return super().forward(x)


class PreemptedCNN(SmallCNN):
    """SmallCNN (with BatchNorm) whose rank 0 sends itself SIGTERM, as SLURM's preemption notice, in its
    `preempt_at`-th training forward pass (0: never): the run stops after that update and saves there."""

    def __init__(self, *args, preempt_at: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_calls, self.preempt_at = 0, preempt_at

    def forward(self, x):
        if self.training:
            self.train_calls += 1
            if process_info().rank == 0 and self.train_calls == self.preempt_at:
                os.kill(os.getpid(), signal.SIGTERM)
        return super().forward(x)


class KilledCNN(SmallCNN):
    """SmallCNN that SIGKILLs its own process in its `kill_at`-th training forward pass (0: never), as the OOM
    killer or a node's loss would: no handler, no `finally`, nothing flushed after that moment."""

    def __init__(self, *args, kill_at: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_calls, self.kill_at = 0, kill_at

    def forward(self, x):
        if self.training:
            self.train_calls += 1
            if self.train_calls == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(x)


class RecordingCNN(nn.Module):
    """A small CNN (optionally with one BatchNorm) that writes what its rank sees to
    `<record_dir>/rank<r>.json` after every forward pass, so end-to-end DDP tests can check the
    loop from inside a real `train.py` run:

    - init: a fingerprint of the weights as built (before DDP's broadcast) and one draw from this
      rank's torch RNG stream (taken from a fork, so training draws are unchanged);
    - train (one entry a training forward pass): the weights and the first layer's gradient as
      they are when the pass starts (None after the optimizer zeroed them), the inputs, and the
      BatchNorm running statistics after the pass;
    - eval (one entry an evaluation forward pass): the BatchNorm running statistics in use.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        record_dir: str,
        widths=(16, 32),
        batchnorm: bool = False,
        dropout: float = 0.0,
    ):
        super().__init__()
        first = [nn.Conv2d(in_channels, widths[0], 3, padding=1)] + ([nn.BatchNorm2d(widths[0])] if batchnorm else [])
        self.body = nn.Sequential(
            *first,
            nn.ReLU(),
            nn.Conv2d(widths[0], widths[1], 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(widths[1], num_classes),
        )
        self.bn = self.body[1] if batchnorm else None
        self.path = Path(record_dir) / f"rank{process_info().rank}.json"
        with torch.random.fork_rng(devices=[]):
            draw = torch.rand(1).item()
        self.record = {"init": {"weights": self._weights(), "draw": draw}, "train": [], "eval": []}

    def _weights(self) -> float:
        return sum(p.detach().double().sum().item() for p in self.parameters())

    def _bn_stats(self):
        if self.bn is None:
            return None
        return {"mean": self.bn.running_mean.tolist(), "var": self.bn.running_var.tolist()}

    def forward(self, x):
        if self.training and torch.is_grad_enabled():
            grad = self.body[0].weight.grad
            entry = {
                "weights": self._weights(),
                "grad": None if grad is None else grad.double().sum().item(),
                "inputs": x.detach().double().sum().item(),
            }
            logits = self.body(x)
            self.record["train"].append({**entry, "bn": self._bn_stats()})
        else:
            logits = self.body(x)
            if not self.training:
                self.record["eval"].append({"bn": self._bn_stats()})
        self.path.write_text(json.dumps(self.record))
        return logits


class WithoutDeterministicKernel(NoNormCNN):
    """Raises what torch raises for an op with no deterministic kernel (index_add_ on CUDA, say) when
    deterministic algorithms are on: CPU ops all have one, so a CPU test needs this stand-in."""

    def forward(self, x):
        if torch.are_deterministic_algorithms_enabled():
            raise RuntimeError(
                "index_add_cuda_ does not have a deterministic implementation, but you set "
                "'torch.use_deterministic_algorithms(True)'. You can turn off determinism just for this operation, "
                "or you can use the 'warn_only=True' option, if that's acceptable for your application."
            )
        return super().forward(x)


class TokenTagger(nn.Module):
    """Token ids [B, T] -> a class score a token [B, T, num_classes]: an embedding and a linear layer, each
    token on its own (no normalization over the batch), so how a batch is cut cannot change its gradient."""

    def __init__(self, vocab_size: int, num_classes: int, width: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, tokens):
        return self.head(torch.tanh(self.embed(tokens.long())))


class TableNet(nn.Module):
    """Features [B, F] -> [B, num_classes]: one linear layer, for tabular data."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x):
        return self.linear(x)


class HalvingCNN(NoNormCNN):
    """NoNormCNN that declares a check on its own arguments beside its code, as a model of yours would: the
    config check (trainkit.config.validation) gathers it, with no name of it written there."""

    @staticmethod
    def config_problems(widths):
        if widths[0] % 2:
            yield "model.widths", f"starts at {widths[0]}, but HalvingCNN halves its first width; start at an even one"


class PixelCNN(NoNormCNN):
    """NoNormCNN that declares, as a per-pixel model of yours would, one class per pixel (`spatial_outputs`) and what
    its input's side must be divisible by (`input_size_multiple`): the config check reads both from the class."""

    spatial_outputs = True

    @staticmethod
    def input_size_multiple(widths=(16, 32)):
        return 2 ** len(widths)


class RenamedWithoutItsCheck(HalvingCNN):
    """HalvingCNN with `widths` renamed `channels` in the constructor but not in the check it inherits."""

    def __init__(self, in_channels: int, num_classes: int, channels=(16, 32), dropout: float = 0.0):
        super().__init__(in_channels, num_classes, channels, dropout)


class DownloadingCNN(NoNormCNN):
    """NoNormCNN that can load weights of its own (`pretrained`), as a library's model would, and says so beside
    its code (`own_weights`): the config check refuses finetune.pretrained_path beside it."""

    def __init__(self, in_channels: int, num_classes: int, widths=(16, 32), dropout: float = 0.0, pretrained=False):
        super().__init__(in_channels, num_classes, widths, dropout)

    @staticmethod
    def own_weights(pretrained=False):
        return "model.pretrained" if pretrained is True else None


class PreemptedAt:
    """A model mixin: rank 0 sends itself SIGTERM in its `preempt_at`-th training forward pass (0: never)."""

    def __init__(self, *args, preempt_at: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.train_calls, self.preempt_at = 0, preempt_at

    def forward(self, *inputs, **named_inputs):  # any model's inputs: a recipe's two views, a signal and its lengths
        if self.training:
            self.train_calls += 1
            if process_info().rank == 0 and self.train_calls == self.preempt_at:
                os.kill(os.getpid(), signal.SIGTERM)
        return super().forward(*inputs, **named_inputs)


def preempted_model(builds: str, preempt_at: int = 0, **arguments):
    """The model the function `builds` names makes of `arguments` (model=hf's create_hf_model: a model whose class
    a library picks), rank 0 sending itself SIGTERM in its `preempt_at`-th training forward pass (0: never), as
    PreemptedAt does."""
    from hydra.utils import get_method

    model = get_method(builds)(**arguments)
    calls = [0]

    def count(module, inputs):
        if module.training:
            calls[0] += 1
            if process_info().rank == 0 and calls[0] == preempt_at:
                os.kill(os.getpid(), signal.SIGTERM)

    model.register_forward_pre_hook(count)
    return model


class LengthsNet(nn.Module):
    """A dict batch's model, two inputs: signals [B, T] zero-padded and their lengths [B] -> [B, num_classes].
    What lies past a signal's length is masked out, and each position has its own weights (no normalization over
    the batch), so neither the padding nor how a batch is cut can change a signal's outputs."""

    def __init__(self, max_length: int, num_classes: int):
        super().__init__()
        self.max_length = max_length
        self.linear = nn.Linear(max_length, num_classes)

    def forward(self, signal, lengths):
        real = torch.arange(signal.shape[1], device=signal.device) < lengths[:, None]
        return self.linear(nn.functional.pad(signal * real, (0, self.max_length - signal.shape[1])))


class WithAuxiliaryOutput(NoNormCNN):
    """NoNormCNN returning (logits, aux): aux is the mean square of its pooled features, an intermediate
    activation, for a task to add as an auxiliary loss."""

    def forward(self, x):
        features = self.body[:-1](x)
        return self.body[-1](features), features.pow(2).mean()


class ImageAndCaption(nn.Module):
    """Two inputs by name, an image batch [B, C, H, W] and a caption's byte ids [B, T] -> [B, num_classes]: the
    model of an image + text dict batch (file_data_for_tests.CaptionedDigits)."""

    def __init__(self, in_channels: int, num_classes: int):
        super().__init__()
        self.image = SmallCNN(in_channels, num_classes, widths=(16, 32))
        self.caption = nn.EmbeddingBag(256, num_classes)

    def forward(self, image, caption):
        return self.image(image) + self.caption(caption.long())
