"""Several drivers on one study: claims, run slots and heartbeats (engine/store.py's docstring says
why each exists). ``Drivers`` keeps them for the store that owns it (``CampaignStore.drivers``), through
a narrow view of it (``Study``); a trial whose driver is gone is failed as interrupted, its claim and
slot released.

Private Optuna API used here, because no public one serves: ``RDBStorage._get_stale_trial_ids``
(the trials whose heartbeat stopped; Optuna's public ``fail_stale_trials`` fails them itself, without
the cause this one records first) and ``FrozenTrial._trial_id`` (the storage's key of a trial, which
the storage's own methods take).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

import optuna
import sqlalchemy as sa
from optuna.trial import TrialState

from recipetune.core.recipe import Recipe
from recipetune.engine.record import TrialRecord, trial_record

if TYPE_CHECKING:
    import optuna.storages

T = TypeVar("T")
INTERRUPTED = "interrupted: the campaign stopped while this trial ran"
DRIVER = f"{socket.gethostname()}:{os.getpid()}"  # who runs a trial; a process is one driver


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


class Study(Protocol):
    """What ``Drivers`` reads of the store that owns it: the study, its storage, its name, and one
    transaction of its database (``sql``), patient as the store's own."""

    name: str

    @property
    def study(self) -> optuna.Study: ...

    @property
    def storage(self) -> optuna.storages.RDBStorage: ...

    def sql(self, what: str, fn: Callable[[sa.engine.Connection], T]) -> T: ...


class Drivers:
    """Claims, run slots and heartbeats of a campaign's study: a part the store owns
    (``CampaignStore.drivers``), given the study (``Study``) and the trials this driver has open (the
    store's, by number: a run slot is taken for one, a heartbeat sent for each)."""

    def __init__(self, db: Study, heartbeat_s: int, open_trials: dict[int, optuna.trial.Trial]):
        self.db, self.heartbeat_s, self._open = db, heartbeat_s, open_trials
        self._beat: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def study(self) -> optuna.Study:
        return self.db.study

    @property
    def storage(self) -> optuna.storages.RDBStorage:
        return self.db.storage

    def _sql(self, what: str, fn: Callable[[sa.engine.Connection], T]) -> T:
        return self.db.sql(what, fn)

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
        study_id = self.storage.get_study_id_from_name(self.db.name)
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
            # Optuna's GridSampler counts a failed trial's point as visited, and an interrupted run measured
            # nothing: its point goes back to the grid (a grid campaign killed twice on one point ended
            # KEEP BASELINE with that point never measured, where the uninterrupted campaign approved it).
            if "grid_id" in self.storage.get_trial_system_attrs(trial_id):
                self.storage.set_trial_system_attr(trial_id, "grid_id", -1)
            if not self.storage.set_trial_state_values(trial_id, TrialState.FAIL):
                return None
        except optuna.exceptions.UpdateFinishedTrialError:
            return None
        rec = trial_record(self.storage.get_trial(trial_id))
        if "recipe_id" in rec.attrs:
            self.unclaim(rec.attrs["recipe_id"])
        self.release_run(trial_id)
        return rec

    # -- claims and heartbeats: several drivers on one study --------------------------------

    def _claim_key(self) -> str:
        # The study's id too: a study deleted and created again under its name starts without claims.
        return f"{self.db.name}#{self.storage.get_study_id_from_name(self.db.name)}"

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
