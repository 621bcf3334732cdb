"""`recipetune watch CAMPAIGN_FILE RUN_METRICS`: a training of the approved recipe against the baseline's curve.

A verdict compares short runs; an approved recipe then trains for days. ``watch`` reads the metrics
stream of such a run (finished, or growing with ``--follow``) the way the campaign file says its
workload writes them (the reference trainer's ``metrics.jsonl``, a command workload's JSONL or log
lines through its regex preset), and compares it block by block with the baseline's curve: the
``--baseline`` metrics files (e.g. last month's production run of the baseline recipe), or without
them the campaign folder's stored baseline runs (the profile, ``guard-runs/``), as speed/watch_read.py
reads them. The test is guard/drift.py's design, fed through guard/monitor.py: a gap beyond noise on
either side (a loss above the baseline's, or below it: data repeated or leaked), a false-alarm chance
of ``--alpha`` over the whole compared length, the noise the guard measured (docs/guard.md, "After
approval: recipetune watch"). Where the run and its baselines record a validation loss, both losses are
judged, each at ``alpha / 2``, and the first alarm decides (``--measure`` forces one); the training loss
otherwise.

Exit codes: 0 no alarm, 5 alarm, 2 bad input (a missing file, a stream with no loss, a baseline of
another workload or recipe, steps that do not line up; nothing written).
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import typer
from rich.console import Console

from recipetune.config import Campaign, load_campaign
from recipetune.core.console import fail
from recipetune.core.errors import ConfigError
from recipetune.core.files import write_atomic
from recipetune.guard import drift
from recipetune.guard.loss import tolerance_of
from recipetune.guard.monitor import Event, EventKind, Measure, Monitor, Monitors, Outcome
from recipetune.speed.watch_read import (
    Baseline,
    Stream,
    WatchInput,
    check_recipe,
    check_tokens,
    ended,
    given_baseline,
    metrics_files,
    no_loss,
    read_curves,
    stored_baseline,
)

EXIT_ALARM = 5


AUTO = "auto"  # --measure: both losses where the run and its baselines record a validation loss, else the training loss
MEASURE_CHOICES = (AUTO, *Measure)


@dataclass
class Session:
    campaign: Campaign
    run: Path
    files: list[Path]
    baseline: Baseline
    start_step: int
    alpha: float
    persist: int
    measure: str = AUTO  # asked for: AUTO, or a Measure's value
    following: bool = False
    monitors: Monitors | None = None
    measure_why: str = ""  # why the judged curves are the ones judged
    points: int = 0  # the run's logged losses read, at the last read

    def begin(self, stream: Stream, final: bool) -> Monitors | None:
        """The plans, once the run has logged enough to tell its logging interval and which losses it
        is judged on (None: not yet, a growing run may still log its first validation losses). Each
        judged loss spends ``alpha / k`` of the run's false-alarm chance (Bonferroni, k losses)."""
        check_tokens(self.baseline, stream.tokens, self.run)
        chosen = self._choose(stream, final)
        if chosen is None:
            return None
        measures, self.measure_why = chosen
        alpha = self.alpha / len(measures)
        self.monitors = Monitors([self._monitor(m, stream, alpha) for m in measures])
        return self.monitors

    def _monitor(self, measure: Measure, stream: Stream, alpha: float) -> Monitor:
        """One loss's monitor: its T, and its blocks tuned for a drift of 1 T per the guard's horizon."""
        parity, b = self.campaign.config.guard.parity, self.baseline
        curves, run, sigma_m, dof = ((b.val_curves, stream.val, None, None) if measure is Measure.VAL_LOSS else
                                     (b.curves, stream.loss, b.sigma_m, b.sigma_dof))
        tol = b.tolerance if measure is Measure.LOSS else None  # the profile's T: the training loss's
        if tol is None:  # T as the verdict would set it (parity.margin, or tolerance x sigma): sigma the seed
            first = self._plan(curves, run, sigma_m, dof, alpha)  # spread of a tail's mean, measured here
            n, tail_points = first.noise, max(1.0, parity.tail * parity.steps / first.interval)
            tol = tolerance_of(n.tail_spread(tail_points), parity)
        return Monitor(self._plan(curves, run, sigma_m, dof, alpha, tol / parity.steps), tol, measure)

    def _plan(self, curves: list[drift.Curve], run: drift.Curve, sigma_m: float | None,
              sigma_dof: int | None, alpha: float, rate: float | None = None) -> drift.Plan:
        interval = drift.logging_interval(run.steps[:50])  # the run has logged two points or more
        if interval < 1:
            raise WatchInput(f"{self.run}: its steps do not increase ({', '.join(map(str, run.steps[:6]))} ...)")
        min_block = max(3, math.ceil(self.campaign.config.guard.parity.window / interval))
        design = drift.Design(min_block, alpha, self.persist, sigma_m, sigma_dof, rate)
        return drift.plan(curves, run.steps[:50], self.start_step, design)

    def _choose(self, stream: Stream, final: bool) -> tuple[list[Measure], str] | None:
        """(measures, why): both losses where the run and at least two baseline runs record a validation
        loss at enough common steps for ``persist`` blocks (its seed spread is measured on those curves:
        the profile's is the training loss's), the training loss otherwise; ``--measure`` forces one."""
        b, val = self.baseline, stream.val
        if len(stream.loss.steps) < 2:
            return None
        loss = "the training loss (--measure loss)" if self.measure == Measure.LOSS else None
        if loss is None:
            recorded = [c for c in b.val_curves if len(c.steps[c.steps >= self.start_step]) >= 2]
            if len(recorded) < len(b.val_curves) or len(recorded) < 2:
                loss = (f"the training loss: {len(recorded)} of the {len(b.val_curves)} baseline run(s) record a "
                        f"validation loss from step {self.start_step} (two or more are needed: its seed spread is "
                        "measured on them)")
            elif len(val.steps) < 2:
                due = np.unique(np.concatenate([c.steps for c in recorded]))
                due = due[due >= self.start_step]
                if not final and len(due) >= 3 and stream.loss.steps[-1] <= due[2]:
                    return None  # the run may yet log its validation losses
                loss = "the training loss: the run records no validation loss where its baselines do"
        if loss is None:
            try:
                plan = self._plan(b.val_curves, val, None, None, self.alpha)
            except drift.DriftInputError as e:
                if self.measure == Measure.VAL_LOSS:
                    raise
                loss = f"the training loss: the validation loss cannot be judged ({e})"
            else:
                recorded = (f"the validation loss (every {plan.interval} steps), which the run and its "
                            f"{len(b.val_curves)} baseline runs record")
                if self.measure == Measure.VAL_LOSS:
                    return [Measure.VAL_LOSS], f"{recorded}, not the training loss (--measure val_loss)"
                return [Measure.LOSS, Measure.VAL_LOSS], (
                    f"both losses: the training loss and {recorded}, each at alpha / 2 (whichever alarms first "
                    "decides): a bug that lowers the training loss may leave the validation loss, and the "
                    "validation loss's sparse points alarm later")
        if self.measure == Measure.VAL_LOSS:
            raise WatchInput(f"{self.run}: --measure val_loss: {loss.split(': ', 1)[1]}")
        return [Measure.LOSS], loss

    def read(self, final: bool = False) -> tuple[Stream, list[Event]]:
        stream = read_curves(self.campaign, self.run, self.files)
        self.points = len(stream.loss.steps)
        final = final or not self.following
        if self.monitors is None:
            self.begin(stream, final)
        if self.monitors is None:
            return stream, []
        return stream, self.monitors.feed({Measure.LOSS: stream.loss, Measure.VAL_LOSS: stream.val}, final)


