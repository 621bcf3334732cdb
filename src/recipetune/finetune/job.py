"""`recipetune finetune`: the quality job on the shared search engine (engine/loop.py).

The baseline experiment is the root. Each round the Researcher (analyst with the fine-tuning
playbook, llm, or random) selects a node, reads its compressed context and proposes children (a
data chain and a training recipe each); each child runs as its own process (``python -m
recipetune.finetune``, a timeout, a crash recorded, never the campaign's), and its validation metric
becomes the reward: the normalised gain over the baseline (finetune/decide.py: ``metric_reward``).

Integrity, the quality job's control system:
- the search never sees the test split: children only ever open train and validation
  (finetune/task.py: ``Splits``); the final evaluation (finetune/final.py) alone opens test;
- contamination is removed in every child (decontamination is always on) and reported per node;
- a child that would change the task, the metric, the model or the evaluation data, or whose data
  steps read the evaluation files, is refused before it runs;
- the decision (finetune/decide.py) is taken on the test split over seeds, paired by seed, in looks
  planned by the speed guard's sequential machinery: APPROVED needs the gain's bound above
  ``search.min_gain`` at the look's level.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from recipetune.core.errors import ConfigError
from recipetune.core.filenames import BASELINE, EXPERIMENT_REPORT
from recipetune.core.process import STOP_FILE
from recipetune.core.recipe import Recipe
from recipetune.core.stats import proportion_ci
from recipetune.engine.job import Checked, Finished, Landing, Outcome, Progress, Reporter, Root, Row, Services, watch
from recipetune.engine.loop import run_search
from recipetune.engine.record import Figures, Trial
from recipetune.engine.status import Status
from recipetune.execute.executor import Executor
from recipetune.execute.factory import make_executor
from recipetune.finetune import decide
from recipetune.finetune.analyst import GOAL, PROFILE, experiment_facts, worst_cases
from recipetune.finetune.decide import metric_reward, normalised_gain
from recipetune.finetune.plan import FinetunePlan
from recipetune.finetune.results import ExperimentReport

# -- one child experiment, in its own process ------------------------------------------------------


@dataclass
class Failed:
    """A child that produced no report (killed for its timeout, refused its input, died)."""

    status: str
    cause: str


@dataclass
class Pruned:
    """A child stopped by the search's pruner at one of its checkpoints: what it showed there."""

    checkpoint: int
    of: int
    value: float
    examples: int


def progress_lines(out: Path) -> list[dict[str, Any]]:
    """The checkpoints a child has reported so far (progress.jsonl; a line being written is skipped)."""
    try:
        text = (out / "progress.jsonl").read_text()
    except OSError:
        return []
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return lines


def follow_steps(out: Path, progress: Progress, done: threading.Event, every_s: float = 0.5) -> None:
    """The live view's step count of a running child, from the ``steps.json`` its training rewrites."""
    while not done.wait(every_s):
        try:
            at = json.loads((out / "steps.json").read_text())
        except (OSError, ValueError):
            continue  # not training yet (data chain, model load)
        progress.step(int(at["step"]), int(at["total"]))


def plausible(report: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint with the most its metric could plausibly be: the upper end of the 95% interval of
    a proportion over the rows it scored (exact for exact match and accuracy, an approximation for
    ROUGE-L or F1). A child is pruned only when even that is below what the pruner keeps the finished
    trials above at that checkpoint, e.g. their median (engine/loop.py: Search.prune)."""
    n = max(1, int(report["examples"]))
    return {**report, "upper": _upper(round(float(report["value"]) * n), n)}


@cache
def _upper(k: int, n: int) -> float:
    """(The watcher reads every checkpoint again at each poll: one exact interval per (k, n) is enough.)"""
    return proportion_ci(k, n)[2]


def run_child(file: str, overrides: list[str], child: dict[str, Any], out_dir: str, timeout_s: float,
              checkpoints: int = 0, checkpoint_examples: int = 64) -> ExperimentReport | Failed | Pruned:
    """``python -m recipetune.finetune FILE --child CHILD.json --out DIR``; its report, or why none.
    With ``checkpoints`` the child reports as it trains, and a stop file in DIR (``watch``) stops it."""
    from recipetune.core.process import run_process

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "child.json").write_text(json.dumps(child, indent=2))
    argv = [sys.executable, "-m", "recipetune.finetune", file, *overrides, "--out", str(out),
            "--child", str(out / "child.json")]
    if checkpoints:
        argv += ["--checkpoints", str(checkpoints), "--checkpoint-examples", str(checkpoint_examples)]
    (out / STOP_FILE).unlink(missing_ok=True)
    outcome = run_process(argv, log_dir=out, timeout_s=timeout_s, env={"PYTHONUNBUFFERED": "1"},
                          stop_file=out / STOP_FILE)
    if outcome.stopped and not (out / EXPERIMENT_REPORT).exists():  # (a child that finished meanwhile is kept)
        at = json.loads((out / STOP_FILE).read_text())  # the report the pruner stopped it at
        return Pruned(at["checkpoint"], at["of"], at["value"], at["examples"])
    report = out / EXPERIMENT_REPORT
    if outcome.timed_out:
        return Failed("timeout", f"killed after {timeout_s:.0f}s")
    if report.exists() and outcome.returncode in (0, 1):
        return ExperimentReport.model_validate_json(report.read_text())
    last_line = outcome.stderr_tail.strip().splitlines()[-1:] or [f"exit code {outcome.returncode}"]
    return Failed("invalid" if outcome.returncode == 2 else "crash", last_line[0][:500])


# -- the job -------------------------------------------------------------------------------------


def error_shares(report: ExperimentReport) -> dict[str, float]:
    return {g.kind: g.share for g in report.validation.errors} if report.validation else {}


def diagnosis(report: ExperimentReport) -> str:
    """The Experimenter's grouped worst cases in one line: ``wrong_number 31%, truncated 4%``."""
    shares = error_shares(report)
    return ", ".join(f"{k} {v:.0%}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1])[:3])


def ceiling(metric: str, value: float, n: int, z: float) -> str:
    """Why no experiment could show a gain over a baseline that scored ``value`` on ``n`` validation
    examples, or '' when one could: the metric's maximum (1.0 for every metric here) is within ``z``
    standard errors of it. The standard error of a mean of n per-example scores in [0, 1] with mean v
    is at most sqrt(v(1-v)/n), exactly that for exact_match and accuracy (a proportion); for exact_match
    ``1 - v <= z * se`` reads: at most z^2 * v errors left (n = 200, z = 2: 3 errors stop, 4 do not)."""
    headroom = 1.0 - value
    se = math.sqrt(max(value * headroom, 0.0) / max(n, 1))
    if headroom > z * se * (1 + 1e-9):  # (a float's last bit does not move a case at the edge)
        return ""
    return (f"the baseline's validation {metric} {value:.4f} is within {z:g} standard errors ({z:g} x {se:.4f}) of "
            f"the maximum 1.0 on {n} examples: the most any experiment could gain ({headroom:.4f}) could not be "
            "told from noise (search.headroom_z)")


class QualityFigures(Figures):
    """The quality job's figures of one trial (engine/record.py), as the study stores them."""

    metric: str | None = None
    value: float | None = None  # the validation metric
    gain: float | None = None  # normalised, over the baseline's (finetune/decide.py: normalised_gain)
    metrics: dict[str, Any] = {}
    errors: dict[str, float] = {}  # share of the validation rows by error kind
    diagnosis: str = ""
    loss_first: float | None = None
    loss_last: float | None = None
    steps: int | None = None
    data_version: str | None = None
    rows: int | None = None
    removed: dict[str, int] = {}  # rows each data step removed, by reason
    time_s: float | None = None
    experiment_id: str | None = None
    pruned_at: int | None = None  # the checkpoint a pruner stopped it at
    value_at_prune: float | None = None
    baseline_at_prune: float | None = None


class QualityJob:
    """A better task metric on held-out data; integrity (above) is the control system."""

    name = "quality"
    figures = QualityFigures

    def __init__(self, p: FinetunePlan):
        self.c = p.campaign
        self.cfg = p.campaign.cfg
        self.subject = p.campaign.space
        self.baseline, self.space = p.campaign.baseline, p.space
        self.metric = p.campaign.experiment.spec.task.metric
        self.briefing = {"facts": experiment_facts, "goal": GOAL, "profile": PROFILE, "details": worst_cases,
                         "score_name": f"validation_{self.metric}", "max_chars": self.cfg.context_chars}
        self.root_value = 0.0
        self.root_curve: dict[int, float] = {}  # the baseline's checkpoints, when it reported them
        self.services: Services | None = None

    def child(self, recipe: Recipe, run_dir: Path, progress: Progress | None = None) -> Future:
        """Run one child; with pruning, its checkpoints go to the pruner as it trains (``watch``)."""
        assert self.services is not None
        pruning = self.cfg.pruning
        n = pruning.reports
        done = threading.Event()
        if progress is not None:
            threading.Thread(target=follow_steps, args=(run_dir, progress, done), daemon=True).start()
            if n:  # each checkpoint the child reports goes to the pruner
                watch(lambda: [plausible(x) for x in progress_lines(run_dir)], progress, run_dir / STOP_FILE, done)
        future = self.services.executor.call(run_child, None, str(self.c.path.resolve()), self.c.overrides,
                                             self.subject.child_file(recipe), str(run_dir), self.cfg.timeout_s, n,
                                             pruning.eval_examples)
        future.add_done_callback(lambda _: done.set())
        return future

    def start(self, services: Services) -> Root:
        self.services = services
        folder, reporter = services.store.folder / BASELINE, services.reporter
        report = self.load(folder)
        if report is None or report.value is None:
            reporter.phase(f"running the baseline experiment ({self.c.experiment.spec.task.name}, "
                           f"{self.metric} on validation)")
            result = self.child(self.baseline, folder).result()
            if isinstance(result, Failed) or result.value is None:
                why = result.cause if isinstance(result, Failed) else f"{result.status}: {result.cause}"
                raise RuntimeError(f"the baseline experiment failed ({why}); see {folder}/stderr.log. "
                                   "Nothing can be compared with it")
            report = result
        else:
            reporter.phase("baseline experiment loaded from the previous session")
        self.root_value = float(report.value)  # type: ignore[arg-type]
        reporter.phase(f"baseline: validation {self.metric} {self.root_value:.4f} "
                       f"({report.validation.n_examples} examples; {diagnosis(report) or 'no errors'}); "  # type: ignore[union-attr]
                       f"data version {report.data.id}, {report.data.rows_out} rows")
        # the baseline's checkpoints: what the pruner compares every child with at the same checkpoint
        self.root_curve = {int(x["checkpoint"]): float(x["value"]) for x in progress_lines(folder)}
        stop = ceiling(self.metric, self.root_value, report.validation.n_examples, self.cfg.headroom_z)  # type: ignore[union-attr]
        if not stop:
            reporter.phase(eta(report, self.cfg.budget.trials, len(self.cfg.seeds), services.executor.parallel,
                               self.cfg.max_test_seeds))
        return Root(report, self.root_value, curve=self.root_curve, stop=stop)

    def check(self, recipe: Recipe) -> Checked:
        try:
            exp = self.subject.experiment_of(recipe)
        except ConfigError as e:
            return Checked(recipe, refusal=f"integrity: {e.field}: {e.message}", details=[str(e)])
        evaluation = {p.resolve() for s, p in self.c.experiment.splits.paths.items() if s != "train"}
        for step in self.subject.chain(recipe):
            paths = [step.get("path")] + [s.get("path") for s in step.get("sources", [])]
            for raw in filter(None, paths):
                where = Path(raw) if Path(raw).is_absolute() else self.c.experiment.base_dir / raw
                if where.resolve() in evaluation:
                    return Checked(recipe, refusal=f"integrity: data step {step['op']} reads {raw}, an evaluation "
                                                   "split: training on it would fake the metric", details=[str(raw)])
        return Checked(recipe, plan={"experiment_id": exp.id})

    def submit(self, recipe: Recipe, run_dir: Path, plan: dict[str, Any], progress: Progress) -> Future:
        return self.child(recipe, run_dir, progress)

    def land(self, result: ExperimentReport | Failed | Pruned, recipe: Recipe, run_dir: Path) -> Landing:
        penalty = self.cfg.failure_penalty
        if isinstance(result, Pruned):  # what it showed is its reward; it is no candidate for the decision
            at = f"checkpoint {result.checkpoint}/{result.of}"
            cause = (f"pruned at {at}: validation {self.metric} {result.value:.4f} on {result.examples} rows "
                     f"({self.cfg.pruning.pruner} pruner)")
            # Its gain is over the baseline at the same checkpoint, on the same rows: a third of the way in
            # every run scores low, the baseline too, so against the baseline's final value a child that
            # kept pace with it would earn the reward of one that lost most of it, and UCT would shun its
            # branch. (A baseline that reported no checkpoints leaves only its final value to compare.)
            reference = self.root_curve.get(result.checkpoint, self.root_value)
            return Landing(Status.PRUNED, None, metric_reward(result.value, reference, True, penalty), cause,
                           QualityFigures(run_status="pruned", pruned_at=result.checkpoint,
                                          value_at_prune=result.value, baseline_at_prune=reference))
        if isinstance(result, Failed):
            return Landing(Status.FAILED, None, penalty, f"{result.status}: {result.cause}",
                           QualityFigures(run_status=result.status))
        figures = experiment_figures(result, self.root_value)
        if result.status != "ok" or result.value is None:
            return Landing(Status.FAILED, None, penalty, f"{result.status}: {result.cause}", figures, result)
        value = float(result.value)
        return Landing(Status.PASSED, value, metric_reward(value, self.root_value, True, penalty), "", figures, result)

    def load(self, run_dir: Path) -> ExperimentReport | None:
        try:
            return ExperimentReport.model_validate_json((run_dir / EXPERIMENT_REPORT).read_text())
        except (OSError, ValueError):
            return None

    def row(self, key: str, number: int | None, recipe: Recipe, t: Trial[QualityFigures]) -> Row:
        f = t.figures
        return Row(key, number, self.subject.describe(recipe, self.baseline), t.status, f.loss_last, f.value,
                   f.diagnosis, t.rationale, t.proposer, t.cause)

    def decide(self, finished: Finished) -> Outcome:
        assert self.services is not None
        return decide.decide(self.c, self.services, finished)


def eta(baseline: ExperimentReport, trials: int, seeds: int, parallel: int, most: int | None = None) -> str:
    """The campaign's time ahead at the baseline's pace: its budget of trials, then the decision on the test
    split (baseline and best, one run each per seed: ``seeds`` at its first look, at most ``most``; only
    when a trial beat the baseline)."""
    each = baseline.timings_s.get("total") or 0.0
    most = max(most or seeds, seeds)
    search, first, last = each * math.ceil(trials / max(parallel, 1)), each * 2 * seeds, each * 2 * most
    return (f"time ahead at the baseline's pace ({each / 60:.1f} min an experiment): {trials} search runs "
            f"~{search / 60:.0f} min, then the decision's {2 * seeds} to at most {2 * most} runs on the test split "
            f"~{first / 60:.0f}-{last / 60:.0f} min")


def experiment_figures(report: ExperimentReport, baseline_value: float) -> QualityFigures:
    """What the study keeps of one experiment (its folder keeps everything)."""
    value = report.value
    removed: dict[str, int] = {}
    for step in report.data.operators:
        for reason, n in step.removed.items():
            removed[f"{step.op}: {reason}"] = removed.get(f"{step.op}: {reason}", 0) + n
    return QualityFigures(
        run_status=report.status, metric=report.validation.metric if report.validation else None,
        value=value, gain=normalised_gain(value, baseline_value) if value is not None else None,
        metrics=report.validation.metrics if report.validation else {},
        errors=error_shares(report), diagnosis=diagnosis(report),
        loss_first=report.loss.first, loss_last=report.loss.last, steps=report.loss.steps,
        data_version=report.data.id, rows=report.data.rows_out, removed=removed,
        time_s=report.timings_s.get("total"), experiment_id=report.id,
    )


def run(p: FinetunePlan, executor: Executor | None = None, reporter: Reporter | None = None) -> Outcome:
    """Run (or resume) a planned fine-tuning campaign to its decision. Ctrl-C leaves it resumable."""
    c = p.campaign
    services = Services(p.store, executor or make_executor(c.settings.execute, 1, c.path), reporter or Reporter())
    return run_search(QualityJob(p), c.cfg, services, meta=p.meta, snapshot=p.snapshot, resume=p.resume,
                      proposer=p.proposer)
