"""The end of a campaign: the guard's final verdict on the best few screened candidates, then the
decision, APPROVED or KEEP BASELINE, and what it leaves in the campaign folder.

    decide()    final verdicts on the finalists (on the executor; a resume keeps the finished ones)
    conclude()  verdict.json; for an approved recipe, approved.yaml and the commands to launch it
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import yaml

from recipetune.config import Campaign
from recipetune.core.recipe import Recipe
from recipetune.engine.loop import Outcome
from recipetune.engine.store import CampaignStore, write_atomic
from recipetune.engine.tree import Node, Tree
from recipetune.execute.executor import Executor


def decide(campaign: Campaign, store: CampaignStore, tree: Tree, profile: Any, runs: int, *,
           final_verdict: Callable[..., Any], executor: Executor, allowed: Callable[[Recipe], list[str]],
           phase: Callable[[str], None]) -> Outcome:
    """Judge the best few screened candidates with ``final_verdict`` (the guard's) and conclude.
    ``allowed``: the semantic knobs a recipe may change; ``runs``: the search's runs, for the record."""
    baseline, cfg = campaign.baseline, campaign.config.search
    finalists = [n for n in tree.ranked() if (n.score or 0) > 1.0][: cfg.finalists]
    if not finalists:
        reasons = ["no candidate passed screening with a speed-up above 1.0x"]
        return conclude(campaign, store, Outcome("KEEP BASELINE", reasons, tree, runs=runs))
    previous = {v["candidate_id"]: v for v in store.read_json("verdicts.json") or []}
    verdicts: list[tuple[Node, Any]] = []
    saved: list[dict[str, Any]] = []
    # Each verdict is one unit on one placement, so its interleaved A/B pairs see the same
    # hardware; different finalists may be judged at once on different placements.
    pending: dict[str, Future] = {}
    for n in finalists:
        if n.id not in previous:
            phase(f"final verdict for {n.recipe.describe_diff(baseline)} (screened {n.score:.2f}x)")
            pending[n.id] = executor.call(
                final_verdict, campaign.workload, baseline, n.recipe, campaign.config.guard,
                store.folder / "final" / n.id, allow_semantic=allowed(n.recipe), profile=profile, progress=phase,
            )
    for n in finalists:
        verdict = SimpleVerdict(previous[n.id]["verdict"]) if n.id in previous else pending[n.id].result()
        verdicts.append((n, verdict))
        saved.append({"candidate_id": n.id, "trial": n.trial, "screened_speedup": n.score,
                      "verdict": _dump(verdict)})
        store.write_json("verdicts.json", saved)  # after each: a resume does not redo a finished verdict
    approved = [(n, v) for n, v in verdicts if v.decision == "APPROVED"]
    if not approved:
        reasons = [f"{n.recipe.describe_diff(baseline)}: {v.decision}: {'; '.join(v.reasons)}" for n, v in verdicts]
        return conclude(campaign, store, Outcome("KEEP BASELINE", reasons, tree, verdicts=verdicts, runs=runs))
    winner, verdict = max(approved, key=lambda nv: nv[1].speedup or 0.0)
    outcome = Outcome("APPROVED", list(verdict.reasons), tree, winner, verdict, verdicts, runs=runs)
    return conclude(campaign, store, outcome)


def conclude(campaign: Campaign, store: CampaignStore, outcome: Outcome) -> Outcome:
    """Write the decision (verdict.json, the study's ``decision``), and approved.yaml for a winner."""
    baseline, winner = campaign.baseline, outcome.winner
    if winner is not None:
        outcome.approved_file = write_approved(campaign, store.folder, winner.recipe, outcome.verdict)
        outcome.launch = launch_commands(campaign, winner.recipe, outcome.approved_file)
    store.write_json("verdict.json", {
        "decision": outcome.decision, "reasons": outcome.reasons,
        "baseline": dict(baseline), "baseline_id": baseline.id,
        "recipe": dict(winner.recipe) if winner else dict(baseline),
        "recipe_id": winner.id if winner else baseline.id,
        "change": winner.recipe.describe_diff(baseline) if winner else "(baseline)",
        "trial": winner.trial if winner else None,
        "verdict": _dump(outcome.verdict) if outcome.verdict is not None else None,
        "runs": outcome.runs, "trials": len(store.records()),
        "approved_file": str(outcome.approved_file) if outcome.approved_file else None,
        "launch": outcome.launch,
    })
    store.set_meta("decision", outcome.decision)
    return outcome


def write_approved(campaign: Campaign, folder: Path, recipe: Recipe, verdict: Any) -> Path:
    """A campaign file whose baseline is the approved recipe: ``recipetune run approved.yaml``."""
    cfg = campaign.config
    workload = cfg.workload.model_dump(mode="json", exclude_none=True)
    if workload.get("kind") == "command":
        # The file lives in the campaign folder: anchor a relative working directory to the original.
        cwd = Path(workload.get("cwd") or ".")
        workload["cwd"] = str(cwd if cwd.is_absolute() else (campaign.path.resolve().parent / cwd).resolve())
    doc = {"workload": workload, "baseline": dict(recipe), "run": cfg.run.model_dump(mode="json")}
    ci = ""
    if getattr(verdict, "ci_low", None) is not None and getattr(verdict, "ci_high", None) is not None:
        ci = f" (95% CI {verdict.ci_low:.3f}-{verdict.ci_high:.3f})"
    header = (f"# Approved by `recipetune tune {campaign.path}` on {time.strftime('%Y-%m-%d %H:%M')}.\n"
              f"# Change from baseline {campaign.baseline.id}: {recipe.describe_diff(campaign.baseline)}\n"
              f"# Speed-up {getattr(verdict, 'speedup', 0) or 0:.3f}x{ci}; evidence in verdict.json.\n")
    return write_atomic(folder / "approved.yaml", header + yaml.safe_dump(doc, sort_keys=False))


def launch_commands(campaign: Campaign, recipe: Recipe, approved_file: Path) -> list[str]:
    """How to launch the approved recipe: through recipetune, and the trainer's own command line."""
    out = [f"recipetune run {shlex.quote(str(approved_file))}"]
    run_dir = approved_file.parent / "approved-run"
    with contextlib.suppress(Exception):  # a workload that cannot render its argv still has the first line
        argv = campaign.workload.command(recipe, campaign.config.run.steps, run_dir)
        if campaign.workload.kind != "reference":  # the reference trainer's argv needs recipe.json: use the line above
            out.append(shlex.join(argv))
    return out


class SimpleVerdict:
    """A verdict read back from verdicts.json (attribute access like the guard's model)."""

    def __init__(self, data: dict[str, Any]):
        self._data = data
        self.__dict__.update(data)

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return self._data


def _dump(obj: Any) -> Any:
    return obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj
