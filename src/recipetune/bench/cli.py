"""`recipetune bench ...`: measured tables of a search space, strategies replayed against them, figures."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from recipetune.config import load_campaign
from recipetune.core.console import fail
from recipetune.core.errors import ConfigError

if TYPE_CHECKING:
    from recipetune.bench.table import Table

bench_app = typer.Typer(
    help="How good is the search? Measure a space's every recipe, replay strategies against it.",
    no_args_is_help=True,
)
console = Console()


@bench_app.command("table")
def table_cmd(
    campaign_file: Path = typer.Argument(..., help="campaign YAML: its baseline and search.knobs define the space"),
    overrides: list[str] = typer.Argument(None, help="key=value overrides, as for `recipetune run`"),
    out: Path = typer.Option(..., help="table file (JSON); an existing one of the same space is resumed"),
    repeats: int = typer.Option(3, min=1, help="runs per recipe, interleaved across recipes"),
    steps: int | None = typer.Option(None, min=1, help="steps per run (default: search.steps_per_trial)"),
    name: str | None = typer.Option(None, help="the table's name (default: the file's stem)"),
    timeout_s: float | None = typer.Option(None, help="per run (default: run.timeout_s)"),
) -> None:
    """Measure every recipe of a campaign's search space with repeats (a table to replay searches on)."""
    from recipetune.bench.table import build_table

    try:
        campaign = load_campaign(campaign_file, overrides or [])
        from recipetune.speed.plan import check_space

        check_space(campaign)
    except ConfigError as e:
        raise fail(e) from None
    n_steps = steps or campaign.config.search.steps_per_trial
    try:
        table = build_table(campaign, out, name or campaign_file.stem, repeats, n_steps,
                            timeout_s or campaign.config.run.timeout_s, log=lambda s: console.print(s, markup=False))
    except ValueError as e:
        raise fail(e) from None
    best, base = table.best(), table.baseline_entry()
    console.print(f"{out}: best {best.values} at {best.tokens_per_s():,.0f} tokens/s, "
                  f"{best.tokens_per_s() / base.tokens_per_s():.2f}x the baseline")  # type: ignore[operator]


def _replayable(path: Path) -> Table:
    """A table file to replay. A table from an older knob set is replayed under today's defaults for the
    new knobs, and says so; one that cannot be mapped is refused (exit 2) before anything runs."""
    from recipetune.bench.table import Table

    try:
        table = Table.load(path)
        _, notes = table.up_to_date(table.make_workload(), path)
    except ConfigError as e:
        raise fail(f"not a bench table that can be replayed: {e}") from None
    for note in notes:
        console.print(f"note: {note}", markup=False)
    return table


@bench_app.command("replay")
def replay_cmd(
    tables: list[Path] = typer.Argument(..., help="table files built by `recipetune bench table`"),
    seeds: int = typer.Option(20, min=1, help="replays per strategy and table"),
    budget: int = typer.Option(32, min=1, help="trials per replay (capped at the table's feasible recipes)"),
    strategies: str = typer.Option(",".join(("mcts-analyst", "mcts-random", "greedy", "sequential", "tpe", "gp",
                                             "optuna-random", "grid")), help="comma-separated"),
    gp_seeds: int | None = typer.Option(None, help="fewer seeds for the (slow) gp sampler"),
    out: Path = typer.Option(Path("benchmarks/results/replay.json"), help="summary (JSON)"),
    markdown_out: Path | None = typer.Option(None, "--markdown", help="the figures as Markdown tables"),
    plot_out: Path | None = typer.Option(None, "--plot", help="the figures as a PNG"),
) -> None:
    """Replay search strategies against measured tables: trials and wall time to within 2% of the best."""
    import json

    from recipetune.bench.figures import markdown, plot, summarize
    from recipetune.bench.replay import STRATEGIES, replay

    names = [s.strip() for s in strategies.split(",") if s.strip()]
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise fail(f"--strategies: unknown {', '.join(unknown)}; expected some of {', '.join(STRATEGIES)}")
    loaded = [_replayable(path) for path in tables]
    report: dict = {"budget": budget, "seeds": seeds, "tables": {}}
    panels, texts = [], []
    for table in loaded:
        n_ok = sum(1 for e in table.entries if e.feasible and e.tokens_per_s() is not None)
        cap = min(budget, n_ok)
        trajectories = []
        for s in names:
            for seed in range(gp_seeds if s == "gp" and gp_seeds else seeds):
                trajectories.append(replay(table, s, cap, seed))
            console.print(f"{table.name}: {s} replayed", markup=False)
        base = table.baseline_entry().tokens_per_s()
        best = table.best().tokens_per_s() / base  # type: ignore[operator]
        summary = summarize(trajectories, best, cap)
        report["tables"][table.name] = {"best_speedup": best, "best": table.best().values, "budget": cap,
                                        "recipes": len(table.entries), "feasible": n_ok,
                                        "environment": table.environment, "summary": summary}
        panels.append((table.name, trajectories, best, cap))
        texts.append(markdown(table.name, summary, best, len(table.entries), cap))
        console.print(texts[-1], markup=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=lambda x: None if x != x else x))
    if markdown_out:
        markdown_out.write_text("\n\n".join(texts) + "\n")
    if plot_out:
        plot(panels, plot_out)
