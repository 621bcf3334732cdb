"""What a job is to the engine, and what the engine gives it.

A job (speed: speed/job.py, quality: finetune/job.py, a measured table: bench/replay.py) says how
its baseline is measured, what may not run, how a run is started and judged, and how the campaign
ends. The engine owns the rest (engine/loop.py): the tree, the budget, the study, resume, trials in
flight. The engine hands the job its ``Services`` (the study, the executor, the live view), never
itself; every job decides through ``decide(Finished) -> Outcome`` and its result is written by one
function, ``conclude``.
"""

from __future__ import annotations

import json
import shlex
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from recipetune.core.filenames import APPROVED, VERDICT
from recipetune.core.files import write_atomic
from recipetune.core.recipe import Recipe, SearchSpace
from recipetune.core.words import Decision
from recipetune.engine.record import Evidence, Figures, Trial
from recipetune.engine.researcher import Subject
from recipetune.engine.status import NodeStatus
from recipetune.engine.store import CampaignStore
from recipetune.engine.tree import Node, Tree
from recipetune.execute.executor import Executor

# -- what the live view is told ----------------------------------------------------------------


@dataclass
class Row:
    """One line of the trial table; ``key`` identifies it across updates. ``figure``, ``score`` and
    ``check`` are the job's three columns (speed: tokens/s, speed-up, loss check)."""

    key: str
    number: int | None
    change: str
    status: str
    figure: float | None = None
    score: float | None = None
    check: str = ""
    rationale: str = ""
    source: str = ""
    cause: str = ""


class Reporter:
    """Receives the campaign's progress; the campaign command draws it (view/live.py), tests may record it."""

    def phase(self, text: str) -> None: ...

    def row(self, row: Row) -> None: ...

    def progress(self, key: str, done: int, total: int) -> None: ...

    def best(self, node: Node | None, baseline: Recipe) -> None: ...

    def campaign(self, done: int, total: int, elapsed_s: float, ended: bool = False) -> None:
        """Runs finished of the budget's ``total``, and the search's time so far (resumes included);
        ``ended``: the search starts no more (a stop rule, or nothing left to try)."""

    def close(self) -> None:
        """The campaign has ended (its decision written, or stopped)."""


@dataclass(frozen=True)
class Services:
    """What the engine gives a job: the campaign's study and folder, where runs run, the live view."""

    store: CampaignStore
    executor: Executor
    reporter: Reporter


class Progress:
    """What a running trial tells the engine: steps done (the live view), and intermediate values
    (``report``: True means stop it now; the job then ends the run and lands it as ``pruned``, with
    ``why``). ``upper`` is the most the value could plausibly be, given its noise: a trial is stopped
    only when even that bound stays below a bar: the one the pruner keeps the finished trials (the
    baseline's curve among them) above at the same report, their median for ``median``
    (engine/trials.py: Trials.prune; engine/samplers.py: pruning_bar), or, for a speed report, the
    set-aside rule's share of the incumbent's speed (engine/effects.py: Effects.stop).
    ``report``'s callable answers why to stop, "" to go on. Called from the thread that watches the run."""

    def __init__(self, step: Callable[[int, int], None], report: Callable[[int, float, float | None], str]):
        self._step, self._report = step, report
        self.why = ""  # why a report was answered "stop": every later one is too

    @property
    def stopped(self) -> bool:
        return bool(self.why)

    def step(self, done: int, total: int) -> None:
        self._step(done, total)

    def report(self, step: int, value: float, upper: float | None = None) -> bool:
        self.why = self.why or self._report(step, value, upper)
        return self.stopped


def checkpoint_steps(total: int, n: int) -> dict[int, int]:
    """The training steps after which a run's ``n`` checkpoints fall (step -> k), evenly spaced
    inside ``total`` steps: at k/(n+1) of the training, so the trials of one campaign are compared at
    the same share of their own schedule. Fewer when the run is too short to hold them all."""
    at: dict[int, int] = {}
    for k in range(1, n + 1):
        step = round(k * total / (n + 1))
        if 1 <= step < total and step not in at:
            at[step] = len(at) + 1
    return at


def watch(reports: Callable[[], list[dict[str, Any]]], progress: Progress, stop_file: Path,
          done: threading.Event, every_s: float = 0.5) -> threading.Thread:
    """A thread on the driver while a run goes on: each report it has made so far (``reports()``:
    dicts with ``checkpoint``, ``of``, ``value`` and optionally ``upper``, in order) goes to the
    pruner once; when the pruner says stop, ``stop_file`` (core/process.py: STOP_FILE, with the report
    it stopped at and why) tells the run's runner, here or on another node, to end it. Stops when
    ``done`` is set."""

    def loop() -> None:
        seen = 0
        while not done.wait(every_s):
            made = reports()
            for r in made[seen:]:
                if progress.report(int(r["checkpoint"]), float(r["value"]), r.get("upper")):
                    write_atomic(stop_file, json.dumps({**r, "why": progress.why}))  # whole or not at all
                    return
            seen = len(made)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


# -- what a job answers --------------------------------------------------------------------------


