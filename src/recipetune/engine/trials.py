"""One trial's life in the study, from a strategy's candidate to its node in the tree.

    claiming and launching   launch: the job's check (once per recipe: ``check``), store.open_trial
                             (claim, trial, run slot, running: one trip), job.submit -> ``Pending``
    landing                  land: job.land -> store.finish (the study first: what a resume reads)
                             -> tree.add (backpropagate); ``prune`` answers a running trial's reports
    reading back             rebuild: the study's finished trials as nodes (a resume, other drivers)

The loop (engine/loop.py) decides when: it owns the tree, the trials in flight and the budget
(engine/stopping.py); ``Trials`` does each step the same way for every job and strategy.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from recipetune.core.process import kill_orphans
from recipetune.core.recipe import Recipe
from recipetune.engine.config import TreeSearchConfig
from recipetune.engine.database import NO_SPACE, DiskFull
from recipetune.engine.job import Checked, Job, Landing, Progress, Services
from recipetune.engine.record import Trial, TrialRecord
from recipetune.engine.samplers import distributions, pruning_bar
from recipetune.engine.status import Refusal, Status
from recipetune.engine.stopping import Stopping
from recipetune.engine.store import Refused
from recipetune.engine.strategy import Candidate
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


class Trials:
    """Each step of a trial, for one session of a campaign: what the job, its study and the live view
    are told, in the order a resume can trust."""

    def __init__(self, job: Job, cfg: TreeSearchConfig, services: Services, stopping: Stopping):
        self.job, self.cfg, self.stopping = job, cfg, stopping
        self.store, self.reporter = services.store, services.reporter
        self.dists = distributions(job.space, job.baseline)
        self.checked: dict[str, Checked] = {}  # the job's check, by recipe id (``check``)
        # why a running trial's own speed report shows it far slower than the incumbent ("": it may go
        # on); set by the loop where the job's reports are speed ratios (``prune``)
        self.stop_slower: Callable[[float], str] | None = None

    def check(self, recipe: Recipe) -> Checked:
        """The job's check of ``recipe``, once per recipe in a session: a strategy couples every
        proposal to filter what is taken, and the launch checks it again (a static check each time)."""
        if recipe.id not in self.checked:
            self.checked[recipe.id] = self.job.check(recipe)
        return self.checked[recipe.id]

    def trial(self, attrs: dict[str, Any]) -> Trial[Any]:
        """A trial's stored attributes as the job's typed record."""
        return Trial[self.job.figures].model_validate(attrs)  # type: ignore[name-defined]

    def report_record(self, rec: TrialRecord) -> None:
        if "recipe" in rec.attrs:
            self.reporter.row(self.job.row(str(rec.number), rec.number, rec.recipe, self.trial(rec.attrs)))

    # claiming and launching --------------------------------------------------------------------

    def launch(self, tree: Tree, c: Candidate) -> Node | Pending | Refused:
        """Check, open the trial and submit its run. A refused candidate is a node at once; a
        submitted run is a ``Pending`` until ``land``; ``Refused``: another driver has this recipe
        (``claimed``), or other drivers' runs took the shared budget (``budget``)."""
        store, job = self.store, self.job
        proposal = replace(c.proposal, rationale=f"{c.proposal.rationale} [{c.note}]") if c.note else c.proposal
        attrs = {"parent": c.parent.id, "proposer": proposal.source, "rationale": proposal.rationale,
                 "edits": proposal.edits, **({"coupled": c.note} if c.note else {})}
        checked = self.check(c.recipe)
        refusal = ({"status": Status.REJECTED, "cause": checked.refusal, "ran": False, "violations": checked.details}
                   if checked.refusal else None)
        opened = store.open_trial(c.recipe, self.dists, attrs, c.trial, budget=self.cfg.budget.trials,
                                  plan=checked.plan, refusal=refusal)
        if isinstance(opened, Refused) and opened.reason == Refusal.CLAIMED:
            return opened
        c.proposal = proposal
        if isinstance(opened, Refused) and opened.reason == Refusal.BUDGET:
            return opened
        if isinstance(opened, Refused):  # the job's check refused it: a node at once, nothing ran
            assert opened.number is not None and refusal is not None
            self.reporter.row(job.row(str(opened.number), opened.number, c.recipe, self.trial({**attrs, **refusal})))
            return tree.add(c.recipe, c.parent, Status.REJECTED, None, cause=opened.cause,
                            rationale=proposal.rationale, source=proposal.source, trial=opened.number)
        number, key = opened.number, str(opened.number)
        self.reporter.row(job.row(key, number, c.recipe, self.trial({**attrs, "status": Status.RUNNING})))
        self.stopping.runs += 1
        tree.reserve(c.parent)  # virtual loss while it runs: parallel selection looks elsewhere
        progress = Progress(lambda done, total: self.reporter.progress(key, done, total),
                            lambda step, value, upper: self.prune(number, step, value, upper))
        # the clock starts before submit: the local executor runs the trial right here, before it returns
        started = time.monotonic()
        future = job.submit(c.recipe, opened.run_dir, checked.plan, progress)
        return Pending(number, c, opened.run_dir, future, started)

    def record_repeat(self, tree: Tree, c: Candidate, prior: Node | None) -> None:
        """A sampler asked for a recipe already tried: its trial is told that result, nothing runs."""
        number = self.store.begin(c.recipe, self.dists, {
            "parent": tree.root.id, "proposer": self.cfg.strategy,
            "duplicate_of": prior.trial if prior is not None else None}, c.trial)
        value = prior.score if prior is not None and prior.status in (Status.PASSED, Status.BASELINE) else None
        same = "the baseline" if prior is tree.root else \
            f"trial {prior.trial}" if prior is not None else "a running trial"
        self.store.finish(number, value, {"status": Status.DUPLICATE, "ran": False, "cause": f"same recipe as {same}"})

    def record_set_aside(self, tree: Tree, c: Candidate, value: float, cause: str) -> None:
        """A sampler asked for a recipe set aside (engine/effects.py): its trial is told the predicted
        speed-up, nothing runs."""
        number = self.store.begin(c.recipe, self.dists, {"parent": tree.root.id, "proposer": self.cfg.strategy},
                                  c.trial)
        self.store.finish(number, value, {"status": Status.SET_ASIDE, "ran": False, "cause": cause})

    # landing -----------------------------------------------------------------------------------

    def judge(self, pending: Pending) -> Landing:
        """The job's judgement of a run that ended; a run that broke is a failed trial, not the campaign's end."""
        run_dir, penalty = pending.run_dir, self.cfg.failure_penalty
        try:
            return self.job.land(pending.future.result(), pending.recipe, run_dir)
        except TrialLost as e:  # its worker or node died on every attempt: recorded, the campaign goes on
            kill_orphans(str(run_dir))  # its trainer's children, if the trial ran on this machine
            return Landing(Status.FAILED, None, penalty, f"lost: {e}", self.job.figures(run_status="lost"))
        except Exception as e:  # a broken trial must not end the campaign; the record says what broke
            if isinstance(e, OSError) and e.errno in NO_SPACE:  # but a full disk is the campaign's, not the
                raise DiskFull(self.store.folder, e) from e  # recipe's: stop, the trial stays open for --resume
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "error.txt").write_text("".join(traceback.format_exception(e)))
            return Landing(Status.FAILED, None, penalty, f"error: {type(e).__name__}: {e}",
                           self.job.figures(run_status="error"))

    def land(self, tree: Tree, pending: Pending, in_flight: int) -> Node:
        """A submitted run has ended: the job judges it; the study closes its trial, then its node joins
        the tree. ``in_flight``: the runs still going (the live view's count)."""
        store, c = self.store, pending.candidate
        tree.release(c.parent)
        recipe, proposal, run_dir, number = c.recipe, c.proposal, pending.run_dir, pending.number
        landing = self.judge(pending)
        passed = landing.status == Status.PASSED
        attempts = run_dir / "attempts.jsonl"
        stored = landing.figures.stored() if landing.figures is not None else {}
        figures = {**stored, "status": landing.status, "cause": landing.cause, "reward": landing.reward,
                   "score": landing.score if passed else None,
                   **(landing.evidence.stored() if landing.evidence is not None else {}),
                   **({"attempts": attempts.read_text().count("\n")} if attempts.exists() else {})}
        store.finish(number, landing.score if passed else None, figures, pruned=landing.status == Status.PRUNED)
        stopping = self.stopping
        stopping.trial_s += time.monotonic() - pending.started
        store.set_meta("search_trial_s", stopping.trial_s)
        self.reporter.row(self.job.row(str(number), number, recipe, self.trial(
            {"rationale": proposal.rationale, "proposer": proposal.source, **figures})))
        node = tree.add(recipe, parent=c.parent, status=landing.status, value=landing.reward,
                        score=landing.score if passed else None, cause=landing.cause, rationale=proposal.rationale,
                        source=proposal.source, trial=number, result=landing.result, evidence=landing.evidence)
        store.set_meta("search_elapsed_s", stopping.elapsed())
        self.reporter.best(tree.best(), self.job.baseline)
        self.reporter.campaign(stopping.runs - in_flight, self.cfg.budget.trials, stopping.elapsed())
        return node

    def prune(self, number: int, step: int, value: float, upper: float | None) -> str:
        """Why a running trial stops at this report ("" to go on). Either its own measurement shows it
        far slower than the incumbent (``stop_slower``: the set-aside rule, engine/effects.py: Effects.stop,
        on jobs whose reports are speed ratios), or the study's pruner says so (Optuna's, over the
        finished trials and the baseline's curve at ``step``) and the trial cannot plausibly reach what
        it is compared with: ``upper``, the most its value could be given its noise, is below the bar
        that pruner keeps trials above there (the median, a percentile, a rung's top share:
        ``pruning_bar``). Noise alone never stops a trial."""
        # every report is kept, with a pruner or without (a store given none prunes nothing: engine/store.py)
        pruner_says = self.store.report(number, step, value)
        if upper is not None and self.stop_slower is not None and (why := self.stop_slower(upper)):
            return why
        if not pruner_says:
            return ""
        bar = pruning_bar(self.cfg.pruning, self.store.values_at(step)) if upper is not None else None
        return f"{self.cfg.pruning.pruner} pruner" if upper is None or bar is None or upper < bar else ""

    # reading back ------------------------------------------------------------------------------

    def rebuild(self, tree: Tree, records: list[TrialRecord], quiet: bool = False) -> None:
        """The tree and the measured set from the study's finished trials, in trial order."""
        for rec in sorted(records, key=lambda r: r.number):
            if not rec.finished:
                self.report_record(rec)
                continue
            if rec.recipe in tree:
                continue
            t = self.trial(rec.attrs)
            self.stopping.runs += t.ran
            parent = tree.nodes.get(t.parent, tree.root)
            result = self.job.load(Path(t.run_dir)) if t.run_dir else None
            tree.add(rec.recipe, parent, t.status, t.reward, score=t.score, cause=t.cause, rationale=t.rationale,
                     source=t.proposer, trial=rec.number, result=result, evidence=t.evidence())
            self.report_record(rec)
        if records and not quiet:
            self.reporter.phase(f"resumed: {len(records)} trials in the study, {self.stopping.runs} runs of the "
                                "budget spent")
            self.reporter.best(tree.best(), self.job.baseline)
