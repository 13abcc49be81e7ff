"""What a run trained on, in a few numbers every checkpoint keeps, so that a resume on changed data is refused in
one line (`check_same_data`), and what it read before any split (`data_identity`, the same for every fold, split seed
and tokenizer): docs/resume-and-preemption.md#resume-and-requeued-jobs."""

import hashlib
import logging
import math
from typing import Any

from trainkit.errors import ConfigError

log = logging.getLogger(__name__)

CHECKED_SAMPLES = 10_000
SPLITS = ("train", "val", "test")
TENSOR_BYTES = 1 << 31  # above this, only the labels are digested


def data_fingerprint(splits: Any, source: str | None = None, **kept: Any) -> dict:
    """The fingerprint of Splits of tensors, or of splits that say theirs (`fingerprints()`), as plain containers that
    load with weights_only=True; `source` and `kept` (fold, tokenizer, identity) are kept where given."""
    made = {name: getattr(splits, name) for name in SPLITS}
    kept = {"source": source, **kept}
    classes = {"classes": splits.num_classes, **{key: value for key, value in kept.items() if value}}
    if not all(isinstance(split, tuple) for split in made.values()):
        return {**classes, **splits.fingerprints()}
    return {**classes, **{name: _tensor_fingerprint(*split) for name, split in made.items()}}


def _tensor_fingerprint(images: Any, labels: Any) -> dict:
    step = max(1, math.ceil(len(images) / CHECKED_SAMPLES))
    checked = images[::step].flatten(1).double().sum(1)
    weights = checked.new_tensor(range(1, len(checked) + 1))  # 1, 2, ...: so that the order counts
    # One class per sample, or a mask of classes summed per sample like the images.
    targets = labels[::step].reshape(len(checked), -1).double().sum(1)
    checksum = (checked * weights).sum() + (targets * weights).sum()
    return {"shape": list(images.shape), "checksum": checksum.item()}


def data_identity(data: Any, made: Any) -> dict:
    """The identity of what `data` read, as plain containers for checkpoints and summary.json."""
    names, source = data.class_names(), data.source()
    return {
        "option": f"{type(data).__module__}.{type(data).__qualname__}",
        "classes": list(names) if names else made.num_classes,
        **({"source": source} if source else {}),
        **data.identity(made),
    }


def samples_identity(made: Any) -> dict:
    """Every sample of `made`'s three splits together, in no order: {"samples": how many, "digest": ...}."""
    splits = [made.train, made.val, made.test]
    total = sum(t.numel() * t.element_size() for split in splits for t in split)
    whole = total <= TENSOR_BYTES
    rows = []
    for inputs, targets in splits:
        for start in range(0, len(targets), 4096):
            chunk = [inputs[start : start + 4096].cpu(), targets[start : start + 4096].cpu()]
            parts = [tensor.contiguous().reshape(len(tensor), -1).numpy() for tensor in chunk]
            for sample, target in zip(*parts, strict=True):
                digest = hashlib.blake2b(target.tobytes(), digest_size=16)
                if whole:
                    digest.update(sample.tobytes())
                rows.append(digest.hexdigest())
    return {"samples": len(rows), "digest": digest_of(sorted(rows)), **({} if whole else {"digest_of": "targets"})}


def digest_of(rows: list[str]) -> str:
    digest = hashlib.sha256()
    for row in rows:
        digest.update(row.encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


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
    from trainkit.data.file_data import split_files_change  # feature: file_data

    if "files" in saved and "files" in now:  # feature: file_data
        return split_files_change(name, saved, now)  # feature: file_data
    if saved.get("shape") != now.get("shape"):
        return f"the {name} split is {now.get('shape')}, was {saved.get('shape')}"
    if not math.isclose(saved.get("checksum", math.nan), now.get("checksum", math.nan), rel_tol=1e-9, abs_tol=1e-6):
        return f"the {name} split holds other values (its shape is the same)"
    return None


def identity_changes(before: dict | None, now: dict | None, samples: bool = True) -> list[str]:
    """What differs from the identity `before` to `now`, one phrase each; [] when they match or one is missing.
    `samples=False` leaves out the samples' count and digest, for a caller that names them otherwise."""
    from trainkit.data.file_data import read_files_changes  # feature: file_data

    if not before or not now:
        return []
    changes = []
    if before.get("option") != now.get("option"):
        changes.append(f"the data option is {now.get('option')}, was {before.get('option')}")
    if before.get("classes") != now.get("classes"):
        changes.append(f"the classes are {_classes(now.get('classes'))}, were {_classes(before.get('classes'))}")
    if before.get("source") != now.get("source") and not ("files" in before and "files" in now):
        changes.append(f"the data is {now.get('source')}, was {before.get('source')}")
    changes += read_files_changes(before.get("files"), now.get("files"))  # feature: file_data
    for count in ("samples", "texts") if samples else ():
        if before.get(count) is not None and now.get(count) is not None and before[count] != now[count]:
            changes.append(f"{now[count]:,} {count} where there were {before[count]:,}")
    if samples and not changes and before.get("digest") != now.get("digest"):
        what = "texts" if "texts" in now else "samples"
        changes.append(f"other {what} (as many: another digest of their contents)")
    return changes


def _classes(classes: Any) -> str:
    if isinstance(classes, list):
        shown = ", ".join(map(str, classes[:6])) + (", ..." if len(classes) > 6 else "")
        return f"{len(classes)} ({shown})"
    return str(classes)


def lacks_file_digests(identity: dict | None) -> bool:
    """Whether a run's `identity` records no digest of its files' contents."""
    return not identity or not any((entry or {}).get("sha256") for entry in (identity.get("files") or {}).values())
