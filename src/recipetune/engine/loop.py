"""The search engine every job shares: an MCTS tree (or an Optuna sampler) over recipes, a study that
survives kill -9, and a live view.

    Search.start()  open or resume the study; the job measures its baseline (the tree's root)
    Search.mcts()   loop { select, propose, job.refuse, job.submit, job.land, backpropagate, store }
    Search.optuna() the same with an Optuna sampler proposing from the root
    job.decide()    the job's control system turns the tree into APPROVED or KEEP BASELINE

What differs between jobs is a ``Job`` (speed/job.py: speed, finetune/job.py: quality): how
the baseline is measured, what is refused before running, how a run is started and judged, and the
decision. The engine owns the rest: the tree, the budget, the study, resume, parallel trials (and
engine/plan.py the checks before anything is written).

Every trial lands in the study before its run starts (RUNNING) and is closed when it ends, so a
campaign killed at any moment resumes from the study: finished trials are kept and never run
again, a trial that was running is marked failed ("interrupted") and its recipe may run again.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from recipetune.core.process import kill_orphans as _kill_orphans
from recipetune.core.recipe import Recipe, SearchSpace
from recipetune.core.relations import Relations
from recipetune.engine.config import TreeSearchConfig
from recipetune.engine.researcher import Proposal, Proposer, SearchContext, Subject
from recipetune.engine.samplers import OptunaStrategy
from recipetune.engine.store import CampaignStore, TrialRecord, distributions
from recipetune.engine.tree import Node, NodeStatus, Tree
from recipetune.execute.executor import Executor, TrialLost

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
    """Receives the campaign's progress; the CLI draws it, tests may record it."""

    def phase(self, text: str) -> None: ...

    def row(self, row: Row) -> None: ...

    def progress(self, key: str, done: int, total: int) -> None: ...

    def best(self, node: Node | None, baseline: Recipe) -> None: ...


@dataclass
class Outcome:
    decision: str  # APPROVED or KEEP BASELINE
    reasons: list[str]
    tree: Tree
    winner: Node | None = None
    verdict: Any = None
    verdicts: list[tuple[Node, Any]] = field(default_factory=list)
    approved_file: Path | None = None
    launch: list[str] = field(default_factory=list)
    runs: int = 0


# -- a job: what one kind of campaign does with a recipe ----------------------------------------


@dataclass
class Landing:
    """How the job judged one finished run."""

    status: NodeStatus  # passed | rejected | failed
    score: float | None  # the job's figure of merit (None unless it ran and was measured)
    reward: float  # in [0, 1], backpropagated (engine/tree.py)
    cause: str = ""
    figures: dict[str, Any] = field(default_factory=dict)  # stored with the trial
    result: Any = None  # what the proposer reads of this run


class Job(Protocol):
    name: str  # speed | quality
    baseline: Recipe
    space: SearchSpace
    subject: Subject  # the knobs and their relations
    cfg: TreeSearchConfig
    heartbeat_s: int

    def relations(self) -> Relations: ...

    def context_options(self) -> dict[str, Any]:
        """What proposers are told of this job (SearchContext's facts, goal, profile ...)."""

    def snapshot(self) -> dict[str, Any]:
        """The campaign's settings, saved as campaign.json when a study is created."""

    def start(self, search: Search) -> tuple[Any, float | None]:
        """Measure (or reload) the baseline: the root's result and score."""

    def couple(self, recipe: Recipe) -> tuple[Recipe, str]:
        """Knobs that follow another one's change, and a note saying what was set."""

    def refuse(self, recipe: Recipe) -> tuple[str, list[Any]]:
        """Why ``recipe`` may not run (the cause and its details), or ('', [])."""

    def plan_run(self, recipe: Recipe) -> dict[str, Any]:
        """What the trial records about its run before it starts (steps ...); passed to ``submit``."""

    def submit(self, executor: Executor, recipe: Recipe, run_dir: Path, plan: dict[str, Any],
               progress: Callable[[int, int], None]) -> Future: ...

    def land(self, result: Any, recipe: Recipe, run_dir: Path) -> Landing: ...

    def load_result(self, run_dir: Path) -> Any:
        """A finished run's result read back from its folder (a resume), or None."""

    def row(self, key: str, number: int | None, recipe: Recipe, attrs: dict[str, Any]) -> Row: ...

    def decide(self, search: Search) -> Outcome: ...


