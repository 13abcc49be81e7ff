"""Building the configured model: `cfg.model` (conf/model/*.yaml) names a factory in `_target_` (the small CNN, a
library's, yours) and holds only its arguments, so `hydra.utils.instantiate` alone builds it (in a notebook too)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn


def build_model(model_config: Mapping) -> nn.Module:
    """Instantiate the configured model."""
    import hydra.utils

    # _convert_="all": the factories get plain lists and dicts, not ListConfig.
    return hydra.utils.instantiate(model_config, _convert_="all")
