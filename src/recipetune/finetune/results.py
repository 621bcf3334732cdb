"""The Experimenter's report: what one experiment produced, as data the Researcher reads.

Saved as ``report.json`` in the run folder, next to ``predictions.jsonl`` (every validation
example), ``data_version.json``, ``recipe.json`` (the resolved experiment) and ``train_log.jsonl``.
Nothing in it comes from the test split: that has its own ``final.json``, written only by
``final_evaluation``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from recipetune.data.chain import DataVersion

ExperimentStatus = Literal["ok", "crash", "nan", "oom", "timeout"]


class Model(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="constants")


class Prediction(Model):
    index: int  # row of the evaluated split
    prompt: str
    target: str
    prediction: str
    score: float  # this example's metric (1/0 for exact match)
    error: str | None = None  # the error kind (metrics.ERROR_KINDS); None when right
    truncated: bool = False


class ErrorGroup(Model):
    kind: str
    count: int
    share: float = Field(..., description="share of the evaluated examples")
    examples: list[Prediction] = Field(default_factory=list, description="the worst few")


class LossCurve(Model):
    steps: int
    first: float | None = None
    last: float | None = None  # mean of the last 10% of steps (at least 1): the end of the curve
    min: float | None = None
    points: list[tuple[int, float]] = Field(default_factory=list, description="up to 50 (step, loss) points")


class Evaluation(Model):
    split: Literal["validation", "test"]
    metric: str
    value: float
    metrics: dict[str, float]
    n_examples: int
    errors: list[ErrorGroup]


class ExperimentReport(Model):
    id: str = Field(..., description="hash of the resolved experiment (task, data chain, model, recipe)")
    status: ExperimentStatus
    cause: str = ""
    task: str
    route: Literal["reference", "hf"]
    validation: Evaluation | None = None  # None when training failed
    loss: LossCurve
    timings_s: dict[str, float] = Field(default_factory=dict, description="data, load, train, eval, total")
    peak_mem_bytes: int | None = None
    params: dict[str, int] = Field(default_factory=dict, description="total and trainable")
    tokens_trained: int = 0
    truncated_train_examples: int = 0
    data: DataVersion
    experiment: dict[str, Any] = Field(..., description="the resolved experiment file")
    environment: dict[str, str] = Field(default_factory=dict)
    run_dir: str = ""

    @property
    def value(self) -> float | None:
        return self.validation.value if self.validation else None


class FinalResult(Model):
    """The test split, over seeds: written by final_evaluation only."""

    experiment_id: str
    metric: str
    seeds: list[int]
    values: list[float]
    mean: float
    std: float
    validation_values: list[float]
    test_metrics: list[dict[str, float]] = Field(default_factory=list, description="every metric, per seed")
    runs: list[str]
