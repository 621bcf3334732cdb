"""The report in a terminal: a verdict panel, the trial table and a compact search tree (Rich)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from recipetune.core.fmt import fmt_bytes, fmt_num, fmt_pct
from recipetune.core.words import Decision
from recipetune.engine.status import Status
from recipetune.report.model import TREE_STATUSES, Report, Trial
from recipetune.report.sources import QUALITY

STYLE = {Status.PASSED: "blue", Status.REJECTED: "yellow", Status.FAILED: "red", Status.PRUNED: "magenta",
         Status.INTERRUPTED: "dim", Status.DUPLICATE: "dim", Status.RUNNING: "cyan", Decision.APPROVED: "green",
         Decision.KEEP_BASELINE: "yellow", Decision.REJECTED: "yellow"}


def _quality_lines(r: Report) -> list[RenderableType]:
    """The test-split comparison behind a quality decision, and the baseline it was measured against."""
    lines: list[RenderableType] = []
    ev, b = r.comparison, r.baseline
    if ev is not None:
        lines.append(Text(f"test {ev.metric}: candidate {fmt_num(ev.candidate_mean, '.4f')} vs baseline "
                          f"{fmt_num(ev.baseline_mean, '.4f')}, gain {fmt_num(ev.gain, '+.4f')}  "
                          f"{100 * ev.confidence:.0f}% CI [{fmt_num(ev.ci_low, '+.4f')}, {fmt_num(ev.ci_high, '+.4f')}]"
                          f"  normalised gain {fmt_num(ev.normalised_gain, '+.3f')}"))
        pairs = ", ".join(f"seed {s}: {fmt_num(x, '.3f')} -> {fmt_num(y, '.3f')}"
                          for s, x, y in zip(ev.seeds, ev.baseline, ev.candidate, strict=False))
        lines.append(Text(f"per seed (baseline -> candidate): {pairs}"))
        lines.append(Text(f"validation {ev.metric}: baseline {fmt_num(ev.validation_baseline, '.4f')}, "
                          f"candidate {fmt_num(ev.validation_candidate, '.4f')}"))
    lines.append(Text(f"baseline {b.recipe_id}: validation {b.metric or r.metric} {fmt_num(b.value, '.4f')}, "
                      f"data version {b.data_version or 'n/a'} ({fmt_num(b.rows, ',.0f')} training rows)",
                      style="dim"))
    return lines


def verdict_panel(r: Report) -> Panel:
    lines: list[RenderableType] = [Text(r.headline, style="bold")]
    ev = r.evidence
    if r.job == QUALITY:
        lines += _quality_lines(r)
    elif ev is not None:
        margin = f"noise margin ±{fmt_pct(ev.noise_margin)}"
        lines.append(Text(f"speed-up {fmt_num(ev.speedup, '.3f', 'x')}  {100 * ev.confidence:.0f}% CI "
                          f"[{fmt_num(ev.ci_low, '.3f')}, "
                          f"{fmt_num(ev.ci_high, '.3f')}]  {margin}  ({len(ev.pairs)} interleaved pairs)"))
        lines.append(Text(f"loss parity ({ev.parity_mode or 'n/a'}): final loss {fmt_num(ev.loss_gap, '+.4f')} "
                          f"nats, tolerance T ±{fmt_num(ev.loss_tolerance, '.4f')}, detectable "
                          f"{fmt_num(ev.loss_detectable, '.4f')}"))
    b = r.baseline
    if r.job != QUALITY:
        lines.append(Text(f"baseline {b.recipe_id}: {fmt_num(b.tokens_per_s)} tokens/s per device over {b.repeats} "
                          f"runs, noise ±{fmt_pct(b.throughput_noise)}, loss tolerance "
                          f"{fmt_num(b.loss_tolerance, '.4f')}", style="dim"))
    lines += [Text(f"- {reason}") for reason in r.reasons]
    for name, cmds in r.commands.items():
        lines += [Text(f"{name}: {c}", style="bold" if name == "approved" else "") for c in cmds]
    style = STYLE.get(r.decision, "white")
    # Titles as Text, not markup: a folder may be called "runs[2]".
    return Panel(Group(*lines), title=Text(r.decision, style=f"bold {style}"), border_style=style, expand=False,
                 subtitle=Text(r.folder))


def trial_table(r: Report, width: int = 200) -> Table:
    """The trials, one line each where the terminal allows: narrow terminals drop the secondary columns."""
    wide, wider = width >= 120, width >= 160
    quality = r.job == QUALITY
    table = Table(title=f"{r.counts['trials']} trials ({r.counts['ran']} ran)", title_justify="left")
    cols = [("#", "right"), ("change", "left"), ("status", "left")]
    if quality:
        cols += [(f"val {r.metric}", "right"), ("gain", "right")]
    else:
        cols += [("tok/s/dev", "right"), ("speed-up", "right")]
        cols += [("MFU", "right"), ("peak mem", "right")] if wide else []
    cols += [("diagnosis / cause" if quality else "cause / loss", "left")]
    cols += [("proposer: rationale", "left")] if wider else []
    for col, just in cols:
        numeric = just == "right"
        table.add_column(col, justify=just, no_wrap=numeric, overflow="ellipsis" if numeric else "fold",  # type: ignore[arg-type]
                         ratio=None if numeric else 1)
    for t in r.trials:
        status = "approved" if t.winner else t.status
        if t.final and not t.winner:
            status += f" (final: {t.final})"
        row: list[RenderableType] = [
            str(t.number), Text(t.change.replace('"', "")),
            Text(status, style="bold green" if t.winner else STYLE.get(t.status, "")),
        ]
        if quality:
            row += [fmt_num(t.value, ".4f") if t.value is not None else "",
                    fmt_num(t.gain, "+.3f") if t.gain is not None else ""]
            row.append(Text("; ".join(x for x in (t.diagnosis, t.cause) if x)[:100]))
        else:
            row += [fmt_num(t.tokens_per_s) if t.tokens_per_s is not None else "",
                    fmt_num(t.speedup, ".3f", "x") if t.speedup is not None else ""]
            if wide:
                row += [fmt_pct(t.mfu, 1) if t.mfu is not None else "",
                        fmt_bytes(t.peak_mem_bytes) if t.peak_mem_bytes is not None else ""]
            row.append(Text((t.cause or t.loss_check)[:100]))
        if wider:
            # Text, never markup: a rationale may hold anything a proposer wrote.
            row.append(Text(f"{t.proposer}: {t.rationale}"[:140], style="dim"))
        table.add_row(*row)
    return table


def _label(t: Trial, job: str) -> Text:
    # The figure the job decides on: validation metric for quality, screened speed-up for speed.
    figure = ""
    if t.status == Status.PASSED and job == QUALITY and t.value is not None:
        figure = f" {t.value:.3f}"
    elif t.status == Status.PASSED and job != QUALITY and t.speedup is not None:
        figure = f" {t.speedup:.2f}x"
    outcome = t.run_status if t.status == "failed" and t.run_status else t.status
    style = "bold green" if t.on_path else STYLE.get(t.status, "")
    return Text.assemble((f"#{t.number} ", "dim"), (t.edit.replace('"', ""), style),
                         (f"{figure} {outcome}", STYLE.get(t.status, "")),
                         (" ★ approved" if t.winner else "", "bold green"))


def search_tree(r: Report) -> Tree:
    nodes = [t for t in r.trials if t.status in TREE_STATUSES]
    by_recipe: dict[str, Trial] = {}
    for t in nodes:
        if t.recipe_id not in by_recipe or by_recipe[t.recipe_id].status == "interrupted":
            by_recipe[t.recipe_id] = t
    root = Tree(Text(f"baseline {r.baseline.recipe_id}", style="bold"))
    branches: dict[int, Tree] = {}
    for t in sorted(nodes, key=lambda t: t.number):  # a parent is always an earlier trial
        parent = by_recipe.get(t.parent or "")
        above = branches.get(parent.number, root) if parent is not None else root
        branches[t.number] = above.add(_label(t, r.job))
    return root


def set_aside_lines(r: Report) -> list[RenderableType]:
    """The recipes set aside as predicted far slower than the incumbent, and the trials that said so."""
    if not r.set_aside:
        return []
    lines: list[RenderableType] = [Text(f"set aside ({len(r.set_aside)}): predicted far slower than the incumbent",
                                        style="bold")]
    for a in r.set_aside[:12]:
        predicted = f"{a.predicted:.2g}x" if a.predicted is not None else "?"
        lines.append(Text(f"  {a.change}: {predicted} the incumbent, for {a.values or 'its values'}; "
                          f"measured {a.measured}", style="dim"))
    if len(r.set_aside) > 12:
        lines.append(Text(f"  ... and {len(r.set_aside) - 12} more (report.json)", style="dim"))
    return lines


def render(r: Report, width: int = 200) -> Group:
    return Group(verdict_panel(r), trial_table(r, width), search_tree(r), *set_aside_lines(r))
