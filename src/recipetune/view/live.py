"""The live view of any campaign: the trial table redrawn as trials start, progress and end, the
verdict panel, and the run under it (Ctrl-C and errors say how to resume)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import make_url

from recipetune.core.console import fail
from recipetune.core.errors import missing_extra
from recipetune.core.filenames import STUDY_DB
from recipetune.core.recipe import Recipe
from recipetune.core.words import Decision
from recipetune.engine.job import Outcome, Reporter, Row
from recipetune.engine.status import Status
from recipetune.engine.store import STUDY_NAME, CampaignStore
from recipetune.engine.tree import Node
from recipetune.execute.executor import Executor

console = Console()
STATUS_STYLE = {Status.PASSED: "green", Status.REJECTED: "yellow", Status.FAILED: "red", Status.PRUNED: "magenta",
                "invalid": "magenta", Status.RUNNING: "cyan", Status.INTERRUPTED: "dim", Status.DUPLICATE: "dim",
                Status.SET_ASIDE: "dim yellow"}
MAX_ROWS = 40  # the table keeps the latest trials; the study keeps them all


RATIONALE_WIDTH = 120  # terminal columns from which the table shows the proposer's rationale
FIGURE_WIDTH = 100  # and the job's figure (tokens/s, train loss)


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def _clip(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, ending in an ellipsis: cut at a space, unless that
    would drop more than half of it (one long identifier), then inside that word."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    cut = len(head) if text[len(head)] == " " else head.rfind(" ")  # the cut falls between two words
    return (head[:cut] if cut >= limit // 2 else head).rstrip() + "…"


@dataclass(frozen=True)
class Columns:
    """A job's three columns of the trial table (Row.figure, Row.score, Row.check) and their formats."""

    figure: str
    score: str
    check: str
    figure_fmt: str
    score_fmt: str
    unit: str  # after a score: "x" for a speed-up
    none_better: str  # what the best line says while nothing has beaten the baseline


class Tee(Reporter):
    """One reporter that tells several: the live table, and observers (MLflow ...)."""

    def __init__(self, *reporters: Reporter):
        self.reporters = reporters

    def phase(self, text: str) -> None:
        for r in self.reporters:
            r.phase(text)

    def row(self, row: Row) -> None:
        for r in self.reporters:
            r.row(row)

    def progress(self, key: str, done: int, total: int) -> None:
        for r in self.reporters:
            r.progress(key, done, total)

    def best(self, node: Node | None, baseline: Recipe) -> None:
        for r in self.reporters:
            r.best(node, baseline)

    def campaign(self, done: int, total: int, elapsed_s: float, ended: bool = False) -> None:
        for r in self.reporters:
            r.campaign(done, total, elapsed_s, ended)

    def close(self) -> None:
        for r in self.reporters:
            r.close()


# Observers of a running campaign, by the option that asks for one: ``(folder, target) -> Reporter``.
# The command line registers them (cli.py: MLflow, from report/), so the campaign command
# (view/campaign.py) offers them without importing report/, its peer; it looks one up by name (``observer``).
OBSERVERS: dict[str, Callable[[Path, str], Reporter]] = {}


def observer(name: str, folder: Path, target: str) -> Reporter:
    """The registered observer ``name`` of the campaign in ``folder``; ValueError when none is."""
    if name not in OBSERVERS:
        raise ValueError(f"--{name} is not available in this program (no observer '{name}' registered)")
    return OBSERVERS[name](folder, target)


