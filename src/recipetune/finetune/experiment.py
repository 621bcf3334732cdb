"""One experiment: (task, data chain, training recipe) -> data -> fine-tune -> evaluate -> report.

The Experimenter's interface for the search: ``load_experiment`` checks a file (nothing
written on bad input), ``Experiment.derive`` makes a child with another chain or recipe (never
another task, model or evaluation data), ``run_experiment`` runs it into a folder and returns the
``ExperimentReport`` (validation only). The test split is opened by ``final.final_evaluation`` alone.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recipetune.core.errors import ConfigError, validation_error
from recipetune.core.filenames import EXPERIMENT_REPORT
from recipetune.core.files import apply_overrides, read_yaml, write_atomic
from recipetune.data.chain import ChainError, DataVersion, run_chain
from recipetune.data.files import DataFileError
from recipetune.data.ops import Operator, Row
from recipetune.finetune import metrics as M
from recipetune.finetune.recipe import ModelSpec, TrainRecipe
from recipetune.finetune.results import ErrorGroup, Evaluation, ExperimentReport, LossCurve, Prediction
from recipetune.finetune.route import ModelError, Route, TrainLog
from recipetune.finetune.routing import check_fit, check_model, load_route
from recipetune.finetune.task import Splits, TaskConfig, iter_rows, load_splits

if TYPE_CHECKING:
    import datasets

WORST_PER_KIND = 5
Rows: TypeAlias = "list[Row] | datasets.Dataset"  # what the data chain returns; either iterates as dict rows


class ExperimentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: TaskConfig
    data: list[Operator] = Field(default_factory=list, description="the data chain over the train split")
    model: ModelSpec = ModelSpec()
    recipe: TrainRecipe = TrainRecipe()


@dataclass
class Experiment:
    """A checked experiment file: its spec, where it lives, and its task's splits (test closed)."""

    path: Path
    spec: ExperimentSpec
    splits: Splits
    cache: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # what the route or this machine cannot honour is refused here, for a file and for every child
        try:
            check_fit(self.spec.model, self.spec.recipe, self.splits.conversational, self.base_dir)
        except ModelError as e:
            raise ConfigError(self.path, e.field, str(e)) from None

    @property
    def base_dir(self) -> Path:
        return self.path.resolve().parent

    @property
    def id(self) -> str:
        return hashlib.sha256(self.spec.model_dump_json().encode()).hexdigest()[:12]

    def derive(self, recipe: dict[str, Any] | None = None, data: list[dict] | None = None) -> Experiment:
        """A child experiment: recipe changes and/or a new chain. Raises ConfigError on bad values."""
        raw = self.spec.model_dump(mode="json")
        raw["recipe"].update(recipe or {})
        if data is not None:
            raw["data"] = data
        spec = validate_spec(self.path, raw)
        if spec.task != self.spec.task or spec.model != self.spec.model:
            raise ConfigError(self.path, "task", "a child experiment cannot change the task or the model")
        return Experiment(self.path, spec, self.splits)


def validate_spec(path: Path, raw: dict) -> ExperimentSpec:
    try:
        return ExperimentSpec.model_validate(raw)
    except ValidationError as e:
        raise validation_error(e, path) from None


CAMPAIGN_SECTIONS = ("search", "execute")  # read by `recipetune finetune` (finetune/plan.py)


