"""The report's data: what a campaign decided, and the evidence, as one JSON-able model.

``report/build.py`` turns a campaign folder (``sources.read_campaign``) into a ``Report`` (speed.py
for a speed campaign, quality.py for a fine-tuning one, with the tree helpers here that both share);
the HTML page, the terminal view and ``report.json`` are all drawn from it, so they always tell the
same story.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from recipetune.engine.status import Status
from recipetune.report import sources as src
from recipetune.report.sources import CampaignFiles

NO_VERDICT = "NO VERDICT YET"
TREE_STATUSES = (Status.PASSED, Status.REJECTED, Status.FAILED, Status.PRUNED, Status.INTERRUPTED)


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


class SetAsideRow(BaseModel):
    """A recipe the search set aside as predicted far slower than the incumbent (engine/effects.py), and
    the measurements it was set aside on."""

    change: str
    source: str = ""
    predicted: float | None = None  # its predicted speed over the incumbent's
    upper: float | None = None  # the most it plausibly is, over the incumbent's
    values: str = ""  # the values that make it slow
    measured: str = ""  # the trials behind it: number, change, ratio to the baseline (or its bound)


def set_aside_rows(files: CampaignFiles) -> list[SetAsideRow]:
    """The campaign folder's set-aside recipes (each once, the latest word on it)."""
    rows: dict[str, SetAsideRow] = {}
    for r in files.set_aside:
        values = r.get("values") if isinstance(r.get("values"), dict) else {}
        measured = [m for m in r.get("measurements") or [] if isinstance(m, dict)]
        text = "; ".join(
            f"trial {m.get('trial')} ({m.get('change')}): "
            + (f"at most {m['ratio']:.3g}x ({m.get('censored')})" if m.get("censored") else f"{m['ratio']:.3g}x")
            for m in measured if isinstance(m.get("ratio"), int | float))
        rows[str(r.get("recipe_id"))] = SetAsideRow(
            change=str(r.get("change", "")), source=str(r.get("source", "")),
            predicted=r.get("predicted") if isinstance(r.get("predicted"), int | float) else None,
            upper=r.get("upper") if isinstance(r.get("upper"), int | float) else None,
            values=", ".join(json_knob(k, v) for k, v in values.items()), measured=text)
    return list(rows.values())


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
    set_aside: list[SetAsideRow] = []  # recipes predicted far slower than the incumbent, not run (or run last)
    environment: dict[str, str]
    commands: dict[str, list[str]]
    metric: str = ""  # the quality job's validation and test metric
    comparison: QualityEvidence | None = None  # the quality job's evidence, in place of ``evidence``


# -- the tree, shared by both jobs' reports ------------------------------------------------------


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
    for status in (Status.PASSED, Status.REJECTED, Status.FAILED, Status.PRUNED, Status.INTERRUPTED, Status.DUPLICATE):
        counts[status] = sum(t.status == status for t in trials)
    counts["invalid proposals"] = len(files.rejected)
    counts["set aside"] = len({r.get("recipe_id") for r in files.set_aside})
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


def report_json(report: Report) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=False) + "\n"