class LiveReporter(Reporter):
    """Keeps the rows of the trial table and redraws it as trials start, progress and end."""

    def __init__(self, columns: Columns, describe: Callable[[Recipe], str] | None = None) -> None:
        self.columns = columns
        self.describe = describe  # a node's change from the baseline, as the job words it
        self.rows: dict[str, Row] = {}
        self.steps: dict[str, str] = {}
        self.started: dict[str, float] = {}  # when each running trial started (time.monotonic)
        self.best_text = Text("best so far: the baseline", style="bold")
        self.campaign_text = Text("")
        self.live: Live | None = None
        # No terminal (a log, CI): nothing is redrawn until the end, so each trial as it starts and
        # lands, and the campaign's pace, are also printed as lines (run_live sets this)
        self.plain = False

    def render(self) -> Group:
        """The trial table, laid out for the width it is drawn at (``_TrialTable``), and the best line."""
        return Group(_TrialTable(self), self.best_text, self.campaign_text)

    def table(self, width: int) -> Table:
        """The trial table for ``width`` columns. Cells wrap at spaces only: a word too long for its
        column ends in an ellipsis, never continues on the next line. What a narrow terminal cannot
        hold goes first: the proposer's rationale (below RATIONALE_WIDTH), then the job's figure
        (below FIGURE_WIDTH); #, the change, the status, the score and a short check always stay."""
        c = self.columns
        wide = width >= RATIONALE_WIDTH
        table = Table(title="trials", title_justify="left", expand=False)
        table.add_column("#", justify="right", no_wrap=True)
        table.add_column("change", ratio=3, min_width=12, overflow="ellipsis")
        table.add_column("status", no_wrap=True, overflow="ellipsis")
        if width >= FIGURE_WIDTH:
            table.add_column(c.figure, justify="right", no_wrap=True)
        table.add_column(c.score, justify="right", no_wrap=True)
        table.add_column(c.check, ratio=2 if wide else None, min_width=10,
                         max_width=None if wide else 24, overflow="ellipsis")
        if wide:
            table.add_column("proposer: rationale", ratio=4, overflow="ellipsis")
        for row in list(self.rows.values())[-MAX_ROWS:]:
            status = row.status
            if row.status == "running":  # a narrow terminal keeps the steps, a wide one also the time
                status += self.running(row.key, timed=wide)
            cells: list[str | Text] = [
                "" if row.number is None else str(row.number),
                Text(row.change),
                Text(status, style=STATUS_STYLE.get(row.status, "red")),
            ]
            if width >= FIGURE_WIDTH:
                cells.append(_num(row.figure, c.figure_fmt))
            cells += [_num(row.score, c.score_fmt) + (c.unit if row.score is not None else ""),
                      Text(_clip(row.check or row.cause, 80))]
            if wide:
                rationale = f"{row.source}: {row.rationale}" if row.source else row.rationale
                cells.append(Text(_clip(rationale, 120), style="dim"))
            table.add_row(*cells)
        return table

    def _refresh(self) -> None:
        if self.live is not None:
            self.live.update(self.render())

    def phase(self, text: str) -> None:
        self._print(text, "bold blue")

    def running(self, key: str, timed: bool = True) -> str:
        """`` 12/30 0:14 eta 0:21``: the steps a running trial has done, its time, and what is left
        at that pace (no ETA before its first step)."""
        text = f" {self.steps[key]}" if key in self.steps else ""
        if not timed:
            return text
        elapsed = time.monotonic() - self.started.get(key, time.monotonic())
        done, _, total = self.steps.get(key, "").partition("/")
        text += f" {_clock(elapsed)}"
        if done.isdigit() and total.isdigit() and 0 < int(done) < int(total):
            text += f" eta {_clock(elapsed / int(done) * (int(total) - int(done)))}"
        return text

    def row(self, row: Row) -> None:
        self.rows[row.key] = row
        self.steps.pop(row.key, None)
        running = row.status == "running"
        if self.plain and not (running and row.key in self.started):  # a log: when it starts, when it lands
            self._print(self.line(row), "dim" if running else "")
        if running:
            self.started.setdefault(row.key, time.monotonic())
        self._refresh()

    def line(self, row: Row) -> str:
        """A trial as one line of a log: ``trial 3 running: epochs=4``, then ``trial 3 passed: epochs=4;
        exact_match 0.010; ...``."""
        c = self.columns
        parts = [f"trial {'-' if row.number is None else row.number} {row.status}: {row.change}"]
        if row.score is not None:
            parts.append(f"{c.score} {format(row.score, c.score_fmt)}{c.unit}")
        if row.figure is not None:
            parts.append(f"{c.figure} {format(row.figure, c.figure_fmt)}")
        if row.check or row.cause:
            parts.append(_clip(row.check or row.cause, 160))
        return "; ".join(parts)

    def _print(self, text: str, style: str = "") -> None:
        (self.live.console if self.live else console).print(Text(text, style=style))

    def progress(self, key: str, done: int, total: int) -> None:
        text = f"{done}/{total}"
        if self.steps.get(key) != text:
            self.steps[key] = text
            self._refresh()

    def best(self, node: Node | None, baseline: Recipe) -> None:
        if node is None:
            self.best_text = Text(f"best so far: the baseline ({self.columns.none_better})", style="bold")
        else:
            c = self.columns
            change = self.describe(node.recipe) if self.describe else node.recipe.describe_diff(baseline)
            self.best_text = Text(f"best so far: {change}  "
                                  f"{format(node.score, c.score_fmt)}{c.unit} (trial {node.trial})", style="bold green")
        self._refresh()

    def campaign(self, done: int, total: int, elapsed_s: float, ended: bool = False) -> None:
        eta = f", eta {_clock(elapsed_s / done * (total - done))}" if 0 < done < total and not ended else ""
        text = f"{done}/{total} runs, {_clock(elapsed_s)} of search{eta}"
        if self.plain and text != self.campaign_text.plain:
            self._print(text, "dim")
        self.campaign_text = Text(text, style="dim")
        self._refresh()


