"""The command-line options every campaign command shares (``tune``, ``finetune``), each naming the
field it overrides, and how they become the file's overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Budget = Annotated[int | None, typer.Option(help="trials to run (search.budget.trials)")]
BudgetS = Annotated[float | None, typer.Option(
    "--budget-s", help="seconds of trial time: no trial starts once the trials have run this long "
                       "(search.budget.trial_s)")]
Pruner = Annotated[str | None, typer.Option(
    help="stop early a trial that cannot plausibly win: none | median | percentile | successive_halving | "
         "hyperband | patient (search.pruning.pruner)")]
Strategy = Annotated[str | None, typer.Option(help="mcts (tree search) | tpe | gp | random | grid")]
Proposer = Annotated[str | None, typer.Option(help="analyst | random | llm (with --strategy mcts)")]
Out = Annotated[Path | None, typer.Option(help="campaign folder (default: campaigns/<file name>)")]
Resume = Annotated[bool, typer.Option("--resume", help="continue the campaign in the folder")]
Executor = Annotated[str | None, typer.Option(
    help="local (default: one trial at a time) | ray (execute.executor)")]
RayAddress = Annotated[str | None, typer.Option(help="'auto', ray://host:10001 (execute.ray_address)")]
Parallel = Annotated[int | None, typer.Option(
    help="trials in flight at once, with --executor ray (execute.parallel)")]
MLflow = Annotated[str | None, typer.Option(
    help="also log each trial to this MLflow tracking URI as it lands (e.g. sqlite:///mlflow.db); needs the "
         "mlflow extra")]

# Each shared option's field in the campaign file.
FIELDS = {"budget": "search.budget.trials", "budget_s": "search.budget.trial_s", "pruner": "search.pruning.pruner",
          "strategy": "search.strategy", "proposer": "search.proposer", "executor": "execute.executor",
          "ray_address": "execute.ray_address", "parallel": "execute.parallel"}


def option_overrides(overrides: list[str] | None, options: dict[str, object]) -> list[str]:
    """The command line's ``key=value`` overrides, then a ``field=value`` for each option given;
    ``options`` by option name (``FIELDS``) or by field."""
    given = {FIELDS.get(key, key): value for key, value in options.items() if value is not None}
    return [*(overrides or []), *(f"{field}={value}" for field, value in given.items())]
