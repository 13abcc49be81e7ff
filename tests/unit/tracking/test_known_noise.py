"""Known noise: exactly the known, harmless plugin log lines are silenced, nothing else."""

import logging
import subprocess
import sys

import pytest

from trainkit.tracking.known_noise import KNOWN_LOG_NOISE, _DropMessages, quiet_known_noise


@pytest.fixture
def clean_log_filters():
    yield
    for name in KNOWN_LOG_NOISE:
        logger = logging.getLogger(name)
        for f in [f for f in logger.filters if isinstance(f, _DropMessages)]:
            logger.removeFilter(f)


def test_quiet_known_noise_drops_plugin_chatter_but_not_errors(clean_log_filters, caplog):
    quiet_known_noise()
    quiet_known_noise()
    alembic = logging.getLogger("alembic.runtime.plugins")
    joblib = logging.getLogger("hydra_plugins.hydra_joblib_launcher._core")
    assert sum(isinstance(f, _DropMessages) for f in joblib.filters) == 1
    with caplog.at_level(logging.INFO):
        alembic.info("setup plugin alembic.autogenerate.schemas")
        joblib.info("Joblib.Parallel(n_jobs=2,backend=loky,prefer=processes) is launching 2 jobs")
        joblib.info("Launching jobs, sweep output dir : /tmp/x")
        alembic.error("Can't locate revision identified by 'abc'")
    assert [r.getMessage() for r in caplog.records] == [
        "Launching jobs, sweep output dir : /tmp/x",
        "Can't locate revision identified by 'abc'",
    ]


def test_a_sqlite_study_needs_no_patch_and_warns_nothing(tmp_path):
    """optuna 2.10 (pinned by hydra-optuna-sweeper) writes its SQLite schema only under SQLAlchemy 1.4
    (pyproject pins sqlalchemy<2 and alembic<1.20 for it): a plain URL works, with no warning."""
    code = (
        "import optuna; optuna.logging.set_verbosity(optuna.logging.WARNING); "
        f"s = optuna.create_study(study_name='s', storage='sqlite:///{tmp_path}/x.db'); "
        "s.optimize(lambda t: t.suggest_float('x', 0, 1), n_trials=1); "
        f"print(len(optuna.load_study(study_name='s', storage='sqlite:///{tmp_path}/x.db').trials))"
    )
    # Python's default filters, as a user runs it (SQLAlchemy 1.4's "not compatible with 2.0" note is a
    # DeprecationWarning raised inside optuna: hidden by default).
    process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert process.returncode == 0 and process.stdout.strip() == "1", process.stderr[-3000:]
    assert "Warning" not in process.stderr, process.stderr[-3000:]