@dataclass
class Root:
    """The baseline as the job measured it: what the Researcher reads of it, its score, the noise of
    that score (the gain a plateau must beat), its intermediate values (what the pruner compares
    a running trial with, by report step), ``stop``: why no trial could show a gain over it, when
    none could (the quality job: a baseline within its noise of the metric's maximum), so none starts,
    and whether its trials' reports are speed ratios (the set-aside rule stops a trial they show far
    slower than the incumbent: engine/effects.py: Effects.stop)."""

    result: Any
    score: float | None
    noise: float = 0.0
    curve: dict[int, float] = field(default_factory=dict)
    stop: str = ""
    speed_reports: bool = False  # its trials report their speed over the baseline's: the set-aside rule reads them


@dataclass
class Checked:
    """A recipe as the job would run it: ``recipe`` after the knobs that follow another one's change
    (``note`` says what was set), and either why it may not run (``refusal`` and its ``details``) or
    what its trial records before it starts (``plan``: steps ...)."""

    recipe: Recipe
    note: str = ""
    refusal: str = ""
    details: list[Any] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)


@dataclass
class Landing:
    """How the job judged one finished run."""

    status: NodeStatus  # passed | rejected | failed | pruned
    score: float | None  # the job's figure of merit (None unless it ran to its end and was measured)
    reward: float  # in [0, 1], backpropagated (engine/tree.py)
    cause: str = ""
    figures: Figures | None = None  # the job's figures, stored with the trial (engine/record.py)
    result: Any = None  # what the proposer reads of this run
    evidence: Evidence | None = None  # its speed over the baseline's, or its bound (a timeout, an OOM)


@dataclass(frozen=True)
class Finished:
    """The search's end, as a job's decision reads it."""

    tree: Tree
    runs: int  # runs of the budget spent, this session and before
    stopped: str = ""  # the stop rule that ended the search before its budget (Stopping.why), if one did


@dataclass
class Outcome:
    """A job's decision. ``approved``: the text of approved.yaml for a winner; ``record``: the job's
    own fields of verdict.json."""

    decision: Decision  # APPROVED or KEEP BASELINE
    reasons: list[str]
    tree: Tree
    winner: Node | None = None
    verdict: Any = None  # the job's verdict model (guard.verdict.Verdict, finetune.decide.QualityVerdict)
    verdicts: list[tuple[Node, Any]] = field(default_factory=list)
    runs: int = 0
    approved: str | None = None
    launch: list[str] = field(default_factory=list)  # commands to run the winner; APPROVED_FILE: its file
    record: dict[str, Any] = field(default_factory=dict)
    approved_file: Path | None = None  # set by ``conclude``


class Job(Protocol):
    name: str  # speed | quality | table
    baseline: Recipe
    space: SearchSpace
    subject: Subject  # the knobs and their relations, as proposers see them
    # What the Researcher is told (engine/researcher.py: SearchContext's facts, goal, score_name,
    # profile, details, max_chars): speed/facts.py BRIEFING, finetune/job.py QualityJob.
    briefing: dict[str, Any]
    figures: type[Figures]  # what its trials store beside the engine's fields (engine/record.py: Trial)

    def start(self, services: Services) -> Root:
        """Measure (or reload) the baseline. The job keeps ``services``."""

    def check(self, recipe: Recipe) -> Checked:
        """The recipe as it would run, and why it may not (or what its trial records)."""

    def submit(self, recipe: Recipe, run_dir: Path, plan: dict[str, Any], progress: Progress) -> Future: ...

    def land(self, result: Any, recipe: Recipe, run_dir: Path) -> Landing: ...

    def load(self, run_dir: Path) -> Any:
        """A finished run's result read back from its folder (a resume), or None."""

    def row(self, key: str, number: int | None, recipe: Recipe, trial: Trial[Any]) -> Row:
        """The trial's line of the live table."""

    def decide(self, finished: Finished) -> Outcome: ...


APPROVED_FILE = "<approved.yaml>"  # in a launch command: the approved file's path, once written


def conclude(store: CampaignStore, job: str, baseline: Recipe, outcome: Outcome,
             describe: Callable[[Recipe], str]) -> Outcome:
    """Write a decision, for every job: approved.yaml for a winner, verdict.json (the decision, the
    recipe, the verdict and the job's ``record``), and the study's ``decision``. ``describe``: a
    recipe's change from the baseline, as the job words it."""
    winner = outcome.winner
    if winner is not None and outcome.approved is not None:
        outcome.approved_file = write_atomic(store.folder / APPROVED, outcome.approved)
        path = shlex.quote(str(outcome.approved_file))
        outcome.launch = [cmd.replace(APPROVED_FILE, path) for cmd in outcome.launch]
    verdict = outcome.verdict
    store.write_json(VERDICT, {
        "job": job, "decision": outcome.decision, "reasons": outcome.reasons,
        "baseline": dict(baseline), "baseline_id": baseline.id,
        "recipe": dict(winner.recipe) if winner else dict(baseline),
        "recipe_id": winner.id if winner else baseline.id,
        "change": describe(winner.recipe) if winner else "(baseline)",
        "trial": winner.trial if winner else None,
        "verdict": verdict.model_dump(mode="json") if verdict is not None else None,
        "runs": outcome.runs, "trials": len(store.records()),
        "approved_file": str(outcome.approved_file) if outcome.approved_file else None,
        "launch": outcome.launch, **outcome.record,
    })
    store.set_meta("decision", outcome.decision)
    return outcome
