"""The quality job's decision: the best node on validation against the baseline, on the test split.

Both are trained again per seed and scored on test (finetune/final.py, the one opener of the test
split), the gain paired by seed. The seeds come in looks planned by the speed guard's sequential
machinery (core/sequential.py: ``GainDesign``; finetune/looks.py runs them): a plan said before the
first seed, a first look at ``search.seeds`` at a level fixed in advance, more seeds only where the
gain's bound straddles the threshold (``search.min_gain``) and the chance that the planned seeds show
it is high enough, a futility stop, and ``search.max_test_seeds`` / ``search.max_test_s`` honoured
with a KEEP BASELINE that says what more would be needed. The seeds default to ones the search did
not use, so the luck that made a node look best at the search's seed is not counted twice; the
decision says how many nodes competed for it (docs/finetune.md, "The decision").

Writes ``verdict.json`` (the decision, every look and its cost), ``final/<recipe id>/`` (each seed's
run, test predictions and ``final.json``), and for an approved recipe ``approved.yaml``: the
experiment file to run it (``recipetune ft run approved.yaml``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from recipetune.core.recipe import Recipe
from recipetune.core.sequential import GainDesign
from recipetune.core.words import Decision, LookOutcome, LooksStop
from recipetune.engine.job import APPROVED_FILE, Finished, Outcome, Services, conclude
from recipetune.finetune.looks import Contender, LookRecord, SplitLooks, design_of, look_line, pace
from recipetune.finetune.plan import FinetuneCampaign


def normalised_gain(value: float, baseline: float) -> float:
    """The quality job's gain in [-1, 1], for metrics in [0, 1] where higher is better: the share of
    the headroom closed above the baseline, ``(m - m0) / (1 - m0)``, the share of the baseline lost
    below it, ``(m - m0) / m0``. So 0.5 -> 0.75 and 0.9 -> 0.95 are worth the same (half the headroom
    each), and falling to 0 is -1."""
    if value >= baseline:
        return 0.0 if baseline >= 1.0 else (value - baseline) / (1.0 - baseline)
    return (value - baseline) / baseline  # baseline > value >= 0, so baseline > 0


def metric_reward(value: float | None, baseline: float, ok: bool, penalty: float = 0.0) -> float:
    """The quality job's reward of one experiment, in [0, 1] (engine/tree.py): ``0.5 + 0.5 * gain``
    of its validation metric over the baseline's; a failed one earns ``penalty``."""
    if not ok or value is None or not math.isfinite(value):
        return penalty
    return min(1.0, max(0.0, 0.5 + 0.5 * normalised_gain(min(1.0, max(0.0, value)), baseline)))


class QualityVerdict(BaseModel):
    """The test-split comparison behind the decision, look by look (the same shape as the speed guard's:
    the looks, the seeds trained, the minutes, what was decided at which look)."""

    decision: str
    reasons: list[str]
    metric: str
    seeds: list[int]  # the last look's
    baseline: list[float]  # test metric per seed
    candidate: list[float]
    baseline_mean: float
    candidate_mean: float
    gain: float  # mean paired difference
    ci_low: float  # the gain's interval at the last look's level
    ci_high: float
    confidence: float  # of that interval: 1 - 2 x the last look's one-sided level
    normalised_gain: float  # of the means (``normalised_gain``)
    validation_baseline: float
    validation_candidate: float
    threshold: float = 0.0  # search.min_gain: the gain must be shown above it
    competed: int = 1  # nodes that competed on validation: the best of them was decided on test
    plan: str = ""  # what the decision said before its first seed
    looks: list[LookRecord] = []
    decided_at: int | None = None  # the look that decided; None where the time budget ended the looks
    stop: str = ""  # shown | futility | budget | plan | time
    runs_trained: int = 0  # runs the looks trained
    runs_reused: int = 0  # runs compared that an earlier session had trained
    minutes: float = 0.0  # wall time of the looks' runs
    max_seeds: int = 0


def final_eta(reports: Sequence[Any], seeds: int) -> float | None:
    """Seconds the test split takes for ``seeds`` seeds of these recipes, each at its own pace
    (finetune/looks.py: ``pace``); None where a run's time is unknown."""
    paces = [pace(r) for r in reports]
    return None if any(p is None for p in paces) else seeds * sum(p or 0.0 for p in paces)


