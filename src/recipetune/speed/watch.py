"""`recipetune watch CAMPAIGN_FILE RUN_METRICS`: a training of the approved recipe against the baseline's curve.

A verdict compares short runs; an approved recipe then trains for days. ``watch`` reads the metrics
stream of such a run (finished, or growing with ``--follow``) the way the campaign file says its
workload writes them (the reference trainer's ``metrics.jsonl``, a command workload's JSONL or log
lines through its regex preset), and compares it block by block with the baseline's curve: the
``--baseline`` metrics files (e.g. last month's production run of the baseline recipe), or without
them the campaign folder's stored baseline runs (the profile, ``guard-runs/``). The test is
guard/drift.py's: a false-alarm chance of ``--alpha`` over the whole compared length, the noise the
guard measured (docs/guard.md, "After approval: recipetune watch").

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
from recipetune.core.filenames import PROFILE, RESULT, RUNS_FOLDER
from recipetune.core.files import write_atomic
from recipetune.core.measure import RunResult
from recipetune.core.recipe import INVARIANT
from recipetune.guard import drift
from recipetune.guard.baseline import BaselineProfile
from recipetune.workloads import log_formats
from recipetune.workloads.command import CommandWorkload, substitute

EXIT_ALARM = 5


class WatchInput(ValueError):
    """Bad input: a message naming the file and what is wrong (exit 2)."""


# ------------------------------------------------------------------------------------ reading curves


def metrics_files(campaign: Campaign, path: Path) -> list[Path]:
    """The files holding a run's metrics: ``path`` itself, or where the workload writes them in a run folder."""
    if not path.exists():
        raise WatchInput(f"{path}: no such file or folder")
    if path.is_file():
        return [path]
    w = campaign.workload
    if isinstance(w, CommandWorkload):
        if w.spec.metrics.jsonl:
            return [path / Path(substitute(w.spec.metrics.jsonl, {"out_dir": "", **_blank(w)})).name]
        return [path / "stdout.log", path / "stderr.log"]
    return [path / "metrics.jsonl"]


def _blank(w: CommandWorkload) -> dict[str, str]:
    names = {*w.knobs(), "steps", "recipe_json", "python"}
    return dict.fromkeys(names, "")


def read_curve(campaign: Campaign, path: Path, files: list[Path]) -> tuple[drift.Curve, int | None]:
    """(the training loss curve, tokens per step) of the run in ``files``; a torn last line waits."""
    w = campaign.workload
    tps = w.tokens_per_step(campaign.baseline) if isinstance(w, CommandWorkload) else None
    try:
        if isinstance(w, CommandWorkload) and w.preset is not None:
            steps, _ = log_formats.read_logs(files, w.preset, tps, w.n_devices(campaign.baseline))
        else:
            steps, _ = log_formats.read_jsonl(files[0], tps, w.n_devices(campaign.baseline))
    except (log_formats.MetricsError, OSError, UnicodeError) as e:
        raise WatchInput(f"{path}: {e}") from None
    tokens = steps[0].tokens if steps else None
    return drift.Curve.of([s.step for s in steps], [s.loss for s in steps], str(path)), tokens


def _no_loss(campaign: Campaign, path: Path) -> WatchInput:
    w = campaign.workload
    how = (f"log lines matching the '{w.preset.name}' preset" if isinstance(w, CommandWorkload) and w.preset
           else "JSON lines with step and loss")
    return WatchInput(f"{path}: no training loss in it ({how}, as the campaign's {w.kind} workload writes them)")


def _check_recipe(campaign: Campaign, folder: Path, what: str) -> None:
    """A run folder's recipe.json, where there is one, must be a recipe of the campaign's workload with
    the baseline's invariants (model, data, sequence length): another workload's run is bad input."""
    file = folder / "recipe.json"
    if not file.is_file():
        return
    try:
        recipe = json.loads(file.read_text())
    except (OSError, ValueError):
        return
    _same_experiment(campaign, recipe, f"{what} ({file})")


