"""`recipetune finetune`: the quality job on the shared search engine (engine/loop.py).

The baseline experiment is the root. Each round the Researcher (analyst with the fine-tuning
playbook, llm, or random) selects a node, reads its compressed context and proposes children (a
data chain and a training recipe each); each child runs as its own process (``python -m
recipetune.finetune``, a timeout, a crash recorded, never the campaign's), and its validation metric
becomes the reward: the normalised gain over the baseline (engine/tree.py: ``metric_reward``).

Integrity, the quality job's control system:
- the search never sees the test split: children only ever open train and validation
  (finetune/task.py: ``Splits``); the final evaluation (finetune/final.py) alone opens test;
- contamination is removed in every child (decontamination is always on) and reported per node;
- a child that would change the task, the metric, the model or the evaluation data, or whose data
  steps read the evaluation files, is refused before it runs;
- the decision (finetune/decide.py) is taken on the test split over several seeds, paired by seed:
  APPROVED needs the whole confidence interval of the gain above zero.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recipetune.core.errors import ConfigError, validation_error
from recipetune.core.recipe import INVARIANT, KnobError, Recipe, SearchSpace
from recipetune.core.relations import Relations
from recipetune.engine.config import TreeSearchConfig
from recipetune.engine.loop import Landing, Outcome, Reporter, Row, Search, run_search
from recipetune.engine.plan import Plan, build_proposer, check_folder
from recipetune.engine.samplers import make_sampler
from recipetune.engine.store import CampaignStore
from recipetune.engine.tree import metric_reward, normalised_gain
from recipetune.execute.config import ExecuteConfig
from recipetune.execute.executor import Executor, executor_for
from recipetune.finetune.experiment import Experiment, ExperimentSpec, _validate, read_experiment_file
from recipetune.finetune.report import ExperimentReport
from recipetune.finetune.routes import ModelError, check_model
from recipetune.finetune.space import DATA_PREFIX, ExperimentSpace, check_data_steps
from recipetune.finetune.task import TaskError, load_splits

PLAYBOOK = "recipetune.finetune:playbook.yaml"


class FinetuneSearchConfig(TreeSearchConfig):
    """The ``search:`` section of a fine-tuning campaign (an experiment file)."""

    data: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="optional data steps, by name: each one becomes a knob data_<name> (on/off)")
    seeds: list[int] = Field([1, 2, 3], min_length=2, description="seeds of the final evaluation on the test split; "
                             "by default not the search's own (recipe.seed 0), whose luck the selection used")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="of the gain's interval over the seeds")
    timeout_s: float = Field(1800.0, gt=0, description="an experiment still running after this is killed")
    context_chars: int = Field(6000, ge=500, description="the llm Researcher's context, at most this much JSON")


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
    spec: ExperimentSpec = _validate(path, raw)
    try:
        settings = FinetuneSettings.model_validate(sections)
    except ValidationError as e:
        raise validation_error(e, path) from None
    try:
        splits = load_splits(spec.task, path.resolve().parent)
        check_model(spec.model, path.resolve().parent)
    except (TaskError, ModelError) as e:
        raise ConfigError(path, e.field, str(e)) from None
    exp = Experiment(path, spec, splits)
    steps = check_data_steps(settings.search.data, str(path))
    space = ExperimentSpace(exp, steps)
    return FinetuneCampaign(path, overrides, exp, settings, space, space.baseline())


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
RESUME_KEYS = ("baseline_id", "space", "strategy", "selection", "experiment", "data_steps")


def plan(c: FinetuneCampaign, folder: Path, resume: bool = False) -> FinetunePlan:
    """Check the campaign and its folder; raise ConfigError (exit 2) before anything is written."""
    cfg = c.cfg
    space = check_space(c)
    proposer = build_proposer(cfg, c.path, builtin=PLAYBOOK)
    spec = c.experiment.spec
    meta = {
        "job": "quality", "file": str(c.path.resolve()), "task": spec.task.name, "metric": spec.task.metric,
        "baseline": dict(c.baseline), "baseline_id": c.baseline.id, "experiment": c.experiment.id,
        "space": {n: list(v) for n, v in space.values.items()}, "data_steps": c.space.data_steps,
        "strategy": cfg.strategy, "selection": cfg.selection, "proposer": cfg.proposer, "seeds": cfg.seeds,
    }
    n_done = check_folder(folder, cfg, meta, resume, RESUME_KEYS, c.path)
    sampler = make_sampler(cfg.strategy, space, c.baseline, cfg.seed + n_done, c.space.relations(),
                           c.settings.execute.parallel)
    store = CampaignStore(folder, cfg.storage, sampler, c.settings.execute.heartbeat_s)
    return FinetunePlan(c, folder, resume, space, proposer, meta, store)


# -- one child experiment, in its own process ------------------------------------------------------


@dataclass
class Failed:
    """A child that produced no report (killed for its timeout, refused its input, died)."""

    status: str
    cause: str


def run_child(_subject: Any, file: str, overrides: list[str], child: dict[str, Any], out_dir: str,
              timeout_s: float) -> ExperimentReport | Failed:
    """``python -m recipetune.finetune FILE --child CHILD.json --out DIR``; its report, or why none."""
    from recipetune.core.process import run_process

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "child.json").write_text(json.dumps(child, indent=2))
    argv = [sys.executable, "-m", "recipetune.finetune", file, *overrides, "--out", str(out),
            "--child", str(out / "child.json")]
    outcome = run_process(argv, log_dir=out, timeout_s=timeout_s, env={"PYTHONUNBUFFERED": "1"})
    report = out / "report.json"
    if outcome.timed_out:
        return Failed("timeout", f"killed after {timeout_s:.0f}s")
    if report.exists() and outcome.returncode in (0, 1):
        return ExperimentReport.model_validate_json(report.read_text())
    last = outcome.stderr_tail.strip().splitlines()[-1:] or [f"exit code {outcome.returncode}"]
    return Failed("invalid" if outcome.returncode == 2 else "crash", last[0][:500])


# -- the job -------------------------------------------------------------------------------------


def error_shares(report: ExperimentReport) -> dict[str, float]:
    return {g.kind: g.share for g in report.validation.errors} if report.validation else {}


def diagnosis(report: ExperimentReport) -> str:
    """The Executor's grouped worst cases in one line: ``wrong_number 31%, truncated 4%``."""
    shares = error_shares(report)
    return ", ".join(f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])[:3])


