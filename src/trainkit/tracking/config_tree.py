"""Show the composed config as a tree at the start of a run, and keep a plain copy of it in the run directory.

The config groups (data, model, optimizer, ...) come first, each labelled with the option that
was picked, then the plain keys. `rich` is imported only when printing. Without this module (the config_tree
row of docs/features.md) train.py prints the config as YAML (trainkit.config.printing).
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from trainkit.config.printing import as_yaml

# The contract's groups, in the order a run flows; used when Hydra's choices are not at hand.
GROUPS = (
    "data",
    "task",
    "model",
    "optimizer",
    "scheduler",
    "precision",
    "distributed",
    "regularization",
    "augmentation",
    "logger",
)
FILENAME = "config_tree.txt"

if TYPE_CHECKING:
    from rich.tree import Tree


def _choices(cfg: DictConfig) -> tuple:
    """({top-level key: picked option} for the groups that fill a top-level key, in the defaults list's
    order; {group: option} for the picked groups that only override others: experiment, debug,
    hparams_search). Outside a Hydra job: GROUPS without option names."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        choices = {g: o for g, o in HydraConfig.get().runtime.choices.items() if not g.startswith("hydra/")}
        # Hydra lists its choices in the reverse of the defaults list: reversed, the order the groups compose in
        # (a group conf/config.yaml also sets keys of, as it does regularization's, does not move to the front).
        groups = {key: option for key, option in reversed(list(choices.items())) if key in cfg}
        if groups:
            overlays = {g: o for g, o in reversed(list(choices.items())) if o is not None and g not in cfg}
            return groups, overlays
    return {group: None for group in GROUPS if group in cfg}, {}


def build_tree(cfg: DictConfig, resolve: bool = True, highlight: bool = True) -> "Tree":
    """A rich Tree: one branch a config group (label `group: option`), then the other sections,
    then the top-level scalar keys in one last branch. `highlight`: the YAML in syntax colours
    (pygments); without, plain characters laid out the same way, for a console that shows
    no colour (a file, a log, a pipe), which then needs neither pygments' import nor its lexing."""
    from rich.text import Text
    from rich.tree import Tree

    def body(yaml: str) -> Any:
        if not highlight:  # as Syntax lays it out: long lines cropped, not wrapped
            return Text(yaml, no_wrap=True, overflow="crop")
        from rich.syntax import Syntax

        return Syntax(yaml, "yaml", theme="ansi_dark", background_color="default")

    choices, overlays = _choices(cfg)
    title = "config" + "".join(f"  [bold]{g}[/bold]=[cyan]{o}[/cyan]" for g, o in overlays.items())
    tree = Tree(title, guide_style="dim")
    sections = [key for key in cfg if OmegaConf.is_dict(cfg._get_node(key)) and key not in choices]  # a list is a value
    scalars = [str(key) for key in cfg if key not in choices and key not in sections]
    for key in [*choices, *sections]:
        option = choices.get(key)
        label = f"[bold]{key}[/bold]" + (f": [cyan]{option}[/cyan]" if option else "")
        branch = tree.add(label)
        yaml = as_yaml(cfg[key], resolve)
        if yaml and yaml != "{}":
            branch.add(body(yaml))
    if scalars:
        tree.add("[bold]top level[/bold]").add(body(as_yaml(OmegaConf.masked_copy(cfg, scalars), resolve)))
    return tree


def _multirun_job() -> tuple[int, list[str]] | None:
    """(job number, its overrides) inside a multirun job, else None."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return HydraConfig.get().job.num, list(HydraConfig.get().overrides.task)


def print_config_tree(cfg: DictConfig, path: str | Path | None = None, resolve: bool = True) -> None:
    """Print the config tree (rank 0 only) and, with `path`, save it without colours: `path` is a run
    directory (the file is `config_tree.txt` in it) or a file name ending in `.txt`.

    In a multirun the first job prints the whole tree and every other job one line with its own
    overrides (a sweep of 100 jobs would otherwise print 100 trees); each job saves its whole tree."""
    from trainkit.distributed.process_group import process_info  # torch: already imported by train.py

    if not process_info().is_main:
        return
    from rich.console import Console

    console = Console()
    tree = build_tree(cfg, resolve=resolve, highlight=console.color_system is not None)  # colours: a terminal's
    target = None
    if path is not None:
        path = Path(path)
        target = path if path.suffix == ".txt" else path / FILENAME
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "w", encoding="utf-8") as file:
            Console(file=file, color_system=None, width=120, soft_wrap=True).print(tree)
    job = _multirun_job()
    if job is None or job[0] == 0:
        console.print(tree)
    else:
        number, overrides = job
        saved = f" (whole config: {target})" if target else ""
        print(f"job {number}: {' '.join(overrides) or 'no overrides'}{saved}", flush=True)