def _same_experiment(campaign: Campaign, recipe: dict[str, Any], what: str) -> None:
    knobs = campaign.workload.knobs()
    foreign = sorted(set(recipe) - set(knobs))
    if foreign:
        raise WatchInput(f"{what} is a run of another workload: knob(s) {', '.join(foreign[:5])} are not the "
                         f"campaign's {campaign.workload.kind} workload's")
    for name, knob in knobs.items():
        if knob.role == INVARIANT and name != "seed" and name in recipe and recipe[name] != campaign.baseline[name]:
            raise WatchInput(f"{what} trains another experiment: {name} = {recipe[name]!r}, the campaign's "
                             f"baseline has {campaign.baseline[name]!r}")


@dataclass
class Baseline:
    curves: list[drift.Curve]
    tokens: list[int | None]
    sigma_m: float | None  # the guard's seed-to-seed spread (the profile), where there is one
    sigma_dof: int | None  # its degrees of freedom (None: the within-run error decided it)
    tolerance: float | None  # the profile's T
    sources: list[str]


def stored_baseline(campaign: Campaign, folder: Path) -> Baseline:
    """The campaign folder's profile and the stored runs of the baseline recipe (any seed)."""
    runs: list[RunResult] = []
    sigma = tol = dof = None
    profile_file = folder / PROFILE
    if profile_file.is_file():
        try:
            profile = BaselineProfile.model_validate_json(profile_file.read_text())
        except (OSError, ValueError) as e:
            raise WatchInput(f"{profile_file}: not a baseline profile ({str(e).splitlines()[0]})") from None
        _same_experiment(campaign, profile.recipe, f"the baseline profile {profile_file}")
        sigma, tol = profile.loss_reference, profile.loss_tolerance
        seeded = profile.loss_reference_kind.startswith("seed-to-seed")
        dof = len(profile.seeds) - 1 if seeded else None
        runs += profile.runs
    base = {k: v for k, v in campaign.baseline.items() if k != "seed"}
    for result_file in sorted((folder / RUNS_FOLDER).glob(f"*/{RESULT}")):
        try:
            r = RunResult.model_validate_json(result_file.read_text())
        except (OSError, ValueError):
            continue
        if r.ok and {k: v for k, v in r.recipe.items() if k != "seed"} == base:
            runs.append(r)
    unique: dict[tuple, RunResult] = {}
    for r in runs:  # the profile's runs are stored in guard-runs/ too
        unique.setdefault((r.recipe.get("seed"), len(r.steps), tuple(r.losses()[:3])), r)
    if not unique:
        raise WatchInput(f"{folder}: no baseline to compare with: no {PROFILE} nor stored runs of the baseline "
                         f"recipe {campaign.baseline.id} in {RUNS_FOLDER}/; give --baseline METRICS (a run of the "
                         "baseline recipe) or --folder (the campaign's folder)")
    curves = [drift.Curve.of([s.step for s in r.steps], r.losses(), r.out_dir) for r in unique.values()]
    tokens = [r.steps[0].tokens if r.steps else None for r in unique.values()]
    return Baseline(curves, tokens, sigma, dof, tol, [c.source for c in curves])


def given_baseline(campaign: Campaign, paths: list[Path], folder: Path) -> Baseline:
    curves, tokens = [], []
    for path in paths:
        files = metrics_files(campaign, path)
        if not any(f.exists() for f in files):
            raise WatchInput(f"{path}: holds no {', '.join(f.name for f in files)}")
        _check_recipe(campaign, path if path.is_dir() else path.parent, f"the baseline {path}")
        curve, tps = read_curve(campaign, path, files)
        if len(curve.steps) == 0:
            raise _no_loss(campaign, path)
        curves.append(curve)
        tokens.append(tps)
    sigma = tol = dof = None
    if (folder / PROFILE).is_file():  # the guard's measured spread, where the campaign has one
        stored = stored_baseline(campaign, folder)
        sigma, dof, tol = stored.sigma_m, stored.sigma_dof, stored.tolerance
    return Baseline(curves, tokens, sigma, dof, tol, [str(p) for p in paths])