# -- the search ---------------------------------------------------------------------------------


@dataclass
class Pending:
    """A trial whose run was submitted and has not landed yet."""

    number: int
    recipe: Recipe
    parent: Node
    proposal: Proposal
    run_dir: Path
    future: Future


class Search:
    """One session of a campaign (a fresh one or a resumed one)."""

    def __init__(self, job: Job, store: CampaignStore, meta: dict[str, Any], resume: bool, executor: Executor,
                 reporter: Reporter):
        self.job, self.store, self.meta, self.resume = job, store, meta, resume
        self.executor, self.reporter = executor, reporter
        self.cfg = job.cfg
        self.baseline = job.baseline
        self.inflight: dict[Future, Pending] = {}
        self.elsewhere: set[str] = set()  # recipes other drivers on this study are running
        self.last_sync = 0.0
        self.dists = distributions(job.space, self.baseline)
        self.tree: Tree | None = None
        self.runs = 0
        self.elapsed_before = 0.0
        self.started = time.monotonic()

    # budget ----------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def budget_left(self) -> bool:
        wall = self.cfg.budget.wall_time_s
        return self.runs < self.cfg.budget.trials and (wall is None or self.elapsed() < wall)

    # start -----------------------------------------------------------------------------------

    def start(self) -> Tree:
        store = self.store
        if self.resume:
            for rec in store.fail_interrupted():
                self.reporter.phase(f"trial {rec.number} was interrupted; its recipe may run again")
                _kill_orphans(rec.attrs.get("run_dir"))  # on this machine; a Ray retry cleans its own node
            self.elapsed_before = float(store.study.user_attrs.get("search_elapsed_s", 0.0))
        else:
            store.create(self.meta)
            store.write_json("campaign.json", self.job.snapshot())
        root_result, root_score = self.job.start(self)
        self.tree = Tree(self.baseline, root_result, self.cfg.exploration, score=root_score)
        self.rebuild(store.records())
        self.started = time.monotonic()  # the wall-time budget is search time: the baseline is apart
        store.start_heartbeat()
        return self.tree

    def rebuild(self, records: list[TrialRecord], quiet: bool = False) -> None:
        """The tree and the measured set from the study's finished trials, in trial order."""
        tree = self.tree
        assert tree is not None
        for rec in sorted(records, key=lambda r: r.number):
            if rec.state not in ("COMPLETE", "FAIL") or rec.status not in ("passed", "rejected", "failed"):
                self._report_record(rec)
                continue
            if rec.recipe in tree:
                continue
            a = rec.attrs
            self.runs += bool(a.get("ran"))
            parent = tree.nodes.get(a.get("parent", ""), tree.root)
            result = self.job.load_result(Path(a["run_dir"])) if a.get("run_dir") else None
            tree.add(rec.recipe, parent, a["status"], a.get("reward"), score=a.get("score", a.get("speedup")),
                     cause=a.get("cause", ""), rationale=a.get("rationale", ""), source=a.get("proposer", ""),
                     trial=rec.number, result=result)
            self._report_record(rec)
        if records and not quiet:
            self.reporter.phase(f"resumed: {len(records)} trials in the study, {self.runs} runs of the budget spent")
            self.reporter.best(tree.best(), self.baseline)

    def _report_record(self, rec: TrialRecord) -> None:
        if "recipe" in rec.attrs:
            self.reporter.row(self.job.row(str(rec.number), rec.number, rec.recipe, rec.attrs))

    # one trial -------------------------------------------------------------------------------

    def launch(self, recipe: Recipe, parent: Node, proposal: Proposal, trial: Any = None,
               coupled: str = "") -> Node | Pending | None:
        """Claim, check, open the trial and submit its run. A refused proposal is a node at once; a
        submitted run is a ``Pending`` until ``land``; None: another driver has this recipe."""
        tree, store, job = self.tree, self.store, self.job
        assert tree is not None
        if not store.claim(recipe):
            self.elsewhere.add(recipe.id)
            if trial is not None:  # the sampler's trial must be told: it is not run here
                number = store.begin(recipe, self.dists, {"parent": tree.root.id, "proposer": self.cfg.strategy}, trial)
                store.finish(number, None, {"status": "duplicate", "ran": False,
                                            "cause": "same recipe as another driver's trial"})
            return None
        if coupled:
            proposal = replace(proposal, rationale=f"{proposal.rationale} [{coupled}]")
        attrs = {"parent": parent.id, "proposer": proposal.source, "rationale": proposal.rationale,
                 "edits": proposal.edits, **({"coupled": coupled} if coupled else {})}
        cause, details = job.refuse(recipe)
        number = store.begin(recipe, self.dists, attrs, trial)
        key = str(number)
        if cause:
            figures = {"status": "rejected", "cause": cause, "ran": False, "violations": details}
            store.finish(number, None, figures)
            self.reporter.row(job.row(key, number, recipe, {**attrs, **figures}))
            return tree.add(recipe, parent, "rejected", None, cause=cause, rationale=proposal.rationale,
                            source=proposal.source, trial=number)
        run_dir = store.run_dir(number, recipe)
        plan = job.plan_run(recipe)
        store.set_running(number, {"run_dir": str(run_dir), "ran": True, **plan})
        self.reporter.row(job.row(key, number, recipe, {**attrs, "status": "running"}))
        self.runs += 1
        tree.reserve(parent)  # virtual loss while it runs: parallel selection looks elsewhere
        # (the local executor runs the trial right here, before submit returns)
        future = job.submit(self.executor, recipe, run_dir, plan,
                            lambda done, total: self.reporter.progress(key, done, total))
        return Pending(number, recipe, parent, proposal, run_dir, future)

    def land(self, pending: Pending) -> Node:
        """A submitted run has ended: the job judges it; reward, store, and add its node."""
        tree, store = self.tree, self.store
        assert tree is not None
        tree.release(pending.parent)
        recipe, proposal, run_dir, number = pending.recipe, pending.proposal, pending.run_dir, pending.number
        penalty = self.cfg.failure_penalty
        try:
            landing = self.job.land(pending.future.result(), recipe, run_dir)
        except TrialLost as e:  # its worker or node died on every attempt: recorded, the campaign goes on
            landing = Landing("failed", None, penalty, f"lost: {e}", {"run_status": "lost"})
            _kill_orphans(str(run_dir))  # its trainer's children, if the trial ran on this machine
        except Exception as e:  # a broken trial must not end the campaign; the record says what broke
            landing = Landing("failed", None, penalty, f"error: {type(e).__name__}: {e}", {"run_status": "error"})
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "error.txt").write_text("".join(traceback.format_exception(e)))
        passed = landing.status == "passed"
        attempts = run_dir / "attempts.jsonl"
        figures = {**landing.figures, "status": landing.status, "cause": landing.cause, "reward": landing.reward,
                   "score": landing.score if passed else None,
                   **({"attempts": attempts.read_text().count("\n")} if attempts.exists() else {})}
        store.finish(number, landing.score if passed else None, figures)
        self.reporter.row(self.job.row(str(number), number, recipe,
                                       {"rationale": proposal.rationale, "proposer": proposal.source, **figures}))
        node = tree.add(recipe, parent=pending.parent, status=landing.status, value=landing.reward,
                        score=landing.score if passed else None, cause=landing.cause, rationale=proposal.rationale,
                        source=proposal.source, trial=number, result=landing.result)
        store.set_meta("search_elapsed_s", self.elapsed())
        self.reporter.best(tree.best(), self.baseline)
        return node

    # loops -----------------------------------------------------------------------------------
    #
    # Up to ``executor.parallel`` trials are in flight. The driver alone owns the tree and the
    # study: it selects, proposes and submits from this thread, and a run that ends is landed here
    # too; only the runs themselves happen elsewhere.

    def taken(self, recipe: Recipe) -> bool:
        """Tried, running here, or claimed by another driver on the same study."""
        assert self.tree is not None
        return recipe in self.tree or recipe.id in self.inflight_ids() or recipe.id in self.elsewhere

    def inflight_ids(self) -> set[str]:
        return {p.recipe.id for p in self.inflight.values()}

    def sync(self) -> None:
        """Trials other drivers finished on this study join the tree; stale ones are failed."""
        if time.monotonic() - self.last_sync < min(5.0, self.job.heartbeat_s):
            return
        self.last_sync = time.monotonic()
        for rec in self.store.fail_interrupted(mine=False):  # another driver died: its trials may run again
            self.reporter.phase(f"trial {rec.number} was interrupted ({rec.attrs.get('driver', '?')} is gone); "
                                "its recipe may run again")
            _kill_orphans(rec.attrs.get("run_dir"))
        mine = {p.number for p in self.inflight.values()}
        others = [r for r in self.store.records() if r.number not in mine]
        assert self.tree is not None
        fresh = [r for r in others if r.state in ("COMPLETE", "FAIL") and "recipe" in r.attrs
                 and r.recipe not in self.tree]
        if fresh:
            self.rebuild(fresh, quiet=True)
        self.elsewhere = {r.attrs["recipe_id"] for r in others if r.state == "RUNNING" and "recipe_id" in r.attrs}

    def drain(self, block: bool) -> None:
        """Land the runs that ended; with ``block``, wait for at least one."""
        if not self.inflight:
            return
        done, _ = wait(list(self.inflight), timeout=None if block else 0, return_when=FIRST_COMPLETED)
        for future in done:
            self.land(self.inflight.pop(future))

    def context(self) -> SearchContext:
        assert self.tree is not None
        return SearchContext(self.job.subject, self.baseline, self.job.space, self.tree, self.cfg.seed,
                             **self.job.context_options())

    def mcts(self, proposer: Proposer) -> None:
        tree = self.tree
        assert tree is not None
        context = self.context()
        couple = self.job.couple
        queue: list[tuple[Node, Proposal]] = []  # the current expansion's proposals not yet started
        while True:
            self.sync()
            waiting = False  # everything new to try is running: wait for a run to land
            while len(self.inflight) < self.executor.parallel and self.budget_left():
                if not queue:
                    node = tree.select(self.cfg.selection)
                    if node is None:
                        break
                    proposals = proposer.propose(node, context, self.cfg.children)
                    self.record_rejections(context)
                    # Proposers skip what was tried; this holds for any proposer, so a node can only
                    # be selected again if it produced something new.
                    fresh = [p for p in proposals if not self.taken(couple(node.recipe.with_(**p.edits))[0])]
                    if not fresh:
                        if any(couple(node.recipe.with_(**p.edits))[0] not in tree for p in proposals):
                            waiting = True  # its ideas are running (here or elsewhere), not used up
                            break
                        node.exhausted = True
                        if node.id in context.failed:  # a failed Researcher, not one with nothing new: say so
                            where = node.recipe.describe_diff(self.baseline)
                            why = context.failed[node.id]
                            self.reporter.phase(f"{proposer.name} proposer failed at {where}: {why}")
                        continue
                    queue = [(node, p) for p in fresh]
                node, proposal = queue.pop(0)
                recipe, coupled = couple(node.recipe.with_(**proposal.edits))
                if self.taken(recipe):  # two proposals of one round may coincide
                    continue
                started = self.launch(recipe, node, proposal, coupled=coupled)
                if isinstance(started, Pending):
                    self.inflight[started.future] = started
            if self.inflight:
                self.drain(block=True)
            elif waiting and self.elsewhere:
                time.sleep(1.0)  # polls the study while another driver runs what is left to try
                self.last_sync = 0.0
            else:
                if self.budget_left() and tree.select(self.cfg.selection) is None:
                    failed = f" ({len(context.failed)} of its nodes only because every answer failed)" \
                        if context.failed else ""
                    self.reporter.phase(f"the tree is exhausted: no proposer has anything new to try{failed}")
                return

    def optuna(self) -> None:
        tree = self.tree
        assert tree is not None
        strategy = OptunaStrategy(self.cfg.strategy, self.store, self.job.space, self.baseline, self.job.relations())
        repeats = 0
        while True:
            self.sync()
            while len(self.inflight) < self.executor.parallel and self.budget_left():
                if strategy.exhausted() or len(tree) + len(self.inflight) >= strategy.space_size() or repeats > 100:
                    break
                trial, recipe = strategy.ask()
                edits = {n: new for n, (_, new) in recipe.diff(self.baseline).items()}
                proposal = Proposal(edits, f"{self.cfg.strategy} sampler", self.cfg.strategy)
                recipe, coupled = self.job.couple(recipe)
                if recipe in tree or recipe.id in self.inflight_ids():
                    # The sampler must hear the outcome to move on; the recipe is not run again.
                    repeats += 1
                    prior = tree.nodes.get(recipe.id)
                    number = self.store.begin(recipe, self.dists, {
                        "parent": tree.root.id, "proposer": self.cfg.strategy,
                        "duplicate_of": prior.trial if prior is not None else None}, trial)
                    value = prior.score if prior is not None and prior.status in ("passed", "baseline") else None
                    same = "the baseline" if prior is tree.root else \
                        f"trial {prior.trial}" if prior is not None else "a running trial"
                    self.store.finish(number, value,
                                      {"status": "duplicate", "ran": False, "cause": f"same recipe as {same}"})
                    continue
                started = self.launch(recipe, tree.root, proposal, trial, coupled)
                repeats = repeats + 1 if started is None else 0  # None: another driver's recipe, told as such
                if isinstance(started, Pending):
                    self.inflight[started.future] = started
            if not self.inflight:
                if self.budget_left():
                    self.reporter.phase("the search space is exhausted")
                return
            self.drain(block=True)

    def record_rejections(self, context: SearchContext) -> None:
        for i, rej in enumerate(context.drain()):
            self.store.append_jsonl("rejected_proposals.jsonl", {"time": time.time(), **vars(rej)})
            self.reporter.row(Row(f"x{time.monotonic_ns()}-{i}", None, "(not a recipe)", "invalid",
                                  rationale=rej.raw[:200], source=rej.source, cause=rej.reason))


def run_search(job: Job, store: CampaignStore, meta: dict[str, Any], resume: bool, proposer: Proposer | None,
               executor: Executor, reporter: Reporter | None = None) -> Outcome:
    """Run (or resume) a campaign to its decision. Ctrl-C leaves it resumable."""
    search = Search(job, store, meta, resume, executor, reporter or Reporter())
    try:
        search.start()
        if job.cfg.strategy == "mcts":
            assert proposer is not None
            search.mcts(proposer)
        else:
            search.optuna()
        search.last_sync = 0.0
        search.sync()  # other drivers' finished trials join the decision; a dead one's leave RUNNING
        search.store.set_meta("search_elapsed_s", search.elapsed())
        return job.decide(search)
    except KeyboardInterrupt:
        search.executor.close()  # remote runs are cancelled; their trainers are killed where they run
        if search.store.opened:
            search.store.fail_interrupted(gone=False)
            search.store.set_meta("search_elapsed_s", search.elapsed())
        raise
    finally:
        search.executor.close()
        search.store.stop_heartbeat()
