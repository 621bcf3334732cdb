"""Settings of the control system (the guard). docs/guard.md explains what each number means."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="level of each one-sided test, spent over the looks")
    power: float = Field(0.8, gt=0.5, lt=1.0, description="the chance the planned evidence shows equivalence "
                         "when the candidate trains exactly like the baseline: what the plan sizes the seeds (or "
                         "steps) for")
    futility: float = Field(0.1, ge=0.0, lt=1.0, description="stop a verdict whose chance to show equivalence within "
                            "the plan (its predictive power) falls below this: KEEP BASELINE, not shown equivalent")
    spending: Literal["obf", "pocock"] = Field(
        "obf", description="how the looks after the first spend alpha: O'Brien-Fleming (strict early, a last look "
        "close to a single test) or Pocock (evenly)")
    first_look: float = Field(0.2, gt=0.0, lt=1.0, description="the share of alpha the first look spends, fixed "
                              "before the candidate runs")
    data_order: Literal["auto", "fixed", "varies"] = Field(
        "auto", description="fixed: a candidate must see the baseline's batches; varies: the trainer's sample "
        "order depends on the recipe; auto: the metrics stream's batch fingerprints tell, else nothing is assumed")
    data_order_knobs: list[str] = Field(
        default_factory=list, description="knobs the trainer's sample order depends on (e.g. batch_size)")
    tail: float = Field(0.5, gt=0.0, le=1.0, description="the share of the tokens, at the end of a run, whose "
                        "training loss is the loss measure")
    trend_alpha: float = Field(0.01, gt=0.0, lt=1.0, description="two-sided level of the trend test: the gap's "
                               "slope over the compared window must be shown growing at this level to block approval")
    trend_margin: float = Field(0.5, ge=0.0, description="a gap shown to grow by more than this many T per "
                                "horizon (the steps compared) is not approved, even where its mean is within T")
    max_steps_factor: int = Field(16, ge=1, description="a trainer without a seed knob: the second look's runs are "
                                  "at most this many times parity.steps")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: object) -> object:
        if isinstance(data, dict) and "max_seeds" in data:
            raise ValueError("max_seeds is gone: the verdict plans its seeds from the profile's noise; cap its "
                             "cost with guard.max_parity_runs (runs, baseline and candidate; default 48)")
        return data


class SpeedSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pairs: int = Field(5, ge=2, description="interleaved baseline/candidate measurement pairs, at most")
    first_pairs: int = Field(3, ge=2, description="pairs of the first look: a gain already clear (or a candidate "
                             "already below the margin) is decided there; from speed.pairs on, one look")
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
    max_parity_runs: int = Field(
        48, ge=1, description="runs one verdict's parity test may train (baseline and candidate; a run k times "
        "parity.steps counts k; stored runs it reuses count nothing); beyond, KEEP BASELINE with what more would tell")
    max_parity_s: float | None = Field(
        None, gt=0, description="wall seconds one verdict's parity test may take; a look that would end later is "
        "not started: KEEP BASELINE with what more would tell")
