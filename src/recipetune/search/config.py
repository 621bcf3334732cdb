"""Settings of a search campaign."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trials: int = Field(24, ge=1)
    wall_time_s: float | None = Field(None, gt=0)


class SearchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    knobs: dict[str, list[bool | int | float | str]] = Field(default_factory=dict)
    allow_semantic: list[str] = Field(default_factory=list)
    strategy: Literal["mcts", "tpe", "random", "grid"] = "mcts"
    proposer: Literal["analyst", "random", "llm"] = "analyst"
    budget: Budget = Budget()
    steps_per_trial: int = Field(30, ge=2)
    seed: int = 0