class Lines:
    """What the watch says: a live line on a terminal; in a log, plain lines (each warning, alarm and
    all-clear, and about twenty progress lines per judged loss over the run)."""

    def __init__(self, console: Console):
        self.console, self.status, self.every, self.blocks = console, None, {}, dict.fromkeys(Measure, 0)
        self.several = False

    def __enter__(self) -> Lines:
        if self.console.is_terminal:
            self.status = self.console.status("waiting for the run's first losses")
            self.status.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.status is not None:
            self.status.__exit__(*exc)

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def plan(self, m: Monitor, per_horizon: str) -> None:
        p, n = m.plan, m.plan.noise
        self.every[m.measure] = max(1, len(p.blocks) // 20)
        self.say(f"comparing the {m.measure.said} at steps {p.blocks[0][0]}-{p.blocks[-1][-1]} "
                 f"in {len(p.blocks)} blocks of "
                 f"{n.block_points} logged steps against the mean of {max(p.m)} baseline curve(s); an alarm needs "
                 f"{p.persist} blocks in a row beyond {p.h:.2f} sd on one side, above or below "
                 f"(gap {p.bounds.min():.4f}-{p.bounds.max():.4f} nats, T = {m.tolerance:.4f}); "
                 f"false-alarm chance {100 * p.alpha:.3g}% over them; {per_horizon}")

    def show(self, events: list[Event], ms: Monitors | None, step: int) -> None:
        for e in events:
            what = f" ({e.measure.said})" if self.several else ""
            if e.kind is EventKind.BLOCK:
                self.blocks[e.measure] += 1
                if self.status is None and self.blocks[e.measure] % self.every.get(e.measure, 1) == 0:
                    self.say(f"step {e.step}: gap{what} {e.gap:+.4f} nats (boundary {e.bound:.4f})")
            else:
                self.say(f"step {e.step}: {e.kind.upper()}: {e.message}")
        if self.status is not None and ms is not None and any(m.gaps for m in ms):
            self.status.update(f"step {step}: " + "; ".join(
                f"{m.measure.said} gap {m.gaps[-1][1]:+.4f} nats at step {m.gaps[-1][0]}, boundary "
                f"{m.gaps[-1][2]:.4f}, {m.done}/{len(m.plan.blocks)} blocks, "
                f"{m.side if m.streak else 'within'}" for m in ms if m.gaps))


def follow(session: Session, lines: Lines, keep_following: bool, poll_s: float) -> str:
    """Read and judge until the run is judged to its end: returns what ended the watch."""
    while True:
        done_before = ended(session.run)  # read after the marker appeared: nothing more will come
        had_plan = session.monitors is not None
        stream, events = session.read(final=done_before)
        ms = session.monitors
        if ms is not None and not had_plan:
            lines.say(f"judged on {session.measure_why}")
            for copy in session.baseline.replicas:
                lines.say(f"baseline {copy}")
            lines.several = len(ms.monitors) > 1
            for m in ms:
                lines.plan(m, per_horizon(session, m))
        lines.show(events, ms, int(stream.loss.steps[-1]) if len(stream.loss.steps) else 0)
        if ms is not None and ms.alarm is not None:
            return "alarm"
        if ms is not None and ms.finished:
            return f"the baseline's curve: its last whole block ends at step {ms.last_step}"
        if not keep_following or done_before:
            if ms is None:
                raise no_loss(session.campaign, session.run)
            return "the run's status file (it has ended)" if done_before else "the end of the metrics file"
        time.sleep(poll_s)


def per_horizon(session: Session, m: Monitor) -> str:
    """The delay the design promises for a drift of 1 T per the guard's horizon (docs/guard.md)."""
    horizon = session.campaign.config.guard.parity.steps
    d = drift.delay_steps(m.plan, m.tolerance / horizon)
    return f"a drift of 1 T per {horizon} steps alarms about {d:,.0f} steps after it begins"


def finding(session: Session, ended_by: str, seconds: float, command: str) -> dict[str, Any]:
    """The deciding loss's finding (the one that alarmed, else the first judged) at the top level, as
    with one judged loss; the other judged loss's in ``also_judged``."""
    ms = session.monitors
    assert ms is not None
    m = ms.decider
    out: dict[str, Any] = {"decision": m.outcome, "exit_code": EXIT_ALARM if m.outcome is Outcome.ALARM else 0,
                           "run": str(session.run), "workload": session.campaign.workload.kind,
                           "baseline": session.baseline.sources, "baseline_left_out": session.baseline.replicas,
                           "ended_by": ended_by,
                           "run_points_read": session.points, "delay": per_horizon(session, m)}
    out.update(m.finding())
    out["measures"] = [x.measure for x in ms]
    out["alpha"] = session.alpha  # the whole run's: each judged loss's design holds its share
    out["also_judged"] = [{**x.finding(), "delay": per_horizon(session, x)} for x in ms if x is not m]
    out["measure_why"] = session.measure_why
    out["covered"] = (f"steps {min(int(x.plan.blocks[0][0]) for x in ms)}-{ms.last_step}: the baseline's curve "
                      "has no later step; a longer run of the baseline recipe (--baseline) covers more"
                      ) if ms.finished and not ms.alarm else ""
    out["cost"] = {"seconds": round(seconds, 2), "runs_trained": 0}
    out["command"] = command
    return out


def summary(f: dict[str, Any]) -> str:
    a, what = f["alarm"], Measure(f["measure"]).said
    if a is not None:
        if a["gap_nats"] is None:
            return f"{Outcome.ALARM} at step {a['step']}: {a['message']}"
        in_t = f" ({a['gap_in_T']:+.1f} T)" if a.get("gap_in_T") is not None else ""
        return (f"{Outcome.ALARM} at step {a['step']}: the run's {what} is {a['direction']} the baseline's: the gap "
                f"crossed the boundary at step {a['crossed_at_step']} and reads {a['gap_nats']:+.4f} nats{in_t} "
                f"against a boundary of {math.copysign(a['bound_nats'], a['gap_nats']):+.4f}")
    parts = []
    for x in [f, *f.get("also_judged", [])]:
        cleared = sum(w["cleared_at"] is not None for w in x["warnings"])
        warned = f"; {cleared} warning(s) that cleared" if cleared else ""
        if cleared < len(x["warnings"]):  # a streak beyond the boundary still open where the watch ended
            w = x["warnings"][-1]
            warned += f"; a warning still open: {w['blocks']} block(s) {w['direction']} from step {w['from_step']}"
        parts.append(f"the {Measure(x['measure']).said} over {x['blocks_judged']} block(s) to step "
                     f"{x['last_judged_step']}{warned}")
    return f"{Outcome.NO_ALARM} on {' and on '.join(parts)} (ended by {f['ended_by']})"


def watch(
    campaign_file: Path = typer.Argument(..., help="the campaign file: how the workload writes its metrics, the guard"),
    run_metrics: Path = typer.Argument(..., help="the run's metrics file, or its run folder"),
    baseline: list[Path] = typer.Option(None, "--baseline", help="metrics file (or run folder) of a run of the "
                                        "baseline recipe; repeat for several (default: the campaign folder's)"),
    folder: Path | None = typer.Option(None, help="the campaign's folder (default: campaigns/<file name>)"),
    follow_: bool = typer.Option(False, "--follow", help="follow a growing file until the run ends (or Ctrl-C)"),
    out: Path | None = typer.Option(None, help="the finding as JSON (default: runs/watch-TIME.json)"),
    alpha: float = typer.Option(drift.ALPHA, min=1e-6, max=0.5, help="false-alarm chance over the whole run"),
    persist: int = typer.Option(drift.PERSIST, min=1, max=100, help="blocks in a row beyond the boundary for an alarm"),
    start_step: int | None = typer.Option(None, min=0, help="first step compared (default: where the guard's "
                                          "loss measure starts, (1 - guard.parity.tail) x guard.parity.steps)"),
    poll_s: float = typer.Option(2.0, min=0.01, help="with --follow: seconds between reads"),
    measure: str = typer.Option("auto", help="the loss judged: auto (both the training and the validation loss, "
                                "each at alpha / 2, where the run and two or more baseline runs record a validation "
                                "loss; else the training loss), loss, val_loss"),
) -> None:
    """Compare a training of the approved recipe with the baseline's curve: alarm when the gap grows beyond noise,
    above or below it.

    Exit code 0: no alarm; 5: alarm; 2: bad input.
    """
    started = time.monotonic()
    console = Console(soft_wrap=True)  # a log keeps each line whole
    try:
        campaign = load_campaign(campaign_file, [])
        parity = campaign.config.guard.parity
        where = folder if folder is not None else Path("campaigns") / campaign_file.stem
        files = metrics_files(campaign, run_metrics)
        if not follow_ and not any(f.exists() for f in files):
            raise WatchInput(f"{run_metrics}: holds no {', '.join(f.name for f in files)}")
        check_recipe(campaign, run_metrics if run_metrics.is_dir() else run_metrics.parent, f"the run {run_metrics}")
        base = given_baseline(campaign, baseline, where) if baseline else stored_baseline(campaign, where)
        start = start_step if start_step is not None else max(1, round((1 - parity.tail) * parity.steps))
        if measure not in MEASURE_CHOICES:
            raise WatchInput(f"--measure {measure!r}: allowed are {', '.join(MEASURE_CHOICES)}")
        session = Session(campaign, run_metrics, files, base, start, alpha, persist, measure, follow_)
        with Lines(console) as lines:
            try:
                ended_by = follow(session, lines, follow_, poll_s)
            except KeyboardInterrupt:
                if session.monitors is None:
                    raise fail("stopped before the run logged a comparable step; nothing written", 130) from None
                ended_by = "Ctrl-C"
    except (ConfigError, WatchInput, drift.DriftInputError) as e:
        raise fail(e) from None
    result = finding(session, ended_by, time.monotonic() - started, " ".join(["recipetune", *sys.argv[1:]]))
    target = out or Path("runs") / f"watch-{time.strftime('%Y%m%d-%H%M%S')}.json"
    write_atomic(target, json.dumps(result, indent=2, default=float, allow_nan=False))
    console.print(summary(result), highlight=False, markup=False,
                  style="bold red" if result["alarm"] else "bold green")
    console.print(f"finding: {target}", highlight=False, markup=False)
    raise typer.Exit(result["exit_code"])
