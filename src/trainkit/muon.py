"""optimizer=muon: Muon (torch.optim.Muon, torch >= 2.9) for the hidden weight matrices and AdamW for the rest,
as one optimizer, so the GradScaler, the LR schedule, checkpoints, the finders and the LR log see one as they do
with AdamW alone.

The split is modded-nanogpt's and Moonlight's: Muon takes the weights of the model's nn.Linear layers, except
the output head (trainkit.models.submodules.head_parameters) and any weight tied to an embedding; AdamW takes the
embeddings, the head, norms, biases, and convolution kernels (Muon orthogonalizes 2-D matrices: a kernel is not
reshaped here, it goes to AdamW). Muon's update is scaled to AdamW's RMS (`adjust_lr_fn: match_rms_adamw`), so
one optimizer.lr and one schedule serve both parts.
"""

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from trainkit.config.schema import Check, Relation, integer, one_of
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)


def hidden_matrices(model: nn.Module) -> list[torch.Tensor]:
    """The trainable weights of `model`'s nn.Linear layers that Muon takes: neither the output head's nor one
    tied to an embedding (a language model's head often is)."""
    from trainkit.models.submodules import head_parameters

    left_out = {id(p) for p in head_parameters(model)}
    left_out |= {id(p) for module in model.modules() if isinstance(module, nn.Embedding) for p in module.parameters()}
    found: dict[int, torch.Tensor] = {}
    for module in model.modules():
        weight = module.weight if isinstance(module, nn.Linear) else None
        if weight is not None and weight.requires_grad and weight.ndim == 2 and id(weight) not in left_out:
            found[id(weight)] = weight
    return list(found.values())


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer over `params` (trainkit.optim.param_groups' groups): Muon steps the `model`'s hidden matrices
    (hidden_matrices), AdamW the rest. Each of its groups is split in two, Muon's first, so the group order is
    fixed; `param_groups` holds both parts' groups (the very dicts each part steps with) and `state` both parts'
    state, so state_dict and load_state_dict are torch's own. `lr` and `weight_decay` are the groups' (decoupled,
    as AdamW's); `momentum`, `nesterov`, `ns_steps`, `adjust_lr_fn` are Muon's; `betas`, `eps`, `fused` AdamW's."""

    def __init__(
        self,
        params: Iterable[dict[str, Any]],
        model: nn.Module,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adjust_lr_fn: str = "match_rms_adamw",
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        fused: bool | None = None,
    ) -> None:
        groups = list(params)
        matrices = {id(p) for p in hidden_matrices(model)}
        muon_groups = [{**group, "params": [p for p in group["params"] if id(p) in matrices]} for group in groups]
        adamw_groups = [{**group, "params": [p for p in group["params"] if id(p) not in matrices]} for group in groups]
        muon_parameters = [p for group in muon_groups for p in group["params"]]
        if not muon_parameters:
            raise ConfigError(
                "optimizer",
                f"is muon, but {type(model).__name__} has no weight matrix for Muon (the weights of nn.Linear "
                "layers other than the output head; convolution kernels go to AdamW); use optimizer=adamw",
            )
        self.muon = torch.optim.Muon(
            muon_groups,
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
        )
        self.adamw = torch.optim.AdamW(
            adamw_groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused
        )
        super().__init__([*self.muon.param_groups, *self.adamw.param_groups], {"lr": lr, "fused": fused})
        self._share()
        adamw_parameters = [p for group in adamw_groups for p in group["params"]]
        self.parts = {
            "Muon": (sum(p.numel() for p in muon_parameters), len(muon_parameters)),
            "AdamW": (sum(p.numel() for p in adamw_parameters), len(adamw_parameters)),
        }

    def _share(self) -> None:
        """Each part steps with its share of this optimizer's groups and with its state (one dict, by parameter)."""
        count = len(self.muon.param_groups)
        self.muon.param_groups, self.adamw.param_groups = self.param_groups[:count], self.param_groups[count:]
        self.muon.state = self.adamw.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # new group dicts and a new state: the parts take them again
        self._share()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adamw.step()
        return loss

    def split(self) -> str:
        """What each part holds, for the run's start: `Muon 98,304 parameters (6 tensors), AdamW ...`."""
        return ", ".join(
            f"{name} {numel:,} parameters ({count} tensors)" for name, (numel, count) in self.parts.items()
        )


# ---- its config checks (gathered by the config check: conf/optimizer/muon.yaml's _checks_) ----

CONFIG_RULES: dict[str, Check] = {
    "optimizer.ns_steps": integer(1),
    "optimizer.adjust_lr_fn": one_of("match_rms_adamw", "original", "spectral_unclamped"),
}


def _torch_has_muon(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    if not hasattr(torch.optim, "Muon"):
        yield (
            "optimizer",
            f"is muon, which needs torch >= 2.9 (torch.optim.Muon), not {torch.__version__}; use optimizer=adamw",
        )


def _not_sharded(cfg: DictConfig) -> Iterator[tuple[str, str]]:
    from trainkit.distributed.parallel import strategy

    try:
        sharded = strategy(cfg.distributed.get("parallel")).last.endswith("/")  # saves a folder of shards
    except ConfigError:  # no strategy that can be imported: the config check says so apart
        return
    if sharded:  # a folder of shards: the parameters are sharded
        yield (
            "optimizer",
            f"is muon, which orthogonalizes whole matrices, but distributed={cfg.distributed.name} shards them; "
            "use distributed=ddp or optimizer=adamw",
        )


CONFIG_RELATIONS = (
    Relation(("optimizer._target_",), _torch_has_muon),
    Relation(("optimizer._target_", "distributed.parallel"), _not_sharded),
)
