"""Models and what adapts them: `build_model` (any `_target_`: the small CNN, timm, torchvision, yours),
the input size they take, pretrained weights, freezing for fine-tuning, and the EMA of the weights.

train.py imports from here; the modules inside import each other directly."""

from trainkit.models.build import build_model
from trainkit.models.ema import build_ema, ema_weights, restore_ema
from trainkit.models.finetune import apply_frozen_bn_eval
from trainkit.models.small_cnn import SmallCNN

__all__ = ["SmallCNN", "apply_frozen_bn_eval", "build_ema", "build_model", "ema_weights", "restore_ema"]
