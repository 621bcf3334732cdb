"""The search loop every job and every strategy runs through.

    Search.start()   open or resume the study; the job measures its baseline (the tree's root)
    Search.run(s)    loop { s.ask -> job.check -> store.open_trial -> job.submit -> job.land -> store.finish
                            -> tree.add (backpropagate) -> s.tell } until the budget is spent or s has nothing left
    job.decide()     the job's control system turns the tree into APPROVED or KEEP BASELINE

The strategy (engine/strategy.py) chooses what to try next: the tree and its Researcher, or an
Optuna sampler. The job (engine/job.py) measures and judges. The loop owns the rest: the tree, the
budget, the study, resume, the trials in flight, other drivers on the same study.

The study before the tree: a landed trial is closed in the study (store.finish) before its node joins
the tree, because the study is what a resume reads: a campaign killed between the two resumes with
the trial and rebuilds its node, where the other order would have shown a node the study never kept.
Every trial lands in the study before its run starts (RUNNING) and is closed when it ends, so a
campaign killed at any moment resumes from the study: finished trials are kept and never run
again, a trial that was running is marked failed ("interrupted") and its recipe may run again.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from recipetune.core.process import kill_orphans
from recipetune.core.recipe import Recipe
from recipetune.engine.config import TreeSearchConfig
from recipetune.engine.database import NO_SPACE, DiskFull
from recipetune.engine.job import Checked, Finished, Job, Landing, Outcome, Progress, Root, Row, Services
from recipetune.engine.record import Trial, TrialRecord
from recipetune.engine.researcher import Proposer, SearchContext
from recipetune.engine.samplers import distributions, pruning_bar
from recipetune.engine.store import Refused
from recipetune.engine.strategy import Candidate, SamplerStrategy, Strategy, TreeStrategy, Wait
from recipetune.engine.tree import Node, Tree
from recipetune.execute.executor import TrialLost


@dataclass
class Pending:
    """A trial whose run was submitted and has not landed yet."""

    number: int
    candidate: Candidate
    run_dir: Path
    future: Future
    started: float  # time.monotonic() at submit

    @property
    def recipe(self) -> Recipe:
        return self.candidate.recipe


class Search:
    """One session of a campaign (a fresh one or a resumed one)."""

    def __init__(self, job: Job, cfg: TreeSearchConfig, services: Services, meta: dict[str, Any],
                 snapshot: dict[str, Any], resume: bool):
        self.job, self.cfg, self.services = job, cfg, services
        self.store, self.executor, self.reporter = services.store, services.executor, services.reporter
        self.meta, self.snapshot, self.resume = meta, snapshot, resume
        self.baseline = job.baseline
        self.inflight: dict[Future, Pending] = {}
        self.elsewhere: set[str] = set()  # recipes other drivers on this study are running
        self.last_sync = 0.0
        self.dists = distributions(job.space, self.baseline)
        self.tree: Tree = Tree(self.baseline)  # replaced by start(), which has the baseline's result
        self.strategy: Strategy | None = None
        self.checked: dict[str, Checked] = {}  # the job's check, by recipe id (``check``)
        self.runs = 0
        self.root = Root(None, None)  # the baseline, once start() measured it
        self.trial_s = 0.0  # seconds the trials have run, this session and before (budget.trial_s)
        self.spent = False  # every run slot of the study's shared budget is taken (engine/drivers.py: take_run)
        self.spent_checked = False  # a sync has looked for a dead driver's slots since it was spent
        self.elapsed_before = 0.0
        self.started = time.monotonic()

    # budget ----------------------------------------------------------------------------------

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def budget_left(self) -> bool:
        wall = self.cfg.budget.wall_time_s
        return self.runs < self.cfg.budget.trials and not self.spent and (wall is None or self.elapsed() < wall)

    # start -----------------------------------------------------------------------------------

    def start(self) -> Tree:
        store = self.store
        if self.resume:
            for rec in store.drivers.fail_interrupted():
                self.reporter.phase(f"trial {rec.number} was interrupted; its recipe may run again")
                kill_orphans(rec.attrs.get("run_dir"))  # on this machine; a Ray retry cleans its own node
            self.elapsed_before = float(store.study.user_attrs.get("search_elapsed_s", 0.0))
            self.trial_s = float(store.study.user_attrs.get("search_trial_s", 0.0))
        else:
            store.create(self.meta)
            store.write_json("campaign.json", self.snapshot)
        root = self.root = self.job.start(self.services)
        self.tree = Tree(self.baseline, root.result, self.cfg.exploration, score=root.score, backup=self.cfg.backup)
        if root.curve and self.cfg.pruning.on and root.score is not None:
            store.set_reference(root.curve, root.score)  # the pruner compares the trials with the baseline
        self.rebuild(store.records())
        self.started = time.monotonic()  # the wall-time budget is search time: the baseline is apart
        store.drivers.start_heartbeat()
        return self.tree

    def rebuild(self, records: list[TrialRecord], quiet: bool = False) -> None:
        """The tree and the measured set from the study's finished trials, in trial order."""
        tree = self.tree
        for rec in sorted(records, key=lambda r: r.number):
            if not rec.finished:
                self._report_record(rec)
                continue
            if rec.recipe in tree:
                continue
            t = self.trial(rec.attrs)
            self.runs += t.ran
            parent = tree.nodes.get(t.parent, tree.root)
            result = self.job.load(Path(t.run_dir)) if t.run_dir else None
            tree.add(rec.recipe, parent, t.status, t.reward, score=t.score, cause=t.cause, rationale=t.rationale,
                     source=t.proposer, trial=rec.number, result=result)
            self._report_record(rec)
        if records and not quiet:
            self.reporter.phase(f"resumed: {len(records)} trials in the study, {self.runs} runs of the budget spent")
            self.reporter.best(tree.best(), self.baseline)

    def trial(self, attrs: dict[str, Any]) -> Trial[Any]:
        """A trial's stored attributes as the job's typed record."""
        return Trial[self.job.figures].model_validate(attrs)  # type: ignore[name-defined]

    def _report_record(self, rec: TrialRecord) -> None:
        if "recipe" in rec.attrs:
            self.reporter.row(self.job.row(str(rec.number), rec.number, rec.recipe, self.trial(rec.attrs)))

    # one trial -------------------------------------------------------------------------------

    def launch(self, c: Candidate) -> Node | Pending | None:
        """Check, open the trial and submit its run. A refused candidate is a node at once; a
        submitted run is a ``Pending`` until ``land``; None: another driver has this recipe, or other
        drivers' runs took the shared budget."""
        tree, store, job = self.tree, self.store, self.job
        proposal = replace(c.proposal, rationale=f"{c.proposal.rationale} [{c.note}]") if c.note else c.proposal
        attrs = {"parent": c.parent.id, "proposer": proposal.source, "rationale": proposal.rationale,
                 "edits": proposal.edits, **({"coupled": c.note} if c.note else {})}
        checked = self.check(c.recipe)
        refusal = ({"status": "rejected", "cause": checked.refusal, "ran": False, "violations": checked.details}
                   if checked.refusal else None)
        opened = store.open_trial(c.recipe, self.dists, attrs, c.trial, budget=self.cfg.budget.trials,
                                  plan=checked.plan, refusal=refusal)
        if isinstance(opened, Refused) and opened.reason == "claimed":
            self.elsewhere.add(c.recipe.id)
            return None
        c.proposal = proposal
        if isinstance(opened, Refused) and opened.reason == "budget":
            self.spent, self.spent_checked = True, False
            return None
        if isinstance(opened, Refused):  # the job's check refused it: a node at once, nothing ran
            assert opened.number is not None and refusal is not None
            self.reporter.row(job.row(str(opened.number), opened.number, c.recipe, self.trial({**attrs, **refusal})))
            return tree.add(c.recipe, c.parent, "rejected", None, cause=opened.cause,
                            rationale=proposal.rationale, source=proposal.source, trial=opened.number)
        number, key = opened.number, str(opened.number)
        self.reporter.row(job.row(key, number, c.recipe, self.trial({**attrs, "status": "running"})))
        self.runs += 1
        tree.reserve(c.parent)  # virtual loss while it runs: parallel selection looks elsewhere
        progress = Progress(lambda done, total: self.reporter.progress(key, done, total),
                            lambda step, value, upper: self.prune(number, step, value, upper))
        # the clock starts before submit: the local executor runs the trial right here, before it returns
        started = time.monotonic()
        future = job.submit(c.recipe, opened.run_dir, checked.plan, progress)
        return Pending(number, c, opened.run_dir, future, started)

    def land(self, pending: Pending) -> Node:
        """A submitted run has ended: the job judges it; reward, store, and add its node."""
        tree, store, c = self.tree, self.store, pending.candidate
        tree.release(c.parent)
        recipe, proposal, run_dir, number = c.recipe, c.proposal, pending.run_dir, pending.number
        penalty = self.cfg.failure_penalty
        try:
            landing = self.job.land(pending.future.result(), recipe, run_dir)
        except TrialLost as e:  # its worker or node died on every attempt: recorded, the campaign goes on
            landing = Landing("failed", None, penalty, f"lost: {e}", self.job.figures(run_status="lost"))
            kill_orphans(str(run_dir))  # its trainer's children, if the trial ran on this machine
        except Exception as e:  # a broken trial must not end the campaign; the record says what broke
            if isinstance(e, OSError) and e.errno in NO_SPACE:  # but a full disk is the campaign's, not the
                raise DiskFull(store.folder, e) from e  # recipe's: stop, the trial stays open for --resume
            landing = Landing("failed", None, penalty, f"error: {type(e).__name__}: {e}",
                              self.job.figures(run_status="error"))
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "error.txt").write_text("".join(traceback.format_exception(e)))
        passed = landing.status == "passed"
        attempts = run_dir / "attempts.jsonl"
        stored = landing.figures.stored() if landing.figures is not None else {}
        figures = {**stored, "status": landing.status, "cause": landing.cause, "reward": landing.reward,
                   "score": landing.score if passed else None,
                   **({"attempts": attempts.read_text().count("\n")} if attempts.exists() else {})}
        store.finish(number, landing.score if passed else None, figures, pruned=landing.status == "pruned")
        self.trial_s += time.monotonic() - pending.started
        store.set_meta("search_trial_s", self.trial_s)
        self.reporter.row(self.job.row(str(number), number, recipe, self.trial(
            {"rationale": proposal.rationale, "proposer": proposal.source, **figures})))
        node = tree.add(recipe, parent=c.parent, status=landing.status, value=landing.reward,
                        score=landing.score if passed else None, cause=landing.cause, rationale=proposal.rationale,
                        source=proposal.source, trial=number, result=landing.result)
        store.set_meta("search_elapsed_s", self.elapsed())
        self.reporter.best(tree.best(), self.baseline)
        self.reporter.campaign(self.runs - len(self.inflight), self.cfg.budget.trials, self.elapsed())
        return node

    def prune(self, number: int, step: int, value: float, upper: float | None) -> bool:
        """Whether a running trial stops at this report: the study's pruner says so (Optuna's, over
        the finished trials and the baseline's curve at ``step``), and the trial cannot plausibly
        reach what it is compared with: ``upper``, the most its value could be given its noise, is
        below the bar that pruner keeps trials above there (the median, a percentile, a rung's top
        share: ``pruning_bar``). Noise alone never stops a trial."""
        if not self.store.report(number, step, value):
            return False
        bar = pruning_bar(self.cfg.pruning, self.store.values_at(step)) if upper is not None else None
        return upper is None or bar is None or upper < bar

    def stop_rule(self) -> str:
        """Why the campaign starts no more trials although runs are left (the job's word on its baseline,
        budget.trial_s, budget.plateau), or ''."""
        if self.root.stop:
            return self.root.stop
        budget = self.cfg.budget
        if budget.trial_s is not None and self.trial_s >= budget.trial_s:
            return f"the compute budget is spent: the trials ran {self.trial_s:.0f} s of {budget.trial_s:.0f} s"
        if budget.plateau is not None:
            gain = budget.plateau_gain if budget.plateau_gain is not None else self.root.noise
            best, since = self.root.score, 0
            for node in sorted((n for n in self.tree if n.trial is not None), key=lambda n: n.trial or 0):
                if node.status == "rejected":
                    continue  # refused before running: it cost nothing
                if node.score is not None and node.status == "passed" and (best is None or node.score > best + gain):
                    best, since = node.score, 0
                else:
                    since += 1
            if since >= budget.plateau:
                return f"a plateau: {since} runs in a row without a gain beyond {gain:.4g} over the best ({best:.4g})"
        return ""

    # what strategies see (engine/strategy.py: SearchView) ----------------------------------------

    def taken(self, recipe: Recipe) -> bool:
        """Tried, running here, or claimed by another driver on the same study."""
        return recipe in self.tree or recipe.id in self.inflight_ids() or recipe.id in self.elsewhere

    def inflight_ids(self) -> set[str]:
        return {p.recipe.id for p in self.inflight.values()}

    def check(self, recipe: Recipe) -> Checked:
        """The job's check of ``recipe``, once per recipe in a session: a strategy couples every
        proposal to filter what is taken, and the launch checks it again (a static check each time)."""
        if recipe.id not in self.checked:
            self.checked[recipe.id] = self.job.check(recipe)
        return self.checked[recipe.id]

    def couple(self, recipe: Recipe) -> tuple[Recipe, str]:
        checked = self.check(recipe)
        return checked.recipe, checked.note

    def phase(self, text: str) -> None:
        self.reporter.phase(text)

    def record_rejections(self, context: SearchContext) -> None:
        for i, rej in enumerate(context.drain()):
            self.store.append_jsonl("rejected_proposals.jsonl", {"time": time.time(), **vars(rej)})
            self.reporter.row(Row(f"x{time.monotonic_ns()}-{i}", None, "(not a recipe)", "invalid",
                                  rationale=rej.raw[:200], source=rej.source, cause=rej.reason))

    def record_repeat(self, c: Candidate, prior: Node | None) -> None:
        """A sampler asked for a recipe already tried: its trial is told that result, nothing runs."""
        number = self.store.begin(c.recipe, self.dists, {
            "parent": self.tree.root.id, "proposer": self.cfg.strategy,
            "duplicate_of": prior.trial if prior is not None else None}, c.trial)
        value = prior.score if prior is not None and prior.status in ("passed", "baseline") else None
        same = "the baseline" if prior is self.tree.root else \
            f"trial {prior.trial}" if prior is not None else "a running trial"
        self.store.finish(number, value, {"status": "duplicate", "ran": False, "cause": f"same recipe as {same}"})

    def context(self) -> SearchContext:
        """What the Researcher reads: the job's knobs and briefing, the tree so far."""
        return SearchContext(self.job.subject, self.baseline, self.job.space, self.tree, self.cfg.seed,
                             **self.job.briefing)

    def make_strategy(self, proposer: Proposer | None) -> Strategy:
        if self.cfg.strategy == "mcts":
            if proposer is None:
                raise ValueError("strategy mcts needs a proposer (the Researcher)")
            return TreeStrategy(self, proposer, self.context(), self.cfg.children, self.cfg.selection)
        return SamplerStrategy(self, self.cfg.strategy, self.job.subject.relations() or None)

    # the loop --------------------------------------------------------------------------------
    #
    # Up to ``executor.parallel`` trials are in flight. The driver alone owns the tree and the
    # study: it asks, checks and submits from this thread, and a run that ends is landed here too;
    # only the runs themselves happen elsewhere.

    def sync(self) -> None:
        """Trials other drivers finished on this study join the tree; stale ones are failed."""
        if time.monotonic() - self.last_sync < min(5.0, self.store.heartbeat_s):
            return
        self.last_sync = time.monotonic()
        for rec in self.store.drivers.fail_interrupted(mine=False):  # another driver died: its trials may run again
            self.spent = False  # and its run slots are free again
            self.reporter.phase(f"trial {rec.number} was interrupted ({rec.attrs.get('driver', '?')} is gone); "
                                "its recipe may run again")
            kill_orphans(rec.attrs.get("run_dir"))
        mine = {p.number for p in self.inflight.values()}
        others = [r for r in self.store.records() if r.number not in mine]
        # (an interrupted trial is no node: it was reported once at resume, not again at every sync)
        fresh = [r for r in others if r.finished and "recipe" in r.attrs and r.recipe not in self.tree]
        if fresh:
            self.rebuild(fresh, quiet=True)
        self.elsewhere = {r.attrs["recipe_id"] for r in others if r.state == "RUNNING" and "recipe_id" in r.attrs}

    def drain(self, block: bool) -> None:
        """Land the runs that ended; with ``block``, wait for at least one."""
        if not self.inflight:
            return
        done, _ = wait(list(self.inflight), timeout=None if block else 0, return_when=FIRST_COMPLETED)
        for future in done:
            pending = self.inflight.pop(future)
            node = self.land(pending)
            assert self.strategy is not None
            self.strategy.tell(pending.candidate, node)

    def run(self, strategy: Strategy) -> None:
        self.strategy = strategy
        while True:
            self.sync()
            waiting = False  # everything new to try is running: wait for a run to land
            stop = self.stop_rule()
            while len(self.inflight) < self.executor.parallel and self.budget_left() and not stop:
                c = strategy.ask()
                if c is None:
                    break
                if isinstance(c, Wait):
                    waiting = True
                    break
                started = self.launch(c)
                if isinstance(started, Pending):
                    self.inflight[started.future] = started
                else:
                    strategy.tell(c, started)
            if self.inflight:
                self.drain(block=True)
            elif waiting and self.elsewhere:
                time.sleep(1.0)  # polls the study while another driver runs what is left to try
                self.last_sync = 0.0
            elif self.spent and not self.spent_checked:
                # the slots looked taken, maybe by a driver that died mid-trial: only a sync (at most
                # every few seconds) frees them, so look once more before calling the budget spent
                self.spent_checked, self.last_sync = True, 0.0
            else:
                self.reporter.campaign(self.runs, self.cfg.budget.trials, self.elapsed(), ended=True)
                if stop:
                    self.reporter.phase(f"stopped: {stop}")
                elif self.budget_left() and not waiting:
                    self.reporter.phase(strategy.exhausted())
                return

    def finished(self) -> Finished:
        return Finished(self.tree, self.runs, self.stop_rule() if self.budget_left() else "")


def run_search(job: Job, cfg: TreeSearchConfig, services: Services, *, meta: dict[str, Any],
               snapshot: dict[str, Any], resume: bool, proposer: Proposer | None = None,
               strategy: Callable[[Search], Strategy] | None = None) -> Outcome:
    """Run (or resume) a campaign to its decision. ``strategy`` builds one of the caller's own on the
    started search (bench/replay.py's plain baselines); by default the campaign's (``cfg.strategy``,
    with ``proposer`` for the tree). Ctrl-C leaves it resumable."""
    search = Search(job, cfg, services, meta, snapshot, resume)
    try:
        search.start()
        search.run(strategy(search) if strategy else search.make_strategy(proposer))
        search.last_sync = 0.0
        search.sync()  # other drivers' finished trials join the decision; a dead one's leave RUNNING
        search.store.set_meta("search_elapsed_s", search.elapsed())
        return job.decide(search.finished())
    except KeyboardInterrupt:
        search.executor.close()  # remote runs are cancelled; their trainers are killed where they run
        if search.store.opened:
            search.store.drivers.fail_interrupted(gone=False)
            search.store.set_meta("search_elapsed_s", search.elapsed())
        raise
    finally:
        search.executor.close()
        search.store.drivers.stop_heartbeat()
