"""What the report reads from a campaign folder: the study, the decision and the files beside them.

Their names are core/filenames.py's, where the jobs and the guard that write them name them too.
Everything is read, nothing is written, and a missing optional file reads as empty.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from recipetune.core.filenames import (
    BASELINE_REPORT,
    CAMPAIGN,
    FINALISTS,
    PROFILE,
    REJECTED,
    RESULT,
    SET_ASIDE,
    STUDY_DB,
    VERDICT,
)
from recipetune.core.measure import RunResult
from recipetune.core.stats import smooth as guard_smooth  # the guard's smoothing: the report shows what it judged
from recipetune.engine.record import Figures, Trial, TrialRecord
from recipetune.engine.store import CampaignStore

SPEED, QUALITY = "speed", "quality"  # the campaign's job (meta "job"; campaigns older than the quality job: speed)

# Trial user attributes read by key (the others through the job's typed record: ``stored``).
A_RECIPE, A_RUN_DIR = "recipe", "run_dir"
# Study user attributes.
M_CAMPAIGN, M_ELAPSED, M_JOB = "campaign", "search_elapsed_s", "job"


F = TypeVar("F", bound=Figures)


def stored(rec: TrialRecord, figures: type[F]) -> Trial[F]:
    """A trial's stored attributes as the job's typed record (engine/record.py: ``Trial[F]``), read
    leniently: a field whose stored value has another type (a hand-edited study: text for a number, a
    boolean for a count) reads as absent, as the report has always read it; nothing is converted."""
    attrs = dict(rec.attrs)
    while True:
        try:
            return Trial[figures].model_validate(attrs, strict=True)  # type: ignore[valid-type]
        except ValidationError as e:
            bad = {str(err["loc"][1] if err["loc"][:1] == ("figures",) else err["loc"][0]) for err in e.errors()
                   if err["loc"]}
            if not bad & set(attrs):
                raise
            attrs = {k: v for k, v in attrs.items() if k not in bad}


class NotACampaign(ValueError):
    """The folder is not a campaign folder (or not one this version can read)."""


@dataclass
class CampaignFiles:
    """Everything a campaign folder holds, read once."""

    folder: Path
    meta: dict[str, Any]
    study_attrs: dict[str, Any]
    config: dict[str, Any]
    records: list[TrialRecord]
    results: dict[int, RunResult]  # trial number -> its run
    profile: dict[str, Any] | None
    profile_runs: list[RunResult]
    verdict: dict[str, Any] | None
    finalists: list[dict[str, Any]]
    rejected: list[dict[str, Any]] = field(default_factory=list)
    set_aside: list[dict[str, Any]] = field(default_factory=list)  # engine/effects.py: SetAside.record
    baseline_report: dict[str, Any] | None = None  # the quality job's baseline experiment

    @property
    def job(self) -> str:
        return str(self.meta.get(M_JOB) or SPEED)


def _json(path: Path) -> Any | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise NotACampaign(f"{path}: unreadable JSON ({e})") from None


def _result(path: Path) -> RunResult | None:
    try:
        return RunResult.load(path) if path.is_file() else None
    except (OSError, ValueError, ValidationError):
        return None  # a run killed while saving: the study still has its figures


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def trial_dir(folder: Path, rec: TrialRecord) -> Path | None:
    """The trial's run folder: as recorded, else found by its number under trials/."""
    recorded = rec.attrs.get(A_RUN_DIR)
    if recorded:
        path = Path(recorded)
        if not path.is_absolute() and not path.exists():
            path = folder / path
        if path.exists():
            return path
    matches = sorted((folder / "trials").glob(f"{rec.number:04d}-*"))
    return matches[0] if matches else None


def read_campaign(folder: Path) -> CampaignFiles:
    """Read a campaign folder; raise NotACampaign naming what is missing."""
    if not folder.is_dir():
        raise NotACampaign(f"{folder} is not a folder; expected a campaign folder written by "
                           "`recipetune tune` or `recipetune finetune`")
    config = _json(folder / CAMPAIGN) or {}
    storage = (config.get("search") or {}).get("storage")
    if storage is None and not (folder / STUDY_DB).is_file():
        raise NotACampaign(f"{folder} is not a campaign folder: it has no {STUDY_DB} "
                           "(expected the folder `recipetune tune` or `recipetune finetune` wrote with --out)")
    store = CampaignStore(folder, storage)
    try:
        if not store.exists():
            raise NotACampaign(f"{folder}: the study database holds no recipetune campaign")
        study_attrs = dict(store.study.user_attrs)
        records = store.records()
    except NotACampaign:
        raise
    except Exception as e:  # a foreign or corrupt database: say so rather than print a traceback
        raise NotACampaign(f"{folder}: cannot read the study ({type(e).__name__}: {e})") from None
    results = {}
    for rec in records:
        path = trial_dir(folder, rec)
        result = _result(path / RESULT) if path else None
        if result is not None:
            results[rec.number] = result
    profile = _json(folder / PROFILE)
    runs = []
    for raw in (profile or {}).get("runs") or []:
        try:
            runs.append(RunResult.model_validate(raw))
        except ValidationError:
            continue
    finalists = _json(folder / FINALISTS) or []
    return CampaignFiles(
        folder=folder, meta=study_attrs.get(M_CAMPAIGN) or {}, study_attrs=study_attrs, config=config,
        records=records, results=results, profile=profile, profile_runs=runs, verdict=_json(folder / VERDICT),
        finalists=[f for f in finalists if isinstance(f, dict)], rejected=_jsonl(folder / REJECTED),
        set_aside=_jsonl(folder / SET_ASIDE), baseline_report=_json(folder / BASELINE_REPORT),
    )


def smooth(values: list[float], window: int) -> Any:
    """The guard's smoothing of a loss curve (trailing mean over ``window`` steps, full windows only)."""
    return guard_smooth(values, window)


def number(value: Any) -> float | None:
    """A finite float, or None (the store writes inf/nan as null; hand-edited files may hold text)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
