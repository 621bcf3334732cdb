"""A tuning campaign: profile the baseline, search, and let the guard decide.

    plan()  check everything (space, proposer, folder, resume consistency); writes nothing
    run()   baseline profile -> loop { select, propose, static check, run, screen, backpropagate,
            store } until the budget is spent -> the decision (search/finalize.py: final
            verdict on the best few -> APPROVED or KEEP BASELINE, approved.yaml, launch command)

Every trial lands in the study before its run starts (RUNNING) and is closed when it ends, so a
campaign killed at any moment resumes from the study: finished trials are kept and never run
again, a trial that was running is marked failed ("interrupted") and its recipe may run again.
"""

from __future__ import annotations

import contextlib
import json
import time
import traceback
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from recipetune.config import Campaign, ConfigError
from recipetune.execute.executor import Executor, TrialLost, make_executor
from recipetune.execute.local import kill_orphans as _kill_orphans
from recipetune.measure import RunResult
from recipetune.recipe import INVARIANT, SEMANTIC, KnobError, Recipe, SearchSpace
from recipetune.search import finalize
from recipetune.search.finalize import Outcome
from recipetune.search.proposers import PlaybookError, Proposal, Proposer, SearchContext, make_proposer
from recipetune.search.semantic import BatchRule, batch_rule
from recipetune.search.strategies import OptunaStrategy, make_sampler
from recipetune.search.tree import Node, Tree, reward
from recipetune.store import CampaignStore, TrialRecord, distributions

# -- the control system, as the search sees it ------------------------------------------------


@dataclass
class Guard:
    """The guard's four entry points (recipetune.guard); tests substitute fakes."""

    static_check: Callable[..., list[Any]]
    profile_baseline: Callable[..., Any]
    screen: Callable[..., Any]
    final_verdict: Callable[..., Any]
    load_profile: Callable[[str], Any]


def real_guard() -> Guard:
    from recipetune.guard.baseline import BaselineProfile, profile_baseline
    from recipetune.guard.screen import screen
    from recipetune.guard.static import static_check
    from recipetune.guard.verdict import final_verdict

    return Guard(static_check, profile_baseline, screen, final_verdict, BaselineProfile.model_validate_json)


# -- what the live view is told ----------------------------------------------------------------


@dataclass
class Row:
    """One line of the trial table; ``key`` identifies it across updates."""

    key: str
    number: int | None
    change: str
    status: str
    tokens_per_s: float | None = None
    speedup: float | None = None
    loss: str = ""
    rationale: str = ""
    source: str = ""
    cause: str = ""


class Reporter:
    """Receives the campaign's progress; the CLI draws it, tests may record it."""

    def phase(self, text: str) -> None: ...

    def row(self, row: Row) -> None: ...

    def progress(self, key: str, done: int, total: int) -> None: ...

    def best(self, node: Node | None, baseline: Recipe) -> None: ...


# -- planning: every check before anything is written -----------------------------------------


@dataclass
class Plan:
    campaign: Campaign
    folder: Path
    resume: bool
    space: SearchSpace
    proposer: Proposer | None
    meta: dict[str, Any]
    store: CampaignStore
    batch: BatchRule | None = None  # the global batch may change, up to a measured CBS


def check_space(campaign: Campaign) -> SearchSpace:
    cfg, path = campaign.config.search, campaign.path
    if not cfg.knobs:
        raise ConfigError(path, "search.knobs", "no knobs to search; list knobs with the values to try")
    knobs = campaign.workload.knobs()
    try:
        space = SearchSpace.from_lists(knobs, cfg.knobs)
    except KnobError as e:
        raise ConfigError(path, f"search.knobs.{e.knob}", str(e)) from None
    for name in space.values:
        role = knobs[name].role
        if knobs[name].derive:
            raise ConfigError(path, f"search.knobs.{name}",
                              f"'{name}' is derived from '{knobs[name].derive}' and never searched; "
                              "search the knobs it is derived from")
        if role == INVARIANT:
            raise ConfigError(path, f"search.knobs.{name}",
                              f"'{name}' defines the experiment (an invariant knob) and cannot be searched")
        if role == SEMANTIC and name not in cfg.allow_semantic:
            raise ConfigError(path, f"search.knobs.{name}",
                              f"'{name}' may change what the model learns; list it in search.allow_semantic "
                              "to search it (the guard then judges it on loss)")
    return space


