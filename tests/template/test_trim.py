"""scripts/trim.py on a small git repository of its own: the listing, --dry-run, a real --drop (files, config keys,
marked lines, doc blocks, packages), what needs a dropped capability, --keep, the refusal of a dirty tree, and a file
that two rows list."""

import subprocess
from pathlib import Path

import pytest

from helpers import load_script

trim = load_script("trim")

FILES = {
    "docs/features.md": (
        "| capability | files to delete | config keys to remove | marked lines | packages | needs | places |\n"
        "|---|---|---|---|---|---|---|\n"
        "| `fancy`: a fancy optimizer | `src/fancy.py`, `tests/test_fancy.py` | `conf/config.yaml`: `fancy` | "
        "`train.py`: 1 | `fancy-lib` | | 5 |\n"
        "| `race`: fancy against plain | `scripts/race.py` | | | | `fancy` | 1 |\n"
        "| `plain`: a plain helper | `src/plain.py` | | | | | 1 |\n"
    ),
    "src/fancy.py": "x = 1\ny = 2\n",
    "src/plain.py": "z = 3\n",
    "tests/test_fancy.py": "def test_x():\n    pass\n",
    "scripts/race.py": "import fancy\n",
    "conf/config.yaml": "seed: 0\nfancy:\n  beta: 0.9\n  gamma: 1\nlr: 0.1\n",
    "train.py": "import os\nimport fancy  # feature: fancy\nprint(os.name)\n",
    "README.md": "# Demo\n\nTrain it.\n<!-- feature: fancy -->\n## Fancy\n\nIt is fancy.\n<!-- /feature: fancy -->\n",
    "pyproject.toml": (
        '[project]\ndependencies = [\n    "torch>=2.4",\n    "fancy-lib>=1.0",   # optimizer=fancy\n]\n\n'
        "[project.optional-dependencies]\n# The fancy extra: fancy-lib alone.\n"
        'fancy = ["fancy-lib>=1.0"]\ndev = ["pytest>=8"]\n'
    ),
    "environment.yml": "name: demo\ndependencies:\n  - python=3.11\n  - pip\n",
}


