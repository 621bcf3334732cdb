"""`recipetune report RUN_DIR` (one HTML page + report.json) and `recipetune show RUN_DIR` (the terminal)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from recipetune.core.console import fail
from recipetune.report.build import load_report
from recipetune.report.model import Report
from recipetune.report.sources import NotACampaign

console = Console()


def _load(run_dir: Path) -> Report:
    try:
        return load_report(run_dir)
    except NotACampaign as e:
        raise fail(e) from None


def report(
    run_dir: Path = typer.Argument(..., help="campaign folder written by `recipetune tune` or `recipetune finetune`"),
    out: Path | None = typer.Option(None, help="HTML file to write (default: RUN_DIR/report.html); "
                                               "report.json goes beside it"),
    mlflow: str | None = typer.Option(None, help="also export every trial to this MLflow tracking URI "
                                                 "(e.g. sqlite:///mlflow.db); needs the mlflow extra"),
    screenshot: Path | None = typer.Option(None, help="also save a PNG of the page's top (headless chromium), "
                                                      "e.g. for docs"),
) -> None:
    """Write the campaign's report: one self-contained HTML page and the same data as JSON."""
    target = out or run_dir / "report.html"
    if target.suffix.lower() not in (".html", ".htm"):
        raise fail(f"--out {target}: expected a .html file (report.json is written beside it)")
    if mlflow is not None:
        from recipetune.report.mlflow_export import MlflowUnavailable, require_mlflow

        try:
            require_mlflow()
        except MlflowUnavailable as e:
            raise fail(e) from None
    if screenshot is not None:
        from recipetune.report.browser import find_chromium

        if find_chromium() is None:
            raise fail("--screenshot needs chromium on PATH (Debian: apt-get install chromium)")
    r = _load(run_dir)
    if mlflow is not None:
        from recipetune.report.mlflow_export import export

        n = export(run_dir, mlflow)
        console.print(Text(f"exported {n} trials to MLflow at {mlflow}"))
    from recipetune.report.html import write_report

    page, data = write_report(r, target)
    console.print(Text.assemble((r.decision, "bold"), f"  {page}  (data: {data})"))
    if screenshot is not None:
        from recipetune.report.browser import screenshot as take

        try:
            messages = take(page, screenshot)
        except RuntimeError as e:
            raise fail(f"--screenshot: {e}", 1) from None
        console.print(Text(f"screenshot: {screenshot}; console: " + ("; ".join(messages) or "clean")))


def show(run_dir: Path = typer.Argument(..., help="campaign folder written by `recipetune tune` or "
                                                  "`recipetune finetune`")) -> None:
    """Print the campaign's verdict, its trials and its search tree."""
    from recipetune.report.terminal import render

    console.print(render(_load(run_dir), console.width))
