"""`recipetune finetune`: the quality search under the engine's live table, then the test-split verdict."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from recipetune.core.console import fail
from recipetune.core.errors import ConfigError
from recipetune.core.recipe import Recipe
from recipetune.engine import options as opt
from recipetune.engine.job import Outcome
from recipetune.engine.live import Columns, LiveReporter, decision_panel, observers_for, run_live
from recipetune.engine.plan import default_folder
from recipetune.engine.store import CampaignStore

console = Console()


def verdict_panel(outcome: Outcome, folder: Path, describe: Callable[[Recipe], str],
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
        lines.append(Text(f"gain {v.gain:+.4f}, {v.confidence:.0%} CI [{v.ci_low:+.4f}, {v.ci_high:+.4f}]; "
                          f"normalised gain {v.normalised_gain:+.3f}"))
    return decision_panel(outcome, lines, folder, store, approved="approved experiment", launch="run")


def shared_files(campaign, folder: Path) -> list[Path]:  # type: ignore[no-untyped-def]
    """What a child on any node reads or writes: the campaign folder, the experiment file, the task's
    files and a base model on disk (a cluster's nodes must all see them at the same paths)."""
    exp = campaign.experiment
    model = Path(exp.spec.model.path)
    model = model if model.is_absolute() else exp.base_dir / model
    return [folder, campaign.path, *exp.splits.paths.values(), *([model] if model.exists() else [])]


def finetune(
    experiment_file: Path = typer.Argument(..., help="experiment YAML (task, data, model, recipe) with a search: "
                                                     "section"),
    overrides: list[str] = typer.Argument(None, help="key=value: a recipe knob (lr=1e-3), or a dotted field "
                                                     "(search.seed=3, task.max_eval_examples=100)"),
    budget: opt.Budget = None,
    budget_s: opt.BudgetS = None,
    pruner: opt.Pruner = None,
    strategy: opt.Strategy = None,
    proposer: opt.Proposer = None,
    selection: str | None = typer.Option(None, help="uct | greedy | sequential: which node mcts expands"),
    out: opt.Out = None,
    resume: opt.Resume = False,
    executor: opt.Executor = None,
    ray_address: opt.RayAddress = None,
    parallel: opt.Parallel = None,
    mlflow: opt.MLflow = None,
) -> None:
    """Search fine-tuning experiments (data chain + training recipe) from the file's baseline; approve
    one only on the test split, over seeds, with the gain's confidence interval above zero."""
    # Imported here: the data chain and the trainers load only for a command that needs them.
    from recipetune.execute.factory import make_executor
    from recipetune.finetune import job as ft_job
    from recipetune.finetune.plan import load_finetune_campaign, plan

    extra = opt.option_overrides(overrides, dict(
        budget=budget, budget_s=budget_s, pruner=pruner, strategy=strategy, proposer=proposer, executor=executor,
        ray_address=ray_address, parallel=parallel, **{"search.selection": selection}))
    folder = out or default_folder(experiment_file)
    try:
        campaign = load_finetune_campaign(experiment_file, extra)
        checked = plan(campaign, folder, resume)
        runner = make_executor(campaign.settings.execute, 1, campaign.path, shared=shared_files(campaign, folder))
    except ConfigError as e:
        raise fail(e) from None
    observers = observers_for(folder, mlflow)
    from recipetune.finetune.cli import ensure_base

    ensure_base(campaign.experiment.spec.model)  # where it must be built, with its progress, before the baseline

    metric = campaign.experiment.spec.task.metric
    columns = Columns(figure="train loss", score=f"val {metric}", check="diagnosis", figure_fmt=".3f",
                      score_fmt=".4f", unit="", none_better="no experiment has beaten it on validation yet")
    again = shlex.join(["recipetune", "finetune", str(experiment_file), *extra, "--out", str(folder), "--resume"])
    def describe(recipe: Recipe) -> str:
        return campaign.space.describe(recipe, campaign.baseline)

    reporter = LiveReporter(columns, describe=describe)
    # Every error is shown as a message (a failed baseline experiment is one): no traceback.
    outcome = run_live(reporter, lambda view: ft_job.run(checked, executor=runner, reporter=view), again,
                       messages=(Exception,), observers=observers)
    console.line()
    console.print(verdict_panel(outcome, folder, describe, checked.store))
