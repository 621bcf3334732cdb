"""`recipetune cbs scale`: the critical batch size across data sizes and model sizes.

A scale study is one sweep per (model, D) group. D is the number of training tokens of the reference
runs that set the group's target: the target loss is the best validation loss the reference batch size
reaches after D tokens (over the lr/beta2 sweep) times (1 + epsilon). That mirrors the paper, where D
is the token budget of a run and the target is chosen per data size; here no run is cut off at D (a
large batch may need more tokens to reach the target), only capped at `max_tokens_factor` x D.

The data-size series varies D at one model, the model-size series varies the model at one D; the
groups are fitted together, and B* = c D^alpha and B* = c N^beta come from cbs.table's scaling fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator
from rich.progress import Progress

from recipetune.cbs.run import SweepResult, run_sweep, write_points
from recipetune.cbs.sweep import PositiveInt, Strict, SweepConfig, SweepSpec, make_spec, validate_model
from recipetune.core.errors import ConfigError
from recipetune.core.files import apply_overrides, read_yaml
from recipetune.workloads.reference import ReferenceWorkload


class DataSizes(Strict):
    model: str | None = Field(None, description="model preset of the data-size series (default: base.model)")
    tokens: list[PositiveInt] = Field(min_length=2, description="training tokens D of each group")


class ModelSizes(Strict):
    models: list[str] = Field(min_length=2, description="model presets of the model-size series")
    tokens: PositiveInt = Field(description="the fixed D of the model-size series")


class ScaleConfig(SweepConfig):
    data_sizes: DataSizes | None = None
    model_sizes: ModelSizes | None = None
    max_tokens_factor: float = Field(16.0, ge=1, description="each run stops at this many times its group's D")

    @model_validator(mode="after")
    def _series(self) -> ScaleConfig:
        if self.data_sizes is None and self.model_sizes is None:
            raise ValueError("give data_sizes, model_sizes or both")
        return self


@dataclass
class Group:
    model: str
    tokens: int
    spec: SweepSpec

    @property
    def folder(self) -> Path:
        return Path("groups") / f"{self.model}_D{self.tokens}"


@dataclass
class ScaleSpec:
    path: Path
    config: ScaleConfig
    groups: list[Group]

    @property
    def n_runs(self) -> int:
        return sum(len(g.spec.trials) + len(g.spec.reference_trials) for g in self.groups)


def load_scale(path: str | Path, overrides: list[str] | None = None) -> ScaleSpec:
    """Read and check a scale file and plan every group's sweep; ConfigError on bad input."""
    path = Path(path)
    raw = apply_overrides(read_yaml(path), overrides or [], set(ScaleConfig.model_fields), "base")
    cfg = validate_model(ScaleConfig, raw, path)
    if cfg.target.loss is not None or cfg.target.reference is None:
        raise ConfigError(path, "target", "a scale study sets its target per group: use target.reference, not loss")
    if cfg.target.reference.tokens is not None:
        raise ConfigError(path, "target.reference.tokens", "set per group by data_sizes.tokens / model_sizes.tokens")
    base_model = str(cfg.base.get("model", ReferenceWorkload().knobs()["model"].default))
    pairs: list[tuple[str, int, str]] = []
    if cfg.data_sizes is not None:
        pairs += [(cfg.data_sizes.model or base_model, d, "data_sizes") for d in cfg.data_sizes.tokens]
    if cfg.model_sizes is not None:
        pairs += [(m, cfg.model_sizes.tokens, "model_sizes") for m in cfg.model_sizes.models]
    workload = ReferenceWorkload()
    groups: dict[tuple[str, int], Group] = {}  # a group in both series is measured once
    for model, tokens, series in pairs:
        if (model, tokens) in groups:
            continue
        if model not in workload.knobs()["model"].choices:  # type: ignore[operator]
            raise ConfigError(path, f"{series}.model", f"unknown model preset {model!r}; valid: "
                              + ", ".join(map(str, workload.knobs()["model"].choices or ())))
        cap = int(cfg.max_tokens_factor * tokens)
        sub = cfg.model_copy(update={
            "base": {**cfg.base, "model": model},
            "target": cfg.target.model_copy(update={"reference": cfg.target.reference.model_copy(
                update={"tokens": tokens})}),
            "max_tokens": min(cfg.max_tokens, cap) if cfg.max_tokens else cap,
        })
        sweep_fields = {k: getattr(sub, k) for k in SweepConfig.model_fields}
        spec = make_spec(path, SweepConfig.model_validate(sweep_fields), workload, f"[{model} D={tokens}] ")
        groups[(model, tokens)] = Group(model, tokens, spec)
    return ScaleSpec(path, cfg, list(groups.values()))


@dataclass
class ScaleResult:
    groups: list[tuple[Group, SweepResult]]

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for _, r in self.groups)


def run_scale(spec: ScaleSpec, out_dir: Path, progress: Progress | None = None) -> ScaleResult:
    """Run (or resume) every group's sweep; write the combined points.csv with model_size, data_size."""
    out_dir.mkdir(parents=True, exist_ok=True)
    overall = progress.add_task("scale study (groups)", total=len(spec.groups)) if progress else None
    done = []
    for group in spec.groups:
        done.append((group, run_sweep(group.spec, out_dir / group.folder, progress)))
        if progress is not None and overall is not None:
            progress.advance(overall)
    if progress is not None and overall is not None:
        progress.remove_task(overall)
    rows, labels = [], []
    for group, result in done:
        for r in result.best:
            rows.append(r)
            labels.append(group_columns(group, result))
    write_points(out_dir / "points.csv", rows, labels)
    return ScaleResult(done)


def group_columns(group: Group, result: SweepResult) -> dict[str, Any]:
    from recipetune.trainer.presets import count_params, get_model_config

    # N: the trainer's own parameter count (run.json), else the preset's; D: the reference runs' tokens.
    params = result.params or count_params(get_model_config(group.model))
    return {"model_size": params, "data_size": result.data_tokens, "model": group.model}
