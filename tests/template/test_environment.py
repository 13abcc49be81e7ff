"""environment.yml (conda) and pyproject.toml (pip) must describe the same environment."""

import re
from pathlib import Path

import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the dev extra installs tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_environment_yml_installs_the_project_with_pip_and_a_supported_python():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dependencies = env["dependencies"]
    python = next(d for d in dependencies if isinstance(d, str) and d.startswith("python"))
    minimum = re.search(r">=\s*3\.(\d+)", project["requires-python"]).group(1)
    assert int(python.split("=")[-1].split(".")[1]) >= int(minimum)
    assert "pip" in dependencies
    pip_section = next(d["pip"] for d in dependencies if isinstance(d, dict))
    assert pip_section == ['-e ".[dev]"'] or pip_section == ["-e .[dev]"]


def test_environment_yml_pins_no_package_of_its_own():
    # Any conda package beyond python and pip would be a second, drifting list of dependencies.
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_packages = {re.split(r"[=<>]", d)[0] for d in env["dependencies"] if isinstance(d, str)}
    assert conda_packages == {"python", "pip"}


def test_dev_extra_brings_the_test_runner():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("pytest") for d in project["optional-dependencies"]["dev"])
