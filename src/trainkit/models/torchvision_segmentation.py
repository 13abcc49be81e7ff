"""torchvision's semantic segmentation models by name: images [B, C, H, W] -> per-pixel class logits [B, num_classes, H,
W], as the segmentation task expects.

    model = TorchvisionSegmentation("lraspp_mobilenet_v3_large", in_channels=3, num_classes=4)

torchvision's models return a dict ({"out": logits, "aux": ...}); the loop, the task and the finders take a tensor, so
this wrapper returns `["out"]` and builds the model without its auxiliary head (`aux_loss=False`: nothing would train
it). The models are randomly initialized (weights=None, weights_backbone=None: nothing is downloaded); start from your
own weights with finetune.pretrained_path. The first convolution is rebuilt when the data has other than 3 channels.
`python -c "import torchvision; print(torchvision.models.list_models(module=torchvision.models.segmentation))"` lists
the names.

torchvision is imported when a model is built, not with this module: the config check imports the class to read
`spatial_outputs`, and `--help` and config errors stay fast.
"""

import difflib
from typing import ClassVar

from torch import Tensor, nn

from trainkit.config.schema import Check, string
from trainkit.errors import ConfigError
from trainkit.models.submodules import find_modules


class TorchvisionSegmentation(nn.Module):
    """See the module docstring. Returns logits: apply softmax/argmax over dim 1."""

    spatial_outputs: ClassVar[bool] = True  # one class per pixel: the config check refuses it with task=classification
    suits: ClassVar[tuple[str, ...]] = ("task=segmentation", "experiment=shapes_segmentation")  # for its hint
    config_rules: ClassVar[dict[str, Check]] = {"name": string()}  # what the config check holds it to

    def __init__(self, name: str, in_channels: int = 3, num_classes: int = 21) -> None:
        super().__init__()
        import torchvision

        known = torchvision.models.list_models(module=torchvision.models.segmentation)
        if name not in known:  # a few names: the close ones, else all
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else f"choose one of {', '.join(sorted(known))}"
            raise ConfigError("model.name", f"torchvision has no segmentation model {name!r}; {hint}")
        # lraspp has no auxiliary head and takes no aux_loss argument; fcn and deeplabv3 do.
        options = {} if name.startswith("lraspp") else {"aux_loss": False}
        model = torchvision.models.get_model(
            name, weights=None, weights_backbone=None, num_classes=num_classes, **options
        )
        if in_channels != 3:
            conv_name, conv = find_modules(model, nn.Conv2d)[0]  # the stem: first in registration order
            # Every stem here is square, without bias, dilation or groups: only its input channels change.
            size, stride, padding = conv.kernel_size[0], conv.stride[0], conv.padding[0]
            stem = nn.Conv2d(in_channels, conv.out_channels, size, stride, padding, bias=False)
            model.set_submodule(conv_name, stem, strict=True)
        self.model = model

    @property
    def head(self) -> nn.Module:
        """The per-pixel classifier: what finetune.freeze=backbone leaves trainable (trainkit.models.finetune)."""
        head = self.model.classifier
        assert isinstance(head, nn.Module)  # for mypy: every torchvision segmentation model has one
        return head

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)["out"]
