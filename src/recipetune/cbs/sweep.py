"""`recipetune cbs sweep`: steps to a target loss per batch size, the measurement behind the CBS.

For each batch size B of a grid and each (lr, beta2) of its sweep, the reference trainer runs with a
constant learning rate and exponential weight averaging (EWA) until the validation loss of the averaged
weights reaches the target, or a step cap (arXiv 2410.21676). S(B) is the fewest steps over
the sweep of that B. `points.csv` holds one row per B in the format `recipetune cbs fit` reads; the fit
itself lives in cbs/fit.py and the summary in cbs/table.py.

This module reads and plans a sweep (its file, its grid, its runs); cbs/run.py runs the plan and
writes what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from recipetune.config import check_recipe, resolve_paths
from recipetune.core.batch import scale_lr
from recipetune.core.errors import ConfigError, validation_error
from recipetune.core.files import apply_overrides, read_yaml
from recipetune.core.recipe import KnobError, Recipe, Scalar
from recipetune.workloads.reference import ReferenceWorkload

PositiveInt = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]
# Outcomes that a rerun would repeat; crashes and timeouts may be the machine's fault and are run again.
# Knobs the sweep sets itself for every run; a base recipe that sets them is refused.
SWEEP_KNOBS = {
    "global_batch_size": "from batch_sizes",
    "micro_batch_size": "from micro_batch_cap",
    "lr": "from lr.values",
    "beta2": "from beta2",
    "ewa_decay": "by the ewa rule",
    "eval_interval": "from eval_interval",
    "lr_schedule": "always constant after the warm-up",
}
M = TypeVar("M", bound=BaseModel)


class SweepError(RuntimeError):
    """The sweep ran but cannot go on (e.g. no reference run finished, so there is no target)."""


def geometric_grid(start: int, factor: float, count: int) -> list[int]:
    """start, start*factor, ... (count values, rounded to integers, duplicates dropped)."""
    return sorted({round(start * factor**i) for i in range(count)})


def micro_batch(per_rank: int, cap: int) -> int:
    """The largest micro-batch <= cap that divides the per-process batch: accumulation makes up the rest."""
    return max(d for d in range(1, min(per_rank, cap) + 1) if per_rank % d == 0)


# ---------------------------------------------------------------------------------------------- config


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LRGrid(Strict):
    values: list[PositiveFloat] = Field(min_length=1, description="learning rates at reference_batch_size")
    scaling: Literal["none", "sqrt", "linear"] = Field(
        "sqrt", description="each B tries values * (B / reference_batch_size)^p, p = 0, 1/2 or 1"
    )
    reference_batch_size: PositiveInt | None = Field(None, description="default: the smallest batch size")


class EWARule(Strict):
    """1 - t(B) = (1 - decay_at_reference) * B / B_min, clipped to [min, max]: the averaging horizon
    B / (1 - t) stays the same number of sequences at every batch size. `decays` overrides it per B."""

    decay_at_reference: float = Field(0.99, gt=0, lt=1, description="EWA decay at the smallest batch size")
    min: float = Field(0.9, gt=0, lt=1)
    max: float = Field(0.9995, gt=0, lt=1)
    decays: dict[int, Annotated[float, Field(gt=0, lt=1)]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ordered(self) -> EWARule:
        if self.min > self.max:
            raise ValueError(f"min={self.min} is above max={self.max}")
        return self


class ReferenceTarget(Strict):
    tokens: PositiveInt | None = Field(None, description="training tokens D of the reference runs")
    batch_size: PositiveInt | None = Field(None, description="default: the smallest batch size")


class TargetConfig(Strict):
    """A fixed loss, or the best loss the reference runs reach after D tokens, times (1 + epsilon)."""

    loss: PositiveFloat | None = None
    reference: ReferenceTarget | None = None
    epsilon: float = Field(0.0, ge=0, lt=1, description="relative slack on the reference loss")

    @model_validator(mode="after")
    def _one_rule(self) -> TargetConfig:
        if (self.loss is None) == (self.reference is None):
            raise ValueError("give exactly one of 'loss' (a fixed target) or 'reference' (the rule)")
        return self


class SweepConfig(Strict):
    base: dict[str, Scalar] = Field(default_factory=dict, description="reference-trainer knobs of every run")
    batch_sizes: list[PositiveInt] = Field(min_length=1, description="a list, or {start, factor, count}")
    micro_batch_cap: PositiveInt = 16
    lr: LRGrid
    beta2: list[Annotated[float, Field(gt=0, lt=1)]] = Field([0.95], min_length=1)
    ewa: EWARule = EWARule()
    target: TargetConfig
    max_steps: PositiveInt = 2000
    max_tokens: PositiveInt | None = None
    eval_interval: PositiveInt = 10
    eval_scaling: Literal["fixed", "tokens"] = Field(
        "fixed", description="tokens: every eval_interval * B_min / B steps, the same tokens at every B"
    )
    timeout_s: PositiveFloat = 3600.0
    b_opt: PositiveFloat | None = Field(None, description="reference batch size of the 20% rule")
    bootstrap_seed: int = 0

    @field_validator("batch_sizes", mode="before")
    @classmethod
    def _grid(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        unknown = set(v) - {"start", "factor", "count"}
        if unknown or not {"start", "count"} <= set(v):
            raise ValueError("a geometric grid is {start: int, factor: number > 1, count: int}")
        start, factor, count = v["start"], v.get("factor", 2), v["count"]
        if not (isinstance(start, int) and start >= 1 and isinstance(count, int) and count >= 1):
            raise ValueError(f"start and count must be positive integers, got start={start!r}, count={count!r}")
        if isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 1:
            raise ValueError(f"factor must be a number > 1, got {factor!r}")
        return geometric_grid(start, factor, count)

    @field_validator("batch_sizes")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"batch sizes repeat: {v}")
        return sorted(v)


# ---------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Trial:
    """One run to make: a recipe, its step cap, and where it goes (relative to the sweep folder)."""

    kind: str  # sweep | reference | trunk | branch
    batch_size: int
    lr: float
    beta2: float
    ewa_decay: float
    recipe: Recipe
    max_steps: int
    rel: Path
    extra_args: tuple[str, ...] = ()


@dataclass
class SweepSpec:
    """A checked sweep file: every run it will make has been built and validated."""

    path: Path
    config: SweepConfig
    base: Recipe
    workload: ReferenceWorkload
    label: str = ""  # the group, in a scale study
    trials: list[Trial] = field(default_factory=list)
    reference_trials: list[Trial] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return int(self.base["seq_len"])

    def lr_values(self, batch: int) -> list[float]:
        g = self.config.lr
        ref = g.reference_batch_size or self.config.batch_sizes[0]
        return [scale_lr(v, batch / ref, g.scaling) for v in g.values]

    def ewa_decay(self, batch: int) -> float:
        rule = self.config.ewa
        if batch in rule.decays:
            return rule.decays[batch]
        decay = 1.0 - (1.0 - rule.decay_at_reference) * batch / self.config.batch_sizes[0]
        return float(f"{min(rule.max, max(rule.min, decay)):.6g}")

    def eval_interval(self, batch: int) -> int:
        c = self.config
        if c.eval_scaling == "fixed":
            return c.eval_interval
        return max(1, round(c.eval_interval * c.batch_sizes[0] / batch))

    def step_cap(self, batch: int) -> int:
        c = self.config
        if c.max_tokens is None:
            return c.max_steps
        return max(1, min(c.max_steps, c.max_tokens // (batch * self.seq_len)))

    @property
    def reference_batch_size(self) -> int | None:
        ref = self.config.target.reference
        return None if ref is None else ref.batch_size or self.config.batch_sizes[0]

    def reference_steps(self) -> int:
        ref = self.config.target.reference
        assert ref is not None and ref.tokens is not None and self.reference_batch_size is not None
        return max(1, ref.tokens // (self.reference_batch_size * self.seq_len))

    @property
    def data_tokens(self) -> int | None:
        """D: the tokens the reference runs train on (rounded down to whole steps)."""
        if self.config.target.reference is None:
            return None
        return self.reference_steps() * (self.reference_batch_size or 0) * self.seq_len

    def _trial(self, kind: str, batch: int, lr: float, beta2: float, steps: int, rel: Path, where: str) -> Trial:
        decay = self.ewa_decay(batch)
        micro = micro_batch(batch // int(self.base["nproc"]) or 1, self.config.micro_batch_cap)
        values = {
            **self.base, "global_batch_size": batch, "micro_batch_size": micro, "lr": lr, "beta2": beta2,
            "ewa_decay": decay, "lr_schedule": "constant", "eval_interval": self.eval_interval(batch),
        }
        recipe = check_recipe(self.workload, values, self.path, where)
        return Trial(kind, batch, lr, beta2, decay, recipe, steps, rel)

    def build(self) -> None:
        c = self.config
        self.trials = [
            self._trial("sweep", b, lr, b2, self.step_cap(b),
                        Path("runs") / f"B{b:06d}" / f"lr{lr:.4e}_beta2-{b2:g}", f"batch_sizes[{b}]")
            for b in c.batch_sizes for lr in self.lr_values(b) for b2 in c.beta2
        ]
        b_ref = self.reference_batch_size
        if b_ref is not None:
            self.reference_trials = [
                self._trial("reference", b_ref, lr, b2, self.reference_steps(),
                            Path("reference") / f"B{b_ref:06d}_lr{lr:.4e}_beta2-{b2:g}", "target.reference")
                for lr in self.lr_values(b_ref) for b2 in c.beta2
            ]


def validate_model(cls: type[M], raw: dict[str, Any], path: Path) -> M:
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        raise validation_error(e, path) from None


def check_base(path: Path, base: dict[str, Scalar], workload: ReferenceWorkload, owned: dict[str, str]) -> Recipe:
    """The base recipe: known knobs in their domains, none of those the command sets itself."""
    for knob, where in owned.items():
        if knob in base and not (knob == "lr_schedule" and base[knob] == "constant"):
            raise ConfigError(path, f"base.{knob}", f"set by the command for every run ({where}); remove it here")
    try:
        recipe = workload.resolve(resolve_paths(workload, dict(base), path.resolve().parent))
    except KnobError as e:
        raise ConfigError(path, f"base.{e.knob}", str(e)) from None
    # Relations between knobs (batch vs micro-batch vs nproc) are checked per run, once the batch is set.
    if recipe["data"] != "stdlib" and not Path(str(recipe["data"])).exists():
        raise ConfigError(path, "base.data", f"corpus path {recipe['data']} does not exist (use 'stdlib' or a path)")
    return recipe


def make_spec(path: Path, config: SweepConfig, workload: ReferenceWorkload, label: str = "") -> SweepSpec:
    base = check_base(path, config.base, workload, SWEEP_KNOBS)
    ref = config.target.reference
    if ref is not None and ref.tokens is None:
        raise ConfigError(path, "target.reference.tokens", "required: the training tokens D of the reference runs")
    spec = SweepSpec(path, config, base, workload, label)
    spec.build()
    return spec


def load_sweep(path: str | Path, overrides: list[str] | None = None) -> SweepSpec:
    """Read, check and plan a sweep file; raise ConfigError (naming file and field) on bad input."""
    path = Path(path)
    raw = apply_overrides(read_yaml(path), overrides or [], set(SweepConfig.model_fields), "base")
    return make_spec(path, validate_model(SweepConfig, raw, path), ReferenceWorkload())