def campaign_meta(campaign: Campaign, space: SearchSpace, batch: BatchRule | None = None) -> dict[str, Any]:
    cfg = campaign.config.search
    return {
        "file": str(campaign.path.resolve()), "workload": campaign.workload.kind,
        "baseline": dict(campaign.baseline), "baseline_id": campaign.baseline.id,
        "space": {n: list(v) for n, v in space.values.items()}, "allow_semantic": sorted(cfg.allow_semantic),
        "strategy": cfg.strategy, "steps_per_trial": cfg.steps_per_trial,
        "global_batch": batch.meta() if batch is not None else None,
    }


def plan(campaign: Campaign, folder: Path, resume: bool = False) -> Plan:
    """Check the campaign and its folder; raise ConfigError (exit 2) before anything is written."""
    cfg, path = campaign.config.search, campaign.path
    space = check_space(campaign)
    batch = batch_rule(campaign)
    proposer = None
    if cfg.strategy == "mcts":
        playbook = cfg.playbook
        if playbook and not Path(playbook).is_absolute():
            playbook = str(campaign.path.resolve().parent / playbook)
        try:
            proposer = make_proposer(cfg.proposer, cfg.seed, playbook, cfg.llm)
        except PlaybookError as e:
            raise ConfigError(e.file, e.field, e.message) from None
        except ValueError as e:
            raise ConfigError(path, f"search.{'llm' if cfg.proposer == 'llm' else 'proposer'}", str(e)) from None
    meta = campaign_meta(campaign, space, batch)
    found = CampaignStore(folder, cfg.storage).exists()
    if resume and not found:
        raise ConfigError(folder, "--resume", "no campaign to resume in this folder")
    if not resume and found:
        raise ConfigError(folder, "--out", "this folder already holds a campaign; add --resume to continue it, "
                                           "or choose another --out")
    n_done = 0
    if resume:
        old_meta, n_done = CampaignStore(folder, cfg.storage).peek()
        for key in ("baseline_id", "space", "strategy", "steps_per_trial", "allow_semantic", "global_batch"):
            if old_meta.get(key) != meta[key]:
                raise ConfigError(path, key.replace("_id", ""),
                                  f"differs from the campaign being resumed in {folder} "
                                  f"(was {json.dumps(old_meta.get(key))}); resume with the same file and overrides")
    # A resumed campaign draws afresh: a sampler re-seeded identically would replay its first picks.
    parallel = campaign.config.execute.parallel
    sampler = make_sampler(cfg.strategy, space, campaign.baseline, cfg.seed + n_done, campaign.workload.relations(),
                           parallel)
    store = CampaignStore(folder, cfg.storage, sampler, campaign.config.execute.heartbeat_s)
    return Plan(campaign, folder, resume, space, proposer, meta, store, batch)


# -- running ------------------------------------------------------------------------------------


def _speedup_text(screening: Any) -> str:
    if screening is None:
        return ""
    if screening.passed:
        if screening.loss_gap is not None and screening.loss_tolerance is not None:
            return f"ok (gap {screening.loss_gap:+.3f} within {screening.loss_tolerance:.3f})"
        return "ok"
    return "; ".join(screening.reasons) or "rejected"


@dataclass
class Pending:
    """A trial whose run was submitted and has not landed yet."""

    number: int
    recipe: Recipe
    parent: Node
    proposal: Proposal
    change: str
    steps: int
    run_dir: Path
    future: Future[RunResult]


