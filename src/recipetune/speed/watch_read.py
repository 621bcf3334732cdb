"""What `recipetune watch` reads: a run's metrics stream and its baselines' (speed/watch.py judges them).

A run's training and validation loss curves, read the way the campaign file says its workload writes
them (the reference trainer's ``metrics.jsonl``, a command workload's JSONL or log lines through its
regex preset, or its CSV file); the baseline: ``--baseline`` metrics files, or the campaign folder's profile and stored
runs of the baseline recipe (``guard-runs/``), with the guard's seed-to-seed spread and T where the
folder holds a profile. What cannot be compared (a missing file, no loss, another workload, recipe or
tokens per step) is ``WatchInput``: bad input, exit 2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipetune.config import Campaign
from recipetune.core.filenames import PROFILE, RESULT, RUNS_FOLDER
from recipetune.core.measure import RunResult
from recipetune.core.recipe import INVARIANT
from recipetune.guard import drift
from recipetune.guard.baseline import BaselineProfile
from recipetune.guard.monitor import Measure
from recipetune.workloads import csv_metrics, log_formats
from recipetune.workloads.command import CommandWorkload, substitute


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
        if w.spec.metrics.csv:  # where it lies under the run's folder (a * picks the newest)
            return [path / substitute(w.spec.metrics.csv, {"out_dir": "", **_blank(w)}).lstrip("/")]
        return [path / "stdout.log", path / "stderr.log"]
    return [path / "metrics.jsonl"]


def _blank(w: CommandWorkload) -> dict[str, str]:
    names = {*w.knobs(), "steps", "recipe_json", "python"}
    return dict.fromkeys(names, "")


@dataclass(frozen=True)
class Stream:
    """What one run's metrics hold for the watch: its training loss, its validation loss (often none)."""

    loss: drift.Curve
    val: drift.Curve
    tokens: int | None  # tokens per step

    def curve(self, measure: Measure) -> drift.Curve:
        return self.val if measure is Measure.VAL_LOSS else self.loss


def read_curves(campaign: Campaign, path: Path, files: list[Path]) -> Stream:
    """The training and validation loss curves of the run in ``files``; a torn last line waits."""
    w = campaign.workload
    tps = w.tokens_per_step(campaign.baseline) if isinstance(w, CommandWorkload) else None
    try:
        if isinstance(w, CommandWorkload) and w.preset is not None:
            steps, evals = log_formats.read_logs(files, w.preset, tps, w.n_devices(campaign.baseline))
        elif isinstance(w, CommandWorkload) and w.spec.metrics.csv:
            steps, evals = csv_metrics.read_csv(files[0], w.csv_columns, tps, w.n_devices(campaign.baseline))
        else:
            steps, evals = log_formats.read_jsonl(files[0], tps, w.n_devices(campaign.baseline))
    except (log_formats.MetricsError, OSError, UnicodeError) as e:
        raise WatchInput(f"{path}: {e}") from None
    return Stream(drift.Curve.of([s.step for s in steps], [s.loss for s in steps], str(path)),
                  drift.Curve.of([e.step for e in evals], [e.val_loss for e in evals], str(path)),
                  steps[0].tokens if steps else None)


def no_loss(campaign: Campaign, path: Path) -> WatchInput:
    w = campaign.workload
    how = (f"log lines matching the '{w.preset.name}' preset" if isinstance(w, CommandWorkload) and w.preset
           else "CSV rows with a loss" if isinstance(w, CommandWorkload) and w.spec.metrics.csv
           else "JSON lines with step and loss")
    return WatchInput(f"{path}: no training loss in it ({how}, as the campaign's {w.kind} workload writes them)")


def check_recipe(campaign: Campaign, folder: Path, what: str) -> None:
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
    curves: list[drift.Curve]  # the training loss
    val_curves: list[drift.Curve]  # the validation loss (empty curves where a run recorded none)
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
    vals = [drift.Curve.of([e.step for e in r.evals], [e.val_loss for e in r.evals], r.out_dir)
            for r in unique.values()]
    tokens = [r.steps[0].tokens if r.steps else None for r in unique.values()]
    return Baseline(curves, vals, tokens, sigma, dof, tol, [c.source for c in curves])


def given_baseline(campaign: Campaign, paths: list[Path], folder: Path) -> Baseline:
    curves, vals, tokens = [], [], []
    for path in paths:
        files = metrics_files(campaign, path)
        if not any(f.exists() for f in files):
            raise WatchInput(f"{path}: holds no {', '.join(f.name for f in files)}")
        check_recipe(campaign, path if path.is_dir() else path.parent, f"the baseline {path}")
        stream = read_curves(campaign, path, files)
        if len(stream.loss.steps) == 0:
            raise no_loss(campaign, path)
        curves.append(stream.loss)
        vals.append(stream.val)
        tokens.append(stream.tokens)
    sigma = tol = dof = None
    if (folder / PROFILE).is_file():  # the guard's measured spread, where the campaign has one
        stored = stored_baseline(campaign, folder)
        sigma, dof, tol = stored.sigma_m, stored.sigma_dof, stored.tolerance
    return Baseline(curves, vals, tokens, sigma, dof, tol, [str(p) for p in paths])


def check_tokens(baseline: Baseline, run_tokens: int | None, run: Path) -> None:
    for source, tps in zip(baseline.sources, baseline.tokens, strict=True):
        if tps is not None and run_tokens is not None and tps != run_tokens:
            raise WatchInput(f"{run}: {run_tokens} tokens per step, the baseline {source} {tps}: a run of another "
                             "batch or sequence length (or workload) cannot be compared step by step")


def ended(run: Path) -> bool:
    """The run's end marker: the status file its trainer writes when it stops (the reference trainer's)."""
    folder = run if run.is_dir() else run.parent
    return (folder / "status.json").exists()

