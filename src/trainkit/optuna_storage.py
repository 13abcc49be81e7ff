"""Optuna storage that works with optuna 2.10 under SQLAlchemy 2, for hydra-optuna-sweeper.

    hydra.sweeper.storage: {_target_: trainkit.optuna_storage.rdb_storage, url: sqlite:///outputs/optuna.db}

hydra-optuna-sweeper pins optuna<3, whose RDB storage writes its alembic schema stamp on a
connection it never commits. SQLAlchemy 1.x committed it anyway (autocommit); SQLAlchemy 2 has no
autocommit, so a plain URL fails with an AssertionError in get_current_version. `rdb_storage`
commits the stamp, and only where that combination is installed.

A workaround with an end: tests/test_optuna_storage.py fails once a plain URL works with the
installed versions (e.g. with sqlalchemy<2 and alembic<1.20, or an optuna>=3 sweeper); then delete
this module and its KNOWN_WARNINGS entry in trainkit.known_noise, and give the sweeper the URL.
"""


def needs_patch() -> bool:
    """True where optuna<3 meets SQLAlchemy>=2: the combination whose stamp is never committed."""
    import optuna
    import sqlalchemy

    return int(optuna.__version__.split(".")[0]) < 3 and int(sqlalchemy.__version__.split(".")[0]) >= 2


def rdb_storage(url: str):
    """An Optuna RDB storage for `url` (e.g. sqlite:///outputs/optuna.db) that also works under SQLAlchemy 2."""
    import optuna

    if needs_patch():
        _commit_alembic_stamp()
    return optuna.storages.get_storage(url)


def _commit_alembic_stamp() -> None:
    """Replace optuna 2.10's _VersionManager._set_alembic_revision by one that commits its stamp."""
    import alembic.migration
    from optuna.storages._rdb import storage as rdb

    def set_alembic_revision(self, revision: str) -> None:
        with self.engine.begin() as connection:  # begin() commits on exit
            context = alembic.migration.MigrationContext.configure(connection)
            context.stamp(self._create_alembic_script(), revision)

    rdb._VersionManager._set_alembic_revision = set_alembic_revision
