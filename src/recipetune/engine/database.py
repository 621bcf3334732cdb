"""The study's database, reached patiently: every Optuna storage operation waits out a lost
connection (``patient``: backoff for up to ``execute.db_retry_s``, then ``StoreUnavailable``, which
``--resume`` continues), a full disk stops the campaign (``DiskFull``), SQLite runs in write-ahead-log
mode. engine/store.py opens its study through ``PatientStorage``.

Private Optuna API used here, because no public one serves: ``PatientStorage`` also wraps the
private ``RDBStorage`` methods Optuna's own cache calls (``_create_new_trial``, ``_get_best_trial_id``,
``_get_trials``, ``_set_trial_param``, ``_get_stale_trial_ids``): a ``Study`` wraps its storage in
``_CachedStorage``, which calls these directly, so wrapping the public ones alone would leave a
study's reads and writes unguarded.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import optuna
import sqlalchemy as sa

T = TypeVar("T")


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(RuntimeError):
    """The campaign folder's filesystem is full: the campaign stops (every next write would fail too),
    the trial in flight stays open and is rerun by ``--resume`` once space is freed."""

    def __init__(self, folder: Path | str, detail: object):
        super().__init__(f"no space left on the device of the campaign folder {folder} ({detail}); "
                         "free some space there, then resume")


def no_space(e: BaseException) -> bool:
    """An OSError of a full disk or quota, or SQLite's SQLITE_FULL (what Optuna wrapped)."""
    for err in (e, e.__cause__):
        if isinstance(err, OSError) and err.errno in NO_SPACE:
            return True
        if isinstance(err, sa.exc.OperationalError) and "full" in str(err.orig).lower():
            return True  # "database or disk is full"
    return False


class StoreUnavailable(RuntimeError):
    """The study's database did not answer within ``execute.db_retry_s``: the campaign stops, resumable."""


def connection_lost(e: BaseException) -> bool:
    """Whether ``e`` (or what Optuna wrapped in it) says the database connection failed, which a
    retry may cure, rather than a bad statement, which it never will."""
    for err in (e, e.__cause__):
        if isinstance(err, sa.exc.OperationalError | sa.exc.InterfaceError):
            return True
        if isinstance(err, sa.exc.DBAPIError) and err.connection_invalidated:
            return True
    return False


def schema_race(e: sa.exc.DBAPIError) -> bool:
    """Whether creating the study's schema failed because another process made that part first: its
    version stamp (a UNIQUE constraint), or a table (SQLite: "table ... already exists"; PostgreSQL:
    "relation ... already exists")."""
    return isinstance(e, sa.exc.IntegrityError) or "already exists" in str(e.orig)


def redact(url: str) -> str:
    with contextlib.suppress(Exception):
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    return url


def patient(url: str, bound_s: float, fn: Callable[[], T], what: str = "") -> T:
    """``fn()``, retried with backoff (0.2 s doubling to 5 s) while the database at ``url`` cannot be
    reached, for up to ``bound_s`` seconds; then StoreUnavailable. SQLite is a local file: its
    errors (a full disk, say) are never connection losses worth waiting for, so it is not retried."""
    if url.startswith("sqlite"):
        try:
            return fn()
        except (sa.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
            if no_space(e):
                raise DiskFull(Path(url.removeprefix("sqlite:///")).parent, "the study's SQLite file: "
                               f"{str(e.__cause__ or e).splitlines()[0][:200]}") from e
            raise
    if bound_s <= 0:
        return fn()
    deadline, delay, said = time.monotonic() + bound_s, 0.2, False
    while True:
        try:
            return fn()
        except (sa.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as e:
            if not connection_lost(e):
                raise
            if time.monotonic() + delay > deadline:
                cause = str(e.__cause__ or e).strip().splitlines()[0][:300]
                raise StoreUnavailable(f"the study's database {redact(url)} did not answer for {bound_s:g}s "
                                       f"(execute.db_retry_s){f' during {what}' if what else ''}: {cause}") from e
            if not said:  # once per outage: the live table would hide a stream of these
                print(f"recipetune: the study's database {redact(url)} is unreachable; retrying for up to "
                      f"{bound_s:g}s", file=sys.stderr)
                said = True
            time.sleep(delay)  # backoff between reconnection attempts
            delay = min(5.0, delay * 2)


class PatientStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose every operation waits out a lost database connection (``patient``).
    A write retried after a commit whose answer was lost may apply twice; the only one that is not
    idempotent, a new trial, then leaves an empty trial without a driver, which the next look fails."""

    retry_s: float = 60.0


def _wrap(name: str) -> None:
    method = getattr(optuna.storages.RDBStorage, name)

    @functools.wraps(method)
    def wrapper(self: PatientStorage, *args: Any, **kwargs: Any) -> Any:
        return patient(self.url, self.retry_s, lambda: method(self, *args, **kwargs), name)

    setattr(PatientStorage, name, wrapper)


for _name in ("create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr",
              "get_study_id_from_name", "get_study_name_from_id", "get_study_directions", "get_study_user_attrs",
              "get_study_system_attrs", "get_trial_user_attrs", "get_trial_system_attrs", "get_all_studies",
              "create_new_trial", "set_trial_param", "get_trial_param", "set_trial_state_values",
              "set_trial_intermediate_value", "set_trial_user_attr", "set_trial_system_attr",
              "get_trial_id_from_study_id_trial_number", "get_trial", "get_all_trials", "get_best_trial",
              "record_heartbeat",
              # the private ones Optuna's cache (the _CachedStorage a Study wraps this in) calls
              "_create_new_trial", "_get_best_trial_id", "_get_trials", "_set_trial_param", "_get_stale_trial_ids"):
    _wrap(_name)



def write_ahead(engine: sa.engine.Engine) -> None:
    """SQLite in write-ahead-log mode, synced at checkpoints: a campaign writes a few dozen small
    transactions per trial, and an fsync for each cost ~20 ms on a busy disk, most of the driver's
    time per trial (docs/distributed.md). Still safe against a killed process; a power cut may lose
    the last transactions, never corrupt the file. (WAL needs a local filesystem: a study shared
    across machines belongs in a database server, ``search.storage``.)"""

    @sa.event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    engine.dispose()  # connections opened before the listener get it when reopened
