"""Campaign storage: one Optuna study per campaign, plus a folder of artifacts.

The study (SQLite ``study.db`` in the campaign folder by default, any SQLAlchemy URL otherwise)
holds one trial per proposal that reached the guard: its knob values as parameters, the job's
score as the value, and in user attributes the recipe, its parent, the proposer and its rationale, the
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

Here: the study and the trial's lifecycle (``open_trial``: claim, begin, a run slot, running, in one
trip; finish; reports), and the campaign's files.
The claims, slots and heartbeats are engine/drivers.py (``Drivers``, the store's ``drivers``); the
patient database is engine/database.py; what a trial stores is engine/record.py.

The baseline's curve (``set_reference``) is kept in the study's user attributes, not as a trial:
the pruner reads it through engine/samplers.py: ``WithReference``, ``values_at`` adds it to the
finished trials' reports. A study written before 2026-12-03 holds it as a trial with no recipe
(status ``reference``, ``is_reference``): it is read as the reference, never as a campaign trial.

Private Optuna API used here, because no public one serves: ``Study._storage.create_new_trial`` with a
template trial (``begin``: a trial created whole, its driver included, in one write; ``Study.ask``
creates it empty first, and another driver looking between the two writes would fail it as a dead
driver's), and ``Trial._trial_id`` (the storage's key, which ``record_heartbeat`` takes).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import optuna
import sqlalchemy as sa
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel

from recipetune.core.filenames import STUDY_DB
from recipetune.core.files import write_atomic
from recipetune.core.recipe import Recipe
from recipetune.engine.database import (
    NO_SPACE,
    DiskFull,
    PatientStorage,
    patient,
    schema_race,
    write_ahead,
)
from recipetune.engine.drivers import CLAIMS, DRIVER, Drivers
from recipetune.engine.record import TrialRecord, trial_record
from recipetune.engine.status import Refusal

STUDY_NAME = "recipetune"
REFERENCE = "reference"  # the study's user attribute holding the baseline's curve (set_reference)
T = TypeVar("T")


def is_reference(t: FrozenTrial) -> bool:
    """The baseline's curve as a study written before 2026-12-03 kept it: a trial with no recipe
    and the status ``reference``, none of the campaign's trials."""
    return t.user_attrs.get("status") == REFERENCE


def reference_trial(study: optuna.Study) -> FrozenTrial | None:
    """The baseline's curve (``set_reference``) as a finished trial, the way Optuna's pruners read the
    finished trials; None where the study holds none in its attributes (no pruning, or an older study
    whose reference is a trial of its own, which the pruner reads as it is)."""
    ref = study.user_attrs.get(REFERENCE)
    if not ref:
        return None
    return optuna.trial.create_trial(value=ref["score"], user_attrs={"status": REFERENCE, "ran": False},
                                     intermediate_values={int(k): v for k, v in ref["curve"].items()})


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


@dataclass(frozen=True)
class Opened:
    """A trial open in the study (RUNNING, its recipe claimed, one run slot of the shared budget
    taken): its run may start in ``run_dir``."""

    number: int
    run_dir: Path


@dataclass(frozen=True)
class Refused:
    """No run for this recipe (``open_trial``), and why (``Refusal``). ``number``: the trial closed for it,
    None where none was opened."""

    reason: Refusal
    number: int | None
    cause: str


CLAIMED = "same recipe as another driver's trial"
BUDGET_TAKEN = "the shared budget was spent by other drivers' runs"


