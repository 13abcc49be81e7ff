"""What data a run read before any split, the same for every fold, split seed and tokenizer of one dataset
(docs/resume-and-preemption.md#resume-and-requeued-jobs); no torch at module level, for scripts/compare_runs.py."""

import hashlib
from typing import Any

TENSOR_BYTES = 1 << 31  # above this, only the labels are digested


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


def identity_changes(before: dict | None, now: dict | None, samples: bool = True) -> list[str]:
    """What differs from the identity `before` to `now`, one phrase each; [] when they match or one is missing.
    `samples=False` leaves out the samples' count and digest, for a caller that names them otherwise."""
    if not before or not now:
        return []
    changes = []
    if before.get("option") != now.get("option"):
        changes.append(f"the data option is {now.get('option')}, was {before.get('option')}")
    if before.get("classes") != now.get("classes"):
        changes.append(f"the classes are {_classes(now.get('classes'))}, were {_classes(before.get('classes'))}")
    if before.get("source") != now.get("source") and not ("files" in before and "files" in now):
        changes.append(f"the data is {now.get('source')}, was {before.get('source')}")
    changes += _file_changes(before.get("files"), now.get("files"))
    for count in ("samples", "texts") if samples else ():
        if before.get(count) is not None and now.get(count) is not None and before[count] != now[count]:
            changes.append(f"{now[count]:,} {count} where there were {before[count]:,}")
    if samples and not changes and before.get("digest") != now.get("digest"):
        what = "texts" if "texts" in now else "samples"
        changes.append(f"other {what} (as many: another digest of their contents)")
    return changes


def _file_changes(before: dict | None, now: dict | None) -> list[str]:
    if before is None or now is None:
        return []
    added, removed = sorted(set(now) - set(before)), sorted(set(before) - set(now))
    changes = [f"{', '.join(added)} read, not read before"] if added else []
    changes += [f"{', '.join(removed)} read before, not now"] if removed else []
    for name in sorted(set(now) & set(before)):
        first, second = before[name] or {}, now[name] or {}
        if first.get("bytes") != second.get("bytes"):
            changes.append(f"{name} is {second.get('bytes'):,} bytes, was {first.get('bytes'):,}")
        elif first.get("sha256") and second.get("sha256") and first["sha256"] != second["sha256"]:
            changes.append(
                f"the contents of {name} differ (the same name and size; sha256 {second['sha256'][:12]}, was "
                f"{first['sha256'][:12]})"
            )
    return changes


def _classes(classes: Any) -> str:
    if isinstance(classes, list):
        shown = ", ".join(map(str, classes[:6])) + (", ..." if len(classes) > 6 else "")
        return f"{len(classes)} ({shown})"
    return str(classes)


def lacks_file_digests(identity: dict | None) -> bool:
    """Whether a run's `identity` records no digest of its files' contents."""
    return not identity or not any((entry or {}).get("sha256") for entry in (identity.get("files") or {}).values())
