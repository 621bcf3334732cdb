"""The quality job's decision: the best node on validation against the baseline, on the test split.

Both are trained again with each of ``search.seeds`` and scored on test (finetune/final.py, the one
opener of the test split). The gain is paired by seed (same seed, same data order): with
differences d_i = candidate_i - baseline_i over n seeds, the interval is Student's t,
``mean(d) +- t_{n-1} * sd(d) / sqrt(n)``. APPROVED needs the whole interval above zero; a gain
inside the seed-to-seed spread is KEEP BASELINE. Seeds default to ones the search did not use, so
the luck that made a node look best at the search's seed is not counted twice.

Writes ``verdict.json`` (the decision and every figure), ``final/<recipe id>/`` (each seed's run,
test predictions and ``final.json``), and for an approved recipe ``approved.yaml``: the experiment
file to run it (``recipetune ft run approved.yaml``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from recipetune.core.recipe import Recipe
from recipetune.core.stats import t_interval
from recipetune.engine.job import APPROVED_FILE, Finished, Outcome, Services, conclude
from recipetune.finetune.final import final_evaluation
from recipetune.finetune.plan import FinetuneCampaign
from recipetune.finetune.results import FinalResult


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
    """The test-split comparison behind the decision."""

    decision: str
    reasons: list[str]
    metric: str
    seeds: list[int]
    baseline: list[float]  # test metric per seed
    candidate: list[float]
    baseline_mean: float
    candidate_mean: float
    gain: float  # mean paired difference
    ci_low: float
    ci_high: float
    confidence: float
    normalised_gain: float  # of the means (``normalised_gain``)
    validation_baseline: float
    validation_candidate: float


def judge(metric: str, seeds: list[int], base: FinalResult, cand: FinalResult, confidence: float,
          val_base: float, val_cand: float) -> QualityVerdict:
    # paired by seed: the same seed gives both runs the same data order
    gain, low, high = t_interval([c - b for b, c in zip(base.values, cand.values, strict=True)], confidence)
    approved = low > 0
    pct = f"{confidence:.0%}"
    spread = f"seed-to-seed sd {statistics.stdev(base.values):.4f} (baseline), {statistics.stdev(cand.values):.4f}"
    reason = (f"test {metric}: {cand.mean:.4f} vs {base.mean:.4f} over seeds {seeds}; gain {gain:+.4f}, "
              f"{pct} CI [{low:+.4f}, {high:+.4f}]" + ("" if approved else f" includes 0 ({spread})"))
    return QualityVerdict(
        decision="APPROVED" if approved else "KEEP BASELINE", reasons=[reason], metric=metric, seeds=seeds,
        baseline=base.values, candidate=cand.values, baseline_mean=base.mean, candidate_mean=cand.mean, gain=gain,
        ci_low=low, ci_high=high, confidence=confidence,
        normalised_gain=normalised_gain(min(1.0, max(0.0, cand.mean)), min(1.0, max(0.0, base.mean))),
        validation_baseline=val_base, validation_candidate=val_cand)


def saved_final(c: FinetuneCampaign, services: Services, recipe: Recipe) -> FinalResult | None:
    """A recipe's final evaluation kept by an earlier session on the same experiment and seeds."""
    saved = services.store.folder / "final" / recipe.id / "final.json"
    if not saved.exists():
        return None
    result = FinalResult.model_validate_json(saved.read_text())
    return result if result.experiment_id == c.space.experiment_of(recipe).id and result.seeds == c.cfg.seeds else None


def final_for(c: FinetuneCampaign, services: Services, recipe: Recipe, label: str,
              kept: FinalResult | None) -> FinalResult:
    """The test split over the campaign's seeds for one recipe; ``kept``, what an earlier session
    saved of it (``saved_final``), is returned as it is, so a resume does not redo it."""
    if kept is not None:
        return kept
    services.reporter.phase(f"final evaluation of the {label} on the test split, seeds {c.cfg.seeds}")
    return services.executor.call(final_evaluation, None, c.space.experiment_of(recipe), c.cfg.seeds,
                                  services.store.folder / "final" / recipe.id, log=services.reporter.phase).result()


def final_eta(reports: Sequence[Any], seeds: int) -> float | None:
    """Seconds the final evaluation of these recipes takes, at the pace of their own validation runs:
    each seed trains a recipe again and evaluates it on validation and on test (one evaluation more
    than the run it is timed by). None where a run's time is unknown. Not the baseline's pace: the
    best node may train several times longer (chat-recall's `epochs=4`: 152 s against 75 s)."""
    times = [getattr(r, "timings_s", {}) for r in reports]
    if not all(t.get("total") for t in times):
        return None
    return seeds * sum(t["total"] + t.get("eval", 0.0) for t in times)


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
        return conclude_(Outcome("KEEP BASELINE", [f"no experiment beat the baseline's validation {metric} "
                                                   f"({root:.4f}){found}"], tree, runs=runs))
    kept = {node.recipe.id: saved_final(c, services, node.recipe) for node in (tree.root, best)}
    pending = [node for node in (tree.root, best) if kept[node.recipe.id] is None]
    ahead = final_eta([node.result for node in pending], len(c.cfg.seeds))
    if pending and ahead is not None:
        services.reporter.phase(f"final evaluation: {len(pending) * len(c.cfg.seeds)} runs on the test split, "
                                f"~{ahead / 60:.0f} min at the pace of their validation runs")
    try:
        base = final_for(c, services, baseline, "baseline", kept[baseline.id])
        cand = final_for(c, services, best.recipe, f"best node ({describe(best.recipe)})", kept[best.recipe.id])
    except RuntimeError as e:  # a seed failed to train: no claim can be made
        return conclude_(Outcome("KEEP BASELINE", [f"final evaluation failed: {e}"], tree, verdicts=[(best, None)],
                                 runs=runs))
    verdict = judge(metric, c.cfg.seeds, base, cand, c.cfg.confidence, root, best.score or 0.0)
    if verdict.decision != "APPROVED":
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
              f"{verdict.seeds}; gain {verdict.gain:+.4f} ({verdict.confidence:.0%} CI {verdict.ci_low:+.4f} to "
              f"{verdict.ci_high:+.4f}). Evidence in verdict.json.\n")
    return header + yaml.safe_dump(doc, sort_keys=False)
