"""What a run trained on, in a few numbers a checkpoint keeps, and the one line a resume prints
when the data has changed since.

    fingerprint = data_fingerprint(splits)       # build_data: DataBundle.fingerprint, into every checkpoint
    check_same_data(saved, fingerprint)          # a resume: ConfigError("data", "12 files added to ...")

The number of classes (an image folder counts its class folders). File data (an image folder):
each split's number of files and a digest of its file names (relative to the folder all the splits
share, so a copy of the data elsewhere, on a node's local disk, is the same data) and labels, in
order: an added, removed, renamed or relabelled file, or a file moved to another split, changes it.
The data option's `source()` (the Python version whose standard library is the corpus) is kept too, and
its fold with data.folds ("fold 2 of 5": a resume into another fold is refused, naming both).
Not the files' contents: reading every image at each start would cost minutes. In-memory data: each
split's shape and a checksum of up to CHECKED_SAMPLES evenly spaced samples, in order. And the data's identity
before any split (trainkit.data.identity): data=hf's files with a digest of their bytes, in-memory data every
sample; a checkpoint from before it has none, and nothing is compared where one side lacks it.

A changed dataset would resume into other splits (a new shuffle of a new file list puts test images
into training), so the resume is refused rather than continued on a silently different run.
"""

import hashlib
import logging
import math
import os
from typing import Any

import torch

from trainkit.data.identity import identity_changes, lacks_file_digests
from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

CHECKED_SAMPLES = 10_000  # in-memory data: enough to notice other data, cheap on any size of dataset
SPLITS = ("train", "val", "test")


def data_fingerprint(
    splits: Any,
    source: str | None = None,
    fold: str | None = None,
    tokenizer: str | None = None,
    identity: dict | None = None,
) -> dict:
    """The fingerprint of a Splits (tensors) or FileSplits (datasets): plain containers, as a
    checkpoint holds them (torch.load(weights_only=True)). `source`: what else decides the data
    (Data.source(): the Python version of the standard library's text), kept when given; `fold`
    likewise (Folds.fold_name(): "fold 2 of 5"); `tokenizer`: a text option's tokenizer, other than bytes (its
    name and a digest of its tokenizer.json); `identity`: the data before any split (trainkit.data.identity: its
    files' contents among it), which summary.json records too."""
    made = {name: getattr(splits, name) for name in SPLITS}
    classes = {
        "classes": splits.num_classes,
        **({"source": source} if source else {}),
        **({"fold": fold} if fold else {}),
        **({"tokenizer": tokenizer} if tokenizer else {}),
        **({"identity": identity} if identity else {}),
    }
    if all(isinstance(split, tuple) for split in made.values()):  # Splits: (images, labels) tensors
        return {**classes, **{name: _tensor_fingerprint(*split) for name, split in made.items()}}
    if not all(hasattr(dataset, "samples") for dataset in made.values()):  # yours, without (path, label) samples
        return {**classes, **{name: {"files": len(dataset)} for name, dataset in made.items()}}
    samples: dict[str, list[tuple[str, int]]] = {name: dataset.samples for name, dataset in made.items()}
    top = os.path.commonpath([path for listed in samples.values() for path, _ in listed])
    return {**classes, **{name: _files_fingerprint(listed, top) for name, listed in samples.items()}}


def _files_fingerprint(samples: list[tuple[str, int]], top: str) -> dict:
    digest = hashlib.sha256()
    for path, label in samples:
        digest.update(f"{os.path.relpath(path, top)}\t{label}\n".encode())
    return {"files": len(samples), "digest": digest.hexdigest()}


def _tensor_fingerprint(images: torch.Tensor, labels: torch.Tensor) -> dict:
    step = max(1, math.ceil(len(images) / CHECKED_SAMPLES))
    checked = images[::step].flatten(1).to(torch.float64).sum(1)  # exact for uint8; float data: to rounding
    weights = torch.arange(1, len(checked) + 1, dtype=torch.float64, device=checked.device)  # order counts
    # A label a sample: a class; or a mask of classes (segmentation): summed per sample like the images.
    targets = labels[::step].reshape(len(checked), -1).to(torch.float64).sum(1)
    checksum = (checked * weights).sum() + (targets * weights).sum()
    return {"shape": list(images.shape), "checksum": checksum.item()}


def check_same_data(saved: dict | None, now: dict) -> None:
    """One ConfigError line naming every split that changed since the checkpoint's `saved`
    fingerprint (None or empty: a checkpoint from before fingerprints, or data without one: not checked). A
    checkpoint from before file digests (trainkit.data.identity) is resumed with a warning that says the files'
    contents were not compared."""
    if not saved or not now:
        return
    if saved.get("identity") is None and not lacks_file_digests(now.get("identity")):
        log.warning(
            "the checkpoint records no digest of its data files' contents (saved before digests were recorded): "
            "the resume compares the files' names, sizes and labels, not their contents"
        )
    tokens = saved.get("tokenizer") != now.get("tokenizer")
    # A split fingerprinted by its token values (data=text's blocks) differs by the tokens alone.
    split_keys = {name: {*saved.get(name, {}), *now.get(name, {})} for name in SPLITS}
    of_tokens = [f"the {name} split " for name, keys in split_keys.items() if tokens and "files" not in keys]
    if of_tokens:  # a language model's classes are its token ids
        of_tokens.append(f"{now.get('classes')} classes where there were ")
    changes = [change for change in data_changes(saved, now) if not change.startswith(tuple(of_tokens))]
    if changes:
        consequence = "the resumed run would train and test on other splits"
        if tokens and len(changes) > 1:
            consequence = "the resumed run would read its data as other tokens than its weights learned, and " + (
                "train and test on other splits"
            )
        elif tokens:
            consequence = (
                "the resumed run would read its data as other tokens than its weights learned"
                if of_tokens
                else "the splits are the same, but the resumed run would read them as other tokens than its weights "
                "learned"
            )
        raise ConfigError(
            "data",
            f"{'; '.join(changes)} since the checkpoint: {consequence}; resume with the data "
            f"{'and tokenizer ' if tokens else ''}the run trained on, or start a new run",
        )


def data_changes(saved: dict, now: dict) -> list[str]:
    """What differs from the `saved` fingerprint to `now`, a phrase each ([] for the same data): also what
    scripts/compare_runs.py --diff says of two runs' data."""
    changes = [change for name in SPLITS if (change := _change(name, saved.get(name, {}), now.get(name, {})))]
    # The data before a split (its files' contents among it); the samples' count and digest where no split says more.
    identity = identity_changes(saved.get("identity"), now.get("identity"), samples=not changes)
    if saved.get("classes", now.get("classes")) != now.get("classes") and not identity:  # (identity names them)
        changes.insert(0, f"{now.get('classes')} classes where there were {saved.get('classes')}")
    if saved.get("fold") != now.get("fold"):  # another fold: the splits differ because of it, one line says so
        now_fold, saved_fold = (
            fingerprint.get("fold") or "carved by data.val_fraction" for fingerprint in (now, saved)
        )
        changes = [f"the val split is {now_fold} (data.folds, data.fold), was {saved_fold}"]
    if saved.get("source", now.get("source")) != now.get("source") and not identity:  # the stdlib under another Python
        changes.insert(0, f"the data comes from {now.get('source')}, the run's came from {saved.get('source')}")
    if saved.get("tokenizer") != now.get("tokenizer"):  # bytes (none), a BPE the run trained, a folder's
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
