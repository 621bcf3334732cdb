"""`recipetune cbs sweep`: steps to a target loss per batch size, the measurement behind the CBS.

For each batch size B of a grid and each (lr, beta2) of its sweep, the reference trainer runs with a
constant learning rate and exponential weight averaging (EWA) until the validation loss of the averaged
weights reaches the target, or a step cap (arXiv 2410.21676). S(B) is the fewest steps over
the sweep of that B. `points.csv` holds one row per B in the format `recipetune cbs fit` reads; the fit
itself lives in cbs/fit.py and the summary in cbs/table.py.

Every run has its own folder and, once finished, a `point.json`; a restarted sweep reuses each finished
run whose recipe, step cap and target are unchanged, so a long sweep can be stopped and resumed.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from rich.progress import Progress

from recipetune.config import check_recipe, resolve_paths
from recipetune.core.errors import ConfigError, validation_error
from recipetune.core.files import apply_overrides, read_yaml
from recipetune.core.measure import RunResult
from recipetune.core.recipe import KnobError, Recipe, Scalar
from recipetune.workloads.reference import ReferenceWorkload

PositiveInt = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]
# Outcomes that a rerun would repeat; crashes and timeouts may be the machine's fault and are run again.
FINISHED = frozenset({"ok", "nan", "oom", "invalid"})
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
LR_EXPONENT = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}
M = TypeVar("M", bound=BaseModel)


class SweepError(RuntimeError):
    """The sweep ran but cannot go on (e.g. no reference run finished, so there is no target)."""


def geometric_grid(start: int, factor: float, count: int) -> list[int]:
    """start, start*factor, ... (count values, rounded to integers, duplicates dropped)."""
    return sorted({round(start * factor**i) for i in range(count)})


def scale_lr(lr: float, k: float, rule: str) -> float:
    """The learning rate for a batch k times larger: unchanged, times sqrt(k) (Adam), or times k (SGD)."""
    return lr * k ** LR_EXPONENT[rule]


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


def _num(x: float) -> str:
    return f"{x:.4g}"


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


# ---------------------------------------------------------------------------------------------- run


class TrialRecord(BaseModel):
    """What one run gave, saved as point.json in its folder."""

    key: str
    kind: str
    batch_size: int
    lr: float
    beta2: float
    ewa_decay: float
    seq_len: int
    max_steps: int
    target: float | None
    status: str
    cause: str = ""
    steps_run: int = 0
    steps_to_target: int | None = None  # first validation at or below the target; None: never
    tokens_to_target: int | None = None
    final_val_loss: float | None = None
    best_val_loss: float | None = None
    wall_s: float = 0.0
    params: int | None = None
    folder: str = ""
    resumed: bool = Field(False, exclude=True)

    @property
    def reached(self) -> bool:
        return self.steps_to_target is not None


def trial_key(trial: Trial, target: float | None) -> str:
    blob = json.dumps([trial.recipe.canonical_json(), trial.max_steps, target, list(trial.extra_args)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _write_json(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # a sweep killed mid-write never leaves a torn point.json behind


def run_trial(
    workload: ReferenceWorkload,
    trial: Trial,
    out_dir: Path,
    target: float | None,
    timeout_s: float,
    progress: Progress | None = None,
    label: str = "",
) -> TrialRecord:
    """Run one trial, or reuse its finished point.json when recipe, step cap and target are unchanged."""
    folder = out_dir / trial.rel
    key = trial_key(trial, target)
    point = folder / "point.json"
    if point.is_file():
        try:
            old = TrialRecord.model_validate_json(point.read_text())
        except ValueError:
            old = None
        if old is not None and old.key == key and old.status in FINISHED:
            old.resumed = True
            return old
    args = list(trial.extra_args)
    if target is not None:
        args += ["--stop-at-val-loss", repr(target)]
    task = progress.add_task(label or str(trial.rel), total=trial.max_steps) if progress else None

    def on_steps(done: int) -> None:
        if progress is not None and task is not None:
            progress.update(task, completed=min(done, trial.max_steps))

    try:
        result = workload.run(trial.recipe, trial.max_steps, folder, timeout_s=timeout_s,
                              progress=on_steps, extra_args=args)
    finally:
        if progress is not None and task is not None:
            progress.remove_task(task)
    vals = [e for e in result.evals if math.isfinite(e.val_loss)]
    reached = next((e.step for e in result.evals if target is not None and e.val_loss <= target), None)
    start = result.steps[0].step - 1 if result.steps else 0  # a branch counts from its checkpoint
    steps_to_target = None if reached is None else reached - start
    try:
        params = json.loads((folder / "run.json").read_text()).get("params")
    except (OSError, ValueError):
        params = None
    record = TrialRecord(
        key=key, kind=trial.kind, batch_size=trial.batch_size, lr=trial.lr, beta2=trial.beta2,
        ewa_decay=trial.ewa_decay, seq_len=int(trial.recipe["seq_len"]), max_steps=trial.max_steps,
        target=target, status=result.status, cause=result.cause, steps_run=len(result.steps),
        steps_to_target=steps_to_target,
        tokens_to_target=None if steps_to_target is None else steps_to_target * trial.batch_size * int(
            trial.recipe["seq_len"]),
        final_val_loss=result.evals[-1].val_loss if result.evals else None,
        best_val_loss=min(e.val_loss for e in vals) if vals else None,
        wall_s=result.wall_s, params=params, folder=str(folder),
    )
    _write_json(point, record.model_dump_json(indent=2))
    return record


@dataclass
class SweepResult:
    target: float
    target_rule: str
    trials: list[TrialRecord]
    reference: list[TrialRecord]
    best: list[TrialRecord]  # one per batch size: fewest steps, or (never reached) lowest loss
    params: int | None
    data_tokens: int | None
    wall_s: float  # the runs' own wall time, resumed runs included

    @property
    def missed(self) -> list[int]:
        return [r.batch_size for r in self.best if not r.reached]


def best_per_batch(records: list[TrialRecord]) -> list[TrialRecord]:
    """Per batch size: the run that reached the target in the fewest steps (ties: the lower loss); when none
    reached it, the run that came closest, which then stands for a batch size that missed the target."""
    by_batch: dict[int, list[TrialRecord]] = {}
    for r in records:
        by_batch.setdefault(r.batch_size, []).append(r)
    best = []
    for batch in sorted(by_batch):
        runs = by_batch[batch]
        reached = [r for r in runs if r.reached]
        if reached:
            best.append(min(reached, key=lambda r: (r.steps_to_target, r.best_val_loss or 0.0, r.lr)))
        else:
            best.append(min(runs, key=lambda r: (r.best_val_loss is None, r.best_val_loss or 0.0, r.lr)))
    return best


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress.console.print(text, highlight=False)


def _describe(r: TrialRecord) -> str:
    derived = r.cause.startswith("read from reference")
    tag = " (read from the reference run)" if derived else " (resumed)" if r.resumed else f" in {r.wall_s:.0f}s"
    if r.status != "ok":
        outcome = f"{r.status}: {r.cause}"
    elif r.kind == "reference":
        outcome = f"val loss {r.final_val_loss:.4f} after {r.steps_run} steps"
    elif r.reached:
        outcome = f"target after {r.steps_to_target} steps"
    else:
        best = "n/a" if r.best_val_loss is None else f"{r.best_val_loss:.4f}"
        outcome = f"target missed in {r.steps_run} steps (best val {best})"
    return f"B={r.batch_size} lr={_num(r.lr)} beta2={r.beta2:g}: {outcome}{tag}"


def from_reference(trial: Trial, ref: TrialRecord | None, target: float) -> TrialRecord | None:
    """A sweep run with the recipe of a finished reference run is that run stopped at the target (same seed,
    same data order): read its steps from the reference's validations instead of training it again."""
    if ref is None or ref.status != "ok":
        return None
    try:
        evals = RunResult.load(Path(ref.folder) / "result.json").evals
    except (OSError, ValueError):
        return None
    reached = next((e for e in evals if e.val_loss <= target), None)
    if reached is None or reached.step > trial.max_steps:
        return None  # the reference never got there: the sweep run must go on past D tokens
    loss = [e.val_loss for e in evals if e.step <= reached.step]
    return ref.model_copy(update={
        "key": trial_key(trial, target), "kind": trial.kind, "max_steps": trial.max_steps, "target": target,
        "cause": f"read from reference run {ref.folder}", "steps_run": reached.step,
        "steps_to_target": reached.step, "tokens_to_target": reached.step * trial.batch_size * ref.seq_len,
        "final_val_loss": reached.val_loss, "best_val_loss": min(loss), "wall_s": 0.0, "resumed": ref.resumed,
    })