class QualityJob:
    """A better task metric on held-out data; integrity (above) is the control system."""

    name = "quality"

    def __init__(self, p: FinetunePlan):
        self.p, self.c = p, p.campaign
        self.cfg = p.campaign.cfg
        self.subject = p.campaign.space
        self.baseline, self.space = p.campaign.baseline, p.space
        self.heartbeat_s = p.campaign.settings.execute.heartbeat_s
        self.metric = p.campaign.experiment.spec.task.metric
        self.root_value = 0.0
        self.root_report: ExperimentReport | None = None

    def relations(self) -> Relations:
        return self.subject.relations()

    def context_options(self) -> dict[str, Any]:
        from recipetune.finetune.analyst import GOAL, PROFILE, experiment_facts, worst_cases

        return {"facts": experiment_facts, "goal": GOAL, "profile": PROFILE, "details": worst_cases,
                "score_name": f"validation_{self.metric}", "max_chars": self.cfg.context_chars}

    def snapshot(self) -> dict[str, Any]:
        settings = self.c.settings.model_dump(mode="json")
        if settings["search"]["llm"].get("api_key"):
            settings["search"]["llm"]["api_key"] = "(redacted)"
        return {"job": "quality", "experiment": self.c.experiment.spec.model_dump(mode="json"),
                "overrides": self.c.overrides, **settings}

    def child(self, recipe: Recipe, run_dir: Path, executor: Executor) -> Future:
        return executor.call(run_child, None, str(self.c.path.resolve()), self.c.overrides,
                             self.subject.child_file(recipe), str(run_dir), self.cfg.timeout_s)

    def start(self, search: Search) -> tuple[Any, float | None]:
        folder, reporter = search.store.folder / "baseline", search.reporter
        report = self.load_result(folder)
        if report is None or report.value is None:
            reporter.phase(f"running the baseline experiment ({self.c.experiment.spec.task.name}, "
                           f"{self.metric} on validation)")
            result = self.child(self.baseline, folder, search.executor).result()
            if isinstance(result, Failed) or result.value is None:
                why = result.cause if isinstance(result, Failed) else f"{result.status}: {result.cause}"
                raise RuntimeError(f"the baseline experiment failed ({why}); see {folder}/stderr.log. "
                                   "Nothing can be compared with it")
            report = result
        else:
            reporter.phase("baseline experiment loaded from the previous session")
        self.root_report, self.root_value = report, float(report.value)  # type: ignore[arg-type]
        reporter.phase(f"baseline: validation {self.metric} {self.root_value:.4f} "
                       f"({report.validation.n_examples} examples; {diagnosis(report) or 'no errors'}); "  # type: ignore[union-attr]
                       f"data version {report.data.id}, {report.data.rows_out} rows")
        return report, self.root_value

    def couple(self, recipe: Recipe) -> tuple[Recipe, str]:
        return recipe, ""

    def refuse(self, recipe: Recipe) -> tuple[str, list[Any]]:
        try:
            self.subject.experiment_of(recipe)
        except ConfigError as e:
            return f"integrity: {e.field}: {e.message}", [str(e)]
        evaluation = {p.resolve() for s, p in self.c.experiment.splits.paths.items() if s != "train"}
        for step in self.subject.chain(recipe):
            paths = [step.get("path")] + [s.get("path") for s in step.get("sources", [])]
            for raw in filter(None, paths):
                where = Path(raw) if Path(raw).is_absolute() else self.c.experiment.base_dir / raw
                if where.resolve() in evaluation:
                    return (f"integrity: data step {step['op']} reads {raw}, an evaluation split: training on it "
                            "would fake the metric", [str(raw)])
        return "", []

    def plan_run(self, recipe: Recipe) -> dict[str, Any]:
        return {"experiment_id": self.subject.experiment_of(recipe).id}

    def submit(self, executor: Executor, recipe: Recipe, run_dir: Path, plan: dict[str, Any],
               progress: Callable[[int, int], None]) -> Future:
        return self.child(recipe, run_dir, executor)

    def land(self, result: ExperimentReport | Failed, recipe: Recipe, run_dir: Path) -> Landing:
        penalty = self.cfg.failure_penalty
        if isinstance(result, Failed):
            return Landing("failed", None, penalty, f"{result.status}: {result.cause}", {"run_status": result.status})
        figures = experiment_figures(result, self.root_value)
        if result.status != "ok" or result.value is None:
            return Landing("failed", None, penalty, f"{result.status}: {result.cause}", figures, result)
        value = float(result.value)
        return Landing("passed", value, metric_reward(value, self.root_value, True, penalty), "", figures, result)

    def load_result(self, run_dir: Path) -> ExperimentReport | None:
        try:
            return ExperimentReport.model_validate_json((run_dir / "report.json").read_text())
        except (OSError, ValueError):
            return None

    def row(self, key: str, number: int | None, recipe: Recipe, a: dict[str, Any]) -> Row:
        return Row(key, number, self.subject.describe(recipe, self.baseline), a.get("status", ""),
                   a.get("loss_last"), a.get("value"), a.get("diagnosis", ""), a.get("rationale", ""),
                   a.get("proposer", ""), a.get("cause", ""))

    def decide(self, search: Search) -> Outcome:
        from recipetune.finetune.decide import decide

        return decide(self, search)


