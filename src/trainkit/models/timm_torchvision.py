"""model=timm and model=torchvision: any timm model and any torchvision classifier, by name, built for the data.

conf/model/timm.yaml and conf/model/torchvision.yaml name the factories here in `_target_`; each says beside it
what the config check reads (`config_rules`, timm's `own_weights`) and what trainkit.models.input_size asks
(`input_size_limits`, `probe_input_size`), so the core names neither library. timm and torchvision are imported
inside the functions that use them (each takes seconds), so `--help` and config errors stay fast.
`python scripts/trim.py --drop timm_torchvision` removes this module, its yamls and the fine-tuning experiment.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable, Iterator
from typing import Any

from torch import nn

from trainkit.config.schema import flag, number, string
from trainkit.errors import ConfigError
from trainkit.models.input_size import limits_of_pretrained_cfg
from trainkit.models.submodules import find_modules

# torchvision models that, built without weights, take exactly 224x224 inputs (their own
# metadata only gives a minimum, and vit_h_14's first weights even say 518).
TORCHVISION_FIXED_SIZE_PREFIXES = ("vit_", "maxvit_")


TIMM_LISTING = "python -c \"import timm; print(timm.list_models('*resnet*'))\""
TORCHVISION_LISTING = 'python -c "import torchvision; print(torchvision.models.list_models(torchvision.models))"'


def _conv_like(conv: nn.Conv2d, in_channels: int) -> nn.Conv2d:
    """A fresh Conv2d like `conv` but with `in_channels` inputs (default initialization)."""
    # A Conv2d holds 2-tuples; torch annotates them as tuple[int, ...], shared with Conv1d and Conv3d.
    return nn.Conv2d(
        in_channels,
        conv.out_channels,
        conv.kernel_size,  # type: ignore[arg-type]
        stride=conv.stride,  # type: ignore[arg-type]
        padding=conv.padding,  # type: ignore[arg-type]
        dilation=conv.dilation,  # type: ignore[arg-type]
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
    )


# Shown where a misspelt model name is close to none of a library's hundreds of names.
WELL_KNOWN_MODELS = ("resnet18", "resnet50", "convnext_tiny", "efficientnet_b0", "vit_small_patch16_224", "vit_b_16")


def _did_you_mean(name: str, choices: Iterable[str], listing: str = "") -> str:
    """The close names of `choices`; else all of them where they are few, else a few well-known ones
    and `listing`, the command that prints them all."""
    choices = list(choices)
    matches = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    if matches:
        return f"; did you mean {', '.join(matches)}?"
    if len(choices) <= 12:
        return f"; choose one of {', '.join(sorted(choices))}"
    examples = ", ".join(model for model in WELL_KNOWN_MODELS if model in choices)
    listed = f"; list them with {listing}" if listing else ""
    return f"; none of its {len(choices)} names is close (e.g. {examples}){listed}"


def create_timm_model(
    name: str,
    pretrained: bool = False,
    in_chans: int = 3,
    num_classes: int = 1000,
    drop_rate: float = 0.0,
    drop_path_rate: float = 0.0,
) -> nn.Module:
    """`timm.create_model` with config errors instead of stack traces for the usual mistakes."""
    import timm

    if not timm.is_model(name):
        suggestion = _did_you_mean(name, timm.list_models(), TIMM_LISTING)
        raise ConfigError("model.name", f"timm has no model {name!r}{suggestion}")
    options: dict[str, Any] = {}
    # Passed only when asked for: not every model takes these arguments.
    if drop_rate > 0:
        options["drop_rate"] = drop_rate
    if drop_path_rate > 0:
        options["drop_path_rate"] = drop_path_rate
    try:
        # Offline or unreachable hub: weights in the cache load without asking the hub (no minute of
        # retries), weights not in it are an error at once (see _hub_offline).
        with _hub_offline(name) if pretrained else contextlib.nullcontext():
            return timm.create_model(name, pretrained=pretrained, in_chans=in_chans, num_classes=num_classes, **options)
    except TypeError as error:
        for key in ("drop_path_rate", "drop_rate"):
            if key in str(error):
                fix = "model.drop_path_rate=0" if key == "drop_path_rate" else "regularization.dropout=0"
                raise ConfigError(f"model.{key}", f"timm's {name} does not take {key}; set {fix}") from error
        raise
    except (OSError, RuntimeError) as error:
        if not pretrained:
            raise
        # Offline (HF_HUB_OFFLINE=1 or no network) and not in the cache, or no weights exist.
        reason = str(error).split(". ")[0]
        raise _pretrained_error(name, f"{type(error).__name__}: {reason}") from error


def _an_image_of(in_chans: int = 3) -> Any:
    import torch

    return torch.zeros(1, in_chans, 32, 32)


create_timm_model.example_input = _an_image_of  # type: ignore[attr-defined]  # one image of timm's in_chans (docs/models.md)
# What the arguments may hold, and the key that makes it load weights of its own (finetune.pretrained_path beside
# it is refused): the config check (trainkit.config.validation) reads both from the function, before anything runs.
create_timm_model.config_rules = {  # type: ignore[attr-defined]
    "name": string(),
    "pretrained": flag(),
    "drop_path_rate": number(0, below=1),
}


def _timm_own_weights(pretrained: bool = False) -> str | None:
    return "model.pretrained" if pretrained is True else None


create_timm_model.own_weights = _timm_own_weights  # type: ignore[attr-defined]


def _pretrained_error(name: str, reason: str) -> ConfigError:
    return ConfigError(
        "model.pretrained",
        f"could not load pretrained weights for {name} ({reason}); "
        "download them once with network access (timm caches them under $HF_HOME/hub, by default "
        "~/.cache/huggingface/hub, and finds them there offline), or save a state dict "
        "(torch.save(timm.create_model(name, pretrained=True).state_dict(), path)) and set "
        "finetune.pretrained_path=<path> model.pretrained=false, or set model.pretrained=false",
    )


# The files timm tries in a hub repository when its config names none (safetensors first).
HUB_WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "open_clip_model.safetensors",
    "open_clip_pytorch_model.bin",
)


@contextlib.contextmanager
def _hub_offline(name: str) -> Iterator[None]:
    """Before timm asks the Hugging Face hub for `name`'s weights: if the hub cannot be asked
    (HF_HUB_OFFLINE=1, or its host does not answer within seconds), weights in the local cache
    load in offline mode (no request, so no minute of retries) and weights not in it raise the
    model.pretrained error at once. With a reachable hub (or a proxy set), timm does as usual."""
    from huggingface_hub import constants, try_to_load_from_cache
    from timm.models import get_pretrained_cfg

    found = get_pretrained_cfg(name)
    if found is None or not found.hf_hub_id:  # weights from a URL (torch.hub's cache) or none: timm's error is quick
        yield
        return
    repo, _, revision = found.hf_hub_id.partition("@")
    files = [found.hf_hub_filename] if found.hf_hub_filename else HUB_WEIGHT_FILES
    cached = any(isinstance(try_to_load_from_cache(repo, f, revision=revision or None), str) for f in files)
    offline = constants.is_offline_mode()
    if not offline and not _reachable(constants.ENDPOINT):
        offline = True
        reason = f"{constants.ENDPOINT} does not answer"
    else:
        reason = "HF_HUB_OFFLINE=1"
    if not offline:
        yield
        return
    if not cached:
        raise _pretrained_error(name, f"{repo} is not in the local cache {constants.HF_HUB_CACHE} and {reason}")
    saved = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True  # what is_offline_mode() reads: the cached file, no request
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved


def _reachable(url: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the URL's host opens within `timeout` seconds (True whenever a
    proxy is configured: the proxy, not this machine, reaches the host)."""
    import os
    import socket
    from urllib.parse import urlsplit

    if any(os.environ.get(key) for key in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return True
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "", parts.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def create_torchvision_model(
    name: str, in_channels: int = 3, num_classes: int = 1000, dropout: float = 0.0
) -> nn.Module:
    """A torchvision classifier by name, randomly initialized, adapted to the data: the first
    convolution rebuilt for `in_channels`, dropout inserted before the last linear layer."""
    import torchvision

    known = torchvision.models.list_models(module=torchvision.models)  # classification models only
    if name not in known:
        suggestion = _did_you_mean(name, known, TORCHVISION_LISTING)
        raise ConfigError("model.name", f"torchvision has no classification model {name!r}{suggestion}")
    options: dict[str, Any] = {}
    if name in ("googlenet", "inception_v3"):
        # No auxiliary heads (their training-mode output is a tuple the loop cannot use), and
        # the initialization torchvision asks to choose explicitly.
        options = {"aux_logits": False, "init_weights": True}
    model = torchvision.models.get_model(name, weights=None, num_classes=num_classes, **options)
    if in_channels != 3:
        conv_name, conv = find_modules(model, nn.Conv2d)[0]
        model.set_submodule(conv_name, _conv_like(conv, in_channels=in_channels), strict=True)
    if dropout > 0:
        linears = find_modules(model, nn.Linear)
        if not linears:
            raise ConfigError(
                "model.dropout", f"{name} has no linear layer to put dropout before; set regularization.dropout=0"
            )
        linear_name, linear = linears[-1]
        model.set_submodule(linear_name, nn.Sequential(nn.Dropout(dropout), linear), strict=True)
    return model


create_torchvision_model.config_rules = {"name": string()}  # type: ignore[attr-defined]  # read by the config check


def _timm_input_size_limits(name: str) -> tuple[int, int | None]:
    """(smallest side, fixed side or None) of timm's model `name`, from its metadata, without building it."""
    from timm.models import get_pretrained_cfg

    found = get_pretrained_cfg(name)
    return limits_of_pretrained_cfg(found.to_dict() if found is not None else {})


def _torchvision_input_size_limits(name: str) -> tuple[int, int | None]:
    """(smallest side, fixed side or None) of torchvision's classifier `name`, from its weights' metadata."""
    import torchvision

    if name.startswith(TORCHVISION_FIXED_SIZE_PREFIXES):
        return 224, 224
    weights = list(torchvision.models.get_model_weights(name))
    return (weights[0].meta.get("min_size", (1, 1))[-1] if weights else 1), None


# What trainkit.models.input_size asks: the limits without building, and a forward on small inputs once built.
create_timm_model.input_size_limits = _timm_input_size_limits  # type: ignore[attr-defined]
create_timm_model.probe_input_size = True  # type: ignore[attr-defined]
create_torchvision_model.input_size_limits = _torchvision_input_size_limits  # type: ignore[attr-defined]
create_torchvision_model.probe_input_size = True  # type: ignore[attr-defined]