def resolve_target(spec: SweepSpec, out_dir: Path, progress: Progress | None = None,
                   overall: Any = None) -> tuple[float, str, list[TrialRecord]]:
    """The target loss, and how it was chosen (running the reference trials when the rule asks)."""
    t = spec.config.target
    if t.loss is not None:
        return t.loss, f"fixed: {t.loss:g}", []
    records = []
    for trial in spec.reference_trials:
        rec = run_trial(spec.workload, trial, out_dir, None, spec.config.timeout_s, progress,
                        f"{spec.label}reference B={trial.batch_size} lr={_num(trial.lr)}")
        records.append(rec)
        _say(progress, f"{spec.label}reference {_describe(rec)}")
        if progress is not None and overall is not None:
            progress.advance(overall)
    losses = [r.final_val_loss for r in records if r.status == "ok" and r.final_val_loss is not None]
    if not losses:
        raise SweepError(
            f"{spec.path}: no reference run finished, so there is no target loss; see "
            + ", ".join(f"{r.folder} ({r.status}: {r.cause})" for r in records)
        )
    best = min(losses)
    rule = (
        f"best validation loss after D={spec.data_tokens} tokens at B={spec.reference_batch_size} over the "
        f"lr/beta2 sweep ({best:.4f}) x (1 + {t.epsilon:g})"
    )
    return best * (1.0 + t.epsilon), rule, records


