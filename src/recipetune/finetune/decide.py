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

import shlex
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel

from recipetune.core.recipe import Recipe
from recipetune.engine.loop import Outcome, Search
from recipetune.engine.store import write_atomic
from recipetune.engine.tree import normalised_gain
from recipetune.finetune.final import final_evaluation
from recipetune.finetune.report import FinalResult
from recipetune.guard.stats import t_interval

if TYPE_CHECKING:
    from recipetune.finetune.job import QualityJob


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
    normalised_gain: float  # of the means (engine/tree.py)
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


def final_for(job: QualityJob, search: Search, recipe: Recipe, label: str) -> FinalResult:
    """The test split over the campaign's seeds for one recipe (kept, so a resume does not redo it)."""
    out = search.store.folder / "final" / recipe.id
    saved = out / "final.json"
    exp = job.subject.experiment_of(recipe)
    if saved.exists():
        result = FinalResult.model_validate_json(saved.read_text())
        if result.experiment_id == exp.id and result.seeds == job.cfg.seeds:
            return result
    search.reporter.phase(f"final evaluation of the {label} on the test split, seeds {job.cfg.seeds}")
    return search.executor.call(final_evaluation, exp, job.cfg.seeds, out,
                                log=search.reporter.phase).result()


def decide(job: QualityJob, search: Search) -> Outcome:
    tree, metric = search.tree, job.metric
    assert tree is not None
    best = tree.best()
    root = tree.root.score or 0.0
    if best is None or (best.score or 0.0) <= root:
        found = f"; the best was {best.score:.4f} ({job.subject.describe(best.recipe, job.baseline)})" if best else ""
        outcome = Outcome("KEEP BASELINE", [f"no experiment beat the baseline's validation {metric} "
                                            f"({root:.4f}){found}"], tree, runs=search.runs)
        return conclude(job, search, outcome)
    try:
        base = final_for(job, search, job.baseline, "baseline")
        cand = final_for(job, search, best.recipe, f"best node ({job.subject.describe(best.recipe, job.baseline)})")
    except RuntimeError as e:  # a seed failed to train: no claim can be made
        outcome = Outcome("KEEP BASELINE", [f"final evaluation failed: {e}"], tree, verdicts=[(best, None)],
                          runs=search.runs)
        return conclude(job, search, outcome)
    verdict = judge(metric, job.cfg.seeds, base, cand, job.cfg.confidence, root, best.score or 0.0)
    winner = best if verdict.decision == "APPROVED" else None
    outcome = Outcome(verdict.decision, verdict.reasons, tree, winner, verdict, [(best, verdict)], runs=search.runs)
    return conclude(job, search, outcome)


def conclude(job: QualityJob, search: Search, outcome: Outcome) -> Outcome:
    store, baseline = search.store, job.baseline
    best = outcome.verdicts[0][0] if outcome.verdicts else search.tree.best()  # type: ignore[union-attr]
    if outcome.winner is not None:
        outcome.approved_file = write_approved(job, store.folder, outcome.winner.recipe, outcome.verdict)
        file = shlex.quote(str(outcome.approved_file))
        outcome.launch = [f"recipetune ft run {file}", f"recipetune ft run {file} --final"]
    verdict = outcome.verdict
    store.write_json("verdict.json", {
        "job": "quality", "decision": outcome.decision, "reasons": outcome.reasons, "metric": job.metric,
        "baseline": dict(baseline), "baseline_id": baseline.id,
        "recipe": dict(outcome.winner.recipe) if outcome.winner else dict(baseline),
        "recipe_id": outcome.winner.id if outcome.winner else baseline.id,
        "change": job.subject.describe(outcome.winner.recipe, baseline) if outcome.winner else "(baseline)",
        "trial": outcome.winner.trial if outcome.winner else None,
        "best": {"recipe_id": best.id, "trial": best.trial, "change": job.subject.describe(best.recipe, baseline),
                 "validation": best.score} if best is not None else None,
        "verdict": verdict.model_dump(mode="json") if verdict is not None else None,
        "runs": outcome.runs, "trials": len(store.records()),
        "approved_file": str(outcome.approved_file) if outcome.approved_file else None, "launch": outcome.launch,
    })
    store.set_meta("decision", outcome.decision)
    return outcome


def _absolute(raw: str, base_dir: Path) -> str:
    path = Path(raw).expanduser()
    return raw if path.is_absolute() or not (base_dir / path).exists() else str((base_dir / path).resolve())


def write_approved(job: QualityJob, folder: Path, recipe: Recipe, verdict: Any) -> Path:
    """The approved experiment as a file of its own; paths made absolute, as it lives elsewhere."""
    exp = job.subject.experiment_of(recipe)
    base_dir = exp.base_dir
    doc = exp.spec.model_dump(mode="json", exclude_none=True)
    doc["task"]["files"] = {k: _absolute(v, base_dir) for k, v in doc["task"].get("files", {}).items()}
    doc["model"]["path"] = _absolute(doc["model"]["path"], base_dir)
    for step in doc["data"]:
        if step.get("op") != "export" and "path" in step:
            step["path"] = _absolute(step["path"], base_dir)
        for source in step.get("sources", []):
            source["path"] = _absolute(source["path"], base_dir)
    header = (f"# Approved by `recipetune finetune {job.c.path}` on {time.strftime('%Y-%m-%d %H:%M')}.\n"
              f"# Change from the baseline: {job.subject.describe(recipe, job.baseline)}\n"
              f"# Test {verdict.metric}: {verdict.candidate_mean:.4f} vs {verdict.baseline_mean:.4f} over seeds "
              f"{verdict.seeds}; gain {verdict.gain:+.4f} ({verdict.confidence:.0%} CI {verdict.ci_low:+.4f} to "
              f"{verdict.ci_high:+.4f}). Evidence in verdict.json.\n")
    return write_atomic(folder / "approved.yaml", header + yaml.safe_dump(doc, sort_keys=False))
