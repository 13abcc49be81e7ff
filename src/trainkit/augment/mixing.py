"""MixUp and CutMix of a training batch on the device, with soft targets.

    inputs, targets = mix(transformed_images, labels)  # targets: [B, num_classes] probabilities
    loss = loss_fn(logits, targets)                    # CrossEntropyLoss takes soft targets
    correct = logits.argmax(1) == labels               # accuracy stays against the hard label

`torchvision.transforms.v2.MixUp` / `CutMix` (one Beta(alpha, alpha) draw per batch, the batch
mixed with itself rolled by one; with both alphas set, one of the two is chosen per batch). Their
random draws come from torch's CPU RNG, seeded with seed + rank: deterministic under the seed,
different on every rank, and no host-device synchronisation.

Label smoothing still applies: CrossEntropyLoss(label_smoothing=e) with probability targets uses
targets * (1 - e) + e / num_classes, as it does for class indices. Evaluation never mixes.
"""

from collections.abc import Callable, Mapping

from torch import Tensor


class LabelMixing:
    """(images, int64 labels [B]) -> (mixed images, float targets [B, C]); the batch as it is when
    `augmentation` sets neither mixup_alpha nor cutmix_alpha."""

    def __init__(self, augmentation: Mapping | None = None, num_classes: int = 0):
        options = dict(augmentation or {})
        mixup, cutmix = float(options.get("mixup_alpha") or 0), float(options.get("cutmix_alpha") or 0)
        self.transform: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None
        self.enabled = bool(mixup or cutmix)
        if not self.enabled:
            return
        from torchvision.transforms import v2  # costs seconds: only when mixing is on

        choices = []
        if mixup:
            choices.append(v2.MixUp(alpha=mixup, num_classes=num_classes))
        if cutmix:
            choices.append(v2.CutMix(alpha=cutmix, num_classes=num_classes))
        self.transform = choices[0] if len(choices) == 1 else v2.RandomChoice(choices)

    def __call__(self, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        if self.transform is None:
            return images, labels
        return self.transform(images, labels)