class Search:
    """One session of a campaign (a fresh one or a resumed one)."""

    def __init__(self, p: Plan, guard: Guard, executor: Executor, reporter: Reporter):
        self.p, self.guard, self.executor, self.reporter = p, guard, executor, reporter
        self.campaign, self.store, self.cfg = p.campaign, p.store, p.campaign.config.search
        self.workload, self.baseline = p.campaign.workload, p.campaign.baseline
        self.settings = p.campaign.config.guard
        self.execute = p.campaign.config.execute
        self.inflight: dict[Future, Pending] = {}
        self.elsewhere: set[str] = set()  # recipes other drivers on this study are running
        self.last_sync = 0.0
        self.batch = p.batch
        self.dists = distributions(p.space, self.baseline)
        self.profile: Any = None
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
        if self.p.resume:
            for rec in store.fail_interrupted():
                self.reporter.phase(f"trial {rec.number} was interrupted; its recipe may run again")
                _kill_orphans(rec.attrs.get("run_dir"))  # on this machine; a Ray retry cleans its own node
            self.elapsed_before = float(store.study.user_attrs.get("search_elapsed_s", 0.0))
        else:
            store.create(self.p.meta)
            snapshot = self.campaign.config.model_dump(mode="json")
            if snapshot["search"]["llm"].get("api_key"):
                snapshot["search"]["llm"]["api_key"] = "(redacted)"  # the folder is shared; the key is not
            store.write_json("campaign.json", snapshot)
        saved = store.folder / "baseline_profile.json"
        if saved.exists():
            self.profile = self.guard.load_profile(saved.read_text())
            self.reporter.phase("baseline profile loaded from the previous session")
        else:
            # As long as the guard's parity runs, so its final verdicts reuse this profile; a trial's
            # shorter run is screened over the steps both have.
            steps = max(self.cfg.steps_per_trial, self.settings.parity.steps)
            self.reporter.phase(f"profiling the baseline ({steps} steps per run)")
            # On the executor: the baseline is measured on the same kind of placement as the trials.
            self.profile = self.executor.call(
                self.guard.profile_baseline, self.workload, self.baseline, steps, self.settings,
                store.folder / "baseline", progress=self.reporter.phase,
            ).result()
            store.write_json("baseline_profile.json", self.profile)
        root_run = self.profile.runs[0] if getattr(self.profile, "runs", None) else None
        self.tree = Tree(self.baseline, root_run, self.cfg.exploration)
        self.rebuild(store.records())
        self.reporter.phase(f"baseline {self.baseline.id}: {self.profile.tokens_per_s:,.0f} tokens/s per device, "
                            f"noise {100 * self.profile.throughput_noise:.1f}%")
        if self.batch is not None:
            b = self.batch
            self.reporter.phase(f"{b.knob} may change up to {b.bound} ({b.source}); {b.lr_knob} follows it "
                                f"({b.scaling}); loss is judged at equal tokens")
        self.started = time.monotonic()  # the wall-time budget is search time: the baseline profile is apart
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
            result = None
            if a.get("run_dir") and (Path(a["run_dir"]) / "result.json").exists():
                with contextlib.suppress(ValueError, OSError):
                    result = RunResult.load(Path(a["run_dir"]) / "result.json")
            tree.add(rec.recipe, parent, a["status"], a.get("reward"), speedup=a.get("speedup"),
                     cause=a.get("cause", ""), rationale=a.get("rationale", ""), source=a.get("proposer", ""),
                     trial=rec.number, result=result)
            self._report_record(rec)
        if records and not quiet:
            self.reporter.phase(f"resumed: {len(records)} trials in the study, {self.runs} runs of the budget spent")
            self.reporter.best(tree.best(), self.baseline)

    def _report_record(self, rec: TrialRecord) -> None:
        a = rec.attrs
        if "recipe" not in a:
            return
        self.reporter.row(Row(str(rec.number), rec.number, rec.recipe.describe_diff(self.baseline), a.get("status", ""),
                              a.get("tokens_per_s"), a.get("speedup"), a.get("loss", ""), a.get("rationale", ""),
                              a.get("proposer", ""), a.get("cause", "")))

    # one trial -------------------------------------------------------------------------------

    def couple(self, recipe: Recipe) -> tuple[Recipe, str]:
        """The learning rate follows an allowed change of the global batch; the note says what was set."""
        return self.batch.couple(recipe) if self.batch is not None else (recipe, "")

    def allowed(self, recipe: Recipe) -> list[str]:
        """Semantic knobs ``recipe`` may change: the campaign's, plus a learning rate coupled to the batch."""
        return self.batch.allow(recipe, self.cfg.allow_semantic) if self.batch is not None else self.cfg.allow_semantic

    def launch(self, recipe: Recipe, parent: Node, proposal: Proposal, trial: Any = None,
               coupled: str = "") -> Node | Pending | None:
        """Claim, static check, open the trial and submit its run. A rejected proposal is a node at
        once; a submitted run is a ``Pending`` until ``land``; None: another driver has this recipe."""
        tree, store = self.tree, self.store
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
        change = recipe.describe_diff(self.baseline)
        violations = [*(self.batch.violations(recipe) if self.batch is not None else []),
                      *self.guard.static_check(self.workload, self.baseline, recipe,
                                               allow_semantic=self.allowed(recipe))]
        number = store.begin(recipe, self.dists, attrs, trial)
        key = str(number)
        if violations:
            cause = "static check: " + "; ".join(f"{v.knob}: {v.message}" for v in violations)
            store.finish(number, None, {"status": "rejected", "cause": cause, "ran": False,
                                        "violations": [vars(v) if hasattr(v, "__dict__") else str(v)
                                                       for v in violations]})
            self.reporter.row(Row(key, number, change, "rejected", rationale=proposal.rationale,
                                  source=proposal.source, cause=cause))
            return tree.add(recipe, parent, "rejected", None, cause=cause, rationale=proposal.rationale,
                            source=proposal.source, trial=number)

        steps = self.cfg.steps_per_trial
        if self.batch is not None:  # another batch trains the profile's tokens, to be judged at equal tokens
            steps = self.batch.trial_steps(recipe, steps, getattr(self.profile, "steps", steps))
        run_dir = store.run_dir(number, recipe)
        store.set_running(number, {"run_dir": str(run_dir), "ran": True, "steps": steps})
        self.reporter.row(Row(key, number, change, "running", rationale=proposal.rationale, source=proposal.source))
        self.runs += 1
        tree.reserve(parent)  # virtual loss while it runs: parallel selection looks elsewhere
        future = self.executor.submit(
            self.workload, recipe, steps, run_dir, self.campaign.config.run.timeout_s,
            progress=lambda done: self.reporter.progress(key, done, steps),
        )
        return Pending(number, recipe, parent, proposal, change, steps, run_dir, future)

    def land(self, pending: Pending) -> Node:
        """A submitted run has ended: screen it, reward it, store it, and add its node."""
        tree, store = self.tree, self.store
        assert tree is not None
        tree.release(pending.parent)
        recipe, proposal, run_dir, number = pending.recipe, pending.proposal, pending.run_dir, pending.number
        screening, result, lost = None, None, False
        try:
            result = pending.future.result()
            if result.ok:
                screening = self.guard.screen(self.profile, result, self.settings)
                status, cause = ("passed", "") if screening.passed else ("rejected", "; ".join(screening.reasons))
            else:
                status, cause = "failed", f"{result.status}: {result.cause}"
        except TrialLost as e:  # its worker or node died on every attempt: recorded, the campaign goes on
            status, cause, lost = "failed", f"lost: {e}", True
            _kill_orphans(str(run_dir))  # torchrun's children, if the trial ran on this machine
        except Exception as e:  # a broken trial must not end the campaign; the record says what broke
            status = "failed"
            cause = f"error: {type(e).__name__}: {e}"
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "error.txt").write_text("".join(traceback.format_exception(e)))
        speedup = screening.speedup if screening is not None else None
        value = reward(speedup, status == "passed", self.cfg.reward_span, self.cfg.failure_penalty)
        summary = result.summary() if result is not None and result.steps else None
        attempts = run_dir / "attempts.jsonl"
        figures = {
            "status": status, "cause": cause, "reward": value, "speedup": speedup,
            "run_status": result.status if result is not None else ("lost" if lost else "error"),
            "screening": screening, "loss": _speedup_text(screening),
            "tokens_per_s": summary.tokens_per_s_per_device if summary else None,
            "mfu": summary.mfu if summary else None,
            "step_time_s": summary.mean_step_time_s if summary else None,
            "peak_mem_bytes": summary.peak_mem_bytes if summary else None,
            "loss_last": summary.loss_last if summary else None,
            **({"attempts": attempts.read_text().count("\n")} if attempts.exists() else {}),
        }
        store.finish(number, speedup if status == "passed" else None, figures)
        self.reporter.row(Row(str(number), number, pending.change, status, figures["tokens_per_s"], speedup,
                              figures["loss"], proposal.rationale, proposal.source, cause))
        node = tree.add(recipe, parent=pending.parent, status=status, value=value, speedup=speedup, cause=cause,
                        rationale=proposal.rationale, source=proposal.source, trial=number, result=result)
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
        if time.monotonic() - self.last_sync < min(5.0, self.execute.heartbeat_s):
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

    def mcts(self, proposer: Proposer) -> None:
        tree = self.tree
        assert tree is not None
        context = SearchContext(self.workload, self.baseline, self.p.space, tree, self.cfg.seed)
        queue: list[tuple[Node, Proposal]] = []  # the current expansion's proposals not yet started
        while True:
            self.sync()
            waiting = False  # everything new to try is running: wait for a run to land
            while len(self.inflight) < self.executor.parallel and self.budget_left():
                if not queue:
                    node = tree.select()
                    if node is None:
                        break
                    proposals = proposer.propose(node, context, self.cfg.children)
                    self.record_rejections(context)
                    # Proposers skip what was tried; this holds for any proposer, so a node can only
                    # be selected again if it produced something new.
                    fresh = [p for p in proposals if not self.taken(self.couple(node.recipe.with_(**p.edits))[0])]
                    if not fresh:
                        if any(self.couple(node.recipe.with_(**p.edits))[0] not in tree for p in proposals):
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
                recipe, coupled = self.couple(node.recipe.with_(**proposal.edits))
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
                if self.budget_left() and tree.select() is None:
                    failed = f" ({len(context.failed)} of its nodes only because every answer failed)" \
                        if context.failed else ""
                    self.reporter.phase(f"the tree is exhausted: no proposer has anything new to try{failed}")
                return

    def optuna(self) -> None:
        tree = self.tree
        assert tree is not None
        strategy = OptunaStrategy(self.cfg.strategy, self.store, self.p.space, self.baseline,
                                  self.workload.relations())
        repeats = 0
        while True:
            self.sync()
            while len(self.inflight) < self.executor.parallel and self.budget_left():
                if strategy.exhausted() or len(tree) + len(self.inflight) >= strategy.space_size() or repeats > 100:
                    break
                trial, recipe = strategy.ask()
                edits = {n: new for n, (_, new) in recipe.diff(self.baseline).items()}
                proposal = Proposal(edits, f"{self.cfg.strategy} sampler", self.cfg.strategy)
                recipe, coupled = self.couple(recipe)
                if recipe in tree or recipe.id in self.inflight_ids():
                    # The sampler must hear the outcome to move on; the recipe is not run again.
                    repeats += 1
                    prior = tree.nodes.get(recipe.id)
                    number = self.store.begin(recipe, self.dists, {
                        "parent": tree.root.id, "proposer": self.cfg.strategy,
                        "duplicate_of": prior.trial if prior is not None else None}, trial)
                    value = prior.speedup if prior is not None and prior.status in ("passed", "baseline") else None
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

    # the decision ----------------------------------------------------------------------------

    def decide(self) -> Outcome:
        assert self.tree is not None
        return finalize.decide(self.campaign, self.store, self.tree, self.profile, self.runs,
                               final_verdict=self.guard.final_verdict, executor=self.executor,
                               allowed=self.allowed, phase=self.reporter.phase)


def run(p: Plan, guard: Guard | None = None, executor: Executor | None = None,
        reporter: Reporter | None = None) -> Outcome:
    """Run (or resume) a planned campaign to its decision. Ctrl-C leaves it resumable."""
    search = Search(p, guard or real_guard(), executor or make_executor(p.campaign), reporter or Reporter())
    try:
        search.start()
        if p.campaign.config.search.strategy == "mcts":
            assert p.proposer is not None
            search.mcts(p.proposer)
        else:
            search.optuna()
        search.last_sync = 0.0
        search.sync()  # other drivers' finished trials join the decision; a dead one's leave RUNNING
        search.store.set_meta("search_elapsed_s", search.elapsed())
        return search.decide()
    except KeyboardInterrupt:
        search.executor.close()  # remote runs are cancelled; their trainers are killed where they run
        if search.store.opened:
            search.store.fail_interrupted(gone=False)
            search.store.set_meta("search_elapsed_s", search.elapsed())
        raise
    finally:
        search.executor.close()
        search.store.stop_heartbeat()


def default_folder(campaign_file: Path) -> Path:
    return Path("campaigns") / campaign_file.stem

