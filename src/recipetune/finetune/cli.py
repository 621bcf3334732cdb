"""`recipetune data run` (the data chain alone) and `recipetune ft run` (one experiment)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from recipetune.core.console import fail
from recipetune.core.errors import ConfigError, require_extra

if TYPE_CHECKING:
    from recipetune.finetune.recipe import ModelSpec

data_app = typer.Typer(help="Data operators (load, dedup, filters, decontamination, mixing ...) as a YAML chain.",
                       no_args_is_help=True)
ft_app = typer.Typer(help="Fine-tuning experiments: data chain -> fine-tune -> evaluate.", no_args_is_help=True)
console = Console()


@data_app.callback()
def _data() -> None:
    """The data chain of an experiment file."""


@ft_app.callback()
def _ft() -> None:
    """Fine-tuning experiments."""


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def chain_table(version) -> Table:
    table = Table(title=f"data version {version.id}: {version.rows_in} -> {version.rows_out} training rows",
                  title_justify="left")
    for col, just in (("#", "right"), ("operator", "left"), ("in", "right"), ("out", "right"),
                      ("added", "right"), ("removed (why)", "left"), ("cache", "left"), ("s", "right")):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for s in version.operators:
        removed = ", ".join(f"{n} {reason}" for reason, n in s.removed.items())
        if s.kept:  # found but kept, as the step was told or as its rule says (a renamed copy's family)
            removed += ("; " if removed else "") + "kept: " + ", ".join(f"{n} {reason}" for reason, n in s.kept.items())
        removed = removed or "-"
        name = s.op + (" (always on)" if s.implicit else "")
        table.add_row(str(s.index), name, str(s.rows_in), str(s.rows_out), str(s.added or ""), Text(removed),
                      "hit" if s.cached else "", f"{s.seconds:.2f}")
    return table


def data_run(
    experiment_file: Path = typer.Argument(..., help="experiment YAML (task + data chain)"),
    overrides: list[str] = typer.Argument(None, help="key=value: a dotted field (task.max_eval_examples=50)"),
    out: Path | None = typer.Option(None, help="output folder (default: runs/data-TASK-TIME)"),
) -> None:
    """Run the data chain alone: what each operator kept and removed, and the data version."""
    from recipetune.data.operators import write_rows
    from recipetune.finetune.experiment import load_experiment, prepare_data

    try:
        exp = load_experiment(experiment_file, overrides or [])
        folder = out or Path("runs") / f"data-{exp.spec.task.name}-{_stamp()}"
        rows, version = prepare_data(exp, folder)
    except ConfigError as e:
        raise fail(e) from None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data_version.json").write_text(version.model_dump_json(indent=2))
    write_rows(folder / "train.jsonl", rows)
    console.print(chain_table(version))
    console.print(f"sources: {', '.join(f'{k} {v}' for k, v in version.sources.items())}", style="dim")
    console.print(f"written: {folder / 'train.jsonl'}, {folder / 'data_version.json'}")


def ensure_base(model: ModelSpec) -> None:
    """Build the reference route's base model first where it must be built (neither cached nor a matching
    shipped one: another size, another Python's stdlib, a shipped file that fails its sha256, or
    ``RECIPETUNE_BUILD_BASE=1``), saying why, under a progress bar: the one wait before a first experiment
    can train (400 steps of 8 x 256 bytes, about 137 CPU s on one thread: docs/finetune.md, "The time of a
    first experiment")."""
    if model.kind != "reference" or model.path != "base":
        return
    from rich import progress as rp

    from recipetune.finetune.base_model import base_checkpoint, base_to_build

    build = base_to_build(model)
    if build is None:
        return
    console.print(f"building the base model: {build[1]}", style="yellow")
    columns = (rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(), rp.TextColumn("steps"),
               rp.TimeElapsedColumn(), rp.TextColumn("eta"), rp.TimeRemainingColumn())
    with rp.Progress(*columns, console=console) as bar:
        task = bar.add_task(f"base model {model.preset} (once; then cached)", total=model.pretrain_steps)
        path = base_checkpoint(model, log=lambda text: None,
                               progress=lambda done, total: bar.update(task, completed=done))
    console.print(f"base model: {path}", style="dim")


def report_tables(report) -> list[Table]:
    summary = Table(title=f"experiment {report.id} ({report.task}, {report.route} route)", show_header=False,
                    title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("status", report.status + (f" ({report.cause})" if report.cause else ""))
    if report.validation:
        v = report.validation
        summary.add_row(f"validation {v.metric}", f"{v.value:.4f}  ({v.n_examples} examples)")
        for name, value in v.metrics.items():
            if name != v.metric:
                summary.add_row(f"validation {name}", f"{value:.4f}")
    if report.loss.steps:
        summary.add_row("train loss", f"{report.loss.first:.4f} -> {report.loss.last:.4f} "
                                      f"(min {report.loss.min:.4f}, {report.loss.steps} steps)")
    t = report.timings_s
    summary.add_row("time", f"{t.get('total', 0):.1f}s (data {t.get('data', 0):.1f}, load {t.get('load', 0):.1f}, "
                            f"train {t.get('train', 0):.1f}, eval {t.get('eval', 0):.1f})")
    from recipetune.core.fmt import fmt_bytes

    summary.add_row("peak memory", fmt_bytes(report.peak_mem_bytes))
    params = report.params
    summary.add_row("parameters", f"{params.get('trainable', 0):,} trainable of {params.get('total', 0):,}")
    summary.add_row("data", f"version {report.data.id}: {report.data.rows_out} rows "
                            f"({report.data.rows_in} before the chain); {report.truncated_train_examples} truncated")
    summary.add_row("output", report.run_dir)
    tables = [summary]
    if report.validation and report.validation.errors:
        worst = Table(title="worst validation cases by kind of error", title_justify="left")
        for col in ("kind", "count", "prompt", "target", "prediction"):
            worst.add_column(col, overflow="fold")
        for group in report.validation.errors:
            for i, p in enumerate(group.examples[:2]):
                worst.add_row(group.kind if i == 0 else "", f"{group.count} ({group.share:.0%})" if i == 0 else "",
                              Text(p.prompt[-60:]), Text(p.target[:40]), Text(p.prediction[:40]))
        tables.append(worst)
    return tables


def ft_run(
    experiment_file: Path = typer.Argument(..., help="experiment YAML (task, data, model, recipe)"),
    overrides: list[str] = typer.Argument(None, help="key=value: a recipe knob (lr=1e-3), or a dotted field"),
    out: Path | None = typer.Option(None, help="run folder (default: runs/ft-TASK-TIME-ID)"),
    final: bool = typer.Option(False, "--final", help="also the final evaluation on the TEST split, over --seeds"),
    seeds: str = typer.Option("0,1,2", help="seeds of the final evaluation"),
) -> None:
    """One experiment: data chain -> fine-tune -> evaluate on validation, with its report."""
    from recipetune.finetune.experiment import load_experiment, prepare_data, run_experiment
    from recipetune.finetune.plan import needed_modules

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise fail(f"--seeds: comma-separated integers, got {seeds!r}") from None
    if final and not seed_list:
        raise fail(f"--seeds: at least one seed for --final, got {seeds!r}")
    try:
        exp = load_experiment(experiment_file, overrides or [])
        # a missing extra refused before the data chain runs, not after it (or after training)
        require_extra(needed_modules(exp.spec, {exp.spec.recipe.method}), experiment_file)
        folder = out or Path("runs") / f"ft-{exp.spec.task.name}-{_stamp()}-{exp.id}"
        rows, version = prepare_data(exp, folder)  # an export step writes into the run folder
        console.print(chain_table(version))
        ensure_base(exp.spec.model)
        with console.status("running the experiment ...") as status:
            report = run_experiment(exp, folder, rows, version, log=lambda text: status.update(text))
    except ConfigError as e:
        raise fail(e) from None
    for table in report_tables(report):
        console.print(table)
    if report.status != "ok":
        raise typer.Exit(1)
    if final:
        from recipetune.finetune.final import final_evaluation

        with console.status("final evaluation on the test split ...") as status:
            result = final_evaluation(exp, seed_list, folder / "final", log=lambda text: status.update(text))
        console.print(Text.assemble(
            ("test ", "bold"), f"{result.metric}: {result.mean:.4f} ± {result.std:.4f} over seeds {result.seeds} ",
            f"(values {', '.join(f'{v:.4f}' for v in result.values)}); {folder / 'final' / 'final.json'}"))
