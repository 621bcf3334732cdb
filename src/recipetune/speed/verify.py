"""`recipetune verify BASELINE.yaml CANDIDATE.yaml`: the guard's full decision on one candidate.

A command of the speed job, not of the guard: it reads two campaign files (config.py, a layer above
the guard) and asks the guard for its verdict on their recipes.

Exit codes, one per outcome, so a CI job can gate on the verdict (``EXIT``): 0 APPROVED; 3 KEEP
BASELINE (the evidence does not show a gain); 4 REJECTED, by the static checks (nothing runs, nothing
is written; a ``knob=value`` edit of the candidate that breaks a domain or a relation is refused so,
named as the candidate's) or after measurement (the candidate trains differently or failed to run);
2 bad input (a file, a settings override, mismatched workloads: nothing runs, nothing is written);
1 no verdict (the baseline itself failed to run, or a crash).

The verdict says its plan before the candidate runs and each look as it ends, with what is left
(``Printer``): on a terminal above a spinner, in a log as plain lines. Parity runs are stored in
``guard-runs/`` beside the output folder (``--runs``): a later verify against the same baseline there
reuses them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from recipetune.config import Campaign, CampaignConfig, check_recipe, load_campaign, resolve_paths
from recipetune.core import options as opt
from recipetune.core.console import Note, fail
from recipetune.core.errors import ConfigError
from recipetune.core.filenames import RUNS_FOLDER
from recipetune.core.files import parse_override
from recipetune.core.fmt import fmt_duration, fmt_pct
from recipetune.core.recipe import Recipe
from recipetune.core.words import Decision
from recipetune.execute.factory import make_executor
from recipetune.guard.baseline import GuardError
from recipetune.guard.runs import check_folder as check_runs_folder
from recipetune.guard.static import StaticReport, static_report
from recipetune.guard.verdict import Verdict, cost_text, final_verdict, static_verdict

STYLE = {Decision.APPROVED: "bold green", Decision.KEEP_BASELINE: "bold yellow", Decision.REJECTED: "bold red"}
# 2: bad input; 1: no verdict (GuardError, a crash)
EXIT = {Decision.APPROVED: 0, Decision.KEEP_BASELINE: 3, Decision.REJECTED: 4}
NO_VERDICT = 1


def _split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """knob=value edits the candidate's recipe; section.field=value the settings (from the baseline file)."""
    to_candidate, to_baseline = [], []
    for text in overrides:
        path, _ = parse_override(text, CampaignConfig.model_fields, "baseline")
        (to_candidate if path[0] == "baseline" else to_baseline).append(text)
    return to_candidate, to_baseline


def _candidate(cand: Campaign, edits: list[str]) -> tuple[Recipe, StaticReport | None]:
    """The candidate's recipe: its file's, with the command line's ``knob=value`` edits. An edit that
    leaves a knob's domain or breaks a relation is the candidate's, refused by the static checks (exit
    4), not bad input; a file that is broken as written stays bad input (exit 2, from load_campaign)."""
    if not edits:
        return cand.baseline, None
    values = dict(cand.config.baseline)
    knobs = cand.workload.knobs()
    for text in edits:
        path, value = parse_override(text, CampaignConfig.model_fields, "baseline")
        if len(path) != 2 or path[1] not in knobs:  # a typo is bad input, not the candidate's fault
            raise ConfigError("command line", text, f"the {cand.workload.kind} workload has no knob "
                              f"'{'.'.join(path[1:])}'; valid knobs are: {', '.join(sorted(knobs))}")
        values[path[1]] = value
    values = resolve_paths(cand.workload, values, cand.path.resolve().parent)
    try:
        return check_recipe(cand.workload, values, cand.path, "baseline"), None
    except ConfigError:
        raw = Recipe({**cand.workload.knobs().defaults(), **values})
        report = static_report(cand.workload, cand.baseline, raw)
        if not report.violations:
            raise
        return raw, report


def _check_same_workload(base: Campaign, cand: Campaign) -> None:
    a = base.config.workload.model_dump(mode="json")
    b = cand.config.workload.model_dump(mode="json")
    if a == b:
        return
    if a.get("kind") != b.get("kind"):
        detail = f"workload kind {b.get('kind')!r}, the baseline's is {a.get('kind')!r}"
    else:
        fields = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        detail = "; ".join(f"workload.{k}: {json.dumps(b.get(k))}, the baseline's {json.dumps(a.get(k))}"
                           for k in fields)
    raise ConfigError(cand.path, "workload", f"describes another workload than {base.path} ({detail}); "
                      "verify compares two recipes of the same workload")


class Printer:
    """The verdict's progress: lines the guard marks as notes (its plan, each look's outcome) are
    printed and stay; the others (runs done, what runs now) update a spinner on a terminal and are
    left out of a log, so that a CI log shows the plan and each look, one line each."""

    def __init__(self, console: Console):
        self.console, self.status = console, None
        self.started = time.monotonic()

    def __enter__(self) -> Printer:
        if self.console.is_terminal:
            self.status = self.console.status("starting")
            self.status.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.status is not None:
            self.status.__exit__(*exc)

    def __call__(self, message: str) -> None:
        clock = f"[{fmt_duration(time.monotonic() - self.started)}]"
        if isinstance(message, Note):
            self.console.print(f"{clock} {message}", highlight=False, markup=False)
        elif self.status is not None:
            self.status.update(escape(message))


