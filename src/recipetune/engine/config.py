"""Settings of a search campaign every job has (the ``search:`` section of a campaign file); a job's
own settings extend ``TreeSearchConfig`` in that job's campaign file (config.py: ``SearchConfig`` for
speed, finetune/plan.py: ``FinetuneSearchConfig``)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trials: int = Field(24, ge=1, description="runs to execute; proposals rejected before running cost nothing")
    wall_time_s: float | None = Field(None, gt=0, description="stop starting new trials after this much search time")
    trial_s: float | None = Field(None, gt=0, description="compute budget: stop starting new trials once the trials "
                                                          "have run this many seconds in all (--budget-s)")
    plateau: int | None = Field(None, ge=1, description="stop after this many runs in a row without a gain beyond "
                                                        "noise over the best so far")
    plateau_gain: float | None = Field(None, ge=0, description="the gain that counts, in the job's score; default: "
                                                               "the noise the job measured on its baseline")


class Pruning(BaseModel):
    """Stopping a trial early from the values it reports while it runs (Optuna's pruners, through
    ``trial.report`` / ``should_prune``). A pruned trial is kept with what it showed; it is never a
    finalist and never runs again."""

    model_config = ConfigDict(extra="forbid")

    pruner: Literal["none", "median", "percentile", "successive_halving", "hyperband", "patient"] = Field(
        "none", description="none | median (below the median of the trials at the same step) | percentile | "
                            "successive_halving | hyperband | patient (median, after `patience` bad reports)")
    startup_trials: int = Field(2, ge=0, description="trials that finish (the baseline counts) before any is pruned")
    warmup_steps: int = Field(0, ge=0, description="reports of a trial before it may be pruned")
    percentile: float = Field(50.0, gt=0, lt=100, description="percentile: keep the top this-many percent of the "
                                                              "trials at a report (25: the top quarter; 50: median)")
    patience: int = Field(1, ge=1, description="patient: reports in a row below the median before pruning")
    min_resource: int = Field(1, ge=1, description="successive_halving, hyperband: the first rung's step")
    reduction_factor: int = Field(3, ge=2, description="successive_halving, hyperband: keep 1 of this many per rung")
    checkpoints: int = Field(3, ge=1, le=50, description="reports per trial, at this many points of its run "
                                                         "(the quality job adds what it scores there: "
                                                         "finetune/plan.py: QualityPruning)")

    @property
    def on(self) -> bool:
        """Whether trials may be stopped early: the one switch every reader of this section asks."""
        return self.pruner != "none"

    @property
    def reports(self) -> int:
        """The reports a trial makes: ``checkpoints`` with a pruner, none without one."""
        return self.checkpoints if self.on else 0


class LLMSettings(BaseModel):
    """An OpenAI-compatible chat endpoint; empty fields fall back to RECIPETUNE_LLM_* variables."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(None, description="e.g. http://127.0.0.1:8000/v1 (env RECIPETUNE_LLM_BASE_URL)")
    model: str | None = Field(None, description="model name the server knows (env RECIPETUNE_LLM_MODEL)")
    api_key: str | None = Field(None, description="bearer token, if the server wants one (env RECIPETUNE_LLM_API_KEY)")
    timeout_s: float = Field(60.0, gt=0)
    temperature: float = Field(0.2, ge=0.0, le=2.0)
    retries: int = Field(2, ge=0, le=5, description="times to ask again, with the reason fed back, after an "
                                                    "answer with nothing usable (malformed, refused, endpoint error)")
    fallback: Literal["analyst", "random", "none"] = Field(
        "analyst", description="the Researcher that proposes from a node where the LLM has nothing: every answer "
                               "unusable after the retries, or its own empty answer; none: such a node is exhausted")
    transport_retries: int = Field(2, ge=0, le=10, description="the openai client's own retries, with "
                                                              "exponential backoff, of a connection error, a "
                                                              "timeout, an HTTP 408/409/429/5xx")
    structured: bool = Field(True, description="ask for structured output (response_format: a JSON schema of the "
                                               "proposals); a server that refuses it is asked without, from then on")


class TreeSearchConfig(BaseModel):
    """What every job's search has: the space, the strategy, the Researcher, the budget, the store."""

    model_config = ConfigDict(extra="forbid")

    knobs: dict[str, list[bool | int | float | str]] = Field(default_factory=dict)
    strategy: Literal["mcts", "tpe", "gp", "random", "grid"] = "mcts"
    proposer: Literal["analyst", "random", "llm"] = "analyst"
    budget: Budget = Budget()
    seed: int = 0
    # Tree search (TREX): a node is one measured recipe.
    children: int = Field(3, ge=1, le=8, description="proposals asked for per expansion (TREX uses 3-5)")
    exploration: float = Field(
        1 / math.sqrt(2), ge=0.0, description="UCT constant c in Q/N + c*sqrt(ln N_parent / N); rewards lie in [0, 1]"
    )
    selection: Literal["uct", "greedy", "sequential"] = Field(
        "uct", description="which node mcts expands: uct (MCTS), or the ablation's greedy best-first / sequential")
    backup: Literal["mean", "max"] = Field(
        "mean", description="what a subtree is worth to uct: mean (its mean reward, classic UCT) or max (its best "
                            "reward, min-max scaled over the tree's rewards: the campaign's result is its best node)")
    set_aside: float = Field(
        0.5, ge=0.0, lt=1.0, description="set aside, until nothing else is left, a recipe whose speed the measured "
                                         "trials predict with confidence below this share of the incumbent's "
                                         "(engine/effects.py), and stop a speed trial whose own reports show it "
                                         "below that share while it runs; 0 sets nothing aside")
    failure_penalty: float = Field(0.0, ge=0.0, le=1.0, description="reward of a rejected or failed trial")
    playbook: str | None = Field(None, description="extra analyst rules (YAML), added before the built-in ones")
    explore: Literal["model", "random"] = Field(
        "random", description="the analyst where no specific rule fires: model (TPE fitted to the tree's results so "
                              "far) or random (one other value of a searched knob, seeded)")
    storage: str | None = Field(None, description="SQLAlchemy URL of the study; default sqlite in the campaign folder")
    llm: LLMSettings = LLMSettings()
    pruning: Pruning = Pruning()

    @property
    def speed_reports(self) -> int:
        """The reports a speed trial makes as it runs: for the pruner, and for the set-aside rule, which
        stops a trial its own reports show far slower than the incumbent (engine/effects.py: Effects.stop)."""
        return self.pruning.checkpoints if self.pruning.on or self.set_aside > 0 else 0
