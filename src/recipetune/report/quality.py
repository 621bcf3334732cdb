"""The quality job's report (`recipetune finetune`): the same ``Report`` with the figures that job decides on.

A trial is a fine-tuning experiment judged by its validation metric (and its gain over the baseline's);
the decision rests on the test split, baseline against candidate over seeds (``QualityEvidence``), not on
the guard's speed-up. The tree, the counts and the winner's path are shared with the speed job (model.py).
"""

from __future__ import annotations

import shlex
import time
from typing import Any

from recipetune.core.recipe import Recipe
from recipetune.core.words import Decision
from recipetune.finetune.job import QualityFigures
from recipetune.finetune.recipe import describe_change, knob_text
from recipetune.report import sources as src
from recipetune.report.model import (
    NO_VERDICT,
    Baseline,
    QualityEvidence,
    Report,
    Trial,
    campaign_settings,
    count,
    link,
    mark_path,
)
from recipetune.report.sources import CampaignFiles, number


def describe(changes: dict[str, list[Any]]) -> str:
    return describe_change((k, new) for k, (_, new) in changes.items())


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _trial(rec: src.TrialRecord, base: dict[str, Any]) -> Trial:
    t = src.stored(rec, QualityFigures)
    f = t.figures
    changes = {k: [old, new] for k, (old, new) in Recipe(t.recipe).diff(Recipe(base)).items()}
    return Trial(
        number=rec.number, recipe_id=t.recipe_id or Recipe(t.recipe).id, parent=rec.attrs.get("parent"),
        status=t.status or rec.state.lower(), cause=t.cause, run_status=f.run_status, changes=changes,
        change=describe(changes), proposer=t.proposer, rationale=t.rationale, ran=t.ran, reward=number(t.reward),
        value=number(f.value), gain=number(f.gain), diagnosis=f.diagnosis, data_version=f.data_version,
        rows=f.rows, time_s=number(f.time_s),
    )


def _baseline(files: CampaignFiles) -> Baseline:
    meta, rep = files.meta, files.baseline_report or {}
    recipe = meta.get("baseline") or (files.verdict or {}).get("baseline") or {}
    val = rep.get("validation") if isinstance(rep.get("validation"), dict) else {}
    data = rep.get("data") if isinstance(rep.get("data"), dict) else {}
    metrics = val.get("metrics") if isinstance(val.get("metrics"), dict) else {}
    return Baseline(
        recipe_id=str(meta.get("baseline_id") or Recipe(recipe).id), recipe=recipe, repeats=1 if rep else 0,
        peak_mem_bytes=_int(rep.get("peak_mem_bytes")), metric=str(val.get("metric") or meta.get("metric") or ""),
        value=number(val.get("value")), data_version=data.get("id"), rows=_int(data.get("rows_out")),
        metrics={str(k): v for k, v in metrics.items() if number(v) is not None},
    )


def _evidence(verdict: dict[str, Any], metric: str, recipe_id: str, trial: int | None, change: str) -> QualityEvidence:
    def values(key: str) -> list[float | None]:
        return [number(v) for v in verdict.get(key) or []]

    return QualityEvidence(
        recipe_id=recipe_id, trial=trial, change=change, decision=str(verdict.get("decision", "?")),
        reasons=[str(r) for r in verdict.get("reasons") or []], metric=str(verdict.get("metric") or metric),
        seeds=[s for s in verdict.get("seeds") or [] if _int(s) is not None], baseline=values("baseline"),
        candidate=values("candidate"), baseline_mean=number(verdict.get("baseline_mean")),
        candidate_mean=number(verdict.get("candidate_mean")), gain=number(verdict.get("gain")),
        ci_low=number(verdict.get("ci_low")), ci_high=number(verdict.get("ci_high")),
        confidence=number(verdict.get("confidence")) or 0.95, normalised_gain=number(verdict.get("normalised_gain")),
        validation_baseline=number(verdict.get("validation_baseline")),
        validation_candidate=number(verdict.get("validation_candidate")),
    )