def check_tokens(baseline: Baseline, run_tokens: int | None, run: Path) -> None:
    for source, tps in zip(baseline.sources, baseline.tokens, strict=True):
        if tps is not None and run_tokens is not None and tps != run_tokens:
            raise WatchInput(f"{run}: {run_tokens} tokens per step, the baseline {source} {tps}: a run of another "
                             "batch or sequence length (or workload) cannot be compared step by step")


# ------------------------------------------------------------------------------------ the session


@dataclass
class Session:
    campaign: Campaign
    run: Path
    files: list[Path]
    baseline: Baseline
    start_step: int
    alpha: float
    persist: int
    monitor: drift.Monitor | None = None
    points: int = 0  # the run's logged losses read, at the last read

    def begin(self, curve: drift.Curve, tokens: int | None) -> drift.Monitor:
        """The plan, once the run has logged enough to tell its logging interval."""
        check_tokens(self.baseline, tokens, self.run)
        parity = self.campaign.config.guard.parity
        interval = int(np.min(np.diff(curve.steps[:50])))
        if interval < 1:
            raise WatchInput(f"{self.run}: its steps do not increase ({', '.join(map(str, curve.steps[:6]))} ...)")
        min_block = max(3, math.ceil(parity.window / interval))
        plan = drift.plan(self.baseline.curves, curve.steps[:50], self.start_step, self.baseline.sigma_m,
                          min_block, self.alpha, self.persist, self.baseline.sigma_dof)
        tol = self.baseline.tolerance
        if tol is None:  # no profile: T as the guard would measure it, the seed spread of a tail's mean
            n = plan.noise
            tail_points = max(1.0, parity.tail * parity.steps / interval)
            sigma = math.sqrt(n.offset**2 + n.block**2 * n.block_points / tail_points)
            tol = max(parity.floor, parity.tolerance * sigma)
        self.monitor = drift.Monitor(plan, tol)
        return self.monitor

    def read(self) -> tuple[drift.Curve, list[drift.Event]]:
        curve, tokens = read_curve(self.campaign, self.run, self.files)
        self.points = len(curve.steps)
        if self.monitor is None and len(curve.steps) >= 2:
            self.begin(curve, tokens)
        return curve, self.monitor.feed(curve) if self.monitor is not None else []


def ended(run: Path) -> bool:
    """The run's end marker: the status file its trainer writes when it stops (the reference trainer's)."""
    folder = run if run.is_dir() else run.parent
    return (folder / "status.json").exists()


