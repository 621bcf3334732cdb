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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipetune.config import Campaign
from recipetune.core.filenames import PROFILE, RESULT, RUNS_FOLDER
from recipetune.core.measure import RunResult
from recipetune.core.recipe import INVARIANT
from recipetune.guard import drift
from recipetune.guard.baseline import BaselineProfile
from recipetune.guard.loss import ReferenceKind, replica_curves
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
    sigma_dof: int | None  # its degrees of freedom (None: known, the within-run error decided)
    tolerance: float | None  # the profile's T
    sources: list[str]
    replicas: list[str] = field(default_factory=list)  # baseline runs left out: copies of a kept one, and why


def profile_spread(profile: BaselineProfile, file: Path) -> tuple[float, int | None, float]:
    """The profile's sigma_M, its degrees of freedom and T. The law follows how sigma_M was measured
    (``loss.ReferenceKind``): the seeds' sample std is Student's t on seeds - 1, with or without
    guard.parity.margin (a margin states T, it does not make a spread of 3 seeds known); the within-run
    error, from hundreds of points, is known."""
    try:
        kind = ReferenceKind.read(profile.loss_reference_kind)
    except ValueError as e:
        raise WatchInput(f"{file}: loss_reference_kind: {e}") from None
    dof = len(profile.seeds) - 1 if kind is ReferenceKind.SEEDS and len(profile.seeds) > 1 else None
    return profile.loss_reference, dof, profile.loss_tolerance


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
        sigma, dof, tol = profile_spread(profile, profile_file)
        runs += profile.runs
    base = {k: v for k, v in campaign.baseline.items() if k != "seed"}
    for result_file in sorted((folder / RUNS_FOLDER).glob(f"*/{RESULT}")):
        try:
            r = RunResult.model_validate_json(result_file.read_text())
        except (OSError, ValueError):
            continue
        if r.ok and {k: v for k, v in r.recipe.items() if k != "seed"} == base:
            runs.append(r)
    if not runs:
        raise WatchInput(f"{folder}: no baseline to compare with: no {PROFILE} nor stored runs of the baseline "
                         f"recipe {campaign.baseline.id} in {RUNS_FOLDER}/; give --baseline METRICS (a run of the "
                         "baseline recipe) or --folder (the campaign's folder)")
    curves = [drift.Curve.of([s.step for s in r.steps], r.losses(), r.out_dir) for r in runs]
    vals = [drift.Curve.of([e.step for e in r.evals], [e.val_loss for e in r.evals], r.out_dir) for r in runs]
    tokens = [r.steps[0].tokens if r.steps else None for r in runs]
    seeds = [f" (seed {r.recipe['seed']})" if "seed" in r.recipe else "" for r in runs]
    return _distinct(Baseline(curves, vals, tokens, sigma, dof, tol, [c.source for c in curves]), seeds, sigma, folder)


def given_baseline(campaign: Campaign, paths: list[Path], folder: Path) -> Baseline:
    curves, vals, tokens, seeds = [], [], [], []
    for path in paths:
        files = metrics_files(campaign, path)
        if not any(f.exists() for f in files):
            raise WatchInput(f"{path}: holds no {', '.join(f.name for f in files)}")
        run_folder = path if path.is_dir() else path.parent
        check_recipe(campaign, run_folder, f"the baseline {path}")
        stream = read_curves(campaign, path, files)
        if len(stream.loss.steps) == 0:
            raise no_loss(campaign, path)
        curves.append(stream.loss)
        vals.append(stream.val)
        tokens.append(stream.tokens)
        seeds.append(_seed_said(run_folder))
    sigma = tol = dof = None
    if (folder / PROFILE).is_file():  # the guard's measured spread, where the campaign has one
        stored = stored_baseline(campaign, folder)
        sigma, dof, tol = stored.sigma_m, stored.sigma_dof, stored.tolerance
    return _distinct(Baseline(curves, vals, tokens, sigma, dof, tol, [str(p) for p in paths]), seeds, sigma,
                     paths[0])


def _seed_said(run_folder: Path) -> str:
    try:
        recipe = json.loads((run_folder / "recipe.json").read_text())
    except (OSError, ValueError):
        return ""
    return f" (seed {recipe['seed']})" if isinstance(recipe, dict) and "seed" in recipe else ""


def _distinct(b: Baseline, seeds: list[str], sigma: float | None, where: Path) -> Baseline:
    """The baseline runs that are samples: a run whose training loss is identical to a kept one's, or
    equal up to float noise (``loss.replica_curves``: the same batches, whatever seed it was given, as a
    seed knob the trainer does not read gives), is one sample with it, not another; the longer is kept.
    Copies counted as curves would read as a spread of levels of 0 and a block noise of 0 (guard/drift.py:
    the differences of consecutive curves). Where only copies remain and nothing else measures a spread
    (no profile), that is bad input."""
    losses = [dict(zip(c.steps.tolist(), c.loss.tolist(), strict=True)) for c in b.curves]
    kept: list[int] = []
    copies: list[str] = []  # every run left out, and why
    said: list[str] = []  # those the watch says: not a run stored twice (the profile's runs are in guard-runs/ too)
    for i in range(len(b.curves)):
        twin = next((j for j in kept if replica_curves(losses[j], losses[i])), None)
        if twin is None:
            kept.append(i)
            continue
        if len(losses[i]) > len(losses[twin]):  # the longer covers more steps
            kept[kept.index(twin)] = i
            i, twin = twin, i
        same = "identical to" if losses[i] == losses[twin] else "equal up to float noise to"
        copies.append(f"{b.sources[i]}{seeds[i]}: its training loss is {same} {b.sources[twin]}{seeds[twin]}'s "
                      "(the same batches: one sample), left out")
        if not seeds[i] or seeds[i] != seeds[twin]:
            said.append(copies[-1])
    if len(kept) < 2 <= len(b.curves) and sigma is None:
        raise WatchInput(f"{where}: the {len(b.curves)} baseline runs are one sample: {'; '.join(copies)}. A seed "
                         "knob the trainer does not read gives such copies; give baseline runs that differ (other "
                         "seeds the trainer reads), or the campaign's folder with its baseline profile (--folder)")
    return Baseline([b.curves[i] for i in kept], [b.val_curves[i] for i in kept], [b.tokens[i] for i in kept],
                    b.sigma_m, b.sigma_dof, b.tolerance, [b.sources[i] for i in kept], said)


def check_tokens(baseline: Baseline, run_tokens: int | None, run: Path) -> None:
    for source, tps in zip(baseline.sources, baseline.tokens, strict=True):
        if tps is not None and run_tokens is not None and tps != run_tokens:
            raise WatchInput(f"{run}: {run_tokens} tokens per step, the baseline {source} {tps}: a run of another "
                             "batch or sequence length (or workload) cannot be compared step by step")


def ended(run: Path) -> bool:
    """The run's end marker: the status file its trainer writes when it stops (the reference trainer's)."""
    folder = run if run.is_dir() else run.parent
    return (folder / "status.json").exists()

