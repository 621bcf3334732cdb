"""What the parity test shows: each loss measure's test (``Measured``) and the evidence of one look
(``ParityEvidence``), as verdict.json states them. guard/parity.py computes them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from recipetune.core.words import ParityOutcome, TrendOutcome

Mode = Literal["same batches", "other batches", "batches unknown", "equal tokens"]


class Measured(BaseModel):
    """One loss measure's test (the training loss over the tail, or the validation loss)."""

    measure: str
    baseline_finals: list[float]
    candidate_finals: list[float]
    mean_diff: float
    se: float | None
    low: float | None
    high: float | None
    tolerance: float  # T of this measure
    detectable: float | None
    reference: float  # sigma_M
    reference_kind: str
    se_source: str
    outcome: ParityOutcome
    reason: str = ""
    # Runs longer than the profile's showed a difference beyond noise that is not beyond T: an effect that
    # fades with training looks like this, and a still longer look could only find it smaller (the fade rule).
    fades: bool = False


class Trend(BaseModel):
    """The gap between the two recipes as a function of training: its slope over the window M averages
    (docs/guard.md, "What a verdict proves"). A gap shown (at ``level``, two-sided) to grow by more than
    ``margin`` per horizon (the steps compared) is not approved even where the endpoint is within T."""

    steps: int  # the horizon: steps compared
    tokens: int  # tokens compared
    first_step: int  # the window the slope is fitted over (the records M averages)
    last_step: int
    slope: float  # the gap's slope, nats per 1,000 steps (candidate minus baseline)
    low: float  # bounds at ``level`` (two-sided), nats per 1,000 steps
    high: float
    level: float
    margin: float  # nats the gap may gain per horizon (``steps``) before a shown growth blocks approval
    source: str  # what the slope's error rests on
    outcome: TrendOutcome
    reason: str = ""

    def summary(self) -> str:
        return (f"over {self.steps:,} steps ({self.tokens:,} tokens) the gap's slope over steps {self.first_step:,}-"
                f"{self.last_step:,} is {self.slope:+.4f} [{self.low:+.4f}, {self.high:+.4f}] nats per 1,000 steps "
                f"({confidence_label(self.level)} two-sided)")


# The decisive measure's fields, as verdict.json has always carried them at the evidence's top level (the key
# order of a verdict of today, so that it renders byte-identical): verdict.json key -> Measured field.
_FLAT = {"final_metric": "measure", **{k: k for k in (
    "baseline_finals", "candidate_finals", "mean_diff", "se", "low", "high", "tolerance", "detectable", "reference",
    "reference_kind")}}
_ORDER = ("mode", "mode_reason", "passed", "outcome", "reasons", "notes", "seeds", "steps_compared", *_FLAT,
          "two_sided", "alpha", "level", "se_source")


def confidence_label(level: float) -> str:
    """A level as the confidence its bounds are stated at: a one-sided 0.0025 -> '99.75%'; a two-sided 0.01
    (alpha / 2 on each side) -> '99%'."""
    return f"{100 * (1 - level):.2f}".rstrip("0").rstrip(".") + "%"