def plan_text(c: FinetuneCampaign, design: GainDesign, competed: int, looks: SplitLooks) -> str:
    """The plan, said before the first seed: the threshold, the first look, the most seeds, the cost."""
    cfg, n1 = c.cfg, len(c.cfg.seeds)
    first, most = looks.pending(n1), looks.pending(cfg.max_test_seeds)

    def cost(todo: list[list[int]]) -> str:
        ahead = looks.eta(todo)
        return f"{sum(map(len, todo))} to train" + (f", ~{ahead / 60:.0f} min at the two recipes' pace" if ahead
                                                     is not None else "")

    return (f"the decision: the best of {competed} node(s) on validation against the baseline, test "
            f"{c.experiment.spec.task.metric} paired by seed; APPROVED when the gain's one-sided bound clears "
            f"{cfg.min_gain:g} (level {design.spending.alpha:.4g} over all looks, {cfg.first_look:.0%} of it at the "
            f"first, {cfg.spending} spending after); first look: seeds {cfg.seeds} ({2 * n1} runs, {cost(first)}); "
            f"at most {cfg.max_test_seeds} seeds ({2 * cfg.max_test_seeds} runs, {cost(most)}), which show a gain of "
            f"{design.resolves(1.0, cfg.max_test_seeds):.2f} x the spread of one seed's gain at {cfg.power:.0%}; "
            f"more seeds only while the bound straddles {cfg.min_gain:g} and the chance that the planned seeds show "
            f"the gain is at least {cfg.futility:.0%}")


def more_needed(c: FinetuneCampaign, looks: SplitLooks, last: LookRecord) -> str:
    """What more would settle a gain not shown: the seeds that would show the gain seen, and their cost."""
    if last.needed is None:
        return f"; the gain seen is not above {c.cfg.min_gain:g}: more seeds are unlikely to show it"
    extra = last.needed - len(last.seeds)
    ahead = final_eta([who.report for who in looks.pair], extra)
    mins = f", ~{ahead / 60:.0f} min at their pace" if ahead is not None else ""
    return (f"; about {last.needed} seeds ({2 * extra} more runs{mins}) would show the gain seen at "
            f"{c.cfg.power:.0%} (search.max_test_seeds, search.max_test_s)")


def reasons_for(c: FinetuneCampaign, looks: SplitLooks, last: LookRecord, competed: int) -> list[str]:
    """The decision's reasons: the gain and why it is (not) shown; the looks; their cost."""
    cfg, (base, cand) = c.cfg, (who.result for who in looks.pair)
    assert base is not None and cand is not None
    n, stop = len(last.seeds), looks.stop or last.outcome
    head = (f"test {c.experiment.spec.task.metric}: {cand.mean:.4f} vs {base.mean:.4f} over seeds {last.seeds}; gain "
            f"{last.gain:+.4f}, bound {last.low:+.4f} at look {last.look} (level {last.level:.4f}); ")
    bar = f"not shown above {cfg.min_gain:g}"
    if stop == LookOutcome.SHOWN:
        why = f"shown above the threshold {cfg.min_gain:g}"
    elif stop == LookOutcome.FUTILITY:
        why = (f"{bar}: the chance that {last.planned} seeds show it is {last.chance or 0.0:.0%}, below "
               f"search.futility {cfg.futility:.0%}" + more_needed(c, looks, last))
    elif stop == LookOutcome.BUDGET:
        why = f"{bar} within search.max_test_seeds ({cfg.max_test_seeds})" + more_needed(c, looks, last)
    elif stop == LooksStop.TIME:
        why = (f"{bar}: search.max_test_s ({cfg.max_test_s or 0.0:g} s) ends the looks at {n} seeds"
               + more_needed(c, looks, last))
    else:
        why = f"{bar} at the planned {n} seeds"
    selection = (f"the best of {competed} node(s) on validation, decided on test seeds the search never used"
                 if competed > 1 else "the one node that beat the baseline on validation, decided on test seeds")
    cost = (f"{len(looks.records)} look(s): {2 * n} runs compared, {looks.trained} trained now, "
            f"{2 * n - looks.trained} kept from an earlier session; {looks.minutes:.1f} min")
    return [head + why, selection, cost, *(look_line(r, cfg.min_gain) for r in looks.records)]


def judge(c: FinetuneCampaign, looks: SplitLooks, competed: int, plan: str, val_base: float,
          val_cand: float) -> QualityVerdict:
    """The verdict of the looks run: APPROVED where the last look showed the gain above the threshold."""
    last = looks.records[-1]
    base, cand = (who.result for who in looks.pair)
    assert base is not None and cand is not None
    stop = looks.stop or last.outcome
    return QualityVerdict(
        decision=Decision.APPROVED if stop == LookOutcome.SHOWN else Decision.KEEP_BASELINE,
        reasons=reasons_for(c, looks, last, competed),
        metric=c.experiment.spec.task.metric, seeds=last.seeds, baseline=base.values, candidate=cand.values,
        baseline_mean=base.mean, candidate_mean=cand.mean, gain=last.gain, ci_low=last.low, ci_high=last.high,
        confidence=1.0 - 2.0 * last.level,
        normalised_gain=normalised_gain(min(1.0, max(0.0, cand.mean)), min(1.0, max(0.0, base.mean))),
        validation_baseline=val_base, validation_candidate=val_cand, threshold=c.cfg.min_gain, competed=competed,
        plan=plan, looks=looks.records, decided_at=None if stop == LooksStop.TIME else last.look, stop=stop,
        runs_trained=looks.trained, runs_reused=2 * len(last.seeds) - looks.trained, minutes=looks.minutes,
        max_seeds=c.cfg.max_test_seeds)


