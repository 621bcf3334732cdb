"""The end of a speed campaign: the guard's final verdict on the best few screened candidates, then
the decision, APPROVED or KEEP BASELINE, written by the engine's ``conclude`` (engine/job.py).

    decide()         final verdicts on the finalists, best first (a resume keeps the finished ones)
    approved_text()  approved.yaml: a campaign file whose baseline is the approved recipe
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from recipetune.config import Campaign
from recipetune.core.console import Note
from recipetune.core.filenames import FINALISTS, RUNS_FOLDER
from recipetune.core.recipe import Recipe
from recipetune.core.words import Decision
from recipetune.engine.job import APPROVED_FILE, Finished, Outcome, Services, conclude
from recipetune.engine.tree import Node
from recipetune.guard.verdict import cost_text
from recipetune.speed.spent import spent
from recipetune.workloads.base import tokens_per_step

if TYPE_CHECKING:
    from recipetune.guard.baseline import BaselineProfile
    from recipetune.guard.verdict import Verdict
    from recipetune.speed.control import Guard


def decide(campaign: Campaign, services: Services, finished: Finished, profile: BaselineProfile, guard: Guard,
           allowed: Callable[[Recipe], list[str]]) -> Outcome:
    """Judge the best few screened candidates with the guard's final verdict and conclude.
    ``allowed``: the semantic knobs a recipe may change."""
    baseline, cfg, tree, runs = campaign.baseline, campaign.config.search, finished.tree, finished.runs
    store, executor, phase = services.store, services.executor, services.reporter.phase
    finalists = [n for n in tree.ranked() if (n.score or 0) > 1.0][: cfg.finalists]
    if not finalists:
        reasons = ["no candidate passed screening with a speed-up above 1.0x"]
        return _conclude(campaign, services, Outcome(Decision.KEEP_BASELINE, reasons, tree, runs=runs))
    previous = {v["candidate_id"]: v for v in store.read_json(FINALISTS) or []}
    verdicts: list[tuple[Node, Verdict]] = []
    saved: list[dict] = []
    passed: list[str] = []  # finalists not judged, and why
    # Best first, one at a time: the fastest screened finalist gets its verdict first, a slower one only when
    # the faster ones were not approved (an approved faster one is the decision), and never one whose proof
    # would repeat an unresolved one's. Within a verdict the parity runs of a look still go to the executor
    # side by side (on Ray across the cluster); they are stored in the campaign's guard-runs/ folder, so
    # every verdict shares the baseline's, and a resumed campaign finds every run already made.
    def told(prefix: str) -> Callable[[str], None]:
        """A verdict's plan and each look's outcome reach the live view; what runs now does not."""
        return lambda msg: phase(f"{prefix}: {msg}" if prefix else msg) if isinstance(msg, Note) else None

    for n in finalists:
        change = n.recipe.describe_diff(baseline)
        why = _not_judged(n, verdicts, campaign) if n.id not in previous else None
        if why is not None:
            phase(f"final verdict for {change}: not judged, {why}")
            passed.append(f"{change}: not judged, {why}")
            continue
        if n.id in previous:
            verdict = guard.load_verdict(previous[n.id]["verdict"])
        else:
            phase(f"final verdict for {change} (screened {n.score:.2f}x)")
            verdict = guard.final_verdict(
                campaign.workload, baseline, n.recipe, campaign.config.guard, store.folder / "final" / n.id,
                allow_semantic=allowed(n.recipe), profile=profile,
                progress=told(change if len(finalists) > 1 else ""),
                executor=executor, runs_folder=store.folder / RUNS_FOLDER,
            )
        verdicts.append((n, verdict))
        saved.append({"candidate_id": n.id, "trial": n.trial, "screened_speedup": n.score,
                      "verdict": verdict.model_dump(mode="json")})
        store.write_json(FINALISTS, saved)  # after each: a resume does not redo a finished verdict
    approved = [(n, v) for n, v in verdicts if v.decision == Decision.APPROVED]
    if not approved:
        reasons = [f"{n.recipe.describe_diff(baseline)}: {v.decision}: {'; '.join(v.reasons)}{_spent(v)}"
                   for n, v in verdicts] + passed
        return _conclude(campaign, services, Outcome(Decision.KEEP_BASELINE, reasons, tree, verdicts=verdicts,
                                                     runs=runs))
    winner, verdict = max(approved, key=lambda nv: nv[1].speedup or 0.0)
    spent = [f"the final verdict's cost: {cost_text(verdict.cost)}"] if cost_text(verdict.cost) else []
    outcome = Outcome(Decision.APPROVED, [*verdict.reasons, *spent], tree, winner, verdict, verdicts, runs=runs,
                      approved=approved_text(campaign, winner.recipe, verdict),
                      launch=launch_commands(campaign, winner.recipe, services.store.folder / "approved-run"))
    return _conclude(campaign, services, outcome)


# How a parity verdict ends when the runs could not tell (not a difference shown): the same proof on the
# same trainer ends the same way for another split of the same change.
UNRESOLVED = ("plan", "budget", "futility", "time", "too short")


def _not_judged(n: Node, verdicts: list[tuple[Node, Verdict]], campaign: Campaign) -> str | None:
    """Why finalist ``n`` is not judged after ``verdicts`` (the faster finalists'), or None: a faster one was
    approved, or one that changed the same knobs, at as many tokens a step (so over the same horizon), could
    not tell parity: its runs' noise against T, not its recipe, ended it, and the same proof would end the
    same way."""
    baseline, workload = campaign.baseline, campaign.workload
    for m, v in verdicts:
        if v.decision == Decision.APPROVED:
            return f"the faster {m.recipe.describe_diff(baseline)} was approved"
    for m, v in verdicts:
        if v.decision == Decision.KEEP_BASELINE and v.stop in UNRESOLVED \
                and set(m.recipe.diff(baseline)) == set(n.recipe.diff(baseline)) \
                and tokens_per_step(workload, m.recipe) == tokens_per_step(workload, n.recipe):
            return (f"the same proof as {m.recipe.describe_diff(baseline)}'s (the same knobs changed, as many "
                    f"tokens a step), which ended \"{v.stop}\": parity not shown, the runs could not tell")
    return None


def _spent(verdict: Verdict) -> str:
    return f" (cost: {cost_text(verdict.cost)})" if cost_text(verdict.cost) else ""


def _conclude(campaign: Campaign, services: Services, outcome: Outcome) -> Outcome:
    """The decision, with what the campaign spent and the share of it that proof took (speed/spent.py)."""
    baseline, cost = campaign.baseline, spent(services.store.folder)
    services.reporter.phase(cost.text())
    outcome.reasons.append(cost.text())
    outcome.record["compute"] = cost.record()
    return conclude(services.store, "speed", baseline, outcome, lambda r: r.describe_diff(baseline))


def approved_text(campaign: Campaign, recipe: Recipe, verdict: Verdict) -> str:
    """A campaign file whose baseline is the approved recipe: ``recipetune run approved.yaml``."""
    cfg = campaign.config
    workload = cfg.workload.model_dump(mode="json", exclude_none=True)
    if workload.get("kind") == "command":
        # The file lives in the campaign folder: anchor a relative working directory to the original.
        cwd = Path(workload.get("cwd") or ".")
        workload["cwd"] = str(cwd if cwd.is_absolute() else (campaign.path.resolve().parent / cwd).resolve())
    doc = {"workload": workload, "baseline": dict(recipe), "run": cfg.run.model_dump(mode="json")}
    ci = f" (95% CI {verdict.ci_low:.3f}-{verdict.ci_high:.3f})" \
        if verdict.ci_low is not None and verdict.ci_high is not None else ""
    header = (f"# Approved by `recipetune tune {campaign.path}` on {time.strftime('%Y-%m-%d %H:%M')}.\n"
              f"# Change from baseline {campaign.baseline.id}: {recipe.describe_diff(campaign.baseline)}\n"
              f"# Speed-up {verdict.speedup or 0:.3f}x{ci}; evidence in verdict.json.\n")
    return header + yaml.safe_dump(doc, sort_keys=False)


def launch_commands(campaign: Campaign, recipe: Recipe, run_dir: Path) -> list[str]:
    """How to launch the approved recipe: through recipetune, and the trainer's own command line."""
    out = [f"recipetune run {APPROVED_FILE}"]
    with contextlib.suppress(Exception):  # a workload that cannot render its argv still has the first line
        argv = campaign.workload.command(recipe, campaign.config.run.steps, run_dir)
        if campaign.workload.kind != "reference":  # the reference trainer's argv needs recipe.json: use the line above
            out.append(shlex.join(argv))
    return out
