"""Settings of the control system (the guard). docs/guard.md explains what each number means."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ParitySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(60, ge=2, description="steps each parity run trains")
    seeds: int = Field(3, ge=1, description="seeds of the baseline profile and of the first look of the parity test")
    window: int = Field(10, ge=1, description="smoothing window of the loss curves shown, in steps")
    tolerance: float = Field(
        1.0, gt=0.0, description="T, the loss tolerance, as a multiple of the baseline's own seed-to-seed standard "
        "deviation of the loss measure")
    floor: float = Field(1e-3, ge=0.0, description="smallest tolerance T, in nats")
    margin: float | None = Field(
        None, gt=0.0, description="T stated in nats instead of derived from the baseline (not needed to pass: "
        "the derived T is the product's standard)")
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="level of each one-sided test, shared by all looks")
    data_order: Literal["auto", "fixed", "varies"] = Field(
        "auto", description="fixed: a candidate must see the baseline's batches; varies: the trainer's sample "
        "order depends on the recipe; auto: the metrics stream's batch fingerprints tell, else nothing is assumed")
    data_order_knobs: list[str] = Field(
        default_factory=list, description="knobs the trainer's sample order depends on (e.g. batch_size)")
    tail: float = Field(0.5, gt=0.0, le=1.0, description="the share of the tokens, at the end of a run, whose "
                        "training loss is the loss measure")
    max_seeds: int = Field(24, ge=1, description="the parity test adds seeds (doubling) up to this many before "
                           "it answers KEEP BASELINE, too short to tell")
    max_steps_factor: int = Field(16, ge=1, description="a trainer without a seed knob: runs grow 4x per look "
                                  "up to this many times parity.steps")


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
