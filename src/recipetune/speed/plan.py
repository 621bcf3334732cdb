"""Planning a ``tune`` campaign: every check before anything is written.

The space (searchable knobs only: a semantic one on opt-in, never an invariant or a derived one),
the global batch's rule, the Researcher, the folder (empty, or the same settings on --resume) and the
study's sampler. Bad input is a ConfigError naming the file and field; nothing is written.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipetune.config import Campaign
from recipetune.core.errors import ConfigError
from recipetune.core.filenames import RUNS_FOLDER
from recipetune.core.recipe import INVARIANT, SEMANTIC, KnobError, SearchSpace
from recipetune.core.relations import MAX_CHECKS, Problem, Relation, Relations
from recipetune.engine import plan as planning
from recipetune.engine.plan import open_campaign, redacted
from recipetune.guard.runs import check_folder as check_runs_folder
from recipetune.speed.facts import PLAYBOOK
from recipetune.speed.semantic import BatchRule, batch_rule


@dataclass
class Plan(planning.Plan):
    campaign: Campaign
    batch: BatchRule | None = None  # the global batch may change, up to a measured CBS


def check_space(campaign: Campaign) -> SearchSpace:
    cfg, path = campaign.config.search, campaign.path
    if not cfg.knobs:
        raise ConfigError(path, "search.knobs", "no knobs to search; list knobs with the values to try")
    knobs = campaign.workload.knobs()
    try:
        space = SearchSpace.from_lists(knobs, cfg.knobs)
    except KnobError as e:
        raise ConfigError(path, f"search.knobs.{e.knob}", str(e)) from None
    for name in space.values:
        role = knobs[name].role
        if knobs[name].derive:
            raise ConfigError(path, f"search.knobs.{name}",
                              f"'{name}' is derived from '{knobs[name].derive}' and never searched; "
                              "search the knobs it is derived from")
        if role == INVARIANT:
            raise ConfigError(path, f"search.knobs.{name}",
                              f"'{name}' defines the experiment (an invariant knob) and cannot be searched")
        if role == SEMANTIC and name not in cfg.allow_semantic:
            raise ConfigError(path, f"search.knobs.{name}",
                              f"'{name}' may change what the model learns; list it in search.allow_semantic "
                              "to search it (the guard then judges it on loss)")
    check_moves(campaign, space)
    return space


def check_moves(campaign: Campaign, space: SearchSpace) -> None:
    """Refuse a space whose every point but the baseline breaks a relation (``batch_size`` searched
    alone under ``batch_size * grad_accum == 32``): the search could only measure the baseline again
    and keep it. Stops at the first feasible move; skipped where the space is too large to enumerate
    (core/relations.py MAX_CHECKS). The error names the relations and the knobs to search with."""
    relations = campaign.workload.relations()
    if not relations or math.prod(len(v) for v in space.values.values()) > MAX_CHECKS:
        return
    base = campaign.baseline
    broken: dict[str, set[str]] = {}  # what the points other than the baseline break, and the knobs involved
    for values in itertools.product(*space.values.values()):
        point = dict(zip(space.values, values, strict=True))
        if all(point[n] == base.get(n) for n in point):
            continue
        try:
            problems = relations.problems(relations.derive(base.with_(**point)))
        except KnobError as e:  # a derived knob out of its domain
            problems = [Problem(e.knob, "derived", str(e), frozenset({e.knob}))]
        if not problems:
            return  # a move the search can make
        for p in problems:
            broken.setdefault(p.knob, set()).update(p.knobs)
    if not broken:  # no point but the baseline at all: nothing breaks, and nothing here to refuse
        return
    searched = sorted(space.values)
    partners = sorted(set().union(*broken.values()) - set(searched) - set(relations.derived))
    names = ", ".join(f"'{r.expr}'" if (r := _relation(relations, n)) else f"'{n}' (derived)" for n in broken)
    together = (f"search {', '.join(searched)} together with {', '.join(partners)}" if partners
                else "list other values of the searched knobs")
    raise ConfigError(campaign.path, "search.knobs",
                      f"no recipe of the space but the baseline keeps {names}: every other value of "
                      f"{', '.join(searched)} breaks it while the other knobs keep the baseline's values, so the "
                      f"search could only measure the baseline again; {together}")


def _relation(relations: Relations, name: str) -> Relation | None:
    return next((r for r in relations.relations if r.name == name), None)


def campaign_meta(campaign: Campaign, space: SearchSpace, batch: BatchRule | None = None) -> dict[str, Any]:
    cfg = campaign.config.search
    return {
        "job": "speed", "file": str(campaign.path.resolve()), "workload": campaign.workload.kind,
        "baseline": dict(campaign.baseline), "baseline_id": campaign.baseline.id,
        "space": {n: list(v) for n, v in space.values.items()}, "allow_semantic": sorted(cfg.allow_semantic),
        "strategy": cfg.strategy, "backup": cfg.backup, "steps_per_trial": cfg.steps_per_trial,
        "global_batch": batch.meta() if batch is not None else None,
    }


RESUME_KEYS = ("baseline_id", "space", "strategy", "backup", "steps_per_trial", "allow_semantic", "global_batch")


def plan(campaign: Campaign, folder: Path, resume: bool = False) -> Plan:
    """Check the campaign and its folder; raise ConfigError (exit 2) before anything is written."""
    space = check_space(campaign)
    batch = batch_rule(campaign)
    meta = campaign_meta(campaign, space, batch)
    # Where the guard keeps its runs (RUNS_FOLDER): a file there, a folder this user
    # cannot write, or another trainer's runs is bad input now, not a traceback after the search.
    check_runs_folder(folder / RUNS_FOLDER, campaign.workload, "--out")
    proposer, store = open_campaign(campaign.config.search, campaign.config.execute, campaign.path, folder, resume,
                                    meta, RESUME_KEYS, space, campaign.baseline, campaign.workload.relations(),
                                    PLAYBOOK)
    snapshot = redacted(campaign.config.model_dump(mode="json"))
    return Plan(campaign, folder, resume, space, proposer, meta, store, snapshot, batch)