def experiment_figures(report: ExperimentReport, baseline_value: float) -> dict[str, Any]:
    """What the study keeps of one experiment (its folder keeps everything)."""
    value = report.value
    removed: dict[str, int] = {}
    for step in report.data.operators:
        for reason, n in step.removed.items():
            removed[f"{step.op}: {reason}"] = removed.get(f"{step.op}: {reason}", 0) + n
    return {
        "run_status": report.status, "metric": report.validation.metric if report.validation else None,
        "value": value, "gain": normalised_gain(value, baseline_value) if value is not None else None,
        "metrics": report.validation.metrics if report.validation else {},
        "errors": error_shares(report), "diagnosis": diagnosis(report),
        "loss_first": report.loss.first, "loss_last": report.loss.last, "steps": report.loss.steps,
        "data_version": report.data.id, "rows": report.data.rows_out, "removed": removed,
        "time_s": report.timings_s.get("total"), "experiment_id": report.id,
    }


def run(p: FinetunePlan, executor: Executor | None = None, reporter: Reporter | None = None) -> Outcome:
    """Run (or resume) a planned fine-tuning campaign to its decision. Ctrl-C leaves it resumable."""
    c = p.campaign
    runner = executor or executor_for(c.settings.execute, 1, c.path)
    return run_search(QualityJob(p), p.store, p.meta, p.resume, p.proposer, runner, reporter)
