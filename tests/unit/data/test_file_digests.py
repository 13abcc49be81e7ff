"""trainkit.data.file_digests: data=hf's digest of each file's bytes, cached under the file's size, mtime and inode."""

import json
import os
import shutil

import pytest

from trainkit.data.file_digests import cache_file, file_digest


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def file_sha256(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_files_digest_is_cached_under_its_size_mtime_and_inode_and_a_copy_is_read_again(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_bytes(b"x" * 3_000_000)  # more than a block: streamed
    assert file_digest(data) == file_sha256(data)
    cached = json.loads(cache_file().read_text())
    entry = cached[os.path.realpath(data)]
    assert entry["size"] == 3_000_000 and entry["inode"] == data.stat().st_ino
    entry["sha256"] = "from the cache"
    cache_file().write_text(json.dumps(cached))
    assert file_digest(data) == "from the cache"  # not read again
    copy = tmp_path / "copy.jsonl"
    shutil.copy2(data, copy)  # the same mtime, another inode
    assert copy.stat().st_mtime_ns == data.stat().st_mtime_ns and file_digest(copy) == file_sha256(data)
    data.write_bytes(b"y" * 3_000_000)  # rewritten in place: the same size and inode, another mtime
    os.utime(data, ns=(data.stat().st_atime_ns, entry["mtime_ns"] + 1))  # later (two writes ms apart may share one)
    assert file_digest(data) == file_sha256(data)
