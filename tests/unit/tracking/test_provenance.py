"""provenance.json, packages.txt and code.diff, written into a run directory from a small git
repository made in tmp_path (and from no repository, and with no git at all)."""

import json
import logging
import subprocess
from pathlib import Path

import pytest
import torch

from trainkit.tracking.provenance import strip_credentials, write_provenance

CPU = torch.device("cpu")


def git(repository: Path, *args: str) -> str:
    command = ["git", "-C", str(repository), "-c", "user.name=test", "-c", "user.email=test@example.com", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repository(tmp_path) -> Path:
    """A checkout with one commit (train.py and a binary file) and a remote whose URL holds a token."""
    repository = tmp_path / "repository"
    repository.mkdir()
    git(repository, "init", "-q", "-b", "main")
    (repository / "train.py").write_text("print('hello')\n")
    (repository / "weights.bin").write_bytes(bytes(range(256)))
    git(repository, "add", ".")
    git(repository, "commit", "-q", "-m", "first")
    git(repository, "remote", "add", "origin", "https://user:secret-token@github.com/x/y.git")
    return repository


@pytest.fixture
def run_dir(tmp_path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return run_dir


def test_fields_are_present_and_typed(repository, run_dir):
    returned = write_provenance(run_dir, repository, seed=3, deterministic=True, world_size=1, device=CPU)
    facts = json.loads((run_dir / "provenance.json").read_text())
    assert facts == returned
    commit = git(repository, "rev-parse", "HEAD").strip()
    assert facts["git"] == {
        "commit": commit,
        "branch": "main",
        "dirty": False,
        "remote": "https://github.com/x/y.git",
        "untracked": [],
    }
    assert facts["code"] == commit[:7]
    assert isinstance(facts["command"], list) and all(isinstance(arg, str) for arg in facts["command"])
    assert facts["overrides"] == []  # no .hydra/overrides.yaml here
    assert facts["start_time_utc"].endswith("+00:00")
    assert isinstance(facts["hostname"], str) and isinstance(facts["python"], str)
    assert facts["torch"]["version"] == torch.__version__
    assert set(facts["torch"]) == {"version", "cuda", "cudnn", "nccl"}
    assert facts["packages"]["torch"] and facts["packages"]["hydra-core"]  # pyproject's dependencies
    assert "pytest" not in facts["packages"]  # an extra (dev), not a dependency
    assert isinstance(facts["cpu"]["model"], str) and facts["cpu"]["cores"] >= 1
    assert facts["gpus"] == [] and facts["device"] == "cpu"
    assert (facts["world_size"], facts["seed"], facts["deterministic"]) == (1, 3, True)
    freeze = (run_dir / "packages.txt").read_text().splitlines()
    assert f"torch=={facts['packages']['torch']}" in freeze and all("==" in line for line in freeze)
    assert not (run_dir / "code.diff").exists()  # a clean tree has no diff


def test_overrides_come_from_hydras_file(repository, run_dir):
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("- optimizer.lr=0.1\n- seed=2\n")
    facts = write_provenance(run_dir, repository, seed=2, deterministic=False, world_size=1, device=CPU)
    assert facts["overrides"] == ["optimizer.lr=0.1", "seed=2"]


@pytest.mark.parametrize(
    "url, stripped",
    [
        ("https://user:token@github.com/x/y.git", "https://github.com/x/y.git"),
        ("https://ghp_token@github.com:8443/x/y.git", "https://github.com:8443/x/y.git"),
        ("ssh://git@github.com/x/y.git", "ssh://github.com/x/y.git"),
        ("git@github.com:x/y.git", "git@github.com:x/y.git"),  # scp-style: a user name, no secret
        ("https://github.com/x/y.git", "https://github.com/x/y.git"),
    ],
)
def test_credentials_are_stripped_from_the_remote_url(url, stripped):
    assert strip_credentials(url) == stripped


def test_no_token_is_written_anywhere(repository, run_dir):
    (repository / "train.py").write_text("print('changed')\n")  # dirty: code.diff too
    write_provenance(run_dir, repository, seed=0, deterministic=False, world_size=1, device=CPU)
    for path in run_dir.iterdir():
        assert b"secret-token" not in path.read_bytes(), path.name


def test_a_dirty_tree_writes_a_diff_that_git_applies(repository, run_dir):
    (repository / "train.py").write_text("print('changed')\n")
    (repository / "weights.bin").write_bytes(bytes(reversed(range(256))))  # binary-safe
    (repository / "new_model.py").write_text("x = 1\n")  # untracked
    facts = write_provenance(run_dir, repository, seed=0, deterministic=False, world_size=1, device=CPU)
    assert facts["git"]["dirty"] is True and facts["code"].endswith("+dirty")
    assert facts["git"]["untracked"] == ["new_model.py"]
    diff = (run_dir / "code.diff").read_bytes()
    assert b"# untracked, not in the diff below: new_model.py\n" in diff and b"GIT binary patch" in diff
    git(repository, "checkout", "-q", "--", ".")  # back to the commit, then the diff brings the changes back
    git(repository, "apply", str(run_dir / "code.diff"))
    assert (repository / "train.py").read_text() == "print('changed')\n"
    assert (repository / "weights.bin").read_bytes() == bytes(reversed(range(256)))


def test_untracked_data_is_not_code(repository, run_dir):
    (repository / "images.npy").write_bytes(b"\x93NUMPY")  # left in the checkout, not ignored
    facts = write_provenance(run_dir, repository, seed=0, deterministic=False, world_size=1, device=CPU)
    assert facts["git"]["untracked"] == [] and facts["git"]["dirty"] is False
    assert not (run_dir / "code.diff").exists()


def test_a_clean_start_removes_an_earlier_diff(repository, run_dir):
    (run_dir / "code.diff").write_text("diff of an earlier start, before a resume\n")
    write_provenance(run_dir, repository, seed=0, deterministic=False, world_size=1, device=CPU)
    assert not (run_dir / "code.diff").exists()


def test_a_resume_keeps_what_each_earlier_part_recorded(repository, run_dir):
    (repository / "train.py").write_text("print('first part')\n")
    first = write_provenance(run_dir, repository, seed=0, deterministic=False, world_size=1, device=CPU)
    git(repository, "commit", "-qam", "second")  # the resume runs a newer, clean commit
    second = write_provenance(run_dir, repository, seed=0, deterministic=False, world_size=2, device=CPU)
    third = write_provenance(run_dir, repository, seed=0, deterministic=False, world_size=1, device=CPU)
    assert json.loads((run_dir / "provenance.json").read_text()) == third
    kept = run_dir / "provenance_parts"
    assert json.loads((kept / "1" / "provenance.json").read_text()) == first
    assert json.loads((kept / "2" / "provenance.json").read_text()) == second
    assert "first part" in (kept / "1" / "code.diff").read_text() and (kept / "1" / "packages.txt").is_file()
    assert not (run_dir / "code.diff").exists() and first["git"]["commit"] != third["git"]["commit"]


def test_untracked_files_alone_are_listed_in_code_diff(repository, run_dir):
    (repository / "notes.py").write_text("y = 2\n")
    facts = write_provenance(run_dir, repository, seed=0, deterministic=False, world_size=1, device=CPU)
    assert facts["git"]["dirty"] is True
    assert (run_dir / "code.diff").read_text() == "# untracked, not in the diff below: notes.py\n"


def test_outside_a_git_checkout_one_line_and_the_rest_is_written(tmp_path, run_dir, caplog):
    folder = tmp_path / "not_a_checkout"
    folder.mkdir()
    with caplog.at_level(logging.INFO):
        facts = write_provenance(run_dir, folder, seed=0, deterministic=False, world_size=1, device=CPU)
    lines = [record.getMessage() for record in caplog.records if "provenance" in record.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("provenance: no commit recorded (fatal: not a git repository")
    assert lines[0].endswith("); the rest is in provenance.json")
    assert facts["git"] is None and facts["code"] is None and facts["packages"]["torch"]
    assert (run_dir / "provenance.json").is_file() and (run_dir / "packages.txt").is_file()
    assert not (run_dir / "code.diff").exists()


def test_without_git_installed_one_line(repository, run_dir, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(run_dir))  # no git on it
    with caplog.at_level(logging.INFO):
        facts = write_provenance(run_dir, repository, seed=0, deterministic=False, world_size=1, device=CPU)
    assert [r.getMessage() for r in caplog.records if "provenance" in r.getMessage()] == [
        "provenance: no commit recorded (git is not installed); the rest is in provenance.json"
    ]
    assert facts["git"] is None and (run_dir / "provenance.json").is_file()