class CampaignStore:
    """A campaign folder and its study."""

    def __init__(
        self, folder: Path, storage_url: str | None = None, sampler: optuna.samplers.BaseSampler | None = None,
        heartbeat_s: int = 30, db_retry_s: float = 60.0, pruner: optuna.pruners.BasePruner | None = None,
    ):
        self.folder = folder
        self.url = storage_url or f"sqlite:///{(folder / STUDY_DB).resolve()}"
        # A database server holds many campaigns: each study is named after its folder. A SQLite
        # file holds one campaign, under the fixed name.
        self.name = STUDY_NAME if self.url.startswith("sqlite") else folder.resolve().name
        # No pruner named prunes nothing: Optuna's default (a median pruner) would stop trials nobody asked it to.
        self.sampler = sampler
        self.pruner = pruner if pruner is not None else optuna.pruners.NopPruner()
        self.heartbeat_s = heartbeat_s
        self.db_retry_s = db_retry_s
        self._storage: optuna.storages.RDBStorage | None = None
        self._study: optuna.Study | None = None
        self._open: dict[int, optuna.trial.Trial] = {}
        self._reference: dict[int, float] | None = None  # the baseline's curve, once read (reference())
        self.drivers = Drivers(self, heartbeat_s, self._open)  # claims, run slots, heartbeats

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
                            storage = PatientStorage(self.url, engine_kwargs=engine_kwargs,
                                                      heartbeat_interval=self.heartbeat_s,
                                                      grace_period=2 * self.heartbeat_s)
                        break
                    except sa.exc.DBAPIError as e:
                        # Another process (a second driver, `recipetune show` on a campaign just
                        # starting) created a table of the new schema, or stamped its version,
                        # between Optuna's look and its own statement: the next look finds it so.
                        if attempt == 2 or not schema_race(e):
                            raise
                storage.retry_s = self.db_retry_s
                return storage

            storage = patient(self.url, self.db_retry_s, connect, "connecting")
            if sqlite:
                write_ahead(storage.engine)
            with contextlib.suppress(sa.exc.SQLAlchemyError):  # another driver may be creating it too
                patient(self.url, self.db_retry_s, lambda: CLAIMS.metadata.create_all(storage.engine), "connecting")
            self._storage = storage
        return self._storage

    def sql(self, what: str, fn: Callable[[sa.engine.Connection], T]) -> T:
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
        """The campaign's trials (not an older study's reference trial, ``is_reference``)."""
        return [trial_record(t) for t in self.study.get_trials(deepcopy=False) if not is_reference(t)]

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

    def open_trial(self, recipe: Recipe, dists: dict[str, BaseDistribution], attrs: dict[str, Any],
                   trial: optuna.trial.Trial | None = None, *, budget: int, plan: Mapping[str, Any] | None = None,
                   refusal: Mapping[str, Any] | None = None) -> Opened | Refused:
        """Open the trial of ``recipe`` in one trip: claim the recipe, begin its trial, take one of the
        ``budget`` run slots the study's drivers share, and mark it running with ``plan`` (the job's
        plan of the run). With ``refusal`` (the job's check refused the recipe: the figures it stores)
        the trial is closed at once, claimed but never run. A sampler's ``trial`` is closed as a
        duplicate when another driver has the recipe; a trial whose slot another driver's run took is
        closed as unrun and its recipe released."""
        if not self.drivers.claim(recipe):
            number = None
            if trial is not None:  # the sampler's trial must be told: it is not run here
                number = self.begin(recipe, dists, {k: attrs[k] for k in ("parent", "proposer") if k in attrs}, trial)
                self.finish(number, None, {"status": "duplicate", "ran": False, "cause": CLAIMED})
            return Refused(Refusal.CLAIMED, number, CLAIMED)
        number = self.begin(recipe, dists, attrs, trial)
        if refusal is not None:
            self.finish(number, None, dict(refusal))
            return Refused(Refusal.REJECTED, number, str(refusal.get("cause", "")))
        if not self.drivers.take_run(number, budget):
            self.finish(number, None, {"status": "unrun", "ran": False, "cause": BUDGET_TAKEN})
            self.drivers.unclaim(recipe.id)
            return Refused(Refusal.BUDGET, number, BUDGET_TAKEN)
        run_dir = self.run_dir(number, recipe)
        self.set_running(number, {"run_dir": str(run_dir), "ran": True, **(plan or {})})
        return Opened(number, run_dir)

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
        return trial_record(frozen)

    def report(self, number: int, step: int, value: float) -> bool:
        """A running trial's intermediate value at ``step``; whether the study's pruner stops it now."""
        trial = self._open[number]
        trial.report(value, step)
        return trial.should_prune()

    def values_at(self, step: int) -> list[float]:
        """The finished trials' reports at ``step`` and the baseline's (``reference``): what a pruner
        compares a running trial with (engine/samplers.py: pruning_bar)."""
        finished = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        reference = self.reference()
        return ([t.intermediate_values[step] for t in finished if step in t.intermediate_values and not is_reference(t)]
                + ([reference[step]] if step in reference else []))

    def set_reference(self, curve: dict[int, float], score: float) -> None:
        """The baseline's intermediate values and score, the pruner's reference: kept once per study (the
        first driver's), in its user attributes (an older study keeps its reference trial)."""
        self._reference = None  # read afresh: another driver may have written it first
        if not self.reference():
            self.set_meta(REFERENCE, {"score": score, "curve": {str(k): v for k, v in curve.items()}})
            self._reference = None  # read back what the study holds

    def reference(self) -> dict[int, float]:
        """The baseline's curve by step ({} where the study holds none)."""
        if self._reference is None:  # read once: {} (no reference) is an answer too, not a miss
            ref = reference_trial(self.study) or next(
                (t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if is_reference(t)),
                None)
            self._reference = dict(ref.intermediate_values) if ref is not None else {}
        return self._reference

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