def _clock(seconds: float) -> str:
    """``0:14``, ``12:05``, ``1:02:03``."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class _TrialTable:
    """The reporter's table, built when drawn: only then is the console's width known."""

    def __init__(self, reporter: LiveReporter) -> None:
        self.reporter = reporter

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.reporter.table(options.max_width)


def decision_panel(outcome: Outcome, lines: list[Text], folder: Path, store: CampaignStore | None = None,
                   approved: str = "approved recipe", launch: str = "launch") -> Panel:
    """The verdict panel of any job: its evidence ``lines``, the reasons, the study, what to launch."""
    for reason in outcome.reasons:
        lines.append(Text(f"- {reason}"))
    if store is not None and store.name != STUDY_NAME:  # a shared database: the URL without its password
        url = make_url(store.url).render_as_string(hide_password=True)
        lines.append(Text(f"{outcome.runs} runs; study '{store.name}' in {url}  (optuna-dashboard {url})", style="dim"))
    else:
        lines.append(Text(f"{outcome.runs} runs; study: {folder / STUDY_DB}  (optuna-dashboard sqlite:///"
                          f"{(folder / STUDY_DB).resolve()}); report: recipetune report {folder}", style="dim"))
    if outcome.approved_file:
        lines.append(Text(f"{approved}: {outcome.approved_file}"))
        for cmd in outcome.launch:
            lines.append(Text(f"{launch}: {cmd}", style="bold"))
    style = "green" if outcome.decision == Decision.APPROVED else "yellow"
    return Panel(Group(*lines), title=f"[bold {style}]{outcome.decision}", border_style=style, expand=False)


def observers_for(folder: Path, mlflow: str | None) -> list[Reporter]:
    """The observers a campaign command's options ask for (``--mlflow``); bad input (exit 2), before
    anything is written, when this program has none or its extra is missing."""
    try:
        return [observer("mlflow", folder, mlflow)] if mlflow else []
    except (ValueError, RuntimeError) as e:
        raise fail(e) from None


def run_live(reporter: LiveReporter, run: Callable[..., Outcome], plan: Any, executor: Executor, again: str,
             messages: tuple[type[Exception], ...] = (), observers: list[Reporter] | None = None) -> Outcome:
    """Run a planned campaign under the live table: ``run(plan, executor=, reporter=)``, the job's run,
    told through the table and the ``observers`` (closed once it has decided). Ctrl-C (exit 130) and
    an error (exit 1) say how to resume: the study holds every finished trial. ``messages``: errors
    shown without a traceback. A missing optional extra is bad input (exit 2), with its ``pip install``
    line."""
    view = Tee(reporter, *(observers or []))
    reporter.plain = not console.is_terminal
    try:
        with Live(reporter.render(), console=console, refresh_per_second=4) as live:
            reporter.live = live
            outcome = run(plan, executor=executor, reporter=view)
            reporter.live = None
        view.close()
    except KeyboardInterrupt:
        console.print(Text.assemble(("stopped. ", "bold yellow"), f"Resume with: {again}"))
        raise typer.Exit(130) from None
    except Exception as e:
        hint = missing_extra(e)
        if hint is not None:  # bad input found late (a trial's import): the hint, not a traceback
            raise fail(f"{hint}\nAfter installing it, resume with: {again}") from None
        if not isinstance(e, messages):
            console.print_exception(max_frames=8)
        raise fail(f"{type(e).__name__}: {e}\nAfter fixing it, resume with: {again}", code=1) from None
    return outcome