class ParityEvidence(BaseModel):
    """The parity test's result at one look: the outcome, how the evidence was gathered, and the measure it
    rests on (``decisive``, one of ``measures``), whose figures verdict.json states at the top level."""

    mode: Mode
    mode_reason: str  # declared, what the fingerprints showed, or that nothing tells
    passed: bool
    outcome: ParityOutcome
    reasons: list[str]
    notes: list[str] = []
    seeds: list[int | None]
    steps_compared: int
    decisive: Measured = Field(exclude=True)  # the measure the outcome rests on (flattened into verdict.json)
    two_sided: bool = True
    alpha: float
    level: float  # this look's nominal one-sided level (alpha for a single look; less at a sequential look)
    too_short: bool = False  # too few logged losses in a tail to estimate the noise: only longer runs help
    measures: list[Measured] = []  # each measure's test
    gap: float | None = None  # diagnostic: RMS of the smoothed per-step difference (first pair), nats
    window: int = 10
    noise: dict[str, float] = {}  # step-to-step noise of each side's logged loss in the tail
    trend: Trend | None = None  # the gap's slope over the compared window (None: too few records to fit)

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: object) -> object:
        # A verdict.json (or a caller) states the decisive measure's figures at the top level: gather them.
        # Verdicts written before the planned design carry `looks` (Bonferroni over the doublings) and no
        # level: their level was alpha split over those looks. Reports still read them.
        if not isinstance(data, dict) or "decisive" in data:
            return data
        data = dict(data)
        if "level" not in data and "alpha" in data:
            data["level"] = data["alpha"] / max(1, int(data.get("looks") or 1))
        flat = {field: data.pop(key) for key, field in _FLAT.items() if key in data}
        flat.setdefault("measure", "training loss")
        data["decisive"] = {"baseline_finals": [], "candidate_finals": [], "mean_diff": 0.0, "se": None, "low": None,
                            "high": None, "tolerance": 0.0, "detectable": None, "reference": 0.0, "reference_kind": "",
                            "se_source": data.pop("se_source", ""),
                            "outcome": data.get("outcome", ParityOutcome.INCONCLUSIVE), **flat}
        return data

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        flat = {key: getattr(self.decisive, field) for key, field in _FLAT.items()}
        flat["se_source"] = self.decisive.se_source
        head = {k: (flat[k] if k in flat else out[k]) for k in _ORDER}
        return {**head, **{k: v for k, v in out.items() if k not in head}}

    # The decisive measure's figures, read through (one concept in one place: Measured).
    @property
    def final_metric(self) -> str:  # what M is
        return self.decisive.measure

    @property
    def baseline_finals(self) -> list[float]:
        return self.decisive.baseline_finals

    @property
    def candidate_finals(self) -> list[float]:
        return self.decisive.candidate_finals

    @property
    def mean_diff(self) -> float:  # candidate - baseline M, averaged over the pairs
        return self.decisive.mean_diff

    @property
    def se(self) -> float | None:
        return self.decisive.se

    @property
    def low(self) -> float | None:  # one-sided bounds at this look's level
        return self.decisive.low

    @property
    def high(self) -> float | None:
        return self.decisive.high

    @property
    def tolerance(self) -> float:  # T
        return self.decisive.tolerance

    @property
    def detectable(self) -> float | None:  # the smallest difference these runs resolve (80% power); APPROVED: <= T
        return self.decisive.detectable

    @property
    def reference(self) -> float:  # the baseline's seed-to-seed standard deviation of M that T is a multiple of
        return self.decisive.reference

    @property
    def reference_kind(self) -> str:  # how that standard deviation was measured
        return self.decisive.reference_kind

    @property
    def se_source(self) -> str:
        return self.decisive.se_source

    def horizon(self) -> str:
        """What the verdict's parity covers: 'parity shown over N steps (M tokens); the gap's slope ...'."""
        if self.trend is None:
            return (f"parity {'shown' if self.passed else 'compared'} over {self.steps_compared:,} steps; the gap's "
                    "slope was not fitted (too few logged losses in the window, or a measure not comparable)")
        t = self.trend
        return (f"parity {'shown' if self.passed else 'compared'} over {t.steps:,} steps ({t.tokens:,} tokens); the "
                f"gap's slope over steps {t.first_step:,}-{t.last_step:,} is {t.slope:+.4f} [{t.low:+.4f}, "
                f"{t.high:+.4f}] nats per 1,000 steps")

    def summary(self) -> str:
        bounds = "" if self.low is None else \
            f", one-sided {confidence_label(self.level)} bounds [{self.low:+.4f}, {self.high:+.4f}]"
        side = "+-T" if self.two_sided else "below T"
        det = "" if self.detectable is None else f", detectable {self.detectable:.4f}"
        return (f"{self.mode}: final {self.final_metric} {self.mean_diff:+.4f} nats{bounds} {side} = "
                f"{self.tolerance:.4f}{det}")

