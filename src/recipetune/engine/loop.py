"""The search loop every job and every strategy runs through.

    Search.start()   open or resume the study; the job measures its baseline (the tree's root)
    Search.run(s)    loop { s.ask -> job.check -> store.open_trial -> job.submit -> job.land -> store.finish
                            -> tree.add (backpropagate) -> s.tell } until the budget is spent or s has nothing left
    job.decide()     the job's control system turns the tree into APPROVED or KEEP BASELINE

The strategy (engine/strategy.py) chooses what to try next: the tree and its Researcher, or an
Optuna sampler. The job (engine/job.py) measures and judges. The loop owns the rest: the tree, the
study, resume, the trials in flight, other drivers on the same study; each step of one trial is
engine/trials.py (claiming and launching, landing), the budget and the stop rules engine/stopping.py.

The study before the tree: a landed trial is closed in the study (store.finish) before its node joins
the tree, because the study is what a resume reads: a campaign killed between the two resumes with
the trial and rebuilds its node, where the other order would have shown a node the study never kept.
Every trial lands in the study before its run starts (RUNNING) and is closed when it ends, so a
campaign killed at any moment resumes from the study: finished trials are kept and never run
again, a trial that was running is marked failed ("interrupted") and its recipe may run again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from recipetune.core.filenames import CAMPAIGN, REJECTED, SET_ASIDE
from recipetune.core.process import kill_orphans
from recipetune.core.recipe import Recipe
from recipetune.engine.config import TreeSearchConfig
from recipetune.engine.effects import Effects
from recipetune.engine.job import Finished, Job, Outcome, Root, Row, Services
from recipetune.engine.researcher import Proposer, SearchContext
from recipetune.engine.status import Refusal, Status
from recipetune.engine.stopping import Stopping
from recipetune.engine.store import Refused
from recipetune.engine.strategy import Candidate, SamplerStrategy, Strategy, TreeStrategy, Wait
from recipetune.engine.tree import Node, Tree
from recipetune.engine.trials import Pending, Trials


class Search:
    """One session of a campaign (a fresh one or a resumed one)."""

    def __init__(self, job: Job, cfg: TreeSearchConfig, services: Services, meta: dict[str, Any],
                 snapshot: dict[str, Any], resume: bool):
        self.job, self.cfg, self.services = job, cfg, services
        self.store, self.executor, self.reporter = services.store, services.executor, services.reporter
        self.meta, self.snapshot, self.resume = meta, snapshot, resume
        self.baseline = job.baseline
        self.stopping = Stopping(cfg.budget)
        self.trials = Trials(job, cfg, services, self.stopping)
        self.dists = self.trials.dists  # what a sampler's trials are asked over (SearchView)
        self.inflight: dict[Future, Pending] = {}
        self.elsewhere: set[str] = set()  # recipes other drivers on this study are running
        self.last_sync = 0.0
        self.tree: Tree = Tree(self.baseline)  # replaced by start(), which has the baseline's result
        self.strategy: Strategy | None = None
        self.root = Root(None, None)  # the baseline, once start() measured it
        self.effects: Effects | None = None  # the set-aside rule, on the tree start() builds
        self.culprits: set[str] = set()  # the values the log has named as the reason for a set-aside

    # start -----------------------------------------------------------------------------------

    def start(self) -> Tree:
        store, stopping = self.store, self.stopping
        if self.resume:
            for rec in store.drivers.fail_interrupted():
                self.reporter.phase(f"trial {rec.number} was interrupted; its recipe may run again")
                kill_orphans(rec.attrs.get("run_dir"))  # on this machine; a Ray retry cleans its own node
            stopping.elapsed_before = float(store.study.user_attrs.get("search_elapsed_s", 0.0))
            stopping.trial_s = float(store.study.user_attrs.get("search_trial_s", 0.0))
        else:
            store.create(self.meta)
            store.write_json(CAMPAIGN, self.snapshot)
        root = self.root = self.job.start(self.services)
        self.tree = Tree(self.baseline, root.result, self.cfg.exploration, score=root.score, backup=self.cfg.backup)
        self.effects = Effects(self.tree, self.job.space, root.noise, self.cfg.set_aside)
        self.trials.stop_slower = self.effects.stop if root.speed_reports else None
        if root.curve and self.cfg.pruning.on and root.score is not None:
            store.set_reference(root.curve, root.score)  # the pruner compares the trials with the baseline
        self.trials.rebuild(self.tree, store.records())
        stopping.started = time.monotonic()  # the wall-time budget is search time: the baseline is apart
        store.drivers.start_heartbeat()
        return self.tree

    # what strategies see (engine/strategy.py: SearchView) ----------------------------------------

    def taken(self, recipe: Recipe) -> bool:
        """Tried, running here, or claimed by another driver on the same study."""
        return recipe in self.tree or recipe.id in self.inflight_ids() or recipe.id in self.elsewhere

    def inflight_ids(self) -> set[str]:
        return {p.recipe.id for p in self.inflight.values()}

    def couple(self, recipe: Recipe) -> tuple[Recipe, str]:
        checked = self.trials.check(recipe)
        return checked.recipe, checked.note

    def phase(self, text: str) -> None:
        self.reporter.phase(text)

    def record_rejections(self, context: SearchContext) -> None:
        for i, rej in enumerate(context.drain()):
            self.store.append_jsonl(REJECTED, {"time": time.time(), **vars(rej)})
            self.reporter.row(Row(f"x{time.monotonic_ns()}-{i}", None, "(not a recipe)", "invalid",
                                  rationale=rej.raw[:200], source=rej.source, cause=rej.reason))

    def record_repeat(self, c: Candidate, prior: Node | None) -> None:
        self.trials.record_repeat(self.tree, c, prior)

    def record_set_aside(self, c: Candidate, value: float) -> None:
        assert self.effects is not None
        self.trials.record_set_aside(self.tree, c, value, self.effects.pool[c.recipe.id].aside.line())

    def announce(self) -> None:
        """The recipes set aside since the last call: each a line of the campaign folder's SET_ASIDE and a
        row of the live table; the log names each new reason once, with the measurements behind it."""
        if self.effects is None:
            return
        for pooled in self.effects.fresh():
            aside = pooled.aside
            self.store.append_jsonl(SET_ASIDE, {"time": time.time(), "source": pooled.source, **aside.record()})
            trials = ", ".join(str(m.trial) for m in aside.measurements[:6])
            self.reporter.row(Row(f"a{aside.recipe.id}", None, aside.change, Status.SET_ASIDE, source=pooled.source,
                                  rationale=f"predicted {aside.predicted:.2g}x the incumbent's speed",
                                  cause=f"{aside.culprit()}: at most {aside.upper:.2g}x the incumbent's speed, "
                                        f"on trials {trials}"))
            if aside.culprit() not in self.culprits:
                self.culprits.add(aside.culprit())
                self.reporter.phase(aside.line())

    def context(self) -> SearchContext:
        """What the Researcher reads: the job's knobs and briefing, the tree so far."""
        return SearchContext(self.job.subject, self.baseline, self.job.space, self.tree, self.cfg.seed,
                             effects=self.effects, **self.job.briefing)

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
            self.stopping.spent = False  # and its run slots are free again
            self.reporter.phase(f"trial {rec.number} was interrupted ({rec.attrs.get('driver', '?')} is gone); "
                                "its recipe may run again")
            kill_orphans(rec.attrs.get("run_dir"))
        mine = {p.number for p in self.inflight.values()}
        others = [r for r in self.store.records() if r.number not in mine]
        # (an interrupted trial is no node: it was reported once at resume, not again at every sync)
        fresh = [r for r in others if r.finished and "recipe" in r.attrs and r.recipe not in self.tree]
        if fresh:
            self.trials.rebuild(self.tree, fresh, quiet=True)
        self.elsewhere = {r.attrs["recipe_id"] for r in others if r.state == "RUNNING" and "recipe_id" in r.attrs}

    def launch(self, c: Candidate) -> None:
        """One candidate: in flight, a node at once (told to the strategy), or not run here."""
        assert self.strategy is not None and self.effects is not None
        self.effects.settle()  # the bar its own speed reports may be stopped below
        started = self.trials.launch(self.tree, c)
        if isinstance(started, Pending):
            self.inflight[started.future] = started
            return
        if isinstance(started, Refused):
            if started.reason == Refusal.CLAIMED:
                self.elsewhere.add(c.recipe.id)
            else:  # budget: other drivers' runs took every slot
                self.stopping.slots_taken()
            started = None
        self.strategy.tell(c, started)

    def drain(self, block: bool) -> None:
        """Land the runs that ended; with ``block``, wait for at least one."""
        if not self.inflight:
            return
        done, _ = wait(list(self.inflight), timeout=None if block else 0, return_when=FIRST_COMPLETED)
        for future in done:
            pending = self.inflight.pop(future)
            node = self.trials.land(self.tree, pending, len(self.inflight))
            assert self.strategy is not None
            self.strategy.tell(pending.candidate, node)

    def run(self, strategy: Strategy) -> None:
        self.strategy, stopping = strategy, self.stopping
        while True:
            self.sync()
            waiting = False  # everything new to try is running: wait for a run to land
            stop = stopping.why(self.root, self.tree)
            while len(self.inflight) < self.executor.parallel and stopping.left() and not stop:
                c = strategy.ask()
                self.announce()
                if c is None:
                    break
                if isinstance(c, Wait):
                    waiting = True
                    break
                self.launch(c)
            if self.inflight:
                self.drain(block=True)
            elif waiting and self.elsewhere:
                time.sleep(1.0)  # polls the study while another driver runs what is left to try
                self.last_sync = 0.0
            elif stopping.spent and not stopping.spent_checked:
                # the slots looked taken, maybe by a driver that died mid-trial: only a sync (at most
                # every few seconds) frees them, so look once more before calling the budget spent
                stopping.spent_checked, self.last_sync = True, 0.0
            else:
                self.reporter.campaign(stopping.runs, self.cfg.budget.trials, stopping.elapsed(), ended=True)
                if stop:
                    self.reporter.phase(f"stopped: {stop}")
                elif stopping.left() and not waiting:
                    self.reporter.phase(strategy.exhausted())
                return

    def finished(self) -> Finished:
        stopping = self.stopping
        return Finished(self.tree, stopping.runs, stopping.why(self.root, self.tree) if stopping.left() else "")


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
        search.store.set_meta("search_elapsed_s", search.stopping.elapsed())
        return job.decide(search.finished())
    except KeyboardInterrupt:
        search.executor.close()  # remote runs are cancelled; their trainers are killed where they run
        if search.store.opened:
            search.store.drivers.fail_interrupted(gone=False)
            search.store.set_meta("search_elapsed_s", search.stopping.elapsed())
        raise
    finally:
        search.executor.close()
        search.store.drivers.stop_heartbeat()
