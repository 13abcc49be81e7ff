"""Building the configured model (the small CNN, your own, any factory `_target_` names).

`cfg.model` (conf/model/*.yaml) names a factory in `_target_` and holds only its arguments, so
`hydra.utils.instantiate(cfg.model)` alone builds the network (in a notebook too): `build_model(cfg.model)`.
What fine-tuning does to it after that (weights, freezing, the input size) is trainkit.models.finetune's.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn


def build_model(model_config: Mapping) -> nn.Module:
    """Instantiate the configured model."""
    import hydra.utils

    # _convert_="all": the factories get plain lists and dicts, not ListConfig.
    return hydra.utils.instantiate(model_config, _convert_="all")
