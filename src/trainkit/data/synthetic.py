"""`data=synthetic`: random class-conditional images of any shape, generated in memory, for benchmarks and tests."""

from dataclasses import dataclass
from typing import ClassVar

import torch

from trainkit.config.schema import Check, integer, number
from trainkit.data.datasets import ImageData, Split, Splits


@dataclass(kw_only=True)
class Synthetic(ImageData):
    """Class prototypes plus Gaussian noise, squashed to [0, 1]: learnable, any shape, no files.

    Prototypes are drawn at a quarter of the size and upsampled into smooth blobs, so that a small shift or flip
    keeps a sample in its class, as with real images.
    """

    num_samples: int  # training samples
    val_samples: int
    test_samples: int
    noise: float  # standard deviation, before squashing to [0, 1]
    split_seed: int

    uses_root: ClassVar[bool] = False
    needs_num_classes: ClassVar[bool] = True
    config_rules: ClassVar[dict[str, Check]] = {
        "num_samples": integer(1),
        "val_samples": integer(1),
        "test_samples": integer(1),
        "noise": number(0),
    }

    def splits(self) -> Splits:
        assert self.num_classes is not None, "the config check requires data.num_classes (needs_num_classes)"
        generator = torch.Generator().manual_seed(self.split_seed)
        num_classes, size = self.num_classes, self.image_size
        coarse = torch.randn(num_classes, self.channels, max(1, size // 4), max(1, size // 4), generator=generator)
        prototypes = 2 * torch.nn.functional.interpolate(
            coarse, size=(size, size), mode="bilinear", align_corners=False
        )

        def sample(count: int) -> Split:
            labels = torch.randint(num_classes, (count,), generator=generator)
            noise = torch.randn(prototypes[labels].shape, generator=generator)
            return torch.sigmoid(prototypes[labels] + self.noise * noise), labels

        train, val, test = (sample(count) for count in (self.num_samples, self.val_samples, self.test_samples))
        return Splits(train, val, test, num_classes=num_classes)
