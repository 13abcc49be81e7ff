"""The paths a run reads and writes, checked before use (the checkpoint `resume=` or eval.py's `checkpoint=` names, its
fit to the model and optimizer, the output directory): each way one can be wrong is one ConfigError line."""

import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from trainkit.errors import ConfigError

# The layout of what trainkit.run's Run.state_dict() writes (save_checkpoint adds this). Raise it when that layout
# changes in a way older code cannot read; checkpoints written before versioning hold the same keys as 1.
CHECKPOINT_FORMAT = 1
REQUIRED_KEYS = ("model", "optimizer", "scheduler", "epoch", "step", "batches_done", "config")
# A sharded checkpoint (checkpoints/last/): every rank's DCP shards, complete once DCP wrote its metadata, and state.pt
# beside them with the rest, read here without the shards.
SHARDED_METADATA, SHARDED_REST = ".metadata", "state.pt"
# What format-1 checkpoints from before the model and data nodes became plain constructor arguments hold, and where it
# is now: read_checkpoint moves it, so such a run resumes and evaluates (its old keys and targets would fail).
MOVED_MODEL_KEYS = ("pretrained_path", "freeze", "freeze_bn", "input_size")  # feature: finetune
RENAMED_DATA_TARGETS = {  # the data factories, now the classes that replaced them
    "trainkit.data.datasets.load_digits": "trainkit.data.datasets.Digits",
    "trainkit.data.shapes.make_shapes": "trainkit.data.shapes.Shapes",  # feature: segmentation
    "trainkit.data.datasets.make_synthetic": "trainkit.data.synthetic.Synthetic",  # feature: synthetic
    "trainkit.data.datasets.Synthetic": "trainkit.data.synthetic.Synthetic",  # feature: synthetic
}
IMAGE_FOLDER = "trainkit.data.imagefolder"  # feature: image_folders
RENAMED_DATA_TARGETS[f"{IMAGE_FOLDER}.image_folder"] = f"{IMAGE_FOLDER}.ImageFolder"  # feature: image_folders
RENAMED_DATA_TARGETS["trainkit.data.cache.load_cache"] = "trainkit.data.cache.Cached"  # feature: cache
RENAMED_DATA_TARGETS["trainkit.data.datasets.load_mnist"] = "trainkit.data.downloads.MNIST"  # feature: downloads
RENAMED_DATA_TARGETS["trainkit.data.datasets.MNIST"] = "trainkit.data.downloads.MNIST"  # feature: downloads
RENAMED_DATA_TARGETS["trainkit.data.datasets.load_cifar10"] = "trainkit.data.downloads.CIFAR10"  # feature: downloads
RENAMED_DATA_TARGETS["trainkit.data.datasets.CIFAR10"] = "trainkit.data.downloads.CIFAR10"  # feature: downloads
CHECKED_KEYS = dict.fromkeys(("mixup_alpha", "cutmix_alpha"), "trainkit.augment.mixing")  # feature: augment_recipes
CHECKED_KEYS |= {"per_sample": "trainkit.augment.sample_transforms"}  # feature: augment_recipes


def find_checkpoint(
    given: str | Path, key: str = "resume", names: tuple[str, ...] = ("last.pt",), sharded: bool = True
) -> Path:
    """The checkpoint file `key` names: a .pt file, or a run directory's checkpoints/<name> (the first of `names`),
    or its sharded last/. `sharded=False` (eval.py): a sharded last/ is refused, naming best.pt beside it."""
    path = Path(given).expanduser()
    wanted = " or ".join(f"checkpoints/{name}" for name in names)
    if not path.exists():
        raise ConfigError(key, f"{path} does not exist; give a run directory or its {wanted}")
    if path.is_dir() and not is_sharded_checkpoint(path):
        folders = (path / "checkpoints", path)
        found = [folder / name for name in names for folder in folders if (folder / name).is_file()]
        if "last.pt" in names:  # or a sharded last/
            found += [last for folder in folders if (last := latest_checkpoint(folder))]
        if not found:
            raise ConfigError(
                key, f"{path} is a directory without {wanted}; give a run directory that saved a checkpoint"
            )
        path = found[0]
    if sharded or not path.is_dir():
        return path
    best = path.parent / "best.pt"
    fix = f"evaluate {best} (its full weights), or the run directory" if best.is_file() else "it has no best.pt yet"
    raise ConfigError(
        key, f"{path} is a sharded checkpoint (every rank's shards, for resuming), not one eval.py reads; {fix}"
    )


