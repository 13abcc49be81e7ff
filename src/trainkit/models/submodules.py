"""Find submodules by type (adapting a library's model: its stem, its classifier), and find the classifier head's
parameters (optimizer.head_lr_scale's, which Muon and fine-tuning read)."""

from typing import TypeVar

from torch import nn

from trainkit.checkpointing.checkpoint import unwrap_model

M = TypeVar("M", bound=nn.Module)


def find_modules(model: nn.Module, kind: type[M]) -> list[tuple[str, M]]:
    """(qualified name, module) of every submodule of `kind`, in registration order."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, kind)]


def head_parameters(model: nn.Module) -> set[nn.Parameter]:
    """The classifier head's parameters (empty if none is found): timm's `model.get_classifier()`, else a `.head`
    module's (SmallCNN, your own), else (torchvision) the last nn.Linear's in registration order."""
    model = unwrap_model(model)
    if hasattr(model, "get_classifier"):
        # nn.Module's stubs type any other attribute as Tensor | Module (its __getattr__); this is timm's method.
        head = model.get_classifier()  # type: ignore[operator]
    elif isinstance(getattr(model, "head", None), nn.Module):
        head = model.head
    else:
        linears = find_modules(model, nn.Linear)
        head = linears[-1][1] if linears else None
    return set(head.parameters()) if isinstance(head, nn.Module) else set()
