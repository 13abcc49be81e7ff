"""The sweep plugins' noise: exactly their known, harmless log lines are silenced, nothing else."""

import logging

import pytest

from trainkit.tuning.plugin_noise import KNOWN_LOG_NOISE, _DropMessages, quiet_plugin_noise


@pytest.fixture
def clean_log_filters():
    # Importing mlflow (another test's tracker) gives the "alembic" logger its own handler and stops it
    # propagating: caplog, on the root logger, would then see none of alembic's lines.
    alembic = logging.getLogger("alembic")
    propagate, alembic.propagate = alembic.propagate, True
    yield
    alembic.propagate = propagate
    for name in KNOWN_LOG_NOISE:
        logger = logging.getLogger(name)
        for f in [f for f in logger.filters if isinstance(f, _DropMessages)]:
            logger.removeFilter(f)


def test_plugin_chatter_is_dropped_but_not_errors(clean_log_filters, caplog):
    quiet_plugin_noise()
    quiet_plugin_noise()
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
