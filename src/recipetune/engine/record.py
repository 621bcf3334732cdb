"""One trial as the study keeps it: the engine's fields and the job's figures, typed.

The study stores a trial flat, as its Optuna user attributes: the engine's keys (``status``,
``reward``, ``score``, ``parent`` ...) beside the job's figures (speed: ``speedup``, ``tokens_per_s``
...; quality: ``value``, ``diagnosis`` ...). ``Trial[F]`` reads them back as one model, ``F`` the
job's ``Figures``: the loop's resume (engine/loop.py: rebuild), the job's row of the live table and
the report (report/speed.py, report/quality.py) read the same fields by name. The stored keys are the
ones campaigns have always written, so a campaign written before this model resumes unchanged; a
job whose older campaigns kept the score under another key names it (``Figures.LEGACY_SCORE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from recipetune.core.recipe import Recipe
from recipetune.engine.status import FINISHED


class Figures(BaseModel):
    """A job's own figures of one trial; every field optional (a trial refused before it ran, or
    still running, has none). Written with the fields the job set (``stored``)."""

    model_config = ConfigDict(extra="ignore")
    LEGACY_SCORE: ClassVar[str | None] = None  # where campaigns written before the ``score`` key kept it

    run_status: str | None = None  # the run's own status (ok, oom, crash, pruned, lost, error ...)

    def stored(self) -> dict[str, Any]:
        """The user attributes this writes: the fields the job set, by their stored names."""
        return self.model_dump(mode="json", exclude_unset=True)


@dataclass(frozen=True)
class Evidence:
    """What one trial measured of its speed: its ratio to the baseline's, or (``censored``: why) the
    most it can be."""

    ratio: float
    censored: str = ""  # "" measured; "timeout" or "oom": ``ratio`` is an upper bound

    def stored(self) -> dict[str, Any]:
        """The trial's attributes that keep it (``Trial.evidence_ratio``, ``Trial.evidence_censored``)."""
        return {"evidence_ratio": self.ratio, "evidence_censored": self.censored}

    def text(self) -> str:
        return f"at most {self.ratio:.3g}x ({self.censored})" if self.censored else f"{self.ratio:.3g}x"


TOO_BIG = 0.1  # the ratio an OOM counts as, at most: it does not run at all


def failure_evidence(status: str, bound: float | None) -> Evidence | None:
    """A run that did not finish, as evidence: a timeout is at most ``bound`` (what the time allowed),
    an OOM at most ``TOO_BIG``; anything else (a crash, NaN) says nothing of speed."""
    if status == "timeout" and bound is not None and bound > 0:
        return Evidence(bound, "timeout")
    if status == "oom":
        return Evidence(TOO_BIG, "oom")
    return None


F = TypeVar("F", bound=Figures)


class Trial(BaseModel, Generic[F]):
    """A trial's stored attributes as one record (parametrised by the job's figures: ``Trial[SpeedFigures]``)."""

    model_config = ConfigDict(extra="ignore")

    recipe: dict[str, Any] = {}
    recipe_id: str = ""
    parent: str = ""  # the parent node's recipe id
    proposer: str = ""
    rationale: str = ""
    status: str = ""  # running | passed | rejected | failed | pruned | interrupted | duplicate | unrun
    cause: str = ""
    ran: bool = False  # counted against the budget
    run_dir: str | None = None
    reward: float | None = None
    score: float | None = None  # the job's figure of merit, for a passed trial
    evidence_ratio: float | None = None  # what it measured of its speed over the baseline's (``Evidence``)
    evidence_censored: str = ""
    figures: F

    def evidence(self) -> Evidence | None:
        """What the trial measured of its speed, as the search learns from it (engine/effects.py)."""
        return None if self.evidence_ratio is None else Evidence(self.evidence_ratio, self.evidence_censored)

    @field_validator("recipe_id", "parent", "proposer", "rationale", "status", "cause", "evidence_censored",
                     mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return "" if value is None else value  # a null text reads as none, as a missing one does

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """The stored attributes are flat: the job's figures are read from the same mapping."""
        if not isinstance(data, dict) or "figures" in data:
            return data
        kind = cls.model_fields["figures"].annotation
        legacy = getattr(kind, "LEGACY_SCORE", None)
        extra = {"score": data.get(legacy)} if legacy and "score" not in data else {}
        return {**data, **extra, "figures": data}


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

    @property
    def finished(self) -> bool:
        """Closed in the study with a status that makes it a node of the tree (not an interrupted,
        duplicate or unrun trial, nor one still running)."""
        return self.state in ("COMPLETE", "FAIL", "PRUNED") and self.status in FINISHED


def trial_record(t: FrozenTrial) -> TrialRecord:
    """An Optuna trial as the campaign reads it back."""
    return TrialRecord(t.number, t.state.name, t.value if t.state == TrialState.COMPLETE else None, t.user_attrs)
