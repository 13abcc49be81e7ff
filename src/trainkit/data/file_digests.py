"""data=hf's digest of each data file's bytes, cached under the file's size, mtime and inode, so that a file read
again is not digested again: what tells a changed file of the same name and size apart (trainkit.data.fingerprint)."""

import hashlib
import json
import os
import tempfile
from pathlib import Path

BLOCK = 1 << 20  # bytes read at a time


def cache_file() -> Path:
    """Where file digests are kept: $XDG_CACHE_HOME/trainkit/file_digests.json (else ~/.cache/trainkit/...)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainkit" / "file_digests.json"


def file_digest(path: Path) -> str:
    """The SHA-256 of `path`'s bytes, from the cache where the file's size, mtime and inode match, else read."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    key = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}
    cached = _read_cache()
    entry = cached.get(real)
    if isinstance(entry, dict) and all(entry.get(name) == value for name, value in key.items()):
        return str(entry["sha256"])
    digest = hashlib.sha256()
    with open(real, "rb") as file:
        while block := file.read(BLOCK):
            digest.update(block)
    cached = _read_cache()  # another process may have added to it meanwhile
    cached[real] = {**key, "sha256": digest.hexdigest()}
    _write_cache(cached)
    return digest.hexdigest()


def _read_cache() -> dict:
    try:
        loaded = json.loads(cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _write_cache(cached: dict) -> None:
    where = cache_file()
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=where.parent, prefix=".file_digests.", suffix=".json")
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            json.dump(cached, file)
        os.replace(temporary, where)
    except OSError:
        return  # a read-only home: no cache
