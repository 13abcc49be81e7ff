"""Every optional feature can be deleted: docs/features.md's table, applied to a copy of the repository by
scripts/trim.py's own code (`trim.drop`).

For each row: its files deleted, its config keys removed, its marked lines (`# feature: <name>`) deleted, and in
the docs its marked lines and blocks (`<!-- feature: <name> -->`) and its row of the table; then nothing left names
its modules, ruff and mypy pass, every module imports and `python train.py` trains the default run (one epoch), all
in the copy. With every row dropped at once, the core's quick tests and the template's own pass there too. The
table is the one list: a row added there is deleted here, and one whose deletion needs more than it says fails here.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import load_script
from template.test_docs_links import anchors_in, links_in

ROOT = Path(__file__).resolve().parents[2]
trim = load_script("trim")
TABLE = ROOT / trim.TABLE
MARKER, DOC_MARKER = trim.MARKER, trim.DOC_MARKER
marked_files, doc_files, without_docs_of = trim.marked_files, trim.doc_files, trim.without_docs_of
# What the docs may call a feature by, beyond its files' paths: none of it may outlive its deletion.
DOC_NAMES = {
    "lr_finder": r"lr.?find|range test|lr_finder",
    "hf": r"data=hf|model=hf|experiment=stdlib_functions_hf|export=|data\.tokenizer=bpe|tokenizer_library",
    "signal": r"model=signal|SignalClassifier|variable-length-signals",
    "compare_runs": r"compare_runs\.py",
    "eval_figures": r"confusion_matrix|predictions\.png",
    "slurm": r"launcher=slurm|submitit|slurm_example",
    "tta_flip": r"tta_flip|flip test-time|\btta\b",
    "batch_augment": r"color_jitter|colou?r jitter|random_erasing|random erasing|augmentation=strong\b|BatchAugment"
    r"|batch_augment",
    "local_launch": r"local_launch|self-started|starts the processes itself|parent of (?:the )?DDP workers",
    "file_data": r"FileData|FileSplits|FileLoader|SeededSamples|SeededIndices|file_data\.py|data read from files",
    "image_files": r"image_files|save_png",
    "augment_recipes": r"mixup|cutmix|randaugment|trivialaugment|rand_augment|trivial_augment|\bper_sample|LabelMixing",
    "language_model": r"stdlib_gpt|prompt=|TextBlocks|LanguageModel",
    "downloads": r"mnist|cifar",
    "sweeps": r"hparams_search|_optuna\b|joblib|hydra/sweeper|sweeper\.direction|Optuna (?:search|TPE|stud)",
    "text": r"textfolder|stdlib_functions|model=sequence|SequenceClassifier|TextFolder|StdlibFunctions|tokenizing\.py"
    r"|text classif",
    "size_budget": r"SizeBudgetBatches|size budget|token budget|max_<unit>|max_frames",
    "loop_timing": r"data_wait_fraction|step_ms|peak_memory_gb|cpu_util|gpu_util|LoopTimer|data-bound|ms/step"
    r"|where-the-time-goes",
}
FEATURES = trim.read_table(ROOT)


def test_remove_key_keeps_the_rest_of_the_file():
    text = "a:\n  b: 1   # one\n  c:\n    d: 2\n\n    e: 3\n  f: 4\ng: 5\n"
    assert trim.remove_key(text, "a.c") == "a:\n  b: 1   # one\n  f: 4\ng: 5\n"
    assert trim.remove_key(text, "a.c.d") == "a:\n  b: 1   # one\n  c:\n\n    e: 3\n  f: 4\ng: 5\n"
    assert trim.remove_key("a:\n  b: 1\ng: 5\n", "a.b") == "g: 5\n"
    # a top-level key is found at the top level, not as a nested key of the same name above it
    assert trim.remove_key("t:\n  c:\n    x: 1\nc:\n  y: 2\nz: 3\n", "c.y") == "t:\n  c:\n    x: 1\nz: 3\n"
    # a section between blank lines takes one of them along, so sections dropped side by side leave one blank line
    assert trim.remove_key("a: 1\n\nb:\n  c: 2\n\nd: 3\n", "b") == "a: 1\n\nd: 3\n"


def test_the_table_lists_features_and_every_marked_line_belongs_to_one():
    rows = [line for line in TABLE.read_text(encoding="utf-8").splitlines() if line.startswith("| `")]
    assert len(FEATURES) == len(rows), f"{TABLE} has rows that scripts/trim.py does not read"  # none once all go
    for path in marked_files(ROOT):
        for name in MARKER.findall(path.read_text(encoding="utf-8")):
            assert name in FEATURES, f"{path.relative_to(ROOT)} marks a line for {name}, which {TABLE.name} lacks"
    for path in doc_files(ROOT):
        for _, name in DOC_MARKER.findall(path.read_text(encoding="utf-8")):
            assert name in FEATURES, f"{path.relative_to(ROOT)} marks a line for {name}, which {TABLE.name} lacks"


def test_each_row_counts_the_marked_lines_trim_finds():
    """A row's marked-lines cell is what trim.py removes of it: in code, in conf/ and in pyproject.toml (a pytest
    setting for a row's package, such as the sweeps row's warning filter for optuna)."""
    for row in FEATURES.values():
        removed = trim.drop(ROOT, row, write=False)
        found = {file: count for file, count in removed.marked.items() if file not in row.files}
        assert found == row.marked, f"{row.name}: the table says {row.marked}"


def test_marked_doc_lines_and_blocks_go_and_nothing_else():
    text = (
        "a\nb <!-- feature: x -->\n  <!-- feature: x -->\nc\n<!-- feature: y -->\nd\n<!-- /feature: y -->\n"
        "  <!-- /feature: x -->\ne\n"
    )
    assert trim.without_marked_docs(text, "x") == "a\ne\n"
    only_x = "a\nb <!-- feature: x -->\n  <!-- feature: x -->\nc\n  <!-- /feature: x -->\ne\n"
    assert trim.without_marked_docs(text, "y") == only_x
    with pytest.raises(trim.TrimError, match="no closing"):
        trim.without_marked_docs("a\n<!-- feature: x -->\nb\n", "x")


@pytest.mark.parametrize("name", list(FEATURES))
def test_deleting_the_feature_leaves_no_doc_naming_it_and_every_link_resolves(name):
    """The docs' side of a deletion, on text alone: after its marked doc lines, its table row, its config keys and
    its files go (and those of the rows that need it, which trim.py drops with it), no line of README.md,
    CONTRIBUTING.md, docs/, conf/ or the shell scripts in scripts/ names a file it deleted or a config key it
    removed, picks a config option whose yaml it deleted (`<group>=<option>`, or the option in its group's row of the
    README's config-groups table), or, for a feature in DOC_NAMES, calls it by its name; and every relative link
    still reaches a file and a heading."""
    rows = [FEATURES[dropped] for dropped in trim.to_drop(FEATURES, [name])]
    files = [file for row in rows for file in row.files]
    deleted = {ROOT / file for file in files}
    texts = {}
    shell_scripts = sorted({*(ROOT / "scripts").rglob("*.sh"), *(ROOT / "scripts").glob("*.sbatch")})
    for path in [*doc_files(ROOT), *sorted((ROOT / "conf").rglob("*.yaml")), *shell_scripts]:
        if path in deleted or any(folder in path.parents for folder in deleted):
            continue
        text = path.read_text(encoding="utf-8")
        if path in shell_scripts:
            dropped = {row.name for row in rows}
            text = "\n".join(line for line in text.splitlines() if not dropped & set(trim.MARKER.findall(line)))
        for row in rows:
            for key in row.config.get(str(path.relative_to(ROOT)), []):
                text = trim.remove_key(text, key)
            if path.suffix == ".yaml":
                text = trim.without_marked_lines(text, row.name)
            text = without_docs_of(path.relative_to(ROOT), text, row.name, row.files)
        texts[path] = text
    named = [re.escape(file) for file in files]
    named += [re.escape(file.removeprefix("src/trainkit/")) for file in files if file.startswith("src/")]
    options = config_options(files)
    named += [rf"\b{re.escape(group)}={re.escape(option)}\b" for group, option in options]
    named += [DOC_NAMES[row.name] for row in rows if row.name in DOC_NAMES]
    # a removed key as the docs write it: dotted (sweep.continue_jobs), or a top-level one set or opened (lr_finder.)
    removed = {key for row in rows for keys in row.config.values() for key in keys if "_checks_" not in key}
    named += [rf"(?<![\w./]){re.escape(key)}" + (r"\b" if "." in key else r"[.=]\w") for key in removed]
    pattern = re.compile("|".join(named), re.IGNORECASE)
    left = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path, text in texts.items()
        for number, line in enumerate(text.splitlines(), 1)
        if pattern.search(line) or (path == ROOT / "README.md" and listed_in_config_groups(line, options))
    ]
    assert left == [], f"{name} deleted, the docs still name it:\n" + "\n".join(left)
    for path, text in texts.items():
        if path.suffix != ".md":
            continue
        for link in links_in(text):
            target, _, anchor = link.partition("#")
            target_path = (path.parent / target).resolve() if target else path
            assert target_path.exists() and target_path not in deleted, f"{path.relative_to(ROOT)}: {link} is gone"
            if anchor and target_path in texts:
                assert anchor in anchors_in(texts[target_path]), f"{path.relative_to(ROOT)}: {link}: no such heading"


def config_options(files: list[str]) -> list[tuple[str, str]]:
    """The (group, option) of each `conf/<group>/<option>.yaml` among `files`: the options a deletion takes away."""
    return [
        (str(Path(file).parent.relative_to("conf")), Path(file).stem)
        for file in files
        if file.startswith("conf/") and file.endswith(".yaml") and Path(file).parent != Path("conf")
    ]


def listed_in_config_groups(line: str, options: list[tuple[str, str]]) -> bool:
    """Whether `line`, a row of the README's config-groups table (`| `<group>` | <options> | ...`), lists one of
    `options` of its group in its options cell: a row that outlives its option's file."""
    cells = line.split("|")
    for group, option in options:
        if line.startswith(f"| `{group}` |") and len(cells) > 2 and re.search(rf"\b{re.escape(option)}\b", cells[2]):
            return True
    return False


def modules_of(packages: list[str]) -> set[str]:
    """The modules that only the distributions `packages` install: top-level ones (mlflow-skinny's `mlflow`) and,
    in a namespace several distributions share, their own subpackage (`hydra_plugins.hydra_submitit_launcher`)."""
    from importlib.metadata import PackageNotFoundError, distribution, packages_distributions

    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    wanted = {canonical(package) for package in packages}
    owners = packages_distributions()
    modules = set()
    for package in packages:
        try:
            files = distribution(package).files or []
        except PackageNotFoundError:
            continue
        for parts in (Path(str(file)).parts for file in files if str(file).endswith(".py")):
            top = parts[0].removesuffix(".py")
            if {canonical(owner) for owner in owners.get(top, [])} <= wanted:
                modules.add(top)
            elif len(parts) > 2:  # a namespace package: the distribution's own folder in it
                modules.add(f"{top}.{parts[1]}")
    return modules


def imports_of(modules: set[str]) -> re.Pattern:
    names = "|".join(re.escape(module) for module in sorted(modules))
    return re.compile(rf"^\s*(?:import|from)\s+(?:{names})\b|(?:importorskip|import_module)\([\"'](?:{names})\b", re.M)


@pytest.mark.parametrize("name", [name for name, row in FEATURES.items() if row.packages])
def test_deleting_the_feature_leaves_no_file_importing_its_packages(name):
    """On text alone: once the row's files and marked lines go, no Python file left imports a module of the
    packages the row takes out of pyproject.toml (the slow test also checks that a run imports none)."""
    feature = FEATURES[name]
    modules = modules_of(feature.packages)
    assert modules, f"{name}: none of {feature.packages} is installed here, so nothing can be checked"
    deleted = {ROOT / file for file in feature.files}
    pattern = imports_of(modules)
    left = []
    for path in sorted(
        {*ROOT.glob("*.py"), *ROOT.glob("scripts/**/*.py"), *ROOT.glob("src/**/*.py"), *ROOT.glob("tests/**/*.py")}
    ):
        if path in deleted or any(folder in path.parents for folder in deleted):
            continue
        text = "".join(
            line
            for line in path.read_text(encoding="utf-8").splitlines(keepends=True)
            if name not in MARKER.findall(line)
        )
        left += [f"{path.relative_to(ROOT)}: {match.group().strip()}" for match in pattern.finditer(text)]
    assert left == [], f"{name} deleted, these still import {sorted(modules)}:\n" + "\n".join(left)


def test_the_config_check_names_no_feature():
    """trainkit.config checks the core's keys and gathers each feature's checks from the module its section names
    (`_checks_`): a feature's name, module or config key there would outlive deleting the feature."""
    names, keys = set(), set()
    for name, feature in FEATURES.items():
        names |= {name, *(Path(file).stem for file in feature.files if file.endswith(".py"))}
        keys |= {key.split(".")[-1] for keys in feature.config.values() for key in keys}
    # A key is named as a key ("sample", sample.seed, sample=), not as the word (language_model's `sample`).
    patterns = {name: rf"\b{re.escape(name)}\b" for name in names}
    patterns |= {key: rf"(?<=[\"'.]){re.escape(key)}\b|\b{re.escape(key)}(?=[\".=])" for key in keys - names}
    for path in sorted((ROOT / "src" / "trainkit" / "config").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"^\s*(from|import) (?!trainkit)\S+.*$", "", text, flags=re.M)  # another package's (rich.text)
        named = sorted(name for name, pattern in patterns.items() if re.search(pattern, text))
        assert not named, f"{path.relative_to(ROOT)} names {', '.join(named)}"


# Modules the core keeps for two rows that need neither other (a file listed in both would go with either).
SHARED_BY_ROWS = {
    "trainkit.tasks.confusion": "segmentation's mean IoU and eval_figures' confusion matrix",
}


def test_the_core_holds_no_module_that_only_rows_use():
    """A module of src/trainkit that no row lists is the core's: something outside tests/ and every row's files
    (train.py, eval.py, src/, scripts/, conf/, the docs' recipes) names it, or it belongs in the row that uses it."""
    optional = {file for row in FEATURES.values() for file in row.files}
    users = [*ROOT.glob("*.py"), *ROOT.glob("src/**/*.py"), *ROOT.glob("scripts/**/*.py"), *ROOT.glob("conf/**/*.yaml")]
    users += [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), ROOT / "pyproject.toml"]
    texts = {path: path.read_text(encoding="utf-8") for path in users if str(path.relative_to(ROOT)) not in optional}
    unused = []
    for path in sorted((ROOT / "src" / "trainkit").rglob("*.py")):
        if str(path.relative_to(ROOT)) in optional:
            continue
        module = ".".join(path.relative_to(ROOT / "src").with_suffix("").parts).removesuffix(".__init__")
        package, _, name = module.rpartition(".")
        named = re.compile(rf"\b{re.escape(module)}\b|from {re.escape(package)} import [^\n]*\b{name}\b")
        if module not in SHARED_BY_ROWS and not any(named.search(text) for user, text in texts.items() if user != path):
            unused.append(module)
    assert unused == [], f"only rows or tests use {unused}: list each in the row that uses it"


