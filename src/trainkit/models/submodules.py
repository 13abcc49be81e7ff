"""Find submodules by type and swap one by its dotted name: the two moves that adapting a library
model takes (a new stem convolution, dropout before the classifier, locating the head).

Shared by trainkit.models.build (building), trainkit.models.finetune (heads) and
trainkit.models.pretrained (weights), so that none imports another for them.
"""

from typing import TypeVar

from torch import nn

M = TypeVar("M", bound=nn.Module)


def find_modules(model: nn.Module, kind: type[M]) -> list[tuple[str, M]]:
    """(qualified name, module) of every submodule of `kind`, in registration order."""
    return [(name, module) for name, module in model.named_modules() if isinstance(module, kind)]


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Swap the submodule at the dotted `name` (e.g. "features.0.0") for `new`."""
    parent_name, _, child_name = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child_name, new)
