"""`recipetune tune`: search recipes with a live table of trials, then print the verdict."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from recipetune.config import load_campaign
from recipetune.core.console import fail
from recipetune.core.errors import ConfigError
from recipetune.core.recipe import Recipe
from recipetune.engine import options as opt
from recipetune.engine.job import Outcome
from recipetune.engine.live import Columns, LiveReporter, decision_panel, observers_for, run_live
from recipetune.engine.plan import default_folder
from recipetune.engine.store import CampaignStore, DiskFull, StoreUnavailable
from recipetune.execute.factory import make_executor
from recipetune.guard.baseline import GuardError
from recipetune.speed import job as speed_job
from recipetune.speed.plan import plan

console = Console()
COLUMNS = Columns(figure="tok/s/dev", score="speed-up", check="loss check", figure_fmt=",.0f", score_fmt=".2f",
                  unit="x", none_better="nothing faster has passed screening")


def verdict_panel(outcome: Outcome, folder: Path, baseline: Recipe, store: CampaignStore | None = None) -> Panel:
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


def tune(
    campaign_file: Path = typer.Argument(..., help="campaign YAML"),
    overrides: list[str] = typer.Argument(None, help="key=value: a baseline knob, or a dotted field (search.seed=3)"),
    budget: opt.Budget = None,
    budget_s: opt.BudgetS = None,
    pruner: opt.Pruner = None,
    strategy: opt.Strategy = None,
    proposer: opt.Proposer = None,
    out: opt.Out = None,
    resume: opt.Resume = False,
    executor: opt.Executor = None,
    ray_address: opt.RayAddress = None,
    parallel: opt.Parallel = None,
    mlflow: opt.MLflow = None,
) -> None:
    """Search faster recipes from the campaign's baseline; approve one only on the guard's evidence."""
    extra = opt.option_overrides(overrides, dict(
        budget=budget, budget_s=budget_s, pruner=pruner, strategy=strategy, proposer=proposer, executor=executor,
        ray_address=ray_address, parallel=parallel))
    folder = out or default_folder(campaign_file)
    try:
        campaign = load_campaign(campaign_file, extra)
        if campaign.config.execute.executor == "local":  # runs on this machine: e.g. the warm launcher
            campaign.workload.prepare(campaign.baseline)  # imports torch while the driver plans
        checked = plan(campaign, folder, resume)
        runner = make_executor(campaign.config.execute, campaign.workload.n_devices(campaign.baseline), campaign.path,
                               shared=[folder, campaign.path])  # what every node of a cluster must see
    except ConfigError as e:
        raise fail(e) from None
    observers = observers_for(folder, mlflow)

    again = shlex.join(["recipetune", "tune", str(campaign_file), *extra, "--out", str(folder), "--resume"])
    reporter = LiveReporter(COLUMNS)
    # The guard's own errors, a database that stays away and a full disk are messages, not bugs: no traceback.
    outcome = run_live(reporter, lambda view: speed_job.run(checked, executor=runner, reporter=view), again,
                       messages=(GuardError, StoreUnavailable, DiskFull), observers=observers)
    console.line()
    console.print(verdict_panel(outcome, folder, campaign.baseline, checked.store))