def run_sweep(spec: SweepSpec, out_dir: Path, progress: Progress | None = None) -> SweepResult:
    """Run (or resume) every trial of the sweep and write runs.csv, points.csv and sweep.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(spec.config.model_dump(mode="json"), sort_keys=False))
    total = len(spec.trials) + len(spec.reference_trials)
    overall = progress.add_task(f"{spec.label}sweep (runs)", total=total) if progress else None
    target, rule, reference = resolve_target(spec, out_dir, progress, overall)
    _say(progress, f"{spec.label}target validation loss {target:.4f} ({rule})")
    references = {t.recipe.canonical_json(): r for t, r in zip(spec.reference_trials, reference, strict=False)}
    records = []
    for trial in spec.trials:
        rec = from_reference(trial, references.get(trial.recipe.canonical_json()), target)
        if rec is None:
            rec = run_trial(spec.workload, trial, out_dir, target, spec.config.timeout_s, progress,
                            f"{spec.label}B={trial.batch_size} lr={_num(trial.lr)} beta2={trial.beta2:g}")
        records.append(rec)
        _say(progress, f"{spec.label}{_describe(rec)}")
        if progress is not None and overall is not None:
            progress.advance(overall)
    if progress is not None and overall is not None:
        progress.remove_task(overall)
    params = next((r.params for r in records + reference if r.params), None)
    result = SweepResult(
        target, rule, records, reference, best_per_batch(records), params, spec.data_tokens,
        sum(r.wall_s for r in records + reference),
    )
    write_runs(out_dir / "runs.csv", reference + records)
    write_points(out_dir / "points.csv", result.best)
    _write_json(out_dir / "sweep.json", json.dumps(sweep_dict(spec, result), indent=2))
    (out_dir / "sweep.md").write_text(sweep_markdown(spec, result))
    return result


# ---------------------------------------------------------------------------------------------- files

POINT_COLUMNS = ("batch_size", "steps", "tokens", "lr", "beta2", "ewa_decay", "best_val_loss", "status")


def _cell(x: Any) -> str:
    return "" if x is None else str(x)


def write_points(path: Path, best: list[TrialRecord], groups: list[dict[str, Any]] | None = None) -> Path:
    """One row per batch size, `recipetune cbs fit` format: steps is empty where the target was missed."""
    extra = list(groups[0]) if groups else []
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*extra, *POINT_COLUMNS])
        for i, r in enumerate(best):
            w.writerow([
                *(_cell(groups[i][c]) for c in extra if groups),
                r.batch_size, _cell(r.steps_to_target), _cell(r.tokens_to_target), r.lr, r.beta2, r.ewa_decay,
                _cell(r.best_val_loss), r.status if r.reached or r.status != "ok" else "missed",
            ])
    return path


def write_runs(path: Path, records: list[TrialRecord]) -> Path:
    columns = ["kind", "batch_size", "lr", "beta2", "ewa_decay", "status", "steps_to_target", "tokens_to_target",
               "steps_run", "max_steps", "final_val_loss", "best_val_loss", "target", "wall_s", "folder", "cause"]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow({k: _cell(v) for k, v in r.model_dump().items()})
    return path


def sweep_dict(spec: SweepSpec, result: SweepResult) -> dict[str, Any]:
    return {
        "config": str(spec.path),
        "base_recipe": dict(spec.base),
        "target": result.target,
        "target_rule": result.target_rule,
        "ewa_rule": "1 - t(B) = (1 - decay_at_reference) * B / B_min, clipped to [min, max]",
        "params": result.params,
        "data_tokens": result.data_tokens,
        "runs_wall_s": result.wall_s,
        "points": [r.model_dump() for r in result.best],
        "missed_batch_sizes": result.missed,
    }


def sweep_markdown(spec: SweepSpec, result: SweepResult) -> str:
    """The steps-to-target table, ready to paste into a report."""
    lines = [
        f"# CBS sweep: `{spec.path}`",
        "",
        f"Target validation loss (EWA weights): {result.target:.4f}, {result.target_rule}.",
        f"Model parameters: {result.params}. Sequence length: {spec.seq_len}. Step cap: {spec.config.max_steps}"
        + (f", token cap {spec.config.max_tokens}" if spec.config.max_tokens else "") + ".",
        f"Runs: {len(result.trials) + len(result.reference)}, their wall time {result.wall_s / 60:.1f} min.",
        "",
        "| B | steps to target | tokens | lr | beta2 | EWA decay | best val loss | runs in sweep |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result.best:
        n = sum(t.batch_size == r.batch_size for t in result.trials)
        steps = str(r.steps_to_target) if r.reached else f"not reached ({r.status}, {r.steps_run} steps)"
        loss = "n/a" if r.best_val_loss is None else f"{r.best_val_loss:.4f}"
        lines.append(f"| {r.batch_size} | {steps} | {_cell(r.tokens_to_target) or '-'} | {_num(r.lr)} | "
                     f"{r.beta2:g} | {r.ewa_decay:g} | {loss} | {n} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- speed job


def cbs_bound(summary_json: str | Path, group: str | None = None, conservative: bool = True) -> int:
    """The largest global batch (in the summary's unit, sequences for our sweeps) a speed campaign may allow.

    Reads a `summary.json` written by `recipetune cbs fit|sweep|scale`. conservative: the lower end of
    the 95% interval of B*, else the estimate itself. `group` picks a group by its label (e.g. "D=1e+06,
    N=7.7e+05") when the summary has several. Raises ValueError when there is no finite B* to bound by.
    """
    path = Path(summary_json)
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable CBS summary ({e})") from None
    groups = summary.get("groups") or []
    if group is not None:
        groups = [g for g in groups if g.get("label") == group]
    if len(groups) != 1:
        labels = ", ".join(str(g.get("label")) for g in summary.get("groups") or [])
        raise ValueError(f"{path}: pick one group with group=...; groups: {labels or 'none'}")
    g = groups[0]
    value = (g.get("b_star_ci95") or [None])[0] if conservative else g.get("b_star")
    if value is None or g.get("b_star_unbounded") or not math.isfinite(value) or value < 1:
        what = "the lower end of the B* interval" if conservative else "B*"
        raise ValueError(f"{path}: group {g.get('label')}: {what} is not finite and >= 1, nothing to bound by")
    return int(math.floor(value))