def read_experiment_file(path: Path, overrides: list[str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The file with overrides applied (``lr=1e-3`` is a recipe knob; dotted keys reach any field),
    split into the experiment and the campaign's own sections (``search:``, ``execute:``)."""
    raw = apply_overrides(read_yaml(path), overrides or [], fields=[*ExperimentSpec.model_fields, *CAMPAIGN_SECTIONS],
                          default_section="recipe")
    campaign = {k: raw.pop(k) for k in CAMPAIGN_SECTIONS if k in raw}
    return raw, campaign


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    """Read, override and check an experiment file (a campaign's sections are ignored here)."""
    path = Path(path)
    raw, _ = read_experiment_file(path, overrides)
    spec = validate_spec(path, raw)
    try:
        splits = load_splits(spec.task, path.resolve().parent)
        check_model(spec.model, path.resolve().parent)
    except (DataFileError, ModelError) as e:  # a TaskError is a DataFileError
        raise ConfigError(path, e.field, str(e)) from None
    return Experiment(path, spec, splits)


def prepare_data(exp: Experiment, out_dir: Path | None = None) -> tuple[Rows, DataVersion]:
    """Run the data chain (cached); ConfigError when it is bad, leaves nothing, or leaves a row without an
    answer (the files' rows were checked when read: such a row comes from a step)."""
    try:
        rows, version = run_chain(exp.spec.data, exp.splits, exp.base_dir, out_dir)
    except ChainError as e:
        raise ConfigError(exp.path, e.field, str(e)) from None
    for i, row in enumerate(iter_rows(rows) if hasattr(rows, "iter") else rows):
        problem = exp.spec.task.problem(row)
        if problem is not None:
            raise ConfigError(exp.path, "data", f"row {i} of the data chain's output: {problem}; a step of the chain "
                                                "made it (the training file's rows were checked when read)")
    return rows, version


def loss_curve(losses: list[tuple[int, float]]) -> LossCurve:
    if not losses:
        return LossCurve(steps=0)
    values = [v for _, v in losses]
    tail = values[-max(1, len(values) // 10):]
    stride = max(1, math.ceil(len(losses) / 50))
    points = losses[::stride] + ([losses[-1]] if (len(losses) - 1) % stride else [])
    return LossCurve(steps=len(losses), first=values[0], last=sum(tail) / len(tail), min=min(values),
                     points=[(s, round(v, 5)) for s, v in points])


def evaluate(route: Route, task: TaskConfig, rows: list[dict], split: str,
             labels: set[str] | None) -> tuple[Evaluation, list[Prediction]]:
    """Generate for every row, score with the task's metrics, group the wrong answers by kind."""
    prompts = [task.render(r) for r in rows]  # the plain text, for the report
    targets = [task.answer(r) for r in rows]
    gens = route.generate([route.prompt(task, r) for r in rows], task.generation)
    preds = [g.text.strip() for g in gens]
    pattern = re.compile(task.answer_pattern) if task.answer_pattern else None
    tol = (task.rel_tol, task.abs_tol)  # the numeric metric's tolerance
    right_tol = tol if task.metric == "numeric" else None  # within it is right when numeric is optimised
    # answers that are programs run once, in the sandbox, for every metric and error kind that reads them
    runs = M.execute(preds, targets) if M.EXEC in (task.metric, *task.metrics) else None
    run_of = (lambda i: runs[i]) if runs is not None and task.metric == M.EXEC else (lambda i: None)
    predictions = [
        Prediction(index=i, prompt=prompts[i], target=targets[i], prediction=preds[i],
                   score=M.example_score(task.metric, preds[i], targets[i], tol, runs[i] if runs else None),
                   truncated=gens[i].truncated,
                   error=M.error_kind(preds[i], targets[i], gens[i].truncated, pattern, labels, right_tol, run_of(i)))
        for i in range(len(rows))
    ]
    values = {m: M.score(m, preds, targets, tol, runs) for m in dict.fromkeys([task.metric, *task.metrics])}
    groups: dict[str, list[Prediction]] = {}
    for p in predictions:
        if p.error is not None:
            groups.setdefault(p.error, []).append(p)
    errors = [
        ErrorGroup(kind=kind, count=len(ps), share=len(ps) / len(rows),
                   examples=sorted(ps, key=lambda p: (p.score, -M.edit_distance(p.prediction, p.target)))[
                       :WORST_PER_KIND])
        for kind, ps in sorted(groups.items(), key=lambda kv: -len(kv[1]))
    ]
    ev = Evaluation(split=split, metric=task.metric, value=values[task.metric], metrics=values,
                    n_examples=len(rows), errors=errors)
    return ev, predictions


def class_labels(task: TaskConfig, train_rows: Rows) -> set[str] | None:
    if task.labels:
        return set(task.labels)
    if task.metric in ("accuracy", "macro_f1"):
        return {task.answer(r) for r in train_rows}
    return None


def _load(exp: Experiment) -> Route:
    """The model route the experiment trains (its threads set first); a bad model is bad input."""
    spec = exp.spec
    if spec.recipe.threads:
        torch.set_num_threads(spec.recipe.threads)
    try:
        return load_route(spec.model, exp.base_dir, spec.recipe)
    except ModelError as e:
        raise ConfigError(exp.path, e.field, str(e)) from None


def _record_inputs(exp: Experiment, route: Route, version: DataVersion, out_dir: Path) -> dict[str, Any]:
    """Write the resolved experiment and its data version; the report's fields that say what ran."""
    from recipetune.core.measure import environment_fingerprint

    out_dir.mkdir(parents=True, exist_ok=True)
    resolved = exp.spec.model_dump(mode="json")
    resolved["model"]["resolved"] = getattr(route, "checkpoint", resolved["model"]["path"])
    (out_dir / "recipe.json").write_text(json.dumps(resolved, indent=2))
    (out_dir / "data_version.json").write_text(version.model_dump_json(indent=2))
    return dict(id=exp.id, task=exp.spec.task.name, route=route.name, data=version, experiment=resolved,
                environment=environment_fingerprint(), run_dir=str(out_dir))


def _checkpoint_reporter(exp: Experiment, route: Route, rows: Rows, out_dir: Path, checkpoints: int,
                         checkpoint_examples: int, t0: float) -> Callable[[int, int], None] | None:
    """With ``checkpoints``: score the first ``checkpoint_examples`` validation rows at each, one line of
    ``progress.jsonl`` each, as it is measured (what a search's pruner reads while the experiment runs)."""
    if not checkpoints:
        return None
    task = exp.spec.task
    early = list(exp.splits.validation)[: min(task.max_eval_examples, checkpoint_examples)]
    labels = class_labels(task, rows)
    progress = out_dir / "progress.jsonl"
    progress.unlink(missing_ok=True)

    def on_checkpoint(k: int, step: int) -> None:
        t = time.perf_counter()
        value = evaluate(route, task, early, "validation", labels)[0].value
        # when it was reached and what the report cost: what a stop here saves, and what
        # reporting adds to a run that goes on
        with progress.open("a") as f:  # one line at a time: the driver reads it while this runs
            f.write(json.dumps({"checkpoint": k, "of": checkpoints, "step": step, "value": value,
                                "examples": len(early), "time_s": round(time.perf_counter() - t0, 2),
                                "eval_s": round(time.perf_counter() - t, 2)}) + "\n")
    return on_checkpoint


def _step_writer(out_dir: Path) -> Callable[[int, int], None]:
    """The live view's progress (``steps.json``), rewritten at most twice a second."""
    steps_file, last_write = out_dir / "steps.json", [0.0]

    def on_step(step: int, total: int) -> None:
        if step == total or time.perf_counter() - last_write[0] >= 0.5:
            write_atomic(steps_file, json.dumps({"step": step, "total": total}))
            last_write[0] = time.perf_counter()
    return on_step


def _train(route: Route, pairs: list[tuple[str, str]], exp: Experiment, out_dir: Path, checkpoints: int,
           on_checkpoint: Callable[[int, int], None] | None) -> tuple[str, str, TrainLog]:
    """Train; a failure is recorded with its cause (a failed experiment is a result, not a crash):
    (status, cause, the training log)."""
    status, cause, train_log = "ok", "", TrainLog()
    try:
        train_log = route.train(pairs, exp.spec.recipe, out_dir, checkpoints, on_checkpoint, _step_writer(out_dir))
    except torch.OutOfMemoryError as e:
        status, cause = "oom", str(e).splitlines()[0]
    except FloatingPointError as e:
        status, cause = "nan", str(e)
    except Exception as e:
        status, cause = "crash", f"{type(e).__name__}: {e}".splitlines()[0][:500]
    return status, cause, train_log


def _validate(exp: Experiment, route: Route, rows: Rows, out_dir: Path, log: Callable[[str], None]) -> Evaluation:
    """Score the validation split (at most ``task.max_eval_examples`` rows); its predictions to a file."""
    task = exp.spec.task
    val_rows = list(exp.splits.validation)[: task.max_eval_examples]
    log(f"evaluating on {len(val_rows)} validation examples ...")
    validation, predictions = evaluate(route, task, val_rows, "validation", class_labels(task, rows))
    with (out_dir / "predictions.jsonl").open("w") as f:
        for p in predictions:
            f.write(p.model_dump_json() + "\n")
    return validation


def train_and_validate(
    exp: Experiment, out_dir: Path, rows: Rows | None = None, version: DataVersion | None = None,
    log=lambda text: None, checkpoints: int = 0, checkpoint_examples: int = 64,
) -> tuple[ExperimentReport, Route | None]:
    """The experiment, returning the trained route too (final.py evaluates it on test). With
    ``checkpoints``, the validation metric on the first ``checkpoint_examples`` validation rows at
    that many points of the training, each a line of ``progress.jsonl`` as it is measured: what a
    search's pruner reads while the experiment runs."""
    from recipetune.trainer.loop import peak_memory_bytes

    t0 = time.perf_counter()
    spec, task = exp.spec, exp.spec.task
    if rows is None or version is None:
        rows, version = prepare_data(exp, out_dir)
    else:  # prepared by the caller: count the chain's own time
        t0 -= sum(s.seconds for s in version.operators)
    t_data = time.perf_counter()
    route = _load(exp)
    t_load = time.perf_counter()
    base = _record_inputs(exp, route, version, out_dir)

    # the answer is followed by the stop string, so the model learns where to stop (and the HF route
    # also gets its end token from TRL)
    pairs = [(route.prompt(task, r), task.answer(r) + task.generation.stop) for r in rows]
    log(f"training on {len(pairs)} examples ({route.name} route, {spec.recipe.method}) ...")
    on_checkpoint = _checkpoint_reporter(exp, route, rows, out_dir, checkpoints, checkpoint_examples, t0)
    status, cause, train_log = _train(route, pairs, exp, out_dir, checkpoints, on_checkpoint)
    t_train = time.perf_counter()
    with (out_dir / "train_log.jsonl").open("w") as f:
        for step, loss in train_log.losses:
            f.write(json.dumps({"step": step, "loss": loss}) + "\n")
    validation = _validate(exp, route, rows, out_dir, log) if status == "ok" else None
    t_eval = time.perf_counter()

    report = ExperimentReport(
        **base, status=status, cause=cause, validation=validation, params=route.params(),
        loss=loss_curve(train_log.losses),
        timings_s={"data": round(t_data - t0, 3), "load": round(t_load - t_data, 3),
                   "train": round(t_train - t_load, 3), "eval": round(t_eval - t_train, 3),
                   "total": round(t_eval - t0, 3)},
        peak_mem_bytes=peak_memory_bytes(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
        tokens_trained=train_log.tokens, truncated_train_examples=train_log.truncated,
    )
    (out_dir / EXPERIMENT_REPORT).write_text(report.model_dump_json(indent=2))
    return report, (route if status == "ok" else None)


def run_experiment(exp: Experiment, out_dir: Path, rows: Rows | None = None,
                   version: DataVersion | None = None, log=lambda text: None, checkpoints: int = 0,
                   checkpoint_examples: int = 64) -> ExperimentReport:
    """Run one experiment into ``out_dir``; return its report (also saved as report.json)."""
    return train_and_validate(exp, out_dir, rows, version, log, checkpoints, checkpoint_examples)[0]
