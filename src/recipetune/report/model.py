"""The report's data: what a campaign decided, and the evidence, as one JSON-able model.

``build_report`` turns a campaign folder (``sources.read_campaign``) into a ``Report``; the HTML page,
the terminal view and ``report.json`` are all drawn from it, so they always tell the same story.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field
from scipy import stats

from recipetune.core.fmt import fmt_pct
from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.report import sources as src
from recipetune.report.sources import CampaignFiles, number

NO_VERDICT = "NO VERDICT YET"
TREE_STATUSES = ("passed", "rejected", "failed", "interrupted")


class Trial(BaseModel):
    number: int
    recipe_id: str
    parent: str | None = None  # the parent node's recipe id (the baseline's for the tree's first level)
    status: str  # passed | rejected | failed | duplicate | interrupted | running
    cause: str = ""
    run_status: str | None = None  # ok | oom | crash | nan | timeout | invalid, when it ran
    changes: dict[str, list[Any]] = Field(default_factory=dict)  # knob -> [baseline value, this value]
    change: str = ""  # from the baseline
    edit: str = ""  # from its parent in the tree: the experiment this node was
    proposer: str = ""
    rationale: str = ""
    ran: bool = False
    tokens_per_s: float | None = None  # per device, warm-up excluded
    tokens_per_s_ci: list[float] | None = None  # 95% interval over the run's measured steps
    speedup: float | None = None  # screened, vs the baseline profile
    reward: float | None = None
    mfu: float | None = None
    peak_mem_bytes: int | None = None
    step_time_s: float | None = None
    breakdown_s: dict[str, float] = Field(default_factory=dict)
    loss_check: str = ""
    loss_gap: float | None = None
    loss_tolerance: float | None = None
    final: str | None = None  # its final verdict's decision, when it was a finalist
    winner: bool = False
    on_path: bool = False  # on the tree path from the baseline to the winner
    # The quality job: the experiment's validation metric and what went wrong in its answers.
    value: float | None = None
    gain: float | None = None  # normalised gain of ``value`` over the baseline's, in [-1, 1]
    diagnosis: str = ""  # error kinds and their shares, e.g. "wrong_number 31%, near_miss 5%"
    data_version: str | None = None
    rows: int | None = None  # training rows after the data chain
    time_s: float | None = None


class Evidence(BaseModel):
    """One final verdict of the guard (interleaved re-measurement and parity over seeds)."""

    recipe_id: str
    trial: int | None = None
    change: str = ""
    decision: str
    reasons: list[str] = Field(default_factory=list)
    screened_speedup: float | None = None
    speedup: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    noise_margin: float | None = None
    confidence: float = 0.95  # of the speed-up's interval
    parity_mode: str = ""  # how the parity evidence was gathered (same batches, other batches, ...)
    loss_gap: float | None = None  # candidate - baseline loss measure, mean over seeds (nats)
    loss_tolerance: float | None = None  # T
    loss_detectable: float | None = None  # the smallest difference the parity runs resolve
    parity: dict[str, Any] = Field(default_factory=dict)
    invariants_checked: list[str] = Field(default_factory=list)
    pairs: list[dict[str, Any]] = Field(default_factory=list)


class Baseline(BaseModel):
    recipe_id: str
    recipe: dict[str, Any]
    tokens_per_s: float | None = None
    throughput_noise: float | None = None
    loss_tolerance: float | None = None
    repeats: int = 0
    mfu: float | None = None
    peak_mem_bytes: int | None = None
    step_time_s: float | None = None
    breakdown_s: dict[str, float] = Field(default_factory=dict)
    # The quality job: the baseline experiment's validation metric and the data version it trained on.
    metric: str = ""
    value: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    data_version: str | None = None
    rows: int | None = None


class QualityEvidence(BaseModel):
    """The quality job's final evidence: baseline and candidate on the test split, one run per seed."""

    recipe_id: str
    trial: int | None = None
    change: str = ""
    decision: str
    reasons: list[str] = Field(default_factory=list)
    metric: str
    seeds: list[int] = Field(default_factory=list)
    baseline: list[float | None] = Field(default_factory=list)  # test metric per seed
    candidate: list[float | None] = Field(default_factory=list)
    baseline_mean: float | None = None
    candidate_mean: float | None = None
    gain: float | None = None  # mean paired difference
    ci_low: float | None = None  # None where it is unbounded (a single seed)
    ci_high: float | None = None
    confidence: float = 0.95
    normalised_gain: float | None = None
    validation_baseline: float | None = None
    validation_candidate: float | None = None


class Curve(BaseModel):
    label: str
    role: str  # baseline | approved | finalist | candidate
    trial: int | None = None
    steps: list[int]
    loss: list[float | None]


