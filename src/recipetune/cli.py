"""The ``recipetune`` command line. Bad input exits with code 2 and a message naming the problem.

A missing optional extra is bad input too, whatever the command: ``_Group`` turns it into the
``pip install`` line (core/errors.py ``missing_extra``) instead of a traceback.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

import recipetune
from recipetune.config import load_campaign
from recipetune.core.console import fail
from recipetune.core.errors import ConfigError, missing_extra
from recipetune.core.fmt import fmt_bytes
from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.workloads.base import Workload


class _Group(TyperGroup):
    """The top-level group: every command runs inside its ``invoke``, the tests' CliRunner included."""

    def invoke(self, ctx: typer.Context) -> object:
        try:
            return super().invoke(ctx)
        except ImportError as e:
            hint = missing_extra(e)
            if hint is None:  # not an optional extra: a bug, with its traceback
                raise
            raise fail(f"{_innermost(e, ctx).command_path}: {hint}") from None


def _innermost(e: BaseException, ctx: typer.Context) -> typer.Context:
    """The context of the command that was running when ``e`` was raised (``recipetune ft run``):
    the last click context on the traceback, as each group's ``invoke`` holds its own. Matched by
    what it has: typer carries its own copy of click, whose Context is not ``click.Context``."""
    tb = e.__traceback__
    while tb is not None:
        found = tb.tb_frame.f_locals.get("ctx")
        if hasattr(found, "command_path") and hasattr(found, "invoked_subcommand"):
            ctx = found
        tb = tb.tb_next
    return ctx


app = typer.Typer(
    cls=_Group,
    help="Search LLM training recipes, run them for real, approve a new one only on evidence.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()


def _print_version(value: bool) -> None:
    if value:
        print(f"recipetune {recipetune.__version__}")
        raise typer.Exit(0)


@app.callback()
def _group(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print the version and exit"),
) -> None:
    # Keeps `run` a named subcommand when it is the only one mounted (see _wanted).
    pass


def run_with_progress(
    workload: Workload, recipe: Recipe, steps: int, out_dir: Path, timeout_s: float, label: str
) -> RunResult:
    """One run in a subprocess, with a progress bar fed by its metrics stream."""
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("steps"), TimeElapsedColumn(), console=console, transient=True,
    ) as bar:
        task = bar.add_task(label, total=steps)
        return workload.run(
            recipe, steps, out_dir, timeout_s=timeout_s,
            progress=lambda done: bar.update(task, completed=min(done, steps)),
        )


def summary_table(result: RunResult, title: str) -> Table:
    s = result.summary()
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("status", result.status + (f" ({result.cause})" if result.cause else ""))
    table.add_row("steps", f"{len(result.steps)} ({s.warmup_steps} warm-up, {s.warmup_time_s:.2f}s, excluded)")
    if s.compile_s:  # apart from the steady figures below (trainer/profile.py: compile_figures)
        table.add_row("compile", f"{s.compile_s:.1f}s in torch.compile")
    if any(x.profiled for x in result.steps):  # a CUDA run's last steps, under torch.profiler: profile.json
        table.add_row("profiled", f"{sum(x.profiled for x in result.steps)} step(s), excluded (profile.json)")
    table.add_row("tokens/s", f"{s.tokens_per_s:,.0f}  (median over windows; mean {s.mean_tokens_per_s:,.0f})")
    if s.stalls:
        table.add_row("stalls", f"{s.stalls} step(s), {s.stall_time_s:.2f}s beyond a median step")
    table.add_row("tokens/s per device", f"{s.tokens_per_s_per_device:,.0f}  ({result.n_devices} device(s))")
    table.add_row("MFU", f"{100 * s.mfu:.2f}%" if s.mfu is not None else "n/a")
    table.add_row("step time", f"{1000 * s.mean_step_time_s:.1f} ms"
                  + "".join(f"  {k[:-2]} {1000 * v:.1f}" for k, v in s.breakdown_s.items()))
    table.add_row("peak memory", fmt_bytes(s.peak_mem_bytes))
    if s.loss_first is not None:
        table.add_row("loss", f"{s.loss_first:.4f} -> {s.loss_last:.4f}")
    if s.val_loss_last is not None:
        table.add_row("validation loss", f"{s.val_loss_last:.4f}")
    table.add_row("output", result.out_dir)
    return table


