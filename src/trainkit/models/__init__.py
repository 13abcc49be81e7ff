"""Models and what adapts them: `build_model` (any `_target_`: the small CNN, a library's factory, yours),
the input size they take, pretrained weights and freezing for fine-tuning.

train.py imports from here; the modules inside import each other directly."""

from trainkit.models.build import build_model
from trainkit.models.finetune import apply_frozen_bn_eval
from trainkit.models.small_cnn import SmallCNN

__all__ = ["SmallCNN", "apply_frozen_bn_eval", "build_model"]
