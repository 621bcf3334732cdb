"""Planning a ``finetune`` campaign: the experiment file with its ``search:`` section, the space of
child experiments, the folder; every check before anything is written (a ConfigError names the file
and field, exit 2)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from recipetune.core.errors import ConfigError, require_extra, validation_error
from recipetune.core.recipe import INVARIANT, KnobError, Recipe, SearchSpace
from recipetune.data.files import DataFileError
from recipetune.engine.config import Pruning, TreeSearchConfig
from recipetune.engine.plan import Plan, open_campaign, redacted
from recipetune.execute.config import ExecuteConfig
from recipetune.finetune.experiment import Experiment, ExperimentSpec, read_experiment_file, validate_spec
from recipetune.finetune.route import ModelError
from recipetune.finetune.routing import check_model
from recipetune.finetune.space import DATA_PREFIX, ExperimentSpace, check_data_steps
from recipetune.finetune.task import load_splits

PLAYBOOK = "recipetune.finetune:playbook.yaml"


class QualityPruning(Pruning):
    """The engine's pruning, and what the quality job scores at each of its checkpoints."""

    eval_examples: int = Field(64, ge=1, description="validation rows scored at a checkpoint")


class FinetuneSearchConfig(TreeSearchConfig):
    """The ``search:`` section of a fine-tuning campaign (an experiment file)."""

    data: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="optional data steps, by name: each one becomes a knob data_<name> (on/off)")
    seeds: list[int] = Field([1, 2, 3], min_length=2, description="seeds of the decision's first look on the test "
                             "split (later looks add the next integers); by default not the search's own "
                             "(recipe.seed 0), whose luck the selection used")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="of the gain's interval: the decision's one-sided "
                              "level in all its looks is (1 - confidence) / 2")
    # The decision's sequential design (finetune/looks.py, core/sequential.py: GainDesign; docs/finetune.md).
    min_gain: float = Field(0.0, ge=0.0, description="the smallest test gain that matters: APPROVED needs the gain "
                            "shown above it (the metric's own units; 0: any gain)")
    max_test_seeds: int = Field(8, ge=2, le=100, description="the most seeds the decision trains each recipe with on "
                                "the test split (2 runs a seed)")
    max_test_s: float | None = Field(None, gt=0, description="the decision's time budget: no look starts that would "
                                     "end past it (at the two recipes' measured pace); None: no limit")
    power: float = Field(0.8, gt=0.5, lt=1.0, description="the chance the planned seeds show the gain they are "
                         "planned for")
    futility: float = Field(0.1, ge=0.0, lt=0.5, description="stop when the chance that the planned seeds show the "
                            "gain is below this")
    first_look: float = Field(0.5, gt=0.0, lt=1.0, description="share of the level the first look spends, fixed "
                              "before any seed runs")
    spending: Literal["obf", "pocock"] = Field("obf", description="how the later looks spend the rest of the level")
    headroom_z: float = Field(2.0, ge=0, description="start no experiment when the baseline's validation metric is "
                              "within this many standard errors of the metric's maximum (1.0): no gain there could "
                              "be told from noise (finetune/job.py: ceiling); 0: only a perfect baseline stops")
    timeout_s: float = Field(1800.0, gt=0, description="an experiment still running after this is killed")
    context_chars: int = Field(6000, ge=500, description="the llm Researcher's context, at most this much JSON")
    # The TREX ablation (docs/benchmarks.md, 8 task-seeds over 3 tasks): MCTS was the best arm on 6 with
    # the model, on 4 with the seeded choice. The speed job keeps the engine's default (its tables do not
    # favour the model).
    explore: Literal["model", "random"] = Field(
        "model", description="the analyst where no specific rule fires: model (TPE fitted to the tree's results so "
                             "far; the default here) or random (one other value of a searched knob, seeded)")
    pruning: QualityPruning = QualityPruning()

    @field_validator("max_test_seeds")
    @classmethod
    def _room_for_the_first_look(cls, v: int, info: ValidationInfo) -> int:
        first = len(info.data.get("seeds") or [])
        if v < first:
            raise ValueError(f"{v} is fewer than the {first} seeds of the first look (search.seeds); at least {first}")
        return v


class FinetuneSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    search: FinetuneSearchConfig = FinetuneSearchConfig()
    execute: ExecuteConfig = ExecuteConfig()


@dataclass
class FinetuneCampaign:
    path: Path
    overrides: list[str]
    experiment: Experiment
    settings: FinetuneSettings
    space: ExperimentSpace
    baseline: Recipe

    @property
    def cfg(self) -> FinetuneSearchConfig:
        return self.settings.search

    def describe(self, recipe: Recipe) -> str:
        """``recipe``'s change from the baseline, in the experiment's words."""
        return self.space.describe(recipe, self.baseline)

    def shared_files(self, folder: Path) -> list[Path]:
        """What a child on any node reads or writes: the campaign folder, the experiment file, the
        task's files and a base model on disk (a cluster's nodes must all see them at the same paths)."""
        exp = self.experiment
        model = Path(exp.spec.model.path)
        model = model if model.is_absolute() else exp.base_dir / model
        return [folder, self.path, *exp.splits.paths.values(), *([model] if model.exists() else [])]


def default_knobs(exp: Experiment) -> dict[str, list[Any]]:
    """A search space when the file lists none: the learning rate and the epochs around the
    baseline's, and full vs LoRA fine-tuning."""
    r = exp.spec.recipe
    other = "lora" if r.method == "full" else "full"
    return {"lr": [round(r.lr / 3, 8), r.lr, round(min(1.0, r.lr * 3), 8)],
            "epochs": [max(0.5, r.epochs / 2), r.epochs, r.epochs * 2], "method": [r.method, other]}