def decide(c: FinetuneCampaign, services: Services, finished: Finished) -> Outcome:
    tree, runs, metric, baseline = finished.tree, finished.runs, c.experiment.spec.task.metric, c.baseline
    best = tree.best()
    root = tree.root.score or 0.0

    def describe(recipe: Recipe) -> str:
        return c.space.describe(recipe, baseline)

    def conclude_(outcome: Outcome) -> Outcome:
        if finished.stopped:  # the decision says why the search spent less than its budget
            outcome.reasons.insert(0, f"the search stopped after {runs} of {c.cfg.budget.trials} runs: "
                                      f"{finished.stopped}")
        shown = outcome.verdicts[0][0] if outcome.verdicts else best
        outcome.record = {"metric": metric, "best": {
            "recipe_id": shown.id, "trial": shown.trial, "change": describe(shown.recipe),
            "validation": shown.score} if shown is not None else None}
        return conclude(services.store, "quality", baseline, outcome, describe)

    if best is None or (best.score or 0.0) <= root:
        found = f"; the best was {best.score:.4f} ({describe(best.recipe)})" if best else ""
        return conclude_(Outcome(Decision.KEEP_BASELINE, [f"no experiment beat the baseline's validation {metric} "
                                                   f"({root:.4f}){found}"], tree, runs=runs))
    competed = len(tree.ranked())  # every node that finished on validation competed to be the one tested
    looks = SplitLooks(c, services, (Contender(baseline, "baseline", tree.root.result),
                                    Contender(best.recipe, f"best node ({describe(best.recipe)})", best.result)))
    design = design_of(c.cfg)
    plan = plan_text(c, design, competed, looks)
    services.reporter.phase(plan)
    try:
        design.run(looks.draw, len(c.cfg.seeds), looks.seen)
    except RuntimeError as e:  # a seed failed to train: no claim can be made
        return conclude_(Outcome(Decision.KEEP_BASELINE, [f"final evaluation failed: {e}"], tree,
                                 verdicts=[(best, None)], runs=runs))
    if not looks.records:  # the time budget allowed not even the first look
        ahead = looks.eta(looks.pending(len(c.cfg.seeds)))
        return conclude_(Outcome(Decision.KEEP_BASELINE, [
            f"search.max_test_s ({c.cfg.max_test_s:g} s) allows no look: the first look's runs take "
            f"~{(ahead or 0.0) / 60:.0f} min at the two recipes' pace"], tree, verdicts=[(best, None)], runs=runs))
    verdict = judge(c, looks, competed, plan, root, best.score or 0.0)
    if verdict.decision != Decision.APPROVED:
        return conclude_(Outcome(verdict.decision, verdict.reasons, tree, None, verdict, [(best, verdict)], runs=runs))
    launch = [f"recipetune ft run {APPROVED_FILE}", f"recipetune ft run {APPROVED_FILE} --final"]
    return conclude_(Outcome(verdict.decision, verdict.reasons, tree, best, verdict, [(best, verdict)], runs=runs,
                             approved=approved_text(c, best.recipe, verdict), launch=launch))


def _absolute(raw: str, base_dir: Path) -> str:
    path = Path(raw).expanduser()
    return raw if path.is_absolute() or not (base_dir / path).exists() else str((base_dir / path).resolve())


def approved_text(c: FinetuneCampaign, recipe: Recipe, verdict: QualityVerdict) -> str:
    """The approved experiment as a file of its own; paths made absolute, as it lives elsewhere."""
    exp = c.space.experiment_of(recipe)
    base_dir = exp.base_dir
    doc = exp.spec.model_dump(mode="json", exclude_none=True)
    doc["task"]["files"] = {k: _absolute(v, base_dir) for k, v in doc["task"].get("files", {}).items()}
    doc["model"]["path"] = _absolute(doc["model"]["path"], base_dir)
    for step in doc["data"]:
        if step.get("op") != "export" and "path" in step:
            step["path"] = _absolute(step["path"], base_dir)
        for source in step.get("sources", []):
            source["path"] = _absolute(source["path"], base_dir)
    header = (f"# Approved by `recipetune finetune {c.path}` on {time.strftime('%Y-%m-%d %H:%M')}.\n"
              f"# Change from the baseline: {c.space.describe(recipe, c.baseline)}\n"
              f"# Test {verdict.metric}: {verdict.candidate_mean:.4f} vs {verdict.baseline_mean:.4f} over seeds "
              f"{verdict.seeds}; gain {verdict.gain:+.4f} ({verdict.confidence:.1%} CI {verdict.ci_low:+.4f} to "
              f"{verdict.ci_high:+.4f}, decided at look {verdict.decided_at}). Evidence in verdict.json.\n")
    return header + yaml.safe_dump(doc, sort_keys=False)
