"""What a run trained on, in a few numbers every checkpoint keeps, so that a resume on changed data is refused in
one line (`check_same_data`): docs/resume-and-preemption.md#resume-and-requeued-jobs says what is compared and why."""

import logging
import math
from typing import Any

import torch

from trainkit.data.identity import identity_changes, lacks_file_digests
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

CHECKED_SAMPLES = 10_000
SPLITS = ("train", "val", "test")


def data_fingerprint(splits: Any, source: str | None = None, **kept: Any) -> dict:
    """The fingerprint of Splits of tensors, or of splits that say theirs (`fingerprints()`), as plain containers that
    load with weights_only=True; `source` and `kept` (fold, tokenizer, identity) are kept where given."""
    made = {name: getattr(splits, name) for name in SPLITS}
    kept = {"source": source, **kept}
    classes = {"classes": splits.num_classes, **{key: value for key, value in kept.items() if value}}
    if not all(isinstance(split, tuple) for split in made.values()):
        return {**classes, **splits.fingerprints()}
    return {**classes, **{name: _tensor_fingerprint(*split) for name, split in made.items()}}


def _tensor_fingerprint(images: torch.Tensor, labels: torch.Tensor) -> dict:
    step = max(1, math.ceil(len(images) / CHECKED_SAMPLES))
    checked = images[::step].flatten(1).to(torch.float64).sum(1)
    weights = torch.arange(1, len(checked) + 1, dtype=torch.float64, device=checked.device)  # so that the order counts
    # One class per sample, or a mask of classes summed per sample like the images.
    targets = labels[::step].reshape(len(checked), -1).to(torch.float64).sum(1)
    checksum = (checked * weights).sum() + (targets * weights).sum()
    return {"shape": list(images.shape), "checksum": checksum.item()}


def check_same_data(saved: dict | None, now: dict) -> None:
    """Refuses in one line, naming what changed since the `saved` fingerprint; without one, checks nothing."""
    if not saved or not now:
        return
    if saved.get("identity") is None and not lacks_file_digests(now.get("identity")):
        log.warning(
            "the checkpoint records no digest of its data files' contents (saved before digests were recorded): "
            "the resume compares the files' names, sizes and labels, not their contents"
        )
    tokens = saved.get("tokenizer") != now.get("tokenizer")
    # A split fingerprinted by its token values (data=text's blocks) differs by the tokens alone.
    keys = {name: {*saved.get(name, {}), *now.get(name, {})} for name in SPLITS}
    of_tokens = [f"the {name} split " for name in SPLITS if tokens and "files" not in keys[name]]
    if of_tokens:  # a language model's classes are its token ids
        of_tokens.append(f"{now.get('classes')} classes where there were ")
    changes = [change for change in data_changes(saved, now) if not change.startswith(tuple(of_tokens))]
    if not changes:
        return
    other_tokens = "read its data as other tokens than its weights learned"
    if not tokens:
        consequence = "the resumed run would train and test on other splits"
    elif len(changes) > 1:
        consequence = f"the resumed run would {other_tokens}, and train and test on other splits"
    elif of_tokens:
        consequence = f"the resumed run would {other_tokens}"
    else:
        consequence = (
            "the splits are the same, but the resumed run would read them as other tokens than its weights learned"
        )
    raise ConfigError(
        "data",
        f"{'; '.join(changes)} since the checkpoint: {consequence}; resume with the data "
        f"{'and tokenizer ' if tokens else ''}the run trained on, or start a new run",
    )


def data_changes(saved: dict, now: dict) -> list[str]:
    """What differs from the `saved` fingerprint to `now`, one phrase each ([] for the same data)."""
    changes = [change for name in SPLITS if (change := _change(name, saved.get(name, {}), now.get(name, {})))]
    identity = identity_changes(saved.get("identity"), now.get("identity"), samples=not changes)
    if saved.get("classes", now.get("classes")) != now.get("classes") and not identity:
        changes.insert(0, f"{now.get('classes')} classes where there were {saved.get('classes')}")
    if saved.get("fold") != now.get("fold"):  # one line, not every split
        now_fold, saved_fold = (side.get("fold") or "carved by data.val_fraction" for side in (now, saved))
        changes = [f"the val split is {now_fold} (data.folds, data.fold), was {saved_fold}"]
    if saved.get("source", now.get("source")) != now.get("source") and not identity:
        changes.insert(0, f"the data comes from {now.get('source')}, the run's came from {saved.get('source')}")
    if saved.get("tokenizer") != now.get("tokenizer"):
        changes.insert(0, f"the tokenizer is {now.get('tokenizer', 'bytes')}, was {saved.get('tokenizer', 'bytes')}")
    return [*identity, *changes]


def _change(name: str, saved: dict, now: dict) -> str | None:
    if "files" in saved and "files" in now:
        added = now["files"] - saved["files"]
        if added:
            return f"{abs(added)} files {'added to' if added > 0 else 'removed from'} the {name} split"
        if saved.get("digest") != now.get("digest"):
            return f"the {name} split holds other files (as many, renamed, relabelled or moved between splits)"
        return None
    if saved.get("shape") != now.get("shape"):
        return f"the {name} split is {now.get('shape')}, was {saved.get('shape')}"
    if not math.isclose(saved.get("checksum", math.nan), now.get("checksum", math.nan), rel_tol=1e-9, abs_tol=1e-6):
        return f"the {name} split holds other values (its shape is the same)"
    return None
