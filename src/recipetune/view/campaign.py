"""`recipetune tune` and `recipetune finetune`: one campaign command, for either job.

    the job's campaign file   config.py: load_campaign | finetune/plan.py: load_finetune_campaign
    the job's plan            speed/plan.py | finetune/plan.py: every check, nothing written yet
    the executor              execute/factory.py: make_executor (local, or Ray)
    run_campaign              the job's run (speed/job.py | finetune/job.py: run -> engine/loop.py)
                              under the live trial table (view/live.py), then the job's verdict panel

A bad campaign file is a ConfigError: exit 2, nothing written. Ctrl-C and errors say how to resume.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from recipetune.core import options as opt
from recipetune.core.console import fail
from recipetune.core.errors import ConfigError
from recipetune.core.recipe import Recipe
from recipetune.engine.database import DiskFull, StoreUnavailable
from recipetune.engine.job import Outcome, Reporter
from recipetune.engine.plan import default_folder
from recipetune.engine.store import CampaignStore
from recipetune.execute.executor import Executor
from recipetune.execute.factory import make_executor
from recipetune.view.live import Columns, LiveReporter, decision_panel, observers_for, run_live

console = Console()
SPEED_COLUMNS = Columns(figure="tok/s/dev", score="speed-up", check="loss check", figure_fmt=",.0f",
                        score_fmt=".2f", unit="x", none_better="nothing faster has passed screening")

# A job's run: (its plan, executor=, reporter=) -> its decision (speed/job.py: run, finetune/job.py: run).
JobRun = Callable[..., Outcome]


def run_campaign(command: str, file: Path, extra: list[str], folder: Path, run: JobRun, plan: Any,
                 executor: Executor, reporter: LiveReporter, observers: list[Reporter],
                 messages: tuple[type[Exception], ...]) -> Outcome:
    """Run a planned campaign under the live table; the resume command is the same one with --resume."""
    again = shlex.join(["recipetune", command, str(file), *extra, "--out", str(folder), "--resume"])
    outcome = run_live(reporter, run, plan, executor, again, messages=messages, observers=observers)
    console.line()
    return outcome


def overrides_of(overrides: list[str] | None, options: dict[str, Any]) -> tuple[list[str], Path | None, bool,
                                                                              str | None]:
    """The file's overrides from the command line (``key=value`` and the options that name a field),
    and the options that name none: the folder, --resume, --mlflow."""
    out, resume, mlflow = options.pop("out", None), bool(options.pop("resume", False)), options.pop("mlflow", None)
    return opt.option_overrides(overrides, options), out, resume, mlflow


# -- tune ------------------------------------------------------------------------------------------


def speed_panel(outcome: Outcome, folder: Path, baseline: Recipe, store: CampaignStore | None = None) -> Panel:
    lines: list[Text] = []
    v = outcome.verdict
    if outcome.winner is not None and v is not None:
        lines.append(Text(f"recipe: {outcome.winner.recipe.describe_diff(baseline)}  ({outcome.winner.id})"))
        ci = f"  95% CI [{v.ci_low:.3f}, {v.ci_high:.3f}]" if v.ci_low is not None and v.ci_high is not None else ""
        noise = v.noise_margin
        lines.append(Text(f"speed-up: {v.speedup:.3f}x{ci}" + (f"  noise margin {noise:.3f}" if noise else "")))
        parity = v.parity
        if parity.get("tolerance") is not None and parity.get("mean_diff") is not None:
            det = parity.get("detectable")
            lines.append(Text(f"loss parity ({parity.get('mode', 'n/a')}): final loss {parity['mean_diff']:+.4f} nats, "
                              f"tolerance ±{parity['tolerance']:.4f}"
                              + (f", detectable {det:.4f}" if det is not None else "")))
    return decision_panel(outcome, lines, folder, store)


@opt.campaign_options
def tune(
    campaign_file: Path = typer.Argument(..., help="campaign YAML"),
    overrides: list[str] = typer.Argument(None, help="key=value: a baseline knob, or a dotted field (search.seed=3)"),
    **options: Any,
) -> None:
    """Search faster recipes from the campaign's baseline; approve one only on the guard's evidence."""
    # Imported here, as finetune's are below: a command loads only its own job.
    from recipetune.config import load_campaign
    from recipetune.guard.baseline import GuardError
    from recipetune.speed import job as speed_job
    from recipetune.speed.plan import plan as plan_speed

    extra, out, resume, mlflow = overrides_of(overrides, options)
    folder = out or default_folder(campaign_file)
    try:
        campaign = load_campaign(campaign_file, extra)
        if campaign.config.execute.executor == "local":  # runs on this machine: e.g. the warm launcher
            campaign.workload.prepare(campaign.baseline)  # imports torch while the driver plans
        checked = plan_speed(campaign, folder, resume)
        runner = make_executor(campaign.config.execute, campaign.workload.n_devices(campaign.baseline), campaign.path,
                               shared=[folder, campaign.path])  # what every node of a cluster must see
    except ConfigError as e:
        raise fail(e) from None
    observers = observers_for(folder, mlflow)
    # The guard's own errors, a database that stays away and a full disk are messages, not bugs: no traceback.
    outcome = run_campaign("tune", campaign_file, extra, folder, speed_job.run, checked, runner,
                           LiveReporter(SPEED_COLUMNS), observers, messages=(GuardError, StoreUnavailable, DiskFull))
    console.print(speed_panel(outcome, folder, campaign.baseline, checked.store))


# -- finetune --------------------------------------------------------------------------------------


def quality_panel(outcome: Outcome, folder: Path, describe: Callable[[Recipe], str],
                  store: CampaignStore | None = None) -> Panel:
    v = outcome.verdict
    lines: list[Text] = []
    if outcome.verdicts:
        best = outcome.verdicts[0][0]
        lines.append(Text(f"best on validation: {describe(best.recipe)}  ({best.id}, trial {best.trial})"))
    if v is not None:
        lines.append(Text(f"test {v.metric}: {v.candidate_mean:.4f} vs baseline {v.baseline_mean:.4f} "
                          f"(seeds {v.seeds}: {', '.join(f'{x:.3f}' for x in v.candidate)} vs "
                          f"{', '.join(f'{x:.3f}' for x in v.baseline)})"))
        lines.append(Text(f"gain {v.gain:+.4f}, {v.confidence:.1%} CI [{v.ci_low:+.4f}, {v.ci_high:+.4f}] "
                          f"(threshold {v.threshold:g}); normalised gain {v.normalised_gain:+.3f}"))
        at = f"decided at look {v.decided_at}" if v.decided_at else "undecided"
        lines.append(Text(f"{at} of {len(v.looks)}: {len(v.seeds)} of at most {v.max_seeds} seeds, {2 * len(v.seeds)} "
                          f"runs ({v.runs_trained} trained now, {v.runs_reused} kept), {v.minutes:.1f} min; the best "
                          f"of {v.competed} node(s) on validation"))
    return decision_panel(outcome, lines, folder, store, approved="approved experiment", launch="run")


@opt.campaign_options
def finetune(
    experiment_file: Path = typer.Argument(..., help="experiment YAML (task, data, model, recipe) with a search: "
                                                     "section"),
    overrides: list[str] = typer.Argument(None, help="key=value: a recipe knob (lr=1e-3), or a dotted field "
                                                     "(search.seed=3, task.max_eval_examples=100)"),
    selection: str | None = typer.Option(None, help="uct | greedy | sequential: which node mcts expands"),
    **options: Any,
) -> None:
    """Search fine-tuning experiments (data chain + training recipe) from the file's baseline; approve
    one only on the test split, over seeds in planned looks, with the gain shown above search.min_gain."""
    # Imported here: the data chain and the trainers load only for a command that needs them.
    from recipetune.finetune import job as ft_job
    from recipetune.finetune.cli import ensure_base
    from recipetune.finetune.plan import load_finetune_campaign, plan

    extra, out, resume, mlflow = overrides_of(overrides, {**options, "search.selection": selection})
    folder = out or default_folder(experiment_file)
    try:
        campaign = load_finetune_campaign(experiment_file, extra)
        checked = plan(campaign, folder, resume)
        runner = make_executor(campaign.settings.execute, 1, campaign.path, shared=campaign.shared_files(folder))
    except ConfigError as e:
        raise fail(e) from None
    observers = observers_for(folder, mlflow)
    ensure_base(campaign.experiment.spec.model)  # where it must be built, with its progress, before the baseline

    metric = campaign.experiment.spec.task.metric
    columns = Columns(figure="train loss", score=f"val {metric}", check="diagnosis", figure_fmt=".3f",
                      score_fmt=".4f", unit="", none_better="no experiment has beaten it on validation yet")
    describe = campaign.describe
    # Every error is shown as a message (a failed baseline experiment is one): no traceback.
    outcome = run_campaign("finetune", experiment_file, extra, folder, ft_job.run, checked, runner,
                           LiveReporter(columns, describe=describe), observers, messages=(Exception,))
    console.print(quality_panel(outcome, folder, describe, checked.store))