def is_sharded_checkpoint(path: Path) -> bool:
    return (path / SHARDED_METADATA).is_file() and (path / SHARDED_REST).is_file()


def latest_checkpoint(checkpoints: Path) -> Path | None:
    """`checkpoints`' last.pt, else its sharded last/ (or last.old/, after a kill between the renames), else None."""
    if (checkpoints / "last.pt").is_file():
        return checkpoints / "last.pt"
    sharded = [checkpoints / "last", checkpoints / "last.old"]
    return next((path for path in sharded if is_sharded_checkpoint(path)), None)


def read_checkpoint(path: Path, mmap: bool = False, key: str = "resume") -> dict[str, Any]:
    """torch.load(weights_only=True) onto the CPU, each way the file is unusable said in one line naming `key`. `mmap`:
    read lazily. A sharded checkpoint: its state.pt, without weights and optimizer state."""
    required: tuple[str, ...] = REQUIRED_KEYS
    if path.is_dir():
        if not is_sharded_checkpoint(path):
            raise ConfigError(
                key,
                f"{path} is a directory but no finished sharded checkpoint (no {SHARDED_METADATA} "
                f"and {SHARDED_REST}); use a run directory or its checkpoints/last.pt or last/",
            )
        path, required = path / SHARDED_REST, tuple(k for k in REQUIRED_KEYS if k not in ("model", "optimizer"))
    size = path.stat().st_size
    if size == 0:
        raise ConfigError(key, f"{path} is empty (0 bytes): not a checkpoint; use another one")
    if not zipfile.is_zipfile(path):
        with path.open("rb") as f:
            head = f.read(4)
        if head[:2] == b"PK":  # a zip's first bytes without its end: cut short by a kill or a full disk
            raise ConfigError(key, f"{path} is truncated ({size:,} bytes, its end is missing); use an older copy")
        raise ConfigError(key, f"{path} is not a PyTorch checkpoint (no torch.save archive); check the path")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as error:  # a damaged archive, or objects a weights-only load refuses
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(key, f"{path} cannot be read as a checkpoint ({first_line[:160]})") from error
    if not isinstance(state, dict) or any(name not in state for name in required):
        found = ", ".join(sorted(map(str, state))[:6]) if isinstance(state, dict) else type(state).__name__
        raise ConfigError(
            key, f"{path} is not a trainkit training checkpoint (it holds {found}); use a run's checkpoints/last.pt"
        )
    version = state.get("format", 1)
    if version != CHECKPOINT_FORMAT:
        age = "a newer" if version > CHECKPOINT_FORMAT else "an older"
        raise ConfigError(
            key,
            f"{path} has checkpoint format {version}, this code reads format {CHECKPOINT_FORMAT} ({age} trainkit "
            f"wrote it); use the trainkit version that wrote it",
        )
    upgrade_config(state["config"])
    upgrade_fingerprint(state.get("data"))
    return state


def upgrade_config(config: dict[str, Any]) -> None:
    """Move, in place, what an older checkpoint's config holds where this code no longer reads it."""
    data = config.get("data", {})
    model = config.get("model", {})  # feature: finetune
    moved = {key: model.pop(key) for key in MOVED_MODEL_KEYS if key in model}  # feature: finetune
    if moved:  # feature: finetune
        config["finetune"] = {**moved, **config.get("finetune", {})}  # feature: finetune
    if data.get("_target_") in RENAMED_DATA_TARGETS:
        data["_target_"] = RENAMED_DATA_TARGETS[data["_target_"]]
    scheduler = config.get("scheduler", {})
    if "_target_" not in scheduler and "name" in scheduler:  # a schedule by name, now the function of that name
        scheduler["_target_"] = f"trainkit.schedules.{scheduler.pop('name')}"
    for name in ("step", "cosine_restarts", "wsd"):  # feature: more_schedules (they left trainkit.schedules)
        if scheduler.get("_target_") == f"trainkit.schedules.{name}":  # feature: more_schedules
            scheduler["_target_"] = f"trainkit.more_schedules.{name}"  # feature: more_schedules
    augmentation = config.get("augmentation", {})  # feature: augment_recipes
    modules = {CHECKED_KEYS[key] for key in augmentation if key in CHECKED_KEYS}  # feature: augment_recipes
    if modules and "_checks_" not in augmentation:  # feature: augment_recipes (the modules that check them now)
        augmentation["_checks_"] = {m.rsplit(".", 1)[-1]: m for m in sorted(modules)}  # feature: augment_recipes
    for key in CHECKED_KEYS:  # feature: augment_recipes (keys the task took once)
        config.get("task", {}).pop(key, None)  # feature: augment_recipes