def commit(files: dict[str, str], root: Path) -> Path:
    """A git repository at `root` holding `files`, committed."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "template"], cwd=root, check=True)
    return root


@pytest.fixture
def repository(tmp_path) -> Path:
    return commit(FILES, tmp_path)


def test_the_listing_gives_each_capability_its_places_lines_packages_and_needs(repository, capsys):
    assert trim.main([], root=repository) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[1].split() == ["fancy", "5", "11", "fancy-lib", "-"]  # 4 lines of files, 1 marked, 6 of docs
    assert listed[2].split() == ["race", "1", "2", "-", "fancy"]
    fancy = trim.read_table(repository)["fancy"]  # its files, config.yaml, train.py, pyproject.toml, README.md
    assert (fancy.counted_places(repository), fancy.counted_places(repository, docs=False)) == (5, 4)


def test_a_dry_run_names_what_would_go_and_changes_nothing(repository, capsys):
    assert trim.main(["--drop", "fancy", "--dry-run"], root=repository) == 0
    out = capsys.readouterr().out
    assert "also dropping race: they need what is dropped" in out
    assert "would remove fancy:" in out and "would remove race:" in out
    assert "pyproject.toml: " in out and "train.py: 1 marked line\n" in out
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repository, capture_output=True).stdout == b""


def test_a_drop_removes_the_rows_and_what_needs_them_and_says_how_to_record_it(repository, capsys):
    assert trim.main(["--drop", "fancy"], root=repository) == 0
    out = capsys.readouterr().out
    assert not (repository / "src/fancy.py").exists() and not (repository / "scripts/race.py").exists()
    assert (repository / "src/plain.py").exists()
    assert (repository / "conf/config.yaml").read_text() == "seed: 0\nlr: 0.1\n"
    assert (repository / "train.py").read_text() == "import os\nprint(os.name)\n"
    assert (repository / "README.md").read_text() == "# Demo\n\nTrain it.\n"
    assert (repository / "pyproject.toml").read_text() == (
        '[project]\ndependencies = [\n    "torch>=2.4",\n]\n\n[project.optional-dependencies]\ndev = ["pytest>=8"]\n'
    )
    assert [row.split("|")[1].strip() for row in (repository / "docs/features.md").read_text().splitlines()[2:]] == [
        "`plain`: a plain helper"
    ]
    assert out.splitlines()[-1] == 'Then record the trim as one commit:  git commit -am "trim: drop fancy, race"'
    assert f"Now check what is left:  {trim.TEST_COMMAND}" in out


def test_keep_drops_every_other_row_but_what_the_kept_ones_need(repository, capsys):
    assert trim.main(["--keep", "race", "--dry-run"], root=repository) == 0
    out = capsys.readouterr().out
    assert "would remove plain:" in out and "fancy" not in out.replace("race", "")


def test_a_dirty_tree_or_an_unknown_name_is_refused_in_one_line(repository, capsys):
    (repository / "train.py").write_text("changed\n")
    assert trim.main(["--drop", "plain"], root=repository) == 1
    assert capsys.readouterr().err == (
        f"error: {repository} has uncommitted changes: commit or discard them first (git status lists them)\n"
    )
    assert (repository / "src/plain.py").exists()
    assert trim.main(["--drop", "plane", "--dry-run"], root=repository) == 1
    names = "fancy, race, plain"
    assert capsys.readouterr().err == f"error: no capability plane in docs/features.md: the names are {names}\n"


SHARED = {
    "docs/features.md": (
        "| capability | files to delete | config keys to remove | marked lines | packages | needs | places |\n"
        "|---|---|---|---|---|---|---|\n"
        "| `search`: a search | `conf/search/grid.yaml`, `conf/search/big.yaml` | | `conf/config.yaml`: 1 | | | 2 |\n"
        "| `big`: a big model | `src/big.py`, `conf/search/big.yaml` | | | | | 1 |\n"
    ),
    "conf/config.yaml": "defaults:\n  - _self_\n  - search: null   # feature: search\nseed: 0\n",
    "conf/search/grid.yaml": "n: 1\n",
    "conf/search/big.yaml": "n: 2\n",
    "src/big.py": "x = 1\n",
    "README.md": "# Demo\n\n- grid <!-- feature: search -->\n- big <!-- feature: big --> <!-- feature: search -->\n",
}


def test_a_file_two_rows_list_goes_with_either_and_a_marked_yaml_line_goes(tmp_path, capsys):
    both = commit(SHARED, tmp_path / "both")
    assert trim.main(["--drop", "search,big"], root=both) == 0  # the second row finds its shared file gone
    assert not (both / "conf/search").exists() and not (both / "src").exists()  # the folders they left empty too
    one = commit(SHARED, tmp_path / "one")
    assert trim.main(["--drop", "search"], root=one) == 0
    assert (one / "conf/config.yaml").read_text() == "defaults:\n  - _self_\nseed: 0\n"
    assert (one / "README.md").read_text() == "# Demo\n\n"  # a line marked for both rows goes with either
    assert not (one / "conf/search/big.yaml").exists() and (one / "src/big.py").exists()
    assert trim.read_table(one)["big"].files == ["src/big.py"]  # the row left no longer lists what went
    capsys.readouterr()
    assert trim.main([], root=one) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["big", "1", "2", "-", "-"]  # its file, its table row


def test_a_package_left_with_only_its_init_goes_and_one_that_keeps_a_module_stays(tmp_path, capsys):
    table = FILES["docs/features.md"].replace("`src/fancy.py`", "`src/finders/fancy.py`")
    files = {**FILES, "docs/features.md": table, "src/finders/__init__.py": '"""Finders."""\n'}
    files["src/finders/fancy.py"] = files.pop("src/fancy.py")
    dropped = commit(files, tmp_path / "dropped")
    assert trim.main(["--drop", "fancy"], root=dropped) == 0
    assert not (dropped / "src/finders").exists() and (dropped / "src/plain.py").exists()
    kept = commit({**files, "src/finders/plain.py": "z = 3\n"}, tmp_path / "kept")
    assert trim.main(["--drop", "fancy"], root=kept) == 0
    assert (kept / "src/finders/__init__.py").exists()
    capsys.readouterr()


def test_a_row_whose_marked_lines_were_in_a_dropped_file_stops_listing_them(tmp_path, capsys):
    table = FILES["docs/features.md"].replace(
        "| `plain`: a plain helper | `src/plain.py` | | | | | 1 |",
        ("| `plain`: a plain helper | `src/plain.py` | | `src/fancy.py`: 1; `train.py`: 1 | | | 3 |"),
    )
    files = {**FILES, "docs/features.md": table, "src/fancy.py": "x = 1\ny = 2  # feature: plain\n"}
    files["train.py"] += "print(3)  # feature: plain\n"
    root = commit(files, tmp_path)
    assert trim.main(["--drop", "fancy"], root=root) == 0
    plain = trim.read_table(root)["plain"]
    assert plain.marked == {"train.py": 1} and plain.places == 2 == plain.counted_places(root)
    capsys.readouterr()


def test_a_blank_line_between_two_marked_lines_goes_with_them():
    """ruff format puts a blank line after an import; between two marked lines it would be left doubled with the
    blank line after them, which ruff format then refuses in the trimmed clone."""
    method = (
        "    def own_val(self):\n"
        '        """Refused by folds."""\n'
        "        from folds import refuse  # feature: folds\n"
        "\n"
        "        refuse(self)  # feature: folds\n"
        "\n"
        "    def next(self):\n"
    )
    assert trim.without_marked_lines(method, "folds") == (
        '    def own_val(self):\n        """Refused by folds."""\n\n    def next(self):\n'
    )
    kept = "x = 1  # feature: folds\n\ny = 2\n"  # a blank line after the last marked line stays
    assert trim.without_marked_lines(kept, "folds") == "\ny = 2\n"
