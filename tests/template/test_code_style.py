"""The code-style tools agree with each other: the dev extra, the pre-commit hooks, CI and the README."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the dev extra installs tomli
    import tomli as tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def dev_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {Requirement(line).name: Requirement(line) for line in project["optional-dependencies"]["dev"]}


def pre_commit_repos() -> dict[str, dict]:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    return {repo["repo"].rstrip("/").split("/")[-1]: repo for repo in config["repos"]}


def test_dev_extra_brings_the_test_lint_type_check_and_hook_tools():
    assert {"pytest", "ruff", "mypy", "pre-commit"} <= dev_requirements().keys()


def test_pre_commit_fixes_lints_formats_and_guards_the_files():
    repos = pre_commit_repos()
    ruff_hooks = [hook["id"] for hook in repos["ruff-pre-commit"]["hooks"]]
    # The linter's fixes can leave code to reformat, so it runs first.
    assert ruff_hooks.index("ruff-check") < ruff_hooks.index("ruff-format")
    ruff_check = next(hook for hook in repos["ruff-pre-commit"]["hooks"] if hook["id"] == "ruff-check")
    assert "--fix" in ruff_check.get("args", [])
    file_hooks = {hook["id"] for hook in repos["pre-commit-hooks"]["hooks"]}
    assert {"end-of-file-fixer", "check-yaml", "check-added-large-files"} <= file_hooks


def test_pre_commit_ruff_is_a_version_the_dev_extra_allows():
    # Otherwise the hook and CI (which installs the dev extra) could lint or format differently.
    rev = pre_commit_repos()["ruff-pre-commit"]["rev"]
    assert Version(rev.removeprefix("v")) in dev_requirements()["ruff"].specifier


def test_pre_commit_config_is_valid():
    pytest.importorskip("pre_commit")
    command = [sys.executable, "-m", "pre_commit", "validate-config", ".pre-commit-config.yaml"]
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert process.returncode == 0, process.stdout + process.stderr


def test_ci_runs_lint_format_and_type_checks_before_the_readme_test_command():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line.removeprefix("python -m ") for line in lines if line and not line.startswith("#")]
    assert "set -euo pipefail" in commands
    quickstart = re.search(r"^## Quickstart\n(.*?)^## ", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)
    test_command = re.search(r"^(python -m pytest\b[^#\n]*?)\s*(#|$)", quickstart.group(1), re.MULTILINE).group(1)
    assert lines[-1] == test_command  # the README's command, exactly, and last
    checks = [commands.index(check) for check in ("ruff check .", "ruff format --check .", "mypy")]
    install = next(i for i, command in enumerate(commands) if command.startswith("pip install"))
    assert install < min(checks) and max(checks) < len(commands) - 1