class Report(BaseModel):
    folder: str
    job: str = src.SPEED  # speed (`recipetune tune`) | quality (`recipetune finetune`)
    generated_at: str
    campaign: dict[str, Any]
    decision: str  # APPROVED | KEEP BASELINE | NO VERDICT YET
    headline: str
    reasons: list[str]
    evidence: Evidence | None  # the verdict behind the decision: the winner's, else the best finalist's
    finalists: list[Evidence]
    baseline: Baseline
    winner: Trial | None
    trials: list[Trial]
    counts: dict[str, int]
    curves: list[Curve]
    smoothing_window: int
    rejected_proposals: list[dict[str, Any]]
    environment: dict[str, str]
    commands: dict[str, list[str]]
    metric: str = ""  # the quality job's validation and test metric
    comparison: QualityEvidence | None = None  # the quality job's evidence, in place of ``evidence``


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
    a = rec.attrs
    recipe = a.get(src.A_RECIPE) or {}
    summary = result.summary() if result is not None and result.steps else None
    screening = a.get(src.A_SCREENING) if isinstance(a.get(src.A_SCREENING), dict) else {}
    tps = number(a.get(src.A_TOKENS_PER_S))
    if tps is None and summary is not None and summary.measured_steps:
        tps = summary.tokens_per_s_per_device
    speedup = number(a.get(src.A_SPEEDUP))
    if speedup is None and tps and base_tps and a.get(src.A_STATUS) != "failed":
        speedup = tps / base_tps
    status = str(a.get(src.A_STATUS) or rec.state.lower())
    return Trial(
        number=rec.number, recipe_id=str(a.get("recipe_id") or Recipe(recipe).id), parent=a.get(src.A_PARENT),
        status=status, cause=str(a.get(src.A_CAUSE) or ""),
        run_status=a.get(src.A_RUN_STATUS) or (result.status if result is not None else None),
        changes=_diff(recipe, base), change=Recipe(recipe).describe_diff(Recipe(base)),
        proposer=str(a.get(src.A_PROPOSER) or ""), rationale=str(a.get(src.A_RATIONALE) or ""),
        ran=bool(a.get(src.A_RAN, result is not None)), tokens_per_s=tps,
        tokens_per_s_ci=tokens_per_s_interval(result) if result is not None else None,
        speedup=speedup, reward=number(a.get(src.A_REWARD)),
        mfu=number(a.get(src.A_MFU)) if a.get(src.A_MFU) is not None else (summary.mfu if summary else None),
        peak_mem_bytes=a.get(src.A_PEAK_MEM) or (summary.peak_mem_bytes if summary else None),
        step_time_s=number(a.get(src.A_STEP_TIME)) or (summary.mean_step_time_s if summary else None),
        breakdown_s=summary.breakdown_s if summary else {},
        loss_check=str(a.get(src.A_LOSS_CHECK) or ""), loss_gap=number(screening.get("loss_gap")),
        loss_tolerance=number(screening.get("loss_tolerance")),
    )


def json_knob(knob: str, value: Any) -> str:
    return f"{knob}={json.dumps(value)}"


def edit_text(t: Trial, parent: Trial | None, knob_text: Callable[[str, Any], str] = json_knob) -> str:
    """What ``t`` changed relative to its parent (the baseline when None), as ``knob_text`` writes each knob."""
    before = parent.changes if parent is not None else {}
    parts = [knob_text(k, v[1]) for k, v in t.changes.items() if before.get(k) != v]
    parts += [knob_text(k, v[0]) for k, v in before.items() if k not in t.changes]
    return ", ".join(parts) or "(same recipe)"


def link(trials: list[Trial], knob_text: Callable[[str, Any], str] = json_knob
         ) -> tuple[dict[int, Trial], dict[str, Trial]]:
    """The trials by number and by recipe id (tree nodes only), each with its edit from its parent."""
    by_number = {t.number: t for t in trials}
    # A recipe run again after an interruption has two trials: the tree links to the finished one.
    by_id: dict[str, Trial] = {}
    for t in trials:
        if t.status in TREE_STATUSES and (t.recipe_id not in by_id or by_id[t.recipe_id].status == "interrupted"):
            by_id[t.recipe_id] = t
    for t in trials:
        t.edit = edit_text(t, by_id.get(t.parent or ""), knob_text)
    return by_number, by_id


def mark_path(winner: Trial | None, by_id: dict[str, Trial]) -> None:
    """Flag the winner and the tree path that led to it."""
    if winner is None:
        return
    winner.winner = True
    walk: Trial | None = winner
    while walk is not None:
        walk.on_path = True
        walk = by_id.get(walk.parent or "")
        if walk is not None and walk.on_path:
            break  # a malformed store with a parent cycle must not hang the report


def count(trials: list[Trial], files: CampaignFiles) -> dict[str, int]:
    counts = {"trials": len(trials), "ran": sum(t.ran for t in trials)}
    for status in ("passed", "rejected", "failed", "interrupted", "duplicate"):
        counts[status] = sum(t.status == status for t in trials)
    counts["invalid proposals"] = len(files.rejected)
    return counts


