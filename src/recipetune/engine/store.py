"""Campaign storage: one Optuna study per campaign, plus a folder of artifacts.

The study (SQLite ``study.db`` in the campaign folder by default, any SQLAlchemy URL otherwise)
holds one trial per proposal that reached the guard: its knob values as parameters, its speed-up
as the value, and in user attributes the recipe, its parent, the proposer and its rationale, the
status and cause, the screening and the run's figures. ``optuna-dashboard sqlite:///study.db``
opens it. Each run keeps its own folder (``trials/NNNN-RECIPEID``: metrics stream, logs,
result.json); the baseline profile and the verdicts are JSON files next to the study.

Several drivers may share one study (a team, a restarted driver, a database such as PostgreSQL):
- a recipe is *claimed* before its trial opens: one row per (study, recipe) in the table
  ``recipetune_claims`` of the same database, whose primary key lets only one driver's insert
  succeed, so no recipe ever runs twice;
- each trial records its driver (``host:pid``) and Optuna heartbeats (``execute.heartbeat_s``): a
  trial whose driver is gone (a dead pid on this host, or no heartbeat for twice the interval) is
  failed as interrupted by the next driver that looks, and its claim released so it may run again.
  Nothing stays RUNNING for ever.
- the budget is shared: a run takes one of ``search.budget.trials`` slots (table ``recipetune_runs``,
  the same primary-key trick) before it starts, so drivers together never start more runs than the
  budget, whatever they had in flight; an interrupted trial gives its slot back.
In a database server (``search.storage``: PostgreSQL, MySQL) the study is named after the campaign
folder, so several campaigns share one database; a SQLite file holds one study named ``recipetune``.
A server that stops answering (a restart, a failover) is waited for: every study operation is
retried with backoff for up to ``execute.db_retry_s`` seconds, then ``StoreUnavailable`` stops the
campaign, which ``--resume`` continues.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import functools
import json
import math
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel

from recipetune.core.files import write_atomic
from recipetune.core.recipe import Recipe, SearchSpace

STUDY_NAME = "recipetune"
INTERRUPTED = "interrupted: the campaign stopped while this trial ran"
REFERENCE = "reference"  # the status of the baseline's curve in the study (add_reference): no campaign trial
DRIVER = f"{socket.gethostname()}:{os.getpid()}"  # who runs a trial; a process is one driver


def is_reference(t: FrozenTrial) -> bool:
    """The baseline's curve (``add_reference``): a study trial that is none of the campaign's."""
    return t.user_attrs.get("status") == REFERENCE


CLAIMS = sa.Table(
    "recipetune_claims", sa.MetaData(),
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("recipe_id", sa.String(64), primary_key=True),
    sa.Column("driver", sa.String(512)),
)
# One row per run of the shared budget: slot k (0 <= k < search.budget.trials) taken by one trial.
RUNS = sa.Table(
    "recipetune_runs", CLAIMS.metadata,
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("slot", sa.Integer, primary_key=True),
    sa.Column("trial_id", sa.Integer),
    sa.Column("driver", sa.String(512)),
)
T = TypeVar("T")


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(RuntimeError):
    """The campaign folder's filesystem is full: the campaign stops (every next write would fail too),
    the trial in flight stays open and is rerun by ``--resume`` once space is freed."""

    def __init__(self, folder: Path | str, detail: object):
        super().__init__(f"no space left on the device of the campaign folder {folder} ({detail}); "
                         "free some space there, then resume")


def _no_space(e: BaseException) -> bool:
    """An OSError of a full disk or quota, or SQLite's SQLITE_FULL (what Optuna wrapped)."""
    for err in (e, e.__cause__):
        if isinstance(err, OSError) and err.errno in NO_SPACE:
            return True
        if isinstance(err, sa.exc.OperationalError) and "full" in str(err.orig).lower():
            return True  # "database or disk is full"
    return False


class StoreUnavailable(RuntimeError):
    """The study's database did not answer within ``execute.db_retry_s``: the campaign stops, resumable."""


