"""Settings of the control system (the guard). docs/guard.md explains what each number means."""

from __future__ import annotations

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


class SpeedSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pairs: int = Field(5, ge=2, description="interleaved baseline/candidate measurement pairs")
    steps: int = Field(20, ge=4, description="steps per throughput measurement")
    noise_margin: float | None = Field(
        None, ge=0.0, description="relative speed-up that counts as noise; None derives it from A/A runs"
    )
    min_noise_margin: float = Field(0.01, ge=0.0, description="the derived noise margin is at least this")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="two-sided bootstrap confidence level")
    resamples: int = Field(9999, ge=100, description="bootstrap resamples")


class GuardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parity: ParitySettings = ParitySettings()
    speed: SpeedSettings = SpeedSettings()
    timeout_s: float = Field(900.0, gt=0, description="a guard run still going after this is killed")