def render(verdict: Verdict) -> Panel:
    """The verdict as one panel: the decision and its reasons, then the evidence section by section."""
    parts: list = [Text(verdict.decision, style=STYLE[verdict.decision])]
    if not verdict.violations:  # the table below says it knob by knob
        parts += [Text(f"  - {r}") for r in verdict.reasons]
    if verdict.violations:
        parts.append(_static_table(verdict))
    parts += _speed_parts(verdict)
    if verdict.parity:
        parts.append(_parity_table(verdict.parity))
    parts += _closing_parts(verdict)
    return Panel(Group(*parts), title=f"verify: {escape(verdict.change)}", title_align="left",
                 subtitle=verdict.out_dir and f"{verdict.out_dir}/verdict.json", subtitle_align="left")


def _static_table(verdict: Verdict) -> Table:
    """The static checks' violations, knob by knob."""
    table = Table(title="static check", title_justify="left")
    for col in ("knob", "rule", "problem"):
        table.add_column(col)
    for v in verdict.violations:
        table.add_row(v["knob"], v["rule"], escape(v["message"]))
    return table


def _speed_parts(verdict: Verdict) -> list:
    """The speed-up against its noise margin, and the interleaved pairs it was measured on."""
    parts: list = []
    if verdict.speedup is not None:
        ci = f"{100 * (verdict.confidence or 0):.0f}% CI [{verdict.ci_low:.3f}, {verdict.ci_high:.3f}]"
        parts.append(Text(f"\nspeed-up {verdict.speedup:.3f}x   {ci}   noise margin {fmt_pct(verdict.noise_margin)}"
                          f" (approved only above {1 + (verdict.noise_margin or 0):.3f})", style="bold"))
        parts.append(Text(f"noise: {verdict.speed.get('noise_source', '')}", style="dim"))
    if verdict.pairs:
        table = Table(title="interleaved pairs (tokens/s per device: median over windows, warm-up excluded)",
                      title_justify="left")
        for col in ("pair", "order", "baseline", "candidate", "ratio", "warm-up s (A / B)", "stalls (A / B)"):
            table.add_column(col, justify="right")
        for p in verdict.pairs:
            table.add_row(str(p["index"]), p["order"], f"{p['baseline_tokens_per_s']:,.0f}",
                          f"{p['candidate_tokens_per_s']:,.0f}", f"{p['ratio']:.3f}",
                          f"{p['baseline_warmup_s']:.2f} / {p['candidate_warmup_s']:.2f}",
                          f"{p.get('baseline_stalls', 0)} / {p.get('candidate_stalls', 0)}")
        parts.append(table)
    return parts