def _connection_lost(e: BaseException) -> bool:
    """Whether ``e`` (or what Optuna wrapped in it) says the database connection failed, which a
    retry may cure, rather than a bad statement, which it never will."""
    for err in (e, e.__cause__):
        if isinstance(err, sa.exc.OperationalError | sa.exc.InterfaceError):
            return True
        if isinstance(err, sa.exc.DBAPIError) and err.connection_invalidated:
            return True
    return False


def _schema_race(e: sa.exc.DBAPIError) -> bool:
    """Whether creating the study's schema failed because another process made that part first: its
    version stamp (a UNIQUE constraint), or a table (SQLite: "table ... already exists"; PostgreSQL:
    "relation ... already exists")."""
    return isinstance(e, sa.exc.IntegrityError) or "already exists" in str(e.orig)


def _redact(url: str) -> str:
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
            if _no_space(e):
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
            if not _connection_lost(e):
                raise
            if time.monotonic() + delay > deadline:
                cause = str(e.__cause__ or e).strip().splitlines()[0][:300]
                raise StoreUnavailable(f"the study's database {_redact(url)} did not answer for {bound_s:g}s "
                                       f"(execute.db_retry_s){f' during {what}' if what else ''}: {cause}") from e
            if not said:  # once per outage: the live table would hide a stream of these
                print(f"recipetune: the study's database {_redact(url)} is unreachable; retrying for up to "
                      f"{bound_s:g}s", file=sys.stderr)
                said = True
            time.sleep(delay)  # backoff between reconnection attempts
            delay = min(5.0, delay * 2)