def copy_of_the_repository(destination: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def leftover_references(copy: Path, feature: dict) -> list[str]:
    """Code still importing (or naming in a string, a YAML value) a module or script the feature's deletion
    removed, or a shell script still running it; a comment may still point at it."""
    patterns = []
    for file in feature.files:
        if file.startswith("src/"):
            module = re.escape(
                file.removeprefix("src/").removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            )
            patterns.append((module, rf"(import|from)\s+{module}\b|[\"']{module}\b", rf"\b{module}\b"))
        elif file.startswith("scripts/") and file.endswith(".py"):
            script = re.escape(Path(file).stem)
            python = rf"(import|from)\s+{script}\b|load_script\([\"']{script}[\"']\)"
            patterns.append((file, python, rf"^[^#]*\b{re.escape(file)}\b"))
    found = []
    for path in [*copy.rglob("*.py"), *copy.rglob("*.yaml"), *copy.rglob("*.sh")]:
        text = path.read_text(encoding="utf-8")
        for name, in_python, elsewhere in patterns:
            if re.search(in_python if path.suffix == ".py" else elsewhere, text, re.MULTILINE):
                found.append(f"{path.relative_to(copy)} names {name}")
    return found


def run(command: list[str], copy: Path, timeout: int) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(copy / "src"), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    return subprocess.run(command, cwd=copy, env=environment, capture_output=True, text=True, timeout=timeout)


# The features that came first, bound to 3 places counted without doc files before the docs were counted.
FIRST_FEATURES = {
    "trial_gpus", "csv", "ladder", "ema", "provenance", "sweep_continuation", "lr_finder", "profiler",
    "tensorboard", "mlflow", "wandb", "batch_size_finder", "micro_batch_auto", "fsdp",
}  # fmt: skip


def test_each_row_comes_out_in_the_places_it_says_and_at_most_five():
    """The places rule of docs/features.md: all the files and folders a row deletes count one place, each config,
    marked code, doc or dependency file it edits one more; the table's count is that one, and no row needs more
    than 5. The first features need at most 3 when the doc files are left out."""
    for row in FEATURES.values():
        assert row.places == row.counted_places(ROOT) <= 5, f"{row.name}: the table says {row.places} places"
        if row.name in FIRST_FEATURES:
            assert row.counted_places(ROOT, docs=False) <= 3, f"{row.name}: more than 3 places without its docs"


@pytest.mark.skipif("downloads" not in FEATURES, reason="this clone has dropped the downloads")
def test_dropping_the_downloads_keeps_the_image_models():
    """A clone that trains timm models or SpeedrunNet on its own image folders drops MNIST and CIFAR-10 without losing
    them: only the CIFAR-10 recipes go, which the downloads row lists beside the models' rows."""
    dropped = trim.to_drop(FEATURES, ["downloads"])
    assert "timm_torchvision" not in dropped and "speedrun" not in dropped


# The core's Python outside tests/ with every row dropped: lowered by each move of a row's code into the row, so
# nothing drifts back (issue 44 asks for 5,000).
CORE_LINES = 6_485


def test_the_trimmed_core_is_no_longer_than_its_budget(tmp_path):
    """train.py, eval.py, src/ and scripts/ with every row dropped (as trim.py drops them) count at most CORE_LINES."""
    copy = ROOT  # a clone that has dropped every row already counts itself
    if FEATURES:
        copy = copy_of_the_repository(tmp_path / "repository")
        for row in FEATURES.values():
            trim.drop(copy, row)
    python = [*copy.glob("*.py"), *copy.glob("src/**/*.py"), *copy.glob("scripts/**/*.py")]
    lines = sum(len(path.read_text(encoding="utf-8").splitlines()) for path in python)
    assert lines <= CORE_LINES, f"the trimmed core has {lines} lines of Python, more than {CORE_LINES}"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """One copy of the repository for every row: each row's test copies it again, and the copies share mypy's
    cache (seeded from the repository's own where there is one), so a row pays for what it changed."""
    base = tmp_path_factory.mktemp("pristine")
    if (ROOT / ".mypy_cache").is_dir():
        shutil.copytree(ROOT / ".mypy_cache", base.parent / "mypy-cache", dirs_exist_ok=True)
    return copy_of_the_repository(base / "repository")


def dropped_copy(pristine: Path, tmp_path: Path, names: list[str]) -> Path:
    """A copy of `pristine` with the rows `names` dropped by scripts/trim.py, each by its table row exactly."""
    copy = tmp_path / "repository"
    shutil.copytree(pristine, copy, symlinks=True)
    for name in names:
        removed = trim.drop(copy, FEATURES[name])
        assert removed.marked == FEATURES[name].marked, f"{name}: the marked lines are {removed.marked}"
    for name in names:  # once all are gone: a row that needs another names it until it goes too
        assert leftover_references(copy, FEATURES[name]) == []
    return copy


@pytest.mark.slow
@pytest.mark.template
@pytest.mark.parametrize("name", list(FEATURES))
def test_deleting_the_feature_leaves_a_template_that_trains(name, pristine, tmp_path):
    """Each row alone (with the rows that need it, as trim.py drops them): the copy imports, passes ruff and mypy,
    and trains the default run an epoch."""
    names = trim.to_drop(FEATURES, [name])
    packages = [package for dropped in names for package in FEATURES[dropped].packages]
    assert_a_template_that_trains(dropped_copy(pristine, tmp_path, names), tmp_path, packages)


@pytest.mark.slow
@pytest.mark.template
@pytest.mark.skipif(not FEATURES, reason="this clone has dropped every row: its own suite is the check")
def test_dropping_every_row_at_once_leaves_a_template_that_trains(pristine, tmp_path):
    """All rows together (every tracker included): nothing the core reads lives only in their files, and the
    epoch trains to the untrimmed template's test metrics exactly.
    Here, once, every quick test of tests/unit and the template's own quick tests (the README's named step, its
    keys, the docs' links, the style: all of tests/template/ but test_contributing.py, whose recipes touch no
    feature) pass too; each row's docs are checked on text alone by the quick test above."""
    copy = dropped_copy(pristine, tmp_path, list(FEATURES))
    assert_a_template_that_trains(copy, tmp_path, [package for row in FEATURES.values() for package in row.packages])
    untrimmed = tmp_path / "untrimmed"
    assert run([sys.executable, "train.py", *one_epoch(untrimmed)], pristine, 600).returncode == 0
    summaries = [json.loads((folder / "run" / "summary.json").read_text()) for folder in (tmp_path, untrimmed)]
    assert summaries[0]["test"] == summaries[1]["test"]  # the trimmed core trains exactly as the whole template
    template = sorted(str(path.relative_to(copy)) for path in (copy / "tests" / "template").glob("test_*.py"))
    template.remove("tests/template/test_contributing.py")  # the recipes touch no feature: 12 s here instead of 160
    quick = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow"]
    checked = run([*quick, "tests/unit", *template], copy, 1800)
    assert checked.returncode == 0, checked.stdout[-3000:]


# Every module of the package imported, then train.py run, in one process: a module that imports what a row
# deleted fails here, not in a user's run, and -X importtime lists what the modules and the run imported.
IMPORT_ALL_AND_TRAIN = (
    "import importlib, pkgutil, runpy, sys, trainkit; "
    "[importlib.import_module(module.name) for module in pkgutil.walk_packages(trainkit.__path__, 'trainkit.')]; "
    "sys.argv = ['train.py', *sys.argv[1:]]; runpy.run_path('train.py', run_name='__main__')"
)


def one_epoch(tmp_path: Path) -> list[str]:
    return ["trainer.max_epochs=1", "print_config=false", f"hydra.run.dir={tmp_path / 'run'}"]


def assert_a_template_that_trains(copy: Path, tmp_path: Path, dropped_packages: list[str]) -> None:
    """In `copy`: ruff's check and format pass as CONTRIBUTING.md runs them (a trimmed clone's own CI), mypy passes,
    each shell script parses, and in one process every module of the package imports and `python train.py` trains
    one epoch (`tmp_path`/run), together importing no module of `dropped_packages`."""
    for lint in (["check", "--quiet", "."], ["format", "--check", "--quiet", "."]):
        linted = run([sys.executable, "-m", "ruff", *lint], copy, 120)
        assert linted.returncode == 0, linted.stdout + linted.stderr
    cache = tmp_path.parent / "mypy-cache"  # beside every test's folder: one cache for all the copies
    typed = run([sys.executable, "-m", "mypy", "--cache-dir", str(cache)], copy, 1800)  # cold: minutes
    assert typed.returncode == 0, typed.stdout[-3000:]
    for script in copy.glob("scripts/*.sh"):
        assert run(["bash", "-n", str(script)], copy, 60).returncode == 0, f"{script.name} is no longer valid shell"
    trained = run([sys.executable, "-X", "importtime", "-c", IMPORT_ALL_AND_TRAIN, *one_epoch(tmp_path)], copy, 600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()
    dropped = modules_of(dropped_packages)
    names = {line.rsplit("|", 1)[-1].strip() for line in trained.stderr.splitlines() if "|" in line}
    loaded = sorted(name for name in names if any(name == m or name.startswith(f"{m}.") for m in dropped))
    assert not loaded, f"the run imported {loaded}, of the packages {dropped_packages} that the trim took out"
