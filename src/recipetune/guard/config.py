"""Settings of the control system (the guard)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ParitySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(60, ge=2, description="steps each parity run trains")
    seeds: int = Field(3, ge=1, description="seeds for the final non-inferiority test")
    window: int = Field(10, ge=1, description="smoothing window over the loss curve, in steps")


class SpeedSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pairs: int = Field(5, ge=2, description="interleaved baseline/candidate measurement pairs")
    steps: int = Field(20, ge=4, description="steps per throughput measurement")
    noise_margin: float | None = Field(
        None, ge=0.0, description="relative speed-up that counts as noise; None derives it from A/A runs"
    )


class GuardConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parity: ParitySettings = ParitySettings()
    speed: SpeedSettings = SpeedSettings()