class Lines:
    """What the watch says: a live line on a terminal; in a log, plain lines (each warning, alarm and
    all-clear, and about twenty progress lines over the run)."""

    def __init__(self, console: Console):
        self.console, self.status, self.every, self.blocks = console, None, 1, 0

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

    def plan(self, m: drift.Monitor, per_horizon: str) -> None:
        p, n = m.plan, m.plan.noise
        self.every = max(1, len(p.blocks) // 20)
        self.say(f"comparing steps {p.blocks[0][0]}-{p.blocks[-1][-1]} in {len(p.blocks)} blocks of "
                 f"{n.block_points} logged steps against the mean of {max(p.m)} baseline curve(s); an alarm needs "
                 f"{p.persist} blocks in a row beyond {p.h:.2f} sd "
                 f"(gap {p.bounds.min():.4f}-{p.bounds.max():.4f} nats, T = {m.tolerance:.4f}); "
                 f"false-alarm chance {100 * p.alpha:.0f}% over them; {per_horizon}")

    def show(self, events: list[drift.Event], m: drift.Monitor | None, step: int) -> None:
        for e in events:
            self.blocks += e.kind == "block"
            if e.kind == "block" and self.status is None and self.blocks % self.every == 0:
                self.say(f"step {e.step}: gap {e.gap:+.4f} nats (boundary {e.bound:.4f})")
            elif e.kind != "block":
                self.say(f"step {e.step}: {e.kind.upper()}: {e.message}")
        if self.status is not None and m is not None and m.gaps:
            s, gap, bound = m.gaps[-1]
            self.status.update(f"step {step}: gap {gap:+.4f} nats at step {s}, boundary {bound:.4f}, "
                               f"{m.done}/{len(m.plan.blocks)} blocks, {'beyond' if m.streak else 'within'}")


def follow(session: Session, lines: Lines, keep_following: bool, poll_s: float) -> str:
    """Read and judge until the run is judged to its end: returns what ended the watch."""
    while True:
        done_before = ended(session.run)  # read after the marker appeared: nothing more will come
        had_plan = session.monitor is not None
        curve, events = session.read()
        m = session.monitor
        if m is not None and not had_plan:
            lines.plan(m, per_horizon(session, m))
        lines.show(events, m, int(curve.steps[-1]) if len(curve.steps) else 0)
        if m is not None and m.alarm is not None:
            return "alarm"
        if m is not None and m.finished:
            return f"the baseline's curve: its last whole block ends at step {int(m.plan.blocks[-1][-1])}"
        if not keep_following or done_before:
            if m is None:
                raise _no_loss(session.campaign, session.run)
            return "the run's status file (it has ended)" if done_before else "the end of the metrics file"
        time.sleep(poll_s)


def per_horizon(session: Session, m: drift.Monitor) -> str:
    """The delay the design promises for a drift of 1 T per the guard's horizon (docs/guard.md)."""
    horizon = session.campaign.config.guard.parity.steps
    d = drift.delay_steps(m.plan, m.tolerance / horizon)
    return f"a drift of 1 T per {horizon} steps alarms about {d:,.0f} steps after it begins"


def finding(session: Session, ended_by: str, seconds: float, command: str) -> dict[str, Any]:
    m = session.monitor
    assert m is not None
    out: dict[str, Any] = {"decision": "ALARM" if m.alarm is not None else "NO ALARM",
                           "exit_code": EXIT_ALARM if m.alarm is not None else 0,
                           "run": str(session.run), "workload": session.campaign.workload.kind,
                           "baseline": session.baseline.sources, "ended_by": ended_by,
                           "run_points_read": session.points, "delay": per_horizon(session, m)}
    out.update(m.finding())
    last = m.plan.blocks[-1][-1]
    out["covered"] = (f"steps {m.plan.blocks[0][0]}-{last}: the baseline's curve has no later step; a longer "
                      "run of the baseline recipe (--baseline) covers more") if m.finished and not m.alarm else ""
    out["cost"] = {"seconds": round(seconds, 2), "runs_trained": 0}
    out["command"] = command
    return out


def summary(f: dict[str, Any]) -> str:
    a = f["alarm"]
    if a is not None:
        in_t = f" ({a['gap_in_T']:+.1f} T)" if a.get("gap_in_T") is not None else ""
        gap = f"{a['gap_nats']:+.4f} nats{in_t}" if a["gap_nats"] is not None else "non-finite"
        if a["gap_nats"] is None:
            return f"ALARM at step {a['step']}: {a['message']}"
        return (f"ALARM at step {a['step']}: the gap crossed the boundary at step {a['crossed_at_step']} and reads "
                f"{gap} against a boundary of {a['bound_nats']:.4f}")
    warned = f"; {len(f['warnings'])} warning(s) that cleared" if f["warnings"] else ""
    return (f"NO ALARM over {f['blocks_judged']} block(s) to step {f['last_judged_step']} "
            f"(ended by {f['ended_by']}){warned}")


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
) -> None:
    """Compare a training of the approved recipe with the baseline's curve: alarm when the gap grows beyond noise.

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
        _check_recipe(campaign, run_metrics if run_metrics.is_dir() else run_metrics.parent, f"the run {run_metrics}")
        base = given_baseline(campaign, baseline, where) if baseline else stored_baseline(campaign, where)
        start = start_step if start_step is not None else max(1, round((1 - parity.tail) * parity.steps))
        session = Session(campaign, run_metrics, files, base, start, alpha, persist)
        with Lines(console) as lines:
            try:
                ended_by = follow(session, lines, follow_, poll_s)
            except KeyboardInterrupt:
                if session.monitor is None:
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