class _PatientStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose every operation waits out a lost database connection (``patient``).
    A write retried after a commit whose answer was lost may apply twice; the only one that is not
    idempotent, a new trial, then leaves an empty trial without a driver, which the next look fails."""

    retry_s: float = 60.0


def _wrap(name: str) -> None:
    method = getattr(optuna.storages.RDBStorage, name)

    @functools.wraps(method)
    def wrapper(self: _PatientStorage, *args: Any, **kwargs: Any) -> Any:
        return patient(self.url, self.retry_s, lambda: method(self, *args, **kwargs), name)

    setattr(_PatientStorage, name, wrapper)


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


def _alive(driver: str | None) -> bool:
    """Whether the driver of a RUNNING trial may still be running it (unknown on another host: the
    heartbeat decides there)."""
    host, _, pid = (driver or "").rpartition(":")
    if not host or not pid.isdigit():
        return False
    if host != socket.gethostname():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def distributions(space: SearchSpace, baseline: Recipe) -> dict[str, BaseDistribution]:
    """Categorical distributions over each searched knob's listed values, plus the baseline's."""
    out: dict[str, BaseDistribution] = {}
    for name, values in space.values.items():
        choices = list(values)
        if baseline.get(name) is not None and not any(
            v == baseline[name] and isinstance(v, bool) == isinstance(baseline[name], bool) for v in choices
        ):
            choices.insert(0, baseline[name])
        out[name] = CategoricalDistribution(choices)
    return out


@dataclass(frozen=True)
class TrialRecord:
    """One finished (or interrupted) trial as the campaign reads it back."""

    number: int
    state: str  # the Optuna state: COMPLETE, FAIL, RUNNING
    value: float | None
    attrs: dict[str, Any]

    @property
    def recipe(self) -> Recipe:
        return Recipe(self.attrs["recipe"])

    @property
    def status(self) -> str:
        return self.attrs.get("status", "")


def _write_ahead(engine: sa.engine.Engine) -> None:
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


def _record(t: FrozenTrial) -> TrialRecord:
    return TrialRecord(t.number, t.state.name, t.value if t.state == TrialState.COMPLETE else None, t.user_attrs)


def _jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no inf/nan; Optuna's user attributes are JSON
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


class CampaignStore:
    """A campaign folder and its study."""

    def __init__(
        self, folder: Path, storage_url: str | None = None, sampler: optuna.samplers.BaseSampler | None = None,
        heartbeat_s: int = 30, db_retry_s: float = 60.0, pruner: optuna.pruners.BasePruner | None = None,
    ):
        self.folder = folder
        self.url = storage_url or f"sqlite:///{(folder / 'study.db').resolve()}"
        # A database server holds many campaigns: each study is named after its folder. A SQLite
        # file holds one campaign, under the fixed name.
        self.name = STUDY_NAME if self.url.startswith("sqlite") else folder.resolve().name
        self.sampler, self.pruner = sampler, pruner
        self.heartbeat_s = heartbeat_s
        self.db_retry_s = db_retry_s
        self._storage: optuna.storages.RDBStorage | None = None
        self._study: optuna.Study | None = None
        self._open: dict[int, optuna.trial.Trial] = {}
        self._beat: threading.Thread | None = None
        self._stop = threading.Event()

    # -- the study --------------------------------------------------------------------------

    @property
    def storage(self) -> optuna.storages.RDBStorage:
        if self._storage is None:
            if self.url.startswith("sqlite:///"):
                self.folder.mkdir(parents=True, exist_ok=True)
            sqlite = self.url.startswith("sqlite")
            # A server's connections may die under the pool (a restart): each is tested before use.
            engine_kwargs = {} if sqlite else {"pool_pre_ping": True}

            def connect() -> optuna.storages.RDBStorage:
                for attempt in range(3):
                    try:
                        with warnings.catch_warnings():  # heartbeats are marked experimental
                            warnings.simplefilter("ignore")
                            storage = _PatientStorage(self.url, engine_kwargs=engine_kwargs,
                                                      heartbeat_interval=self.heartbeat_s,
                                                      grace_period=2 * self.heartbeat_s)
                        break
                    except sa.exc.DBAPIError as e:
                        # Another process (a second driver, `recipetune show` on a campaign just
                        # starting) created a table of the new schema, or stamped its version,
                        # between Optuna's look and its own statement: the next look finds it so.
                        if attempt == 2 or not _schema_race(e):
                            raise
                storage.retry_s = self.db_retry_s
                return storage

            storage = patient(self.url, self.db_retry_s, connect, "connecting")
            if sqlite:
                _write_ahead(storage.engine)
            with contextlib.suppress(sa.exc.SQLAlchemyError):  # another driver may be creating it too
                patient(self.url, self.db_retry_s, lambda: CLAIMS.metadata.create_all(storage.engine), "connecting")
            self._storage = storage
        return self._storage

    def _sql(self, what: str, fn: Callable[[sa.engine.Connection], T]) -> T:
        """``fn`` in one transaction of the study's database, waiting out a lost connection."""

        def run() -> T:
            with self.storage.engine.begin() as conn:
                return fn(conn)

        return patient(self.url, self.db_retry_s, run, what)

    def exists(self) -> bool:
        """Whether this campaign already has a study (without creating anything)."""
        if self.url.startswith("sqlite:///") and not Path(self.url.removeprefix("sqlite:///")).exists():
            return False
        return any(s.study_name == self.name for s in optuna.get_all_study_summaries(self.storage))

    def create(self, meta: dict[str, Any]) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._study = optuna.create_study(storage=self.storage, study_name=self.name, direction="maximize",
                                          sampler=self.sampler, pruner=self.pruner)
        self._study.set_user_attr("campaign", _jsonable(meta))
        return self._study

    @property
    def study(self) -> optuna.Study:
        if self._study is None:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            self._study = optuna.load_study(study_name=self.name, storage=self.storage, sampler=self.sampler,
                                            pruner=self.pruner)
        return self._study

    @property
    def opened(self) -> bool:
        return self._study is not None

    def meta(self) -> dict[str, Any]:
        return self.study.user_attrs.get("campaign", {})

    def peek(self) -> tuple[dict[str, Any], int]:
        """The campaign's settings and its number of trials, read without keeping the study open."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name=self.name, storage=self.storage)
        return study.user_attrs.get("campaign", {}), len(study.get_trials(deepcopy=False))

    def set_meta(self, key: str, value: Any) -> None:
        self.study.set_user_attr(key, _jsonable(value))

    def records(self) -> list[TrialRecord]:
        """The campaign's trials (not the baseline's reference curve, ``add_reference``)."""
        return [_record(t) for t in self.study.get_trials(deepcopy=False) if not is_reference(t)]

    def fail_interrupted(self, mine: bool = True, gone: bool = True) -> list[TrialRecord]:
        """Mark trials left RUNNING by a stopped driver as failed; their recipes may run again.

        ``mine``: this process's trials (a Ctrl-C, a resume in the same process). ``gone``: those
        of a driver that is gone: a dead process on this host, no driver recorded, or no heartbeat
        for twice ``heartbeat_s`` (another host). A live driver's trials are left alone.
        """
        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
            driver = t.user_attrs.get("driver")
            if (mine and driver == DRIVER) or (gone and driver != DRIVER and not _alive(driver)):
                rec = self._interrupted(t._trial_id, INTERRUPTED)
                if rec is not None:
                    out.append(rec)
        if gone:
            out += self.fail_stale()
            self._release_leftovers()
        return out

    def _release_leftovers(self) -> None:
        """Claims and run slots a driver killed at the wrong moment left behind: a claim of a dead
        driver (on this host) whose recipe has no trial that ran or runs (killed between its claim and
        its trial, or while closing its trial as interrupted), and the slot of an interrupted trial.
        Left alone, such a claim keeps its recipe "running elsewhere" for ever and the slot shortens
        the budget. (A dead driver on another host cannot be told from a live one without a trial's
        heartbeat: its claims stay.)"""
        key = self._claim_key()
        claims = self._sql("reading claims", lambda conn: conn.execute(
            sa.select(CLAIMS.c.recipe_id, CLAIMS.c.driver).where(CLAIMS.c.study == key)).all())
        dead = [rid for rid, driver in claims if driver != DRIVER and not _alive(driver)]
        slots = self._sql("reading runs", lambda conn: conn.execute(
            sa.select(RUNS.c.trial_id).where(RUNS.c.study == key)).scalars().all())
        if not dead and not slots:
            return
        trials = self.study.get_trials(deepcopy=False)
        held = {t.user_attrs.get("recipe_id") for t in trials
                if t.user_attrs.get("status") not in ("interrupted", "duplicate", "unrun")}
        for rid in set(dead) - held:
            self.unclaim(rid)
        interrupted = {t._trial_id for t in trials if t.user_attrs.get("status") == "interrupted"
                       and t.state != TrialState.RUNNING}
        for trial_id in interrupted & set(slots):
            self.release_run(trial_id)

    def fail_stale(self) -> list[TrialRecord]:
        """Trials whose driver sent no heartbeat for twice ``heartbeat_s``: failed as interrupted
        (Optuna's heartbeat table; the failing is ours so the trial says why before it closes)."""
        out = []
        study_id = self.storage.get_study_id_from_name(self.name)
        for trial_id in self.storage._get_stale_trial_ids(study_id):
            driver = self.storage.get_trial(trial_id).user_attrs.get("driver", "?")
            rec = self._interrupted(trial_id, f"{INTERRUPTED} (its driver {driver} sent no heartbeat for "
                                              f"{2 * self.heartbeat_s}s)")
            if rec is not None:
                out.append(rec)
        return out

    def _interrupted(self, trial_id: int, cause: str) -> TrialRecord | None:
        """Close a trial as interrupted and release its recipe; None when another driver closed it first."""
        try:
            self.storage.set_trial_user_attr(trial_id, "status", "interrupted")
            self.storage.set_trial_user_attr(trial_id, "cause", cause)
            if not self.storage.set_trial_state_values(trial_id, TrialState.FAIL):
                return None
        except optuna.exceptions.UpdateFinishedTrialError:
            return None
        rec = _record(self.storage.get_trial(trial_id))
        if "recipe_id" in rec.attrs:
            self.unclaim(rec.attrs["recipe_id"])
        self.release_run(trial_id)
        return rec

    # -- claims and heartbeats: several drivers on one study --------------------------------

    def _claim_key(self) -> str:
        # The study's id too: a study deleted and created again under its name starts without claims.
        return f"{self.name}#{self.storage.get_study_id_from_name(self.name)}"

    def claim(self, recipe: Recipe) -> bool:
        """Reserve ``recipe`` for this driver; False when a driver (this one included) already has it."""
        key = self._claim_key()
        try:
            self._sql("a claim", lambda conn: conn.execute(
                CLAIMS.insert().values(study=key, recipe_id=recipe.id, driver=DRIVER)))
        except sa.exc.IntegrityError:
            return False
        return True

    def unclaim(self, recipe_id: str) -> None:
        key = self._claim_key()
        self._sql("releasing a claim", lambda conn: conn.execute(
            CLAIMS.delete().where((CLAIMS.c.study == key) & (CLAIMS.c.recipe_id == recipe_id))))

    def take_run(self, number: int, budget: int) -> bool:
        """One of the ``budget`` run slots this study's drivers share, for trial ``number``; False when
        they are all taken (by runs that finished or are running, on any driver). The primary key
        lets one insert per slot succeed, so the drivers together never start more than ``budget``."""
        key, trial_id = self._claim_key(), self._open[number]._trial_id
        while True:
            taken = set(self._sql("counting runs", lambda conn: conn.execute(
                sa.select(RUNS.c.slot).where(RUNS.c.study == key)).scalars().all()))
            free = [k for k in range(budget) if k not in taken]
            if not free:
                return False
            row = {"study": key, "slot": free[0], "trial_id": trial_id, "driver": DRIVER}
            try:
                self._sql("taking a run", lambda conn, row=row: conn.execute(RUNS.insert().values(**row)))
            except sa.exc.IntegrityError:
                continue  # another driver took that slot first: look again
            return True

    def release_run(self, trial_id: int) -> None:
        """An interrupted trial's slot: its run did not count, the budget gets it back."""
        key = self._claim_key()
        self._sql("releasing a run", lambda conn: conn.execute(
            RUNS.delete().where((RUNS.c.study == key) & (RUNS.c.trial_id == trial_id))))

    def start_heartbeat(self) -> None:
        """Beat for every open trial every ``heartbeat_s`` seconds, from a background thread."""
        if self._beat is None:
            self._stop.clear()
            self._beat = threading.Thread(target=self._heartbeats, daemon=True, name="recipetune-heartbeat")
            self._beat.start()

    def stop_heartbeat(self) -> None:
        if self._beat is not None:
            self._stop.set()
            self._beat.join()
            self._beat = None

    def _heartbeats(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            for trial in list(self._open.values()):
                with contextlib.suppress(Exception):  # a missed beat is retried; the grace period is 2 beats
                    # Optuna's own method, not the patient one: stop_heartbeat must not wait an outage out.
                    optuna.storages.RDBStorage.record_heartbeat(self.storage, trial._trial_id)

    # -- trials -----------------------------------------------------------------------------

    def ask(self, dists: dict[str, BaseDistribution]) -> optuna.trial.Trial:
        """A new RUNNING trial whose parameters the study's sampler chooses (Optuna strategies)."""
        with warnings.catch_warnings():  # Optuna warns that heartbeats are meant for Study.optimize
            warnings.simplefilter("ignore")
            trial = self.study.ask(dists)
        self._open[trial.number] = trial
        self.storage.record_heartbeat(trial._trial_id)
        return trial

    def begin(self, recipe: Recipe, dists: dict[str, BaseDistribution], attrs: dict[str, Any],
              trial: optuna.trial.Trial | None = None) -> int:
        """Open a trial for ``recipe`` (a fresh one unless ``trial`` came from ``ask``); returns its number."""
        if trial is None:
            # Created whole, its driver included, in one write: a trial seen without a driver is taken
            # for a dead driver's (fail_interrupted), so another driver looking between an ask() and
            # the attributes would have failed it under this one.
            study_id = self.storage.get_study_id_from_name(self.name)
            template = FrozenTrial(
                number=-1, state=TrialState.RUNNING, value=None, datetime_start=datetime.datetime.now(),
                datetime_complete=None, params={name: recipe[name] for name in dists}, distributions=dict(dists),
                user_attrs={"driver": DRIVER, "recipe_id": recipe.id, "status": "running"}, system_attrs={},
                intermediate_values={}, trial_id=-1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trial = optuna.trial.Trial(self.study, self.study._storage.create_new_trial(study_id, template))
        self._open[trial.number] = trial
        self.storage.record_heartbeat(trial._trial_id)
        attrs = {**attrs, "recipe": dict(recipe), "recipe_id": recipe.id, "status": "running", "driver": DRIVER}
        for key, value in attrs.items():
            trial.set_user_attr(key, _jsonable(value))
        return trial.number

    def set_running(self, number: int, attrs: dict[str, Any]) -> None:
        trial = self._open[number]
        for key, value in attrs.items():
            trial.set_user_attr(key, _jsonable(value))

    def run_dir(self, number: int, recipe: Recipe) -> Path:
        return self.folder / "trials" / f"{number:04d}-{recipe.id}"

    def finish(self, number: int, value: float | None, attrs: dict[str, Any], pruned: bool = False) -> TrialRecord:
        """Close a trial: COMPLETE with ``value``, FAIL when ``value`` is None, or PRUNED (its last report
        is its value, as Optuna keeps it)."""
        trial = self._open.pop(number)
        for key, v in attrs.items():
            trial.set_user_attr(key, _jsonable(v))
        if pruned:
            frozen = self.study.tell(trial, state=TrialState.PRUNED)
        elif value is not None and math.isfinite(value):
            frozen = self.study.tell(trial, value)
        else:
            frozen = self.study.tell(trial, state=TrialState.FAIL)
        return _record(frozen)

    def report(self, number: int, step: int, value: float) -> bool:
        """A running trial's intermediate value at ``step``; whether the study's pruner stops it now."""
        trial = self._open[number]
        trial.report(value, step)
        return trial.should_prune()

    def values_at(self, step: int) -> list[float]:
        """The finished trials' reports at ``step`` (the baseline's reference included): what a
        pruner compares a running trial with (engine/samplers.py: pruning_bar)."""
        finished = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        return [t.intermediate_values[step] for t in finished if step in t.intermediate_values]

    def add_reference(self, values: dict[int, float], value: float) -> None:
        """The baseline's intermediate values, as a finished trial the pruner compares the others with
        (once per study; it has no recipe, so the search never reads it as a trial of its own)."""
        if any(is_reference(t) for t in self.study.get_trials(deepcopy=False)):
            return
        self.study.add_trial(optuna.trial.create_trial(
            value=value, intermediate_values=values, user_attrs={"status": REFERENCE, "ran": False}))

    # -- artifacts --------------------------------------------------------------------------

    def write_json(self, name: str, obj: Any) -> Path:
        try:
            return write_atomic(self.folder / name, json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n")
        except OSError as e:
            if e.errno in NO_SPACE:
                raise DiskFull(self.folder, f"writing {name}: {e.strerror}") from e
            raise

    def read_json(self, name: str) -> Any | None:
        path = self.folder / name
        return json.loads(path.read_text()) if path.exists() else None

    def append_jsonl(self, name: str, obj: Any) -> None:
        """One whole line or none: a write cut short (a full disk) is taken back before the error rises."""
        data = (json.dumps(_jsonable(obj), sort_keys=True) + "\n").encode()
        fd = os.open(self.folder / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(28, os.strerror(28), str(self.folder / name))  # ENOSPC: a short write
            except OSError as e:
                os.ftruncate(fd, size)
                if e.errno in NO_SPACE:
                    raise DiskFull(self.folder, f"writing {name}: {e.strerror}") from e
                raise
        finally:
            os.close(fd)

