"""Models: `build_model` (any `_target_`: the small CNN, a library's factory, yours). The modules inside import each
other directly."""

from trainkit.models.build import build_model
from trainkit.models.small_cnn import SmallCNN

__all__ = ["SmallCNN", "build_model"]