def _num(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def headline(decision: str, ev: QualityEvidence | None, n_trials: int, reasons: list[str]) -> str:
    """The decision and the test-split figures behind it, e.g.
    ``APPROVED: lr=0.01, +more_sums: test exact_match 0.742 vs 0.680 (gain +0.062, 95% CI [+0.02, +0.10])
    over seeds [1, 2, 3]``."""
    if decision == NO_VERDICT:
        return f"The campaign has not reached its verdict yet ({n_trials} trials so far)."
    if ev is None or ev.candidate_mean is None or ev.baseline_mean is None:
        return f"{decision}: {reasons[0] if reasons else 'no experiment beat the baseline'}."
    ci = "" if ev.ci_low is None or ev.ci_high is None else (
        f", {100 * ev.confidence:.0f}% CI [{ev.ci_low:+.2f}, {ev.ci_high:+.2f}]")
    lead = ev.change if decision == Decision.APPROVED else f"best candidate {ev.change}"
    return (f"{decision}: {lead}: test {ev.metric} {ev.candidate_mean:.3f} vs {ev.baseline_mean:.3f} "
            f"(gain {_num(ev.gain, '+.3f')}{ci}) over seeds [{', '.join(str(s) for s in ev.seeds)}]")


def looks_sentence(verdict: dict[str, Any]) -> str:
    """The decision's looks and cost, as the speed guard's verdict says its own (verdict.json's ``looks``):
    `` Decided at look 2 of 2: 5 of at most 8 seeds, 10 runs (4 trained now), 12.4 min; the best of 5 nodes
    on validation, decided on test seeds the search never used.`` Empty for a decision before looks existed."""
    looks = verdict.get("looks")
    if not isinstance(looks, list) or not looks:
        return ""
    seeds = [s for s in verdict.get("seeds") or [] if _int(s) is not None]
    at = f"Decided at look {verdict['decided_at']}" if _int(verdict.get("decided_at")) else "Undecided (time budget)"
    most, trained = verdict.get("max_seeds", "?"), verdict.get("runs_trained", "?")
    return (f" {at} of {len(looks)}: {len(seeds)} of at most {most} seeds, {2 * len(seeds)} runs ({trained} trained "
            f"now), {_num(number(verdict.get('minutes')), '.1f')} min; the best of {verdict.get('competed', '?')} "
            "node(s) on validation, decided on test seeds the search never used.")


def commands(files: CampaignFiles) -> dict[str, list[str]]:
    """The baseline experiment as the campaign ran it, and the approved one (decide.py wrote its launch lines)."""
    file = files.meta.get("file")
    if not file:
        return {}
    # Search and execution settings belong to the campaign; `ft run` takes the experiment's own fields.
    extra = [shlex.quote(str(o)) for o in files.config.get("overrides") or []
             if not str(o).startswith(("search.", "execute."))]
    out = {"baseline": [" ".join(["recipetune", "ft", "run", shlex.quote(str(file)), *extra])]}
    launch = [str(c) for c in (files.verdict or {}).get("launch") or []]
    if launch:
        out["approved"] = launch
    return out


def build_quality(files: CampaignFiles) -> Report:
    base = _baseline(files)
    vfile = files.verdict or {}
    decision = str(vfile.get("decision") or NO_VERDICT)
    reasons = [str(r) for r in vfile.get("reasons") or []]
    metric = str(files.meta.get("metric") or vfile.get("metric") or base.metric)

    trials = [_trial(r, base.recipe) for r in sorted(files.records, key=lambda r: r.number) if src.A_RECIPE in r.attrs]
    by_number, by_id = link(trials, knob_text)
    # The candidate taken to the test split: the winner, or (the baseline kept) the best node, if it got that far.
    ref = vfile if decision == Decision.APPROVED else vfile.get("best") if isinstance(vfile.get("best"), dict) else {}
    compared = by_number.get(ref.get("trial")) or by_id.get(str(ref.get("recipe_id")))  # type: ignore[arg-type]
    winner = compared if decision == Decision.APPROVED else None
    evidence = None
    if isinstance(vfile.get("verdict"), dict):
        evidence = _evidence(vfile["verdict"], metric, str(ref.get("recipe_id") or ""), ref.get("trial"),
                             compared.change if compared else str(ref.get("change") or ""))
        if compared is not None:
            compared.final = evidence.decision
    mark_path(winner, by_id)

    env = (files.baseline_report or {}).get("environment")
    return Report(
        folder=str(files.folder), job=src.QUALITY, generated_at=time.strftime("%Y-%m-%d %H:%M:%S"),
        campaign=campaign_settings(files), decision=decision,
        headline=headline(decision, evidence, len(trials), reasons) + looks_sentence(
            vfile["verdict"] if evidence is not None else {}),
        reasons=reasons, evidence=None, finalists=[], baseline=base, winner=winner, trials=trials,
        counts=count(trials, files), curves=[], smoothing_window=0,
        rejected_proposals=[{k: r.get(k) for k in ("source", "reason", "raw")} for r in files.rejected],
        environment={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
        commands=commands(files), metric=metric, comparison=evidence,
    )
