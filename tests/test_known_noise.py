"""Known noise: exactly the known, harmless warnings and plugin log lines are silenced, nothing else."""
import logging
import subprocess
import sys
import warnings

import pytest

from trainkit.known_noise import KNOWN_LOG_NOISE, _DropMessages, quiet_known_warnings


@pytest.fixture
def clean_log_filters():
    yield
    for name in KNOWN_LOG_NOISE:
        logger = logging.getLogger(name)
        for f in [f for f in logger.filters if isinstance(f, _DropMessages)]:
            logger.removeFilter(f)


def test_quiet_known_warnings_hides_exactly_the_known_ones(clean_log_filters):
    from sqlalchemy.exc import MovedIn20Warning

    known = ("The ``declarative_base()`` function is now available as sqlalchemy.orm.declarative_base(). "
             "(deprecated since: 2.0) (Background on SQLAlchemy 2.0 at: https://sqlalche.me/e/b8d9)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_known_warnings()
        quiet_known_warnings()  # idempotent
        warnings.warn(known, MovedIn20Warning)
        warnings.warn("The ``Query.get()`` method is considered legacy", MovedIn20Warning)
        warnings.warn("something else is deprecated", DeprecationWarning)
        warnings.warn("a real problem", UserWarning)
    assert [str(w.message).split(" (Background")[0] for w in caught] == [
        "The ``Query.get()`` method is considered legacy", "something else is deprecated", "a real problem"]


def test_quiet_known_warnings_drops_plugin_chatter_but_not_errors(clean_log_filters, caplog):
    quiet_known_warnings()
    quiet_known_warnings()
    alembic = logging.getLogger("alembic.runtime.plugins")
    joblib = logging.getLogger("hydra_plugins.hydra_joblib_launcher._core")
    assert sum(isinstance(f, _DropMessages) for f in joblib.filters) == 1
    with caplog.at_level(logging.INFO):
        alembic.info("setup plugin alembic.autogenerate.schemas")
        joblib.info("Joblib.Parallel(n_jobs=2,backend=loky,prefer=processes) is launching 2 jobs")
        joblib.info("Launching jobs, sweep output dir : /tmp/x")
        alembic.error("Can't locate revision identified by 'abc'")
    assert [r.getMessage() for r in caplog.records] == ["Launching jobs, sweep output dir : /tmp/x",
                                                        "Can't locate revision identified by 'abc'"]


def test_sqlite_storage_is_quiet_about_known_sqlalchemy_warnings(tmp_path):
    code = (f"from trainkit.known_noise import quiet_known_warnings; quiet_known_warnings(); "
            f"from trainkit.optuna_storage import rdb_storage; rdb_storage('sqlite:///{tmp_path}/x.db'); print('ok')")
    process = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=120)
    assert process.returncode == 0 and "ok" in process.stdout, process.stderr[-3000:]
    assert "declarative_base" not in process.stderr and "Warning" not in process.stderr, process.stderr[-3000:]