@app.command()
def run(
    campaign_file: Path = typer.Argument(..., help="campaign or recipe YAML"),
    overrides: list[str] = typer.Argument(None, help="key=value: a knob of the recipe, or a dotted field"),
    out: Path | None = typer.Option(None, help="output folder (default: runs/run-TIME-RECIPEID)"),
    steps: int | None = typer.Option(None, min=1, help="training steps (default: the file's run.steps)"),
) -> None:
    """Run one recipe for real and report tokens/s, MFU, memory and loss."""
    try:
        campaign = load_campaign(campaign_file, overrides or [])
    except ConfigError as e:
        raise fail(str(e)) from None
    recipe = campaign.baseline
    n_steps = campaign.config.run.steps if steps is None else steps
    out_dir = out or Path("runs") / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{recipe.id}"
    console.print(f"[bold]{campaign.workload.kind}[/] recipe {recipe.id}: {n_steps} steps -> {out_dir}")
    result = run_with_progress(
        campaign.workload, recipe, n_steps, out_dir, campaign.config.run.timeout_s, "training"
    )
    console.print(summary_table(result, f"run {recipe.id}"))
    if not result.ok:
        if result.stderr_tail:
            console.print(result.stderr_tail[-2000:], style="dim", markup=False, highlight=False)
        raise typer.Exit(2 if result.status == "invalid" else 1)


SUBCOMMANDS = ("cbs", "verify", "watch", "tune", "report", "show", "bench", "data", "ft", "finetune")


def _wanted(argv: list[str]) -> str | None:
    """The one subcommand this `recipetune` process runs; None (mount all) for help, tests, or a typo.

    Each trial and each `recipetune run` is a fresh process: mounting only the command it runs keeps
    matplotlib, scipy and optuna (seconds of imports) out of the processes that do not use them.
    """
    if not argv or Path(argv[0]).name not in ("recipetune", "cli.py"):
        return None
    first = next((a for a in argv[1:] if not a.startswith("-")), None)
    return first if first == "run" or first in SUBCOMMANDS else None


def _mlflow_live(folder: Path, tracking_uri: str):  # type: ignore[no-untyped-def]
    from recipetune.report.mlflow_live import MlflowLive  # the exporter loads only when asked for

    return MlflowLive(folder, tracking_uri)


def _mount_subcommands(wanted: str | None = None) -> None:
    if wanted in (None, "cbs"):
        from recipetune.cbs.cli import cbs_app

        app.add_typer(cbs_app, name="cbs")
    if wanted in (None, "verify"):
        from recipetune.speed.verify import verify

        app.command()(verify)
    if wanted in (None, "watch"):
        from recipetune.speed.watch import watch

        app.command()(watch)
    if wanted in (None, "tune", "finetune"):
        from recipetune.view.live import OBSERVERS

        OBSERVERS["mlflow"] = _mlflow_live  # `tune --mlflow`, `finetune --mlflow`: a view from report/
    if wanted in (None, "tune"):
        from recipetune.view.campaign import tune

        app.command()(tune)
    if wanted in (None, "report", "show"):
        from recipetune.report.cli import report, show

        app.command()(report)
        app.command()(show)
    if wanted in (None, "bench"):
        from recipetune.bench.cli import bench_app

        app.add_typer(bench_app, name="bench")
    if wanted in (None, "data", "ft"):
        from recipetune.finetune.cli import data_app, data_run, ft_app, ft_run

        data_app.command("run")(data_run)
        ft_app.command("run")(ft_run)
        app.add_typer(data_app, name="data")
        app.add_typer(ft_app, name="ft")
    if wanted in (None, "finetune"):
        from recipetune.view.campaign import finetune

        app.command()(finetune)


# `recipetune --version` alone needs none of them (`run` stays mounted: the group needs a command)
if not (Path(sys.argv[0]).name == "recipetune" and sys.argv[1:] == ["--version"]):
    _mount_subcommands(_wanted(sys.argv))


def main() -> None:  # pragma: no cover
    app()
