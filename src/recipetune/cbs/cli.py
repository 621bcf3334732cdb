"""`recipetune cbs ...`: critical batch size commands. Each command is one function on `cbs_app`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table as RichTable

from recipetune.cbs.plots import plot_scaling, plot_steps_vs_batch
from recipetune.cbs.table import Summary, TableError, fmt, fmt_ci, load_table, summarize, write_summary

cbs_app = typer.Typer(
    help="Critical batch size (arXiv 2410.21676): fit steps-vs-batch measurements, scaling laws.",
    no_args_is_help=True,
)
console = Console()
errors = Console(stderr=True, soft_wrap=True)  # soft wrap: a long path must not split the message


@cbs_app.callback()
def _group() -> None:
    """Critical batch size: measure, fit and scale."""
    # A callback keeps `fit` a named subcommand even while it is the only one.


def _with_rel_se(value: float, se: float) -> str:
    # Relative standard errors keep the columns narrow enough for an 80-column terminal.
    return f"{fmt(value, 3)} ±{100 * se / abs(value):.0f}%" if value else fmt(value)


def _print_summary(summary: Summary) -> None:
    table = RichTable(title=f"S(B) = a + b/B, B* = b/(5a) + 1.2 B_opt (B_opt: {summary.b_opt_rule})")
    for col in ("group", "n", "a", "b", "r2", "B_opt", "B*", "B* 95% CI"):
        table.add_column(col, justify="left" if col == "group" else "right")
    for g in summary.groups:
        table.add_row(
            g.label,
            str(g.fit.n),
            _with_rel_se(g.fit.a, g.fit.a_se),
            _with_rel_se(g.fit.b, g.fit.b_se),
            f"{g.fit.r2:.4f}",
            fmt(g.b_opt),
            g.b_star_text,
            escape(fmt_ci(g.b_star_ci, 3)),  # "[lo, hi]" would otherwise parse as markup
        )
    console.print(table)
    if summary.scaling:
        scaling = RichTable(title="Scaling of B* = c X^exponent (95% CI: t, n-2 dof)")
        for col in ("variable", "n", "exponent", "95% CI", "r2", "paper"):
            scaling.add_column(col, justify="left" if col == "variable" else "right")
        for s in summary.scaling:
            scaling.add_row(
                s.label,
                str(s.fit.n),
                f"{s.fit.exponent:.3f}",
                escape(fmt_ci(s.fit.exponent_ci, 3)),
                f"{s.fit.r2:.3f}",
                f"{s.paper_exponent}",
            )
        console.print(scaling)
    for r in summary.excluded:
        where = "".join(f", {k}={v:g}" for k, v in r.groups.items())
        console.print(
            f"[yellow]excluded line {r.line}[/yellow] (batch_size={r.batch_size:g}{where}): "
            "steps missing, target loss not reached",
            highlight=False,
        )
    for note in summary.notes:
        console.print(f"[yellow]note:[/yellow] {note}", highlight=False)


@cbs_app.command("fit")
def fit_command(
    table: Path = typer.Argument(..., help="CSV with columns batch_size,steps[,model_size,data_size]."),
    b_opt: float | None = typer.Option(
        None, "--b-opt", help="Reference batch size in the linear regime (default: the smallest measured)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Output folder (default: <csv stem>-cbs/ beside the CSV)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap for the B* interval."),
) -> None:
    """Fit S(B) = a + b/B per group, report the critical batch size B* and its scaling with D and N."""
    try:
        summary = summarize(load_table(table), b_opt=b_opt, seed=seed)
    except TableError as exc:
        errors.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None
    out_dir = out or table.with_name(f"{table.stem}-cbs")
    written = write_summary(summary, out_dir)
    written.append(plot_steps_vs_batch(summary.groups, out_dir / "steps_vs_batch.png"))
    if summary.scaling:
        written.append(plot_scaling(summary.scaling, out_dir / "scaling.png"))
    _print_summary(summary)
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False)
