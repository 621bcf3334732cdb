"""Any training command as a workload: knob values into its arguments or environment, metrics
read back from a JSONL stream or from log lines through a named regex preset."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Scalar = bool | int | float | str


class KnobSpec(BaseModel):
    """A knob of an outside trainer, declared in the campaign file."""

    model_config = ConfigDict(extra="forbid")

    default: Scalar
    role: Literal["speed", "semantic", "invariant"] = "speed"
    choices: list[Scalar] | None = None
    low: float | None = None
    high: float | None = None
    integer: bool = False
    help: str = ""


class MetricsSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jsonl: str | None = Field(None, description="path template of a JSONL metrics stream, e.g. {out_dir}/m.jsonl")
    regex_preset: str | None = Field(None, description="name of a log-line preset")


class CommandSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["command"] = "command"
    argv: list[str] = Field(min_length=1, description="argv with {knob}, {steps}, {out_dir} placeholders")
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    knobs: dict[str, KnobSpec] = Field(default_factory=dict)
    metrics: MetricsSpec = MetricsSpec(jsonl="{out_dir}/metrics.jsonl")
    tokens_per_step: str | None = Field(None, description="expression over knobs, when the log lacks tokens")
    devices: str = Field("1", description="expression over knobs: devices one run uses")
    flops_per_token: float | None = None
    invariants: list[str] = Field(
        default_factory=list,
        description="relations that must hold ('a * b == 32') or expressions that must not change ('model')",
    )