def _parity_table(par: dict) -> Table:
    """The loss parity evidence: each measure's finals, difference, bounds and T, then the last look."""
    table = Table(title=f"loss parity ({par['mode']})", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("evidence", escape(f"{par['mode']}: {par['mode_reason']}"))
    for m in par.get("measures") or [par | {"measure": par["final_metric"]}]:
        bounds = "" if m["low"] is None else f", bounds [{m['low']:+.4f}, {m['high']:+.4f}]"
        det = "unbounded" if m["detectable"] is None else f"{m['detectable']:.4f}"
        table.add_row(escape(m["measure"]),
                      f"baseline {', '.join(f'{x:.4f}' for x in m['baseline_finals'])}; candidate "
                      f"{', '.join(f'{x:.4f}' for x in m['candidate_finals'])}\n"
                      f"difference {m['mean_diff']:+.4f} nats{bounds} ({escape(m['se_source'])})\n"
                      f"T ±{m['tolerance']:.4f} ({escape(m['reference_kind'])}: {m['reference']:.4f}); "
                      f"smallest detectable {det}: {m.get('outcome', par['outcome'])}")
    level = par.get("level", par.get("alpha", 0.05))
    table.add_row("seeds", f"{par['seeds']}; last look's one-sided level {level:.4g}")
    table.add_row("verdict", par["outcome"])
    return table


def _closing_parts(verdict: Verdict) -> list:
    """What the verdict spent, its notes, and the invariants it checked."""
    parts: list = []
    if verdict.cost:
        parts.append(Text(f"\ncost: {cost_text(verdict.cost)}", style="dim"))
    if verdict.notes:
        parts.append(Text("\nnotes", style="bold"))
        parts += [Text(f"  - {n}") for n in verdict.notes]
    if verdict.invariants_checked:
        parts.append(Text("\ninvariants checked", style="bold"))
        parts += [Text(f"  - {line}") for line in verdict.invariants_checked]
        if verdict.allowed_semantic:
            parts.append(Text(f"  allowed semantic change: {', '.join(verdict.allowed_semantic)} "
                              "(judged on loss at equal tokens)"))
    return parts


def verify(
    baseline_file: Path = typer.Argument(..., help="campaign file of the baseline; its guard: section applies"),
    candidate_file: Path = typer.Argument(..., help="campaign file of the candidate (same workload)"),
    overrides: list[str] = typer.Argument(
        None, help="knob=value edits the candidate's recipe; section.field=value (e.g. guard.speed.pairs=3) "
        "edits the settings, which come from the baseline file"),
    out: Path | None = typer.Option(None, help="output folder (default: runs/verify-TIME-CANDIDATEID)"),
    runs: Path | None = typer.Option(None, help="where parity runs are stored and reused by later verdicts "
                                               "(default: guard-runs beside the output folder)"),
    json_output: bool = typer.Option(False, "--json", help="print the verdict as JSON on stdout"),
    executor: opt.Executor = None,
    ray_address: opt.RayAddress = None,
) -> None:
    """Decide whether CANDIDATE may replace BASELINE: APPROVED, REJECTED or KEEP BASELINE, with evidence.

    Exit code 0: APPROVED; 3: KEEP BASELINE; 4: REJECTED; 2: bad input; 1: no verdict (the baseline
    failed to run).
    """
    console = Console(stderr=json_output)  # with --json, stdout carries the JSON alone
    inputs = _read_inputs(baseline_file, candidate_file, overrides or [], out, runs, executor, ray_address)
    base, candidate = inputs.base, inputs.candidate
    settings = base.config.guard
    allow = base.config.search.allow_semantic
    report = inputs.refused or static_report(base.workload, base.baseline, candidate, allow)
    if report.violations:
        _refuse(report, inputs, json_output, console)

    out_dir = out or Path("runs") / f"verify-{time.strftime('%Y%m%d-%H%M%S')}-{candidate.id}"
    try:
        runner = make_executor(base.config.execute, base.workload.n_devices(base.baseline), base.path)
    except ConfigError as e:
        raise fail(e) from None
    console.print(f"verifying {candidate.describe_diff(base.baseline)} against baseline "
                  f"{base.baseline.id} -> {out_dir}", highlight=False)
    try:
        with Printer(console) as printer:
            verdict = final_verdict(base.workload, base.baseline, candidate, settings, out_dir,
                                    allow_semantic=allow, progress=printer, executor=runner,
                                    runs_folder=inputs.runs)
    except GuardError as e:
        raise fail(e, NO_VERDICT) from None
    finally:
        runner.close()
    _show(verdict, json_output, console)
    raise typer.Exit(EXIT[verdict.decision])


@dataclass(frozen=True)
class _Inputs:
    """What verify read from its command line, checked: nothing has run yet."""

    base: Campaign  # the baseline's campaign file, with the settings overrides
    cand: Campaign  # the candidate's campaign file, as written
    candidate: Recipe  # its recipe with the command line's knob=value edits
    refused: StaticReport | None  # the static checks' report where an edit breaks a rule, else None
    runs: Path  # the folder of parity runs
    to_candidate: list[str]  # the knob=value edits, as typed


def _read_inputs(
    baseline_file: Path, candidate_file: Path, overrides: list[str], out: Path | None, runs: Path | None,
    executor: str | None, ray_address: str | None,
) -> _Inputs:
    """Both campaign files, the candidate's recipe with its edits, and the runs folder; bad input of any
    of them exits 2 before anything runs."""
    try:
        to_candidate, to_baseline = _split_overrides(overrides)
        to_baseline = opt.option_overrides(to_baseline, {"executor": executor, "ray_address": ray_address})
        base = load_campaign(baseline_file, to_baseline)
        cand = load_campaign(candidate_file, [])  # the file as written; the edits are the candidate's
        _check_same_workload(base, cand)
        candidate, refused = _candidate(cand, to_candidate)
        runs = runs or (out.parent if out else Path("runs")) / RUNS_FOLDER
        check_runs_folder(runs, base.workload)  # a file, unwritable, another trainer's: exit 2, nothing ran
    except ConfigError as e:
        raise fail(e) from None
    return _Inputs(base, cand, candidate, refused, runs, to_candidate)


def _refuse(report: StaticReport, inputs: _Inputs, json_output: bool, console: Console) -> NoReturn:
    """The static checks refuse the candidate: show the verdict and exit REJECTED, nothing run."""
    verdict = static_verdict(report, inputs.base.baseline, inputs.candidate, inputs.base.config.guard, "")
    _show(verdict, json_output, console)
    edited = f" with {' '.join(inputs.to_candidate)}" if inputs.to_candidate else ""
    raise fail(f"{inputs.cand.path}{edited}: the candidate breaks {len(report.violations)} rule(s); nothing was run",
               EXIT[verdict.decision])


def _show(verdict: Verdict, json_output: bool, console: Console) -> None:
    """The verdict as JSON on stdout (--json), else as a panel."""
    if json_output:
        print(verdict.model_dump_json(indent=2))
    else:
        console.print(render(verdict))