def campaign_settings(files: CampaignFiles) -> dict[str, Any]:
    """The campaign's settings for the page's header and report.json (the baseline recipe has its own block)."""
    vfile = files.verdict or {}
    campaign = {k: v for k, v in files.meta.items() if k not in ("baseline",)}
    if src.M_ELAPSED in files.study_attrs:
        campaign["search_elapsed_s"] = files.study_attrs[src.M_ELAPSED]
    for key in ("approved_file", "runs"):
        if vfile.get(key) is not None:
            campaign[key] = vfile[key]
    return campaign


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
        lead = "Approved" if decision == "APPROVED" else "The baseline stays"
        return f"{lead}: {reasons[0] if reasons else 'no candidate beat it'}."
    ci = f" ({_ci(ev)})" if _ci(ev) else ""
    noise = f"the {fmt_pct(ev.noise_margin)} noise margin" if ev.noise_margin is not None else "the noise"
    loss = ""
    if ev.loss_gap is not None and ev.loss_tolerance is not None:
        within = "within" if abs(ev.loss_gap) <= ev.loss_tolerance else "outside"
        loss = f"; final loss {ev.loss_gap:+.4f} nats, {within} the tolerance +-{ev.loss_tolerance:.4f}"
    if decision == "APPROVED":
        return f"Approved {ev.change}: {ev.speedup:.3f}x tokens/s per device{ci}, clear of {noise}{loss}."
    clears = ev.ci_low is not None and ev.noise_margin is not None and ev.ci_low > 1 + ev.noise_margin
    speed = f"clear of {noise}" if clears else f"not clear of {noise}"
    return f"The baseline stays. Best candidate {ev.change}: {ev.speedup:.3f}x{ci}, {speed}{loss}."


def build_report(files: CampaignFiles) -> Report:
    if files.job == src.QUALITY:
        from recipetune.report.quality import build_quality  # imported here: it builds on this module

        return build_quality(files)
    base = _baseline(files)
    vfile = files.verdict or {}
    decision = str(vfile.get("decision") or NO_VERDICT)
    reasons = [str(r) for r in vfile.get("reasons") or []]

    trials = [_trial(r, files.results.get(r.number), base.recipe, base.tokens_per_s)
              for r in sorted(files.records, key=lambda r: r.number) if src.A_RECIPE in r.attrs]
    by_number, by_id = link(trials)

    finalists = []
    for f in files.finalists:
        v = f.get("verdict") if isinstance(f.get("verdict"), dict) else {}
        rid = str(f.get("candidate_id") or "")
        t = by_number.get(f.get("trial")) or by_id.get(rid)  # type: ignore[arg-type]
        ev = _evidence(v, rid, t.number if t else f.get("trial"), t.change if t else rid, f.get("screened_speedup"))
        finalists.append(ev)
        if t is not None:
            t.final = ev.decision

    winner = None
    if decision == "APPROVED":
        winner = by_number.get(vfile.get("trial")) or by_id.get(str(vfile.get("recipe_id")))  # type: ignore[arg-type]
    evidence = None
    if isinstance(vfile.get("verdict"), dict):
        rid = str(vfile.get("recipe_id") or "")
        evidence = _evidence(vfile["verdict"], rid, vfile.get("trial"),
                             winner.change if winner else str(vfile.get("change") or ""))
    elif finalists:
        evidence = max(finalists, key=lambda e: e.speedup or 0.0)
    mark_path(winner, by_id)

    curves = [_curve(r, f"baseline run {i + 1}", "baseline") for i, r in enumerate(files.profile_runs) if r.steps]
    shown = [e.trial for e in finalists if e.trial is not None]
    if not shown:  # nothing reached the final verdict: show the best screened candidates instead
        passed = sorted((t for t in trials if t.status == "passed"), key=lambda t: t.speedup or 0, reverse=True)
        shown = [t.number for t in passed[:3]]
    if winner is not None and winner.number not in shown:
        shown.insert(0, winner.number)
    for n in shown:
        result = files.results.get(n)
        if result is not None and result.steps:
            role = "approved" if winner is not None and n == winner.number else (
                "finalist" if finalists else "candidate")
            curves.append(_curve(result, f"#{n} {by_number[n].change}" if n in by_number else f"#{n}", role, n))

    runs = files.profile_runs or list(files.results.values())
    env = dict(runs[0].environment) if runs else {}
    if runs:
        env["devices per run"] = str(runs[0].n_devices)
    for knob in ("device", "dtype", "nproc"):
        if knob in base.recipe:
            env[f"baseline {knob}"] = str(base.recipe[knob])

    window = (files.profile or {}).get("window") or ((files.config.get("guard") or {}).get("parity") or {}).get(
        "window") or 10
    return Report(
        folder=str(files.folder), generated_at=time.strftime("%Y-%m-%d %H:%M:%S"), campaign=campaign_settings(files),
        decision=decision, headline=headline(decision, evidence, len(trials), reasons), reasons=reasons,
        evidence=evidence, finalists=finalists, baseline=base, winner=winner, trials=trials,
        counts=count(trials, files), curves=curves, smoothing_window=int(window),
        rejected_proposals=[{k: r.get(k) for k in ("source", "reason", "raw")} for r in files.rejected],
        environment={str(k): str(v) for k, v in env.items()},
        commands=commands(files, vfile.get("recipe") if winner is not None else None),
    )


def load_report(folder: Path) -> Report:
    """Read a campaign folder into a Report (raises sources.NotACampaign)."""
    return build_report(src.read_campaign(folder))


def report_json(report: Report) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=False) + "\n"
