"""`recipetune cbs ...`: critical batch size commands. Each command is one function on `cbs_app`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable

from recipetune.cbs.local import LocalError, load_local, run_local
from recipetune.cbs.plots import plot_scaling, plot_steps_vs_batch
from recipetune.cbs.run import SweepResult, run_sweep
from recipetune.cbs.scale import load_scale, run_scale
from recipetune.cbs.sweep import SweepError, load_sweep
from recipetune.cbs.table import Summary, TableError, fmt, fmt_ci, load_table, summarize, write_summary
from recipetune.core.console import fail
from recipetune.core.errors import ConfigError

S, R = TypeVar("S"), TypeVar("R")  # a command's spec, its result
cbs_app = typer.Typer(
    help="Critical batch size (arXiv 2410.21676): measure steps vs batch size, fit B* and its scaling laws.",
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
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the bootstrap for the B* interval (>= 0)."),
) -> None:
    """Fit S(B) = a + b/B per group, report the critical batch size B* and its scaling with D and N."""
    try:
        summary = summarize(load_table(table), b_opt=b_opt, seed=seed)
    except TableError as exc:
        raise fail(exc) from None
    _write_fit(summary, out or table.with_name(f"{table.stem}-cbs"))


def _write_fit(summary: Summary, out_dir: Path) -> None:
    """A fit's files (summary, plots) in ``out_dir``, its tables on the terminal."""
    written = write_summary(summary, out_dir)
    written.append(plot_steps_vs_batch(summary.groups, out_dir / "steps_vs_batch.png"))
    if summary.scaling:
        written.append(plot_scaling(summary.scaling, out_dir / "scaling.png"))
    _print_summary(summary)
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False)


# ---------------------------------------------------------------------------------------------- measuring


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True,
    )


def _fit_points(points: Path, out_dir: Path, b_opt: float | None, seed: int) -> bool:
    """Fit a points.csv the way `cbs fit` does; False (with the reason printed) when it cannot be fitted."""
    try:
        summary = summarize(load_table(points), b_opt=b_opt, seed=seed)
    except TableError as exc:
        errors.print(f"[yellow]no fit:[/yellow] {exc}; the measurements are in {points}", highlight=False)
        return False
    _write_fit(summary, out_dir)
    return True


def _measure(config: Path, overrides: list[str] | None, out: Path | None, load: Callable[[Path, list[str]], S],
             run: Callable[[S, Path, Progress], R], failure: type[Exception],
             describe: Callable[[S, Path], str] | None = None) -> tuple[S, Path, R]:
    """What every measuring command does before its own output: load its file (bad input: exit 2, nothing
    written), the output folder, what will run (``describe``), the runs under a progress bar (a run that
    cannot go on: exit 1)."""
    try:
        spec = load(config, overrides or [])
    except ConfigError as exc:
        raise fail(exc) from None
    out_dir = out or Path("runs") / f"cbs-{config.stem}"
    if describe is not None:
        console.print(describe(spec, out_dir), highlight=False)
    try:
        with _progress() as progress:
            result = run(spec, out_dir, progress)
    except failure as exc:
        raise fail(exc, 1) from None
    return spec, out_dir, result


def _print_points(result: SweepResult, title: str) -> None:
    table = RichTable(title=f"{title}: target {result.target:.4f}", title_justify="left")
    for col in ("B", "steps", "tokens", "lr", "beta2", "EWA", "best val"):
        table.add_column(col, justify="right")
    for r in result.best:
        steps = str(r.steps_to_target) if r.reached else f"[yellow]missed[/yellow] ({r.status})"
        loss = "n/a" if r.best_val_loss is None else f"{r.best_val_loss:.4f}"
        table.add_row(str(r.batch_size), steps, str(r.tokens_to_target or "-"), f"{r.lr:.3g}", f"{r.beta2:g}",
                      f"{r.ewa_decay:g}", loss)
    console.print(table)


OVERRIDES_HELP = "key=value: a dotted field (lr.values=[0.001,0.003]) or a knob of base (seq_len=64)"
OUT_HELP = "Output folder (default: runs/cbs-<file stem>); running again resumes, finished runs are kept."


@cbs_app.command("sweep")
def sweep_command(
    config: Path = typer.Argument(..., help="CBS sweep YAML (see examples/cbs-tiny.yaml)."),
    overrides: list[str] = typer.Argument(None, help=OVERRIDES_HELP),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
) -> None:
    """Measure steps to a target loss per batch size (constant LR + EWA, best lr/beta2 per B), then fit B*."""
    spec, out_dir, result = _measure(config, overrides, out, load_sweep, run_sweep, SweepError, lambda spec, out_dir: (
        f"{len(spec.trials)} sweep runs over B={spec.config.batch_sizes}"
        + (f" + {len(spec.reference_trials)} reference runs" if spec.reference_trials else "") + f" -> {out_dir}"))
    _print_points(result, "steps to target per batch size")
    if not _fit_points(out_dir / "points.csv", out_dir, spec.config.b_opt, spec.config.bootstrap_seed):
        raise typer.Exit(1)


@cbs_app.command("scale")
def scale_command(
    config: Path = typer.Argument(..., help="CBS scale YAML (see examples/cbs-scale-tiny.yaml)."),
    overrides: list[str] = typer.Argument(None, help=OVERRIDES_HELP),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
) -> None:
    """Sweep several data sizes and model sizes, fit B* = c D^alpha and B* = c N^beta with 95% intervals."""
    spec, out_dir, result = _measure(config, overrides, out, load_scale, run_scale, SweepError, lambda spec, out_dir:
                                     f"{len(spec.groups)} groups, {spec.n_runs} runs -> {out_dir}")
    for group, sweep in result.groups:
        _print_points(sweep, f"{group.model}, D={sweep.data_tokens} tokens, N={sweep.params}")
    if not _fit_points(out_dir / "points.csv", out_dir, spec.config.b_opt, spec.config.bootstrap_seed):
        raise typer.Exit(1)


@cbs_app.command("local")
def local_command(
    config: Path = typer.Argument(..., help="local-CBS YAML (see examples/cbs-local-tiny.yaml)."),
    overrides: list[str] = typer.Argument(None, help=OVERRIDES_HELP),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
) -> None:
    """Local CBS by branched training (arXiv 2505.23971): branches at k*B with LR x sqrt(k), same tokens."""
    spec, out_dir, result = _measure(config, overrides, out, load_local, run_local, LocalError)
    c = spec.config
    table = RichTable(title=f"local CBS: B={c.batch_size}, epsilon={c.epsilon} nats, LR x k^p ({c.lr_scaling})",
                      title_justify="left")
    for col in ("step", *(f"k={k}" for k in c.multipliers), "CBS"):
        table.add_column(col, justify="right")
    for p in result.points:
        cells = []
        for k in c.multipliers:
            loss = p.records[k].final_val_loss
            text = "n/a" if loss is None else f"{loss:.3f}"
            cells.append(text if p.within[k] else f"[yellow]{text}[/yellow]")
        table.add_row(str(p.step), *cells, str(p.local_cbs or "n/a"))
    console.print(table)
    console.print(f"validation loss after {result.points[0].tokens} tokens per branch; yellow: beyond epsilon",
                  highlight=False)
    console.print(f"wrote {out_dir / 'local.csv'}, {out_dir / 'local.json'}", highlight=False)
