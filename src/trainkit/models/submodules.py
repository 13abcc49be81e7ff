"""Find submodules by type, swap one by its dotted name, and find the classifier head: the moves that adapting a
library model takes (a new stem convolution, dropout before the classifier) and that the optimizer's head LR
(`optimizer.head_lr_scale`), Muon and fine-tuning need (which parameters are the head).
"""

from typing import TypeVar

from torch import nn

from trainkit.checkpointing.checkpoint import unwrap_model

M = TypeVar("M", bound=nn.Module)


def find_modules(model: nn.Module, kind: type[M]) -> list[tuple[str, M]]:
    """(qualified name, module) of every submodule of `kind`, in registration order."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, kind)]


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Swap the submodule at the dotted `name` (e.g. "features.0.0") for `new`."""
    parent_name, _, child_name = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child_name, new)


def head_parameters(model: nn.Module) -> set[nn.Parameter]:
    """The parameters of the classifier head (empty if none is found).

    timm models: `model.get_classifier()`; models with a `.head` module (SmallCNN, your own):
    its parameters; anything else (torchvision): the last nn.Linear in registration order.
    """
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
