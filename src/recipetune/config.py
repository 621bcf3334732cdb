"""Campaign files: YAML + ``key=value`` overrides (core/files.py) -> typed, checked settings.

One file format serves every command: ``run`` launches its baseline, ``verify`` compares two of
them, ``tune`` searches from it. Every error names the file and the field and says what is
allowed; nothing is written before the whole file has been checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recipetune.core.errors import ConfigError, validation_error
from recipetune.core.files import apply_overrides, read_yaml
from recipetune.core.recipe import KnobError, Recipe
from recipetune.engine.config import TreeSearchConfig
from recipetune.execute.config import ExecuteConfig
from recipetune.guard.config import GuardConfig
from recipetune.workloads.base import Workload
from recipetune.workloads.command import CommandSpec

Scalar = bool | int | float | str


class GlobalBatch(BaseModel):
    """Opt-in to searching the global batch: bounded by a measured critical batch size, the LR following it."""

    model_config = ConfigDict(extra="forbid")

    cbs_summary: str | None = Field(
        None, description="summary.json of `recipetune cbs fit|sweep|scale` (relative to the campaign file)"
    )
    group: str | None = Field(None, description="the summary's group label, when it holds several")
    conservative: bool = Field(True, description="bound by the lower end of B*'s 95% interval; false: B* itself")
    max: int | None = Field(None, ge=1, description="the bound itself (the knob's unit); wins over cbs_summary")
    lr_scaling: Literal["sqrt", "linear", "none"] = Field(
        "sqrt", description="lr = baseline lr x k^p for a batch k times the baseline's: p = 1/2, 1 or 0"
    )
    knob: str = Field("global_batch_size", description="the workload's global-batch knob (sequences per step)")
    lr_knob: str = Field("lr", description="the workload's learning-rate knob")


class SearchConfig(TreeSearchConfig):
    """The speed job's search: semantic knobs only on opt-in, screened at a fixed number of steps."""

    allow_semantic: list[str] = Field(default_factory=list)
    global_batch: GlobalBatch | None = Field(None, description="needed to list the global batch in allow_semantic")
    steps_per_trial: int = Field(30, ge=2)
    reward_span: float = Field(
        4.0, gt=1.0, description="speed-up that earns the full reward 1 (its inverse earns 0; 1.0x earns 0.5)"
    )
    finalists: int = Field(3, ge=1, description="best screened candidates sent to the guard's final verdict")
    production_steps: int = Field(0, ge=0, description="the planned length of the production run, in steps: recipes "
                                  "are ranked with each trial's compile seconds paid once over it (0: not charged)")


class ReferenceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["reference"] = "reference"


class RunSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(30, ge=1, description="training steps of a single run")
    timeout_s: float = Field(900.0, gt=0, description="a run still going after this is killed")


class CampaignConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workload: Annotated[ReferenceSpec | CommandSpec, Field(discriminator="kind")] = ReferenceSpec()
    baseline: dict[str, Scalar] = Field(default_factory=dict, description="the initial recipe")
    run: RunSettings = RunSettings()
    search: SearchConfig = SearchConfig()
    guard: GuardConfig = GuardConfig()
    execute: ExecuteConfig = ExecuteConfig()


@dataclass
class Campaign:
    """A checked campaign file: its settings, its workload and its baseline recipe."""

    path: Path
    config: CampaignConfig
    workload: Workload
    baseline: Recipe


def build_workload(spec: ReferenceSpec | CommandSpec, base_dir: Path, file: str | Path = "campaign") -> Workload:
    if isinstance(spec, CommandSpec):
        from recipetune.workloads.command import CommandWorkload

        try:
            return CommandWorkload(spec, base_dir)
        except ValueError as e:
            field = getattr(e, "field", "")
            raise ConfigError(file, f"workload.{field}" if field else "workload", str(e)) from None
    from recipetune.workloads.reference import ReferenceWorkload

    return ReferenceWorkload()


def resolve_paths(workload: Workload, values: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Relative corpus paths are relative to the campaign file, so examples run from anywhere."""
    if workload.kind == "reference" and isinstance(values.get("data"), str) and values["data"] != "stdlib":
        path = Path(values["data"]).expanduser()
        if not path.is_absolute():
            path = (base_dir / path).resolve()
        values = {**values, "data": str(path)}
    return values


def load_campaign(path: str | Path, overrides: list[str] | None = None) -> Campaign:
    path = Path(path)
    raw = apply_overrides(read_yaml(path), overrides or [], CampaignConfig.model_fields, "baseline")
    try:
        config = CampaignConfig.model_validate(raw)
    except ValidationError as e:
        raise validation_error(e, path) from None
    except RecursionError:
        raise ConfigError(path, "", "nested too deeply to be a campaign file") from None
    base_dir = path.resolve().parent
    workload = build_workload(config.workload, base_dir, path)
    baseline = check_recipe(workload, resolve_paths(workload, config.baseline, base_dir), path, "baseline")
    for name, values in config.search.knobs.items():
        try:
            knob = workload.knobs()[name]
            for v in values:
                knob.validate(v)
        except KnobError as e:
            raise ConfigError(path, f"search.knobs.{name}", str(e)) from None
    for name in config.search.allow_semantic:
        if name not in workload.knobs():
            raise ConfigError(path, "search.allow_semantic", f"unknown knob '{name}'")
    return Campaign(path, config, workload, baseline)


def check_recipe(workload: Workload, values: dict[str, Any], file: Path, section: str) -> Recipe:
    """A recipe from a file: known knobs, in-domain values, consistent, and its data present."""
    try:
        recipe = workload.resolve(values)
    except KnobError as e:
        raise ConfigError(file, f"{section}.{e.knob}", str(e)) from None
    problems = workload.check(recipe)
    if problems:
        raise ConfigError(file, section, "; ".join(problems))
    data = recipe.get("data")
    if workload.kind == "reference" and data != "stdlib" and not Path(str(data)).exists():
        raise ConfigError(file, f"{section}.data", f"corpus path {data} does not exist (use 'stdlib' or a path)")
    return recipe
