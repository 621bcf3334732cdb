"""Campaign files: YAML + ``key=value`` overrides -> typed, checked settings.

One file format serves every command: ``run`` launches its baseline, ``verify`` compares two of
them, ``tune`` searches from it. Every error names the file and the field and says what is
allowed; nothing is written before the whole file has been checked.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recipetune.core.errors import ConfigError, validation_error
from recipetune.core.recipe import KnobError, Recipe
from recipetune.engine.config import SearchConfig
from recipetune.execute.config import ExecuteConfig
from recipetune.guard.config import GuardConfig
from recipetune.workloads.base import Workload
from recipetune.workloads.command import CommandSpec

Scalar = bool | int | float | str


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


def parse_override(
    text: str, fields: Collection[str] | None = None, default_section: str = "baseline"
) -> tuple[list[str], Any]:
    """``micro_batch_size=16`` sets a knob of the default section; a dotted key (``run.steps=50``)
    any field. ``fields`` are the top-level sections of the file (a campaign file's by default)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError("command line", text, "an override must look like key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    path = key.strip().split(".")
    if path[0] not in (CampaignConfig.model_fields if fields is None else fields):
        path = [default_section, *path]
    return path, value


def apply_overrides(
    raw: dict[str, Any],
    overrides: list[str],
    fields: Collection[str] | None = None,
    default_section: str = "baseline",
) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text, fields, default_section)
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError("command line", text, f"'{part}' is not a section")
            node = child
        node[path[-1]] = value
    return raw


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(path, "", "no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(path, "", f"not a text file: byte {e.start} is not UTF-8 (a campaign file is YAML text)") \
            from None
    except OSError as e:
        raise ConfigError(path, "", f"cannot read: {e.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(path, where, f"malformed YAML: {getattr(e, 'problem', e)}") from None
    except RecursionError:
        raise ConfigError(path, "", "nested too deeply to be a campaign file") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(path, "", f"expected a mapping of sections at the top, got {type(raw).__name__}")
    return raw


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
    raw = apply_overrides(read_yaml(path), overrides or [])
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
