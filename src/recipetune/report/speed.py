"""The speed job's report (`recipetune tune`): trials judged by tokens/s, the guard's verdicts as evidence.

The ``Report`` model and the tree helpers are model.py's, shared with the quality job's report.
"""

from __future__ import annotations

import math
import shlex
import time
from pathlib import Path
from typing import Any

import yaml
from scipy import stats

from recipetune.core.fmt import fmt_pct
from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.core.words import Decision
from recipetune.engine.status import Status
from recipetune.report import sources as src
from recipetune.report.model import (
    NO_VERDICT,
    Baseline,
    Curve,
    Evidence,
    Report,
    Trial,
    campaign_settings,
    count,
    link,
    mark_path,
    set_aside_rows,
)
from recipetune.report.sources import CampaignFiles, number
from recipetune.speed.job import SpeedFigures

# -- figures ------------------------------------------------------------------------------------


def tokens_per_s_interval(result: RunResult, level: float = 0.95) -> list[float] | None:
    """Interval of tokens/s per device over the measured steps (ratio estimator, delta method, t)."""
    steps = result.measured()
    n = len(steps)
    if n < 3:
        return None
    tok = [s.tokens for s in steps]
    sec = [s.step_time_s for s in steps]
    total_t = sum(sec)
    if total_t <= 0:
        return None
    rate = sum(tok) / total_t
    resid = [k - rate * t for k, t in zip(tok, sec, strict=True)]
    mean_r = sum(resid) / n
    var = sum((r - mean_r) ** 2 for r in resid) / (n - 1)
    se = math.sqrt(var / n) / (total_t / n)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * se
    per = max(result.n_devices, 1)
    return [max(rate - half, 0.0) / per, (rate + half) / per]


def _diff(recipe: dict[str, Any], base: dict[str, Any]) -> dict[str, list[Any]]:
    return {k: [old, new] for k, (old, new) in Recipe(recipe).diff(Recipe(base)).items()}


def _evidence(verdict: dict[str, Any], recipe_id: str, trial: int | None, change: str,
              screened: float | None = None) -> Evidence:
    parity = verdict.get("parity") if isinstance(verdict.get("parity"), dict) else {}
    return Evidence(
        recipe_id=recipe_id, trial=trial, change=change, decision=str(verdict.get("decision", "?")),
        reasons=[str(r) for r in verdict.get("reasons") or []], screened_speedup=number(screened),
        speedup=number(verdict.get("speedup")), ci_low=number(verdict.get("ci_low")),
        ci_high=number(verdict.get("ci_high")), noise_margin=number(verdict.get("noise_margin")),
        confidence=number(verdict.get("confidence")) or 0.95, parity_mode=str(parity.get("mode") or ""),
        loss_gap=number(parity.get("mean_diff")), loss_tolerance=number(parity.get("tolerance")),
        loss_detectable=number(parity.get("detectable")),
        parity=parity, invariants_checked=[str(i) for i in verdict.get("invariants_checked") or []],
        pairs=[p for p in verdict.get("pairs") or [] if isinstance(p, dict)],
    )


def _trial(rec: src.TrialRecord, result: RunResult | None, base: dict[str, Any], base_tps: float | None) -> Trial:
    t = src.stored(rec, SpeedFigures)
    f = t.figures
    summary = result.summary() if result is not None and result.steps else None
    screening = f.screening or {}
    tps = number(f.tokens_per_s)
    if tps is None and summary is not None and summary.measured_steps:
        tps = summary.tokens_per_s_per_device
    speedup = number(f.speedup)
    if speedup is None and tps and base_tps and t.status != "failed":
        speedup = tps / base_tps
    return Trial(
        number=rec.number, recipe_id=t.recipe_id or Recipe(t.recipe).id, parent=rec.attrs.get("parent"),
        status=t.status or rec.state.lower(), cause=t.cause,
        run_status=f.run_status or (result.status if result is not None else None),
        changes=_diff(t.recipe, base), change=Recipe(t.recipe).describe_diff(Recipe(base)),
        proposer=t.proposer, rationale=t.rationale,
        ran=t.ran if "ran" in t.model_fields_set else result is not None, tokens_per_s=tps,
        tokens_per_s_ci=tokens_per_s_interval(result) if result is not None else None,
        speedup=speedup, reward=number(t.reward),
        mfu=number(f.mfu) if f.mfu is not None else (summary.mfu if summary else None),
        peak_mem_bytes=f.peak_mem_bytes or (summary.peak_mem_bytes if summary else None),
        step_time_s=number(f.step_time_s) or (summary.mean_step_time_s if summary else None),
        breakdown_s=summary.breakdown_s if summary else {},
        loss_check=f.loss, loss_gap=number(screening.get("loss_gap")),
        loss_tolerance=number(screening.get("loss_tolerance")),
    )


