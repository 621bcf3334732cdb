"""Campaign storage: one Optuna study per campaign, plus a folder of artifacts.

The study (SQLite ``study.db`` in the campaign folder by default, any SQLAlchemy URL otherwise)
holds one trial per proposal that reached the guard: its knob values as parameters, its speed-up
as the value, and in user attributes the recipe, its parent, the proposer and its rationale, the
status and cause, the screening and the run's figures. ``optuna-dashboard sqlite:///study.db``
opens it. Each run keeps its own folder (``trials/NNNN-RECIPEID``: metrics stream, logs,
result.json); the baseline profile and the verdicts are JSON files next to the study.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel

from recipetune.recipe import Recipe, SearchSpace

STUDY_NAME = "recipetune"
INTERRUPTED = "interrupted: the campaign stopped while this trial ran"


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
        self, folder: Path, storage_url: str | None = None, sampler: optuna.samplers.BaseSampler | None = None
    ):
        self.folder = folder
        self.url = storage_url or f"sqlite:///{(folder / 'study.db').resolve()}"
        self.sampler = sampler
        self._storage: optuna.storages.RDBStorage | None = None
        self._study: optuna.Study | None = None
        self._open: dict[int, optuna.trial.Trial] = {}

    # -- the study --------------------------------------------------------------------------

    @property
    def storage(self) -> optuna.storages.RDBStorage:
        if self._storage is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._storage = optuna.storages.RDBStorage(self.url)
        return self._storage

    def exists(self) -> bool:
        """Whether this campaign already has a study (without creating anything)."""
        if self.url.startswith("sqlite:///") and not Path(self.url.removeprefix("sqlite:///")).exists():
            return False
        return any(s.study_name == STUDY_NAME for s in optuna.get_all_study_summaries(self.storage))

    def create(self, meta: dict[str, Any]) -> optuna.Study:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._study = optuna.create_study(storage=self.storage, study_name=STUDY_NAME, direction="maximize",
                                          sampler=self.sampler)
        self._study.set_user_attr("campaign", _jsonable(meta))
        return self._study

    @property
    def study(self) -> optuna.Study:
        if self._study is None:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            self._study = optuna.load_study(study_name=STUDY_NAME, storage=self.storage, sampler=self.sampler)
        return self._study

    @property
    def opened(self) -> bool:
        return self._study is not None

    def meta(self) -> dict[str, Any]:
        return self.study.user_attrs.get("campaign", {})

    def peek(self) -> tuple[dict[str, Any], int]:
        """The campaign's settings and its number of trials, read without keeping the study open."""
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.load_study(study_name=STUDY_NAME, storage=self.storage)
        return study.user_attrs.get("campaign", {}), len(study.get_trials(deepcopy=False))

    def set_meta(self, key: str, value: Any) -> None:
        self.study.set_user_attr(key, _jsonable(value))

    def records(self) -> list[TrialRecord]:
        return [_record(t) for t in self.study.get_trials(deepcopy=False)]

    def fail_interrupted(self) -> list[TrialRecord]:
        """Mark trials left RUNNING by a killed campaign as failed; their recipes may run again."""
        out = []
        study_id = self.storage.get_study_id_from_name(STUDY_NAME)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
            self.storage.set_trial_user_attr(trial_id, "status", "interrupted")
            self.storage.set_trial_user_attr(trial_id, "cause", INTERRUPTED)
            self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
            out.append(_record(self.storage.get_trial(trial_id)))
        return out

    # -- trials -----------------------------------------------------------------------------

    def ask(self, dists: dict[str, BaseDistribution]) -> optuna.trial.Trial:
        """A new RUNNING trial whose parameters the study's sampler chooses (Optuna strategies)."""
        trial = self.study.ask(dists)
        self._open[trial.number] = trial
        return trial

    def begin(self, recipe: Recipe, dists: dict[str, BaseDistribution], attrs: dict[str, Any],
              trial: optuna.trial.Trial | None = None) -> int:
        """Open a trial for ``recipe`` (a fresh one unless ``trial`` came from ``ask``); returns its number."""
        if trial is None:
            trial = self.study.ask()
            study_id = self.storage.get_study_id_from_name(STUDY_NAME)
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            for name, dist in dists.items():
                self.storage.set_trial_param(trial_id, name, dist.to_internal_repr(recipe[name]), dist)
        self._open[trial.number] = trial
        for key, value in {**attrs, "recipe": dict(recipe), "recipe_id": recipe.id, "status": "running"}.items():
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
        """Write atomically: a reader never sees half a file, a crash never leaves one."""
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
        return path

    def read_json(self, name: str) -> Any | None:
        path = self.folder / name
        return json.loads(path.read_text()) if path.exists() else None

    def append_jsonl(self, name: str, obj: Any) -> None:
        with (self.folder / name).open("a") as f:
            f.write(json.dumps(_jsonable(obj), sort_keys=True) + "\n")

