"""Settings of the control system (the guard). docs/guard.md explains what each number means."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ParitySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(60, ge=2, description="steps each parity run trains")
    seeds: int = Field(3, ge=1, description="seeds for the final non-inferiority test")
    window: int = Field(10, ge=1, description="smoothing window over the loss curve, in steps")
    tolerance: float = Field(
        0.25, gt=0.0, description="same-seed band: this fraction of the baseline's seed-to-seed spread"
    )
    floor: float = Field(1e-3, ge=0.0, description="smallest loss band and margin, in nats")
    margin: float | None = Field(
        None, ge=0.0, description="non-inferiority margin on the final loss, in nats; None: the baseline's seed std"
    )
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="level of the one-sided non-inferiority test")
    data_order: Literal["auto", "fixed", "varies"] = Field(
        "auto", description="fixed: a candidate must see the baseline's batches; varies: the trainer's sample "
        "order depends on the recipe (independent runs are compared); auto: find out from the first losses")
    data_order_knobs: list[str] = Field(
        default_factory=list, description="knobs the trainer's sample order depends on (e.g. batch_size): a "
        "candidate changing one is compared as independent runs")
    tail: float = Field(0.5, gt=0.0, le=1.0, description="independent runs: the share of the tokens, at the "
                        "end, whose training loss is compared")
    relative_margin: float = Field(
        0.02, gt=0.0, lt=1.0, description="independent runs: non-inferiority margin as a share of the baseline's "
        "final loss, when parity.margin is not set")


class SpeedSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pairs: int = Field(5, ge=2, description="interleaved baseline/candidate measurement pairs")
    steps: int = Field(20, ge=4, description="steps per throughput measurement")
    noise_margin: float | None = Field(
        None, ge=0.0, description="relative speed-up that counts as noise; None derives it from A/A runs"
    )
    min_noise_margin: float = Field(0.01, ge=0.0, description="the derived noise margin is at least this")
    max_noise: float = Field(
        0.5, gt=0.0, description="an A/A noise above this is refused: measured again once, then the machine "
        "is declared busy (KEEP BASELINE)")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="two-sided bootstrap confidence level")
    resamples: int = Field(9999, ge=100, description="bootstrap resamples")


class GuardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parity: ParitySettings = ParitySettings()
    speed: SpeedSettings = SpeedSettings()
    timeout_s: float = Field(900.0, gt=0, description="a guard run still going after this is killed")