def load_finetune_campaign(path: str | Path, overrides: list[str] | None = None) -> FinetuneCampaign:
    """Read and check a fine-tuning campaign (experiment file + ``search:``); ConfigError on bad input."""
    path = Path(path)
    overrides = list(overrides or [])
    raw, sections = read_experiment_file(path, overrides)
    # the experiment's and the search's bad fields together: one fix-and-retry for all of them
    bad: list[ConfigError] = []
    try:
        spec: ExperimentSpec = validate_spec(path, raw)
    except ConfigError as e:
        bad.append(e)
    try:
        settings = FinetuneSettings.model_validate(sections)
    except ValidationError as e:
        bad.append(validation_error(e, path))
    if bad:
        first, rest = bad[0], bad[1:]
        raise ConfigError(path, first.field, "; ".join([first.message, *(f"{e.field}: {e.message}" for e in rest)]))
    try:
        splits = load_splits(spec.task, path.resolve().parent)
        check_model(spec.model, path.resolve().parent)
    except (DataFileError, ModelError) as e:  # a TaskError is a DataFileError
        raise ConfigError(path, e.field, str(e)) from None
    exp = Experiment(path, spec, splits)
    steps = check_data_steps(settings.search.data, str(path))
    space = ExperimentSpace(exp, steps)
    return FinetuneCampaign(path, overrides, exp, settings, space, space.baseline())


def needed_modules(spec: ExperimentSpec, methods: set[str]) -> list[str]:
    """The optional extras' modules an experiment imports (core/errors.py EXTRAS): the data chain and
    the error kinds always, the metrics named, the route's, LoRA's when a method is ``lora``."""
    task = spec.task
    metrics = {task.metric, *task.metrics}
    modules = ["datasets", "xxhash", "rapidfuzz"]
    modules += ["sklearn"] * ("macro_f1" in metrics) + ["rouge_score"] * ("rouge_l" in metrics)
    if spec.model.kind == "hf":
        modules += ["transformers", "trl", "tokenizers", "accelerate"]
    if "lora" in methods:
        modules.append("peft")
    return modules


def check_space(c: FinetuneCampaign) -> SearchSpace:
    cfg, knobs = c.cfg, c.space.knobs()
    lists = dict(cfg.knobs or default_knobs(c.experiment))
    for name in c.space.data_steps:
        lists.setdefault(DATA_PREFIX + name, [False, True])
    for name in lists:
        if name not in knobs:
            fields = ", ".join(n for n in knobs if not n.startswith(DATA_PREFIX))
            raise ConfigError(c.path, f"search.knobs.{name}",
                              f"not a knob of a fine-tuning experiment: the training recipe's fields are {fields}, "
                              f"and a data step of search.data is the knob {DATA_PREFIX}<name>; the task, the model "
                              "and the evaluation data are never searched")
        if knobs[name].role == INVARIANT:
            raise ConfigError(c.path, f"search.knobs.{name}", f"'{name}' is not searched: the final evaluation "
                                                              "varies it (search.seeds)")
    try:
        space = SearchSpace.from_lists(knobs, lists)
    except KnobError as e:
        raise ConfigError(c.path, f"search.knobs.{e.knob}", str(e)) from None
    # The experiments run in child processes: a missing extra would fail each of them, after the folder
    # is written; refused here instead. The space has no relations between knobs (space.py: relations),
    # so no searched knob is ever stuck at the baseline's value the way a speed knob can be.
    methods = {str(c.baseline.get("method")), *map(str, space.values.get("method", []))}
    require_extra(needed_modules(c.experiment.spec, methods), c.path)
    for name, values in space.values.items():  # every value must make a valid experiment
        for value in values:
            try:
                c.space.experiment_of(c.baseline.with_(**{name: value}))
            except ConfigError as e:
                raise ConfigError(c.path, f"search.knobs.{name}", f"{value!r}: {e.message}") from None
    return space


@dataclass
class FinetunePlan(Plan):
    campaign: FinetuneCampaign


# What a resumed campaign must keep. Not the final seeds: a close call can be settled by resuming with
# more (search.seeds), and the seeds already evaluated are reused (finetune/final.py).
RESUME_KEYS = ("baseline_id", "space", "strategy", "selection", "backup", "experiment", "data_steps")


def plan(c: FinetuneCampaign, folder: Path, resume: bool = False) -> FinetunePlan:
    """Check the campaign and its folder; raise ConfigError (exit 2) before anything is written."""
    cfg = c.cfg
    space = check_space(c)
    spec = c.experiment.spec
    meta = {
        "job": "quality", "file": str(c.path.resolve()), "task": spec.task.name, "metric": spec.task.metric,
        "baseline": dict(c.baseline), "baseline_id": c.baseline.id, "experiment": c.experiment.id,
        "space": {n: list(v) for n, v in space.values.items()}, "data_steps": c.space.data_steps,
        "strategy": cfg.strategy, "selection": cfg.selection, "backup": cfg.backup, "proposer": cfg.proposer,
        "seeds": cfg.seeds,
    }
    proposer, store = open_campaign(cfg, c.settings.execute, c.path, folder, resume, meta, RESUME_KEYS, space,
                                    c.baseline, c.space.relations(), PLAYBOOK)
    settings = redacted(c.settings.model_dump(mode="json"))
    snapshot = {"job": "quality", "experiment": c.experiment.spec.model_dump(mode="json"),
                "overrides": c.overrides, **settings}
    return FinetunePlan(c, folder, resume, space, proposer, meta, store, snapshot)


