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
In a database server (``search.storage``: PostgreSQL, MySQL) the study is named after the campaign
folder, so several campaigns share one database; a SQLite file holds one study named ``recipetune``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel

from recipetune.core.files import write_atomic
from recipetune.core.recipe import Recipe, SearchSpace

STUDY_NAME = "recipetune"
INTERRUPTED = "interrupted: the campaign stopped while this trial ran"
DRIVER = f"{socket.gethostname()}:{os.getpid()}"  # who runs a trial; a process is one driver

CLAIMS = sa.Table(
    "recipetune_claims", sa.MetaData(),
    sa.Column("study", sa.String(512), primary_key=True),
    sa.Column("recipe_id", sa.String(64), primary_key=True),
    sa.Column("driver", sa.String(512)),
)


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
        heartbeat_s: int = 30,
    ):
        self.folder = folder
        self.url = storage_url or f"sqlite:///{(folder / 'study.db').resolve()}"
        # A database server holds many campaigns: each study is named after its folder. A SQLite
        # file holds one campaign, under the fixed name.
        self.name = STUDY_NAME if self.url.startswith("sqlite") else folder.resolve().name
        self.sampler = sampler
        self.heartbeat_s = heartbeat_s
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
            with warnings.catch_warnings():  # heartbeats are marked experimental
                warnings.simplefilter("ignore")
                self._storage = optuna.storages.RDBStorage(
                    self.url, heartbeat_interval=self.heartbeat_s, grace_period=2 * self.heartbeat_s)
            if self.url.startswith("sqlite"):
                _write_ahead(self._storage.engine)
            with contextlib.suppress(sa.exc.SQLAlchemyError):  # another driver may be creating it too
                CLAIMS.metadata.create_all(self._storage.engine)
        return self._storage

    def exists(self) -> bool:
        """Whether this campaign already has a study (without creating anything)."""
        if self.url.startswith("sqlite:///") and not Path(self.url.removeprefix("sqlite:///")).exists():
            return False
        return any(s.study_name == self.name for s in optuna.get_all_study_summaries(self.storage))

    def create(self, meta: dict[str, Any]) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._study = optuna.create_study(storage=self.storage, study_name=self.name, direction="maximize",
                                          sampler=self.sampler)
        self._study.set_user_attr("campaign", _jsonable(meta))
        return self._study

    @property
    def study(self) -> optuna.Study:
        if self._study is None:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            self._study = optuna.load_study(study_name=self.name, storage=self.storage, sampler=self.sampler)
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
        return [_record(t) for t in self.study.get_trials(deepcopy=False)]

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
        return out

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
        return rec

    # -- claims and heartbeats: several drivers on one study --------------------------------

    def _claim_key(self) -> str:
        # The study's id too: a study deleted and created again under its name starts without claims.
        return f"{self.name}#{self.storage.get_study_id_from_name(self.name)}"

    def claim(self, recipe: Recipe) -> bool:
        """Reserve ``recipe`` for this driver; False when a driver (this one included) already has it."""
        try:
            with self.storage.engine.begin() as conn:
                conn.execute(CLAIMS.insert().values(study=self._claim_key(), recipe_id=recipe.id, driver=DRIVER))
        except sa.exc.IntegrityError:
            return False
        return True

    def unclaim(self, recipe_id: str) -> None:
        key = self._claim_key()
        with self.storage.engine.begin() as conn:
            conn.execute(CLAIMS.delete().where((CLAIMS.c.study == key) & (CLAIMS.c.recipe_id == recipe_id)))

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
                    self.storage.record_heartbeat(trial._trial_id)

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
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trial = self.study.ask()
            for name, dist in dists.items():
                self.storage.set_trial_param(trial._trial_id, name, dist.to_internal_repr(recipe[name]), dist)
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

    def finish(self, number: int, value: float | None, attrs: dict[str, Any]) -> TrialRecord:
        """Close a trial: COMPLETE with ``value``, or FAIL when ``value`` is None."""
        trial = self._open.pop(number)
        for key, v in attrs.items():
            trial.set_user_attr(key, _jsonable(v))
        if value is not None and math.isfinite(value):
            frozen = self.study.tell(trial, value)
        else:
            frozen = self.study.tell(trial, state=TrialState.FAIL)
        return _record(frozen)

    # -- artifacts --------------------------------------------------------------------------

    def write_json(self, name: str, obj: Any) -> Path:
        return write_atomic(self.folder / name, json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n")

    def read_json(self, name: str) -> Any | None:
        path = self.folder / name
        return json.loads(path.read_text()) if path.exists() else None

    def append_jsonl(self, name: str, obj: Any) -> None:
        with (self.folder / name).open("a") as f:
            f.write(json.dumps(_jsonable(obj), sort_keys=True) + "\n")