def upgrade_fingerprint(fingerprint: dict | None) -> dict | None:
    """Rename, in place, the data option an older data fingerprint names (RENAMED_DATA_TARGETS); returns it."""
    identity = (fingerprint or {}).get("identity") or {}
    if identity.get("option") in RENAMED_DATA_TARGETS:
        identity["option"] = RENAMED_DATA_TARGETS[identity["option"]]
    return fingerprint


def check_model_fits(model_state: dict, model: torch.nn.Module) -> None:
    """A ConfigError naming `model` for the first weight the built model lacks, has more, or has of another shape."""
    expected = model.state_dict()
    for key, tensor in expected.items():
        if key not in model_state:
            raise ConfigError("model", f"the checkpoint has no weights for {key}: it is another architecture")
        saved = model_state[key]
        if tuple(saved.shape) != tuple(tensor.shape):
            raise ConfigError(
                "model",
                f"{key} is {list(saved.shape)} in the checkpoint but {list(tensor.shape)} in this model: another "
                f"architecture; use the checkpoint's model settings",
            )
    if extra := [key for key in model_state if key not in expected]:
        raise ConfigError("model", f"the checkpoint has weights this model lacks ({extra[0]}): another architecture")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """optimizer.load_state_dict, with another parameter group layout said in one line."""
    saved = [len(group["params"]) for group in state["param_groups"]]
    built = [len(group["params"]) for group in optimizer.param_groups]
    if saved != built:
        raise ConfigError(
            "optimizer",
            f"the checkpoint's optimizer has parameter groups of {saved} tensors, this one {built}; resume with the "
            f"checkpoint's optimizer and model settings",
        )
    optimizer.load_state_dict(state)


def check_output_dir(directory: str | None, key: str = "hydra.run.dir") -> None:
    """Check that the run directory can be created and written (None: Hydra's default), before Hydra tries: else one
    ConfigError line naming `key`, the path and the reason."""
    path = Path(directory or "outputs").expanduser().absolute()
    key = key if directory else f"{key} (default ./outputs)"
    try:
        existing = next(folder for folder in (path, *path.parents) if folder.exists())
        if not existing.is_dir():
            raise ConfigError(
                key, f"{path} cannot be created: {existing} is a file, not a directory; choose another path"
            )
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(key, f"{path} cannot be written: no write permission in {existing}; choose another path")
        longest = max(path.relative_to(existing).parts, key=lambda name: len(os.fsencode(name)), default="")
        limit = os.pathconf(existing, "PC_NAME_MAX")
        if len(os.fsencode(longest)) > limit:
            raise ConfigError(
                key,
                f"{path} cannot be created: the name {longest[:40]}... is {len(os.fsencode(longest))} bytes, more "
                f"than the {limit} the file system allows; choose a shorter name",
            )
        # What permissions cannot tell (root may "write" to /proc; a read-only mount): try, and leave nothing.
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".trainkit-check-", dir=existing))
        except OSError as error:
            why = f"{existing} takes no new directories ({error.strerror or type(error).__name__})"
            raise ConfigError(key, f"{path} cannot be created: {why}; choose another path") from None
    except OSError as error:  # also from exists() (a name too long, a loop of links)
        raise ConfigError(key, f"{path} cannot be created: {error.strerror or error}; choose another path") from None
