"""The command-line options every campaign command shares (``tune``, ``finetune``; ``verify`` takes
``--executor`` and ``--ray-address``), declared once (``campaign_options``), each naming the field it
overrides, and how they become the file's overrides.

Here, beside core/console.py (how every command fails), because commands of two layers read them:
view/campaign.py (``tune``, ``finetune``) and speed/verify.py (a job's command, which may not reach up
to view/). The engine holds no command-line code."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

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

# The shared options, in the order --help lists them (after a command's own).
SHARED = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
          for name, kind, default in (
              ("budget", Budget, None), ("budget_s", BudgetS, None), ("pruner", Pruner, None),
              ("strategy", Strategy, None), ("proposer", Proposer, None), ("out", Out, None),
              ("resume", Resume, False), ("executor", Executor, None), ("ray_address", RayAddress, None),
              ("parallel", Parallel, None), ("mlflow", MLflow, None))]
C = TypeVar("C", bound=Callable[..., Any])


def campaign_options(command: C) -> C:
    """A campaign command with the shared options: ``command(file, overrides, ..., **options)`` gets
    them by name, and Typer reads them from its signature (the command's own parameters, then ``SHARED``)."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values()
           if p.kind is not inspect.Parameter.VAR_KEYWORD]
    command.__signature__ = inspect.Signature([*own, *SHARED])  # type: ignore[attr-defined]
    return command


# Each shared option's field in the campaign file.
FIELDS = {"budget": "search.budget.trials", "budget_s": "search.budget.trial_s", "pruner": "search.pruning.pruner",
          "strategy": "search.strategy", "proposer": "search.proposer", "executor": "execute.executor",
          "ray_address": "execute.ray_address", "parallel": "execute.parallel"}


def option_overrides(overrides: list[str] | None, options: dict[str, object]) -> list[str]:
    """The command line's ``key=value`` overrides, then a ``field=value`` for each option given;
    ``options`` by option name (``FIELDS``) or by field."""
    given = {FIELDS.get(key, key): value for key, value in options.items() if value is not None}
    return [*(overrides or []), *(f"{field}={value}" for field, value in given.items())]