def _baseline(files: CampaignFiles) -> Baseline:
    meta, prof = files.meta, files.profile or {}
    recipe = meta.get("baseline") or prof.get("recipe") or (files.verdict or {}).get("baseline") or {}
    runs = [r for r in files.profile_runs if r.ok and r.steps]
    summaries = [r.summary() for r in runs]

    def median(values: list[float | None]) -> float | None:
        vals = sorted(v for v in values if v is not None)
        return vals[len(vals) // 2] if vals else None

    breakdown: dict[str, float] = {}
    for part in ("data_s", "compute_s", "optim_s"):
        v = median([s.breakdown_s.get(part) for s in summaries])
        if v is not None:
            breakdown[part] = v
    return Baseline(
        recipe_id=str(meta.get("baseline_id") or Recipe(recipe).id), recipe=recipe,
        tokens_per_s=number(prof.get("tokens_per_s")) or median([s.tokens_per_s_per_device for s in summaries]),
        throughput_noise=number(prof.get("throughput_noise")), loss_tolerance=number(prof.get("loss_tolerance")),
        repeats=len(files.profile_runs), mfu=median([s.mfu for s in summaries]),
        peak_mem_bytes=median([s.peak_mem_bytes for s in summaries]),  # type: ignore[arg-type]
        step_time_s=median([s.mean_step_time_s for s in summaries]), breakdown_s=breakdown,
    )


def _curve(result: RunResult, label: str, role: str, trial: int | None = None) -> Curve:
    return Curve(label=label, role=role, trial=trial, steps=[s.step for s in result.steps],
                 loss=[s.loss if math.isfinite(s.loss) else None for s in result.steps])


# -- commands -----------------------------------------------------------------------------------


def override(knob: str, value: Any) -> str:
    """``knob=value`` as the command line's override parser (YAML) reads it back, shell-quoted."""
    text = yaml.safe_dump(value, default_flow_style=True).strip()
    text = text.removesuffix("...").strip()
    return shlex.quote(f"{knob}={text}")


def _file_baseline(path: str | None) -> dict[str, Any] | None:
    if not path or not Path(path).is_file():
        return None
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None
    return raw.get("baseline") if isinstance(raw, dict) and isinstance(raw.get("baseline"), dict) else {}


def commands(files: CampaignFiles, winner: dict[str, Any] | None) -> dict[str, list[str]]:
    """The runs to reproduce: the baseline and the approved recipe, each for a trial's number of steps."""
    meta, config = files.meta, files.config
    file = meta.get("file")
    if not file:
        return {}
    given = config.get("baseline") or meta.get("baseline") or {}
    in_file = _file_baseline(file)
    # The campaign's own baseline section, less what the file still says: the command-line overrides.
    extra = {k: v for k, v in given.items() if in_file is None or in_file.get(k, object()) != v}
    steps = meta.get("steps_per_trial")
    tail = [f"--steps {int(steps)}"] if steps else []
    base = ["recipetune", "run", shlex.quote(str(file)), *(override(k, v) for k, v in extra.items())]
    out = {"baseline": [" ".join(base + tail)]}
    if winner is not None:
        diff = Recipe(winner).diff(Recipe(meta.get("baseline") or given))
        line = base + [override(k, new) for k, (_, new) in diff.items()] + tail
        out["approved"] = [" ".join(line), *[str(c) for c in (files.verdict or {}).get("launch") or []]]
    return out


# -- the whole report ---------------------------------------------------------------------------


def _ci(ev: Evidence) -> str:
    if ev.ci_low is None or ev.ci_high is None:
        return ""
    return f"{100 * ev.confidence:.0f}% CI {ev.ci_low:.3f}-{ev.ci_high:.3f}x"


def headline(decision: str, ev: Evidence | None, n_trials: int, reasons: list[str]) -> str:
    """One sentence a training lead reads first: built from the figures, not from free-text reasons."""
    if decision == NO_VERDICT:
        return f"The campaign has not reached its verdict yet ({n_trials} trials so far)."
    if ev is None or ev.speedup is None:
        lead = "Approved" if decision == Decision.APPROVED else "The baseline stays"
        return f"{lead}: {reasons[0] if reasons else 'no candidate beat it'}."
    ci = f" ({_ci(ev)})" if _ci(ev) else ""
    noise = f"the {fmt_pct(ev.noise_margin)} noise margin" if ev.noise_margin is not None else "the noise"
    loss = ""
    if ev.loss_gap is not None and ev.loss_tolerance is not None:
        within = "within" if abs(ev.loss_gap) <= ev.loss_tolerance else "outside"
        loss = f"; final loss {ev.loss_gap:+.4f} nats, {within} the tolerance +-{ev.loss_tolerance:.4f}"
    if decision == Decision.APPROVED:
        return f"Approved {ev.change}: {ev.speedup:.3f}x tokens/s per device{ci}, clear of {noise}{loss}."
    clears = ev.ci_low is not None and ev.noise_margin is not None and ev.ci_low > 1 + ev.noise_margin
    speed = f"clear of {noise}" if clears else f"not clear of {noise}"
    return f"The baseline stays. Best candidate {ev.change}: {ev.speedup:.3f}x{ci}, {speed}{loss}."


def _finalists(files: CampaignFiles, by_number: dict, by_id: dict) -> list[Evidence]:
    """The finalists' evidence, each also marked on its trial so the table shows how it ended."""
    finalists = []
    for f in files.finalists:
        v = f.get("verdict") if isinstance(f.get("verdict"), dict) else {}
        rid = str(f.get("candidate_id") or "")
        t = by_number.get(f.get("trial")) or by_id.get(rid)  # type: ignore[arg-type]
        ev = _evidence(v, rid, t.number if t else f.get("trial"), t.change if t else rid, f.get("screened_speedup"))
        finalists.append(ev)
        if t is not None:
            t.final = ev.decision
    return finalists


def _winner_and_evidence(vfile: dict, decision: str, finalists: list[Evidence], by_number: dict,
                         by_id: dict) -> tuple[Trial | None, Evidence | None]:
    """The approved trial (only when approved) and the evidence the headline quotes: the verdict's, else the
    fastest finalist's."""
    winner = None
    if decision == Decision.APPROVED:
        winner = by_number.get(vfile.get("trial")) or by_id.get(str(vfile.get("recipe_id")))  # type: ignore[arg-type]
    evidence = None
    if isinstance(vfile.get("verdict"), dict):
        rid = str(vfile.get("recipe_id") or "")
        evidence = _evidence(vfile["verdict"], rid, vfile.get("trial"),
                             winner.change if winner else str(vfile.get("change") or ""))
    elif finalists:
        evidence = max(finalists, key=lambda e: e.speedup or 0.0)
    return winner, evidence


def _curves(files: CampaignFiles, trials: list[Trial], finalists: list[Evidence], winner: Trial | None,
            by_number: dict) -> list[Curve]:
    """The loss curves worth plotting: the baseline runs, then the finalists (or the best screened) and the winner."""
    curves = [_curve(r, f"baseline run {i + 1}", "baseline") for i, r in enumerate(files.profile_runs) if r.steps]
    shown = [e.trial for e in finalists if e.trial is not None]
    if not shown:  # nothing reached the final verdict: show the best screened candidates instead
        passed = sorted((t for t in trials if t.status == Status.PASSED), key=lambda t: t.speedup or 0, reverse=True)
        shown = [t.number for t in passed[:3]]
    if winner is not None and winner.number not in shown:
        shown.insert(0, winner.number)
    for n in shown:
        result = files.results.get(n)
        if result is not None and result.steps:
            role = "approved" if winner is not None and n == winner.number else (
                "finalist" if finalists else "candidate")
            curves.append(_curve(result, f"#{n} {by_number[n].change}" if n in by_number else f"#{n}", role, n))
    return curves


def _environment(files: CampaignFiles, base: Baseline) -> dict[str, str]:
    """Where the runs ran: the first run's environment plus the baseline's device knobs."""
    runs = files.profile_runs or list(files.results.values())
    env = dict(runs[0].environment) if runs else {}
    if runs:
        env["devices per run"] = str(runs[0].n_devices)
    for knob in ("device", "dtype", "nproc"):
        if knob in base.recipe:
            env[f"baseline {knob}"] = str(base.recipe[knob])
    return {str(k): str(v) for k, v in env.items()}


def build_speed(files: CampaignFiles) -> Report:
    base = _baseline(files)
    vfile = files.verdict or {}
    decision = str(vfile.get("decision") or NO_VERDICT)
    reasons = [str(r) for r in vfile.get("reasons") or []]

    trials = [_trial(r, files.results.get(r.number), base.recipe, base.tokens_per_s)
              for r in sorted(files.records, key=lambda r: r.number) if src.A_RECIPE in r.attrs]
    by_number, by_id = link(trials)
    finalists = _finalists(files, by_number, by_id)
    winner, evidence = _winner_and_evidence(vfile, decision, finalists, by_number, by_id)
    mark_path(winner, by_id)
    curves = _curves(files, trials, finalists, winner, by_number)

    window = (files.profile or {}).get("window") or ((files.config.get("guard") or {}).get("parity") or {}).get(
        "window") or 10
    return Report(
        folder=str(files.folder), generated_at=time.strftime("%Y-%m-%d %H:%M:%S"), campaign=campaign_settings(files),
        decision=decision, headline=headline(decision, evidence, len(trials), reasons), reasons=reasons,
        evidence=evidence, finalists=finalists, baseline=base, winner=winner, trials=trials,
        counts=count(trials, files), curves=curves, smoothing_window=int(window),
        rejected_proposals=[{k: r.get(k) for k in ("source", "reason", "raw")} for r in files.rejected],
        set_aside=set_aside_rows(files), environment=_environment(files, base),
        commands=commands(files, vfile.get("recipe") if winner is not None else None),
    )
