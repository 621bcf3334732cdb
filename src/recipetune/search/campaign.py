"""A tuning campaign: profile the baseline, search, and let the guard decide.

    plan()  check everything (space, proposer, folder, resume consistency); writes nothing
    run()   baseline profile -> loop { select, propose, static check, run, screen, backpropagate,
            store } until the budget is spent -> final verdict on the best few -> APPROVED or
            KEEP BASELINE, approved.yaml and the launch command

Every trial lands in the study before its run starts (RUNNING) and is closed when it ends, so a
campaign killed at any moment resumes from the study: finished trials are kept and never run
again, a trial that was running is marked failed ("interrupted") and its recipe may run again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from recipetune.config import Campaign, ConfigError
from recipetune.execute.executor import Executor, LocalExecutor
from recipetune.measure import RunResult
from recipetune.recipe import INVARIANT, SEMANTIC, KnobError, Recipe, SearchSpace
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
    sampler = make_sampler(cfg.strategy, space, campaign.baseline, cfg.seed + n_done, campaign.workload.relations())
    return Plan(campaign, folder, resume, space, proposer, meta, CampaignStore(folder, cfg.storage, sampler), batch)


# -- running ------------------------------------------------------------------------------------


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


def _speedup_text(screening: Any) -> str:
    if screening is None:
        return ""
    if screening.passed:
        if screening.loss_gap is not None and screening.loss_tolerance is not None:
            return f"ok (gap {screening.loss_gap:+.3f} within {screening.loss_tolerance:.3f})"
        return "ok"
    return "; ".join(screening.reasons) or "rejected"


class Search:
    """One session of a campaign (a fresh one or a resumed one)."""

    def __init__(self, p: Plan, guard: Guard, executor: Executor, reporter: Reporter):
        self.p, self.guard, self.executor, self.reporter = p, guard, executor, reporter
        self.campaign, self.store, self.cfg = p.campaign, p.store, p.campaign.config.search
        self.workload, self.baseline = p.campaign.workload, p.campaign.baseline
        self.settings = p.campaign.config.guard
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
                _kill_orphans(rec.attrs.get("run_dir"))
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
            self.profile = self.guard.profile_baseline(
                self.workload, self.baseline, steps, self.settings, store.folder / "baseline",
                progress=self.reporter.phase,
            )
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
        return self.tree

    def rebuild(self, records: list[TrialRecord]) -> None:
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
        if records:
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

    def evaluate(self, recipe: Recipe, parent: Node, proposal: Proposal, trial: Any = None, coupled: str = "") -> Node:
        """Static check, run, screen, reward, store: one proposal becomes one node."""
        tree, store = self.tree, self.store
        assert tree is not None
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
        screening, result = None, None
        try:
            result = self.executor.submit(
                self.workload, recipe, steps, run_dir, self.campaign.config.run.timeout_s,
                progress=lambda done: self.reporter.progress(key, done, steps),
            ).result()
            if result.ok:
                screening = self.guard.screen(self.profile, result, self.settings)
                status, cause = ("passed", "") if screening.passed else ("rejected", "; ".join(screening.reasons))
            else:
                status, cause = "failed", f"{result.status}: {result.cause}"
        except Exception as e:  # a broken trial must not end the campaign; the record says what broke
            status = "failed"
            cause = f"error: {type(e).__name__}: {e}"
            (run_dir / "error.txt").parent.mkdir(parents=True, exist_ok=True)
            (run_dir / "error.txt").write_text(traceback.format_exc())
        speedup = screening.speedup if screening is not None else None
        value = reward(speedup, status == "passed", self.cfg.reward_span, self.cfg.failure_penalty)
        summary = result.summary() if result is not None and result.steps else None
        figures = {
            "status": status, "cause": cause, "reward": value, "speedup": speedup,
            "run_status": result.status if result is not None else "error",
            "screening": screening, "loss": _speedup_text(screening),
            "tokens_per_s": summary.tokens_per_s_per_device if summary else None,
            "mfu": summary.mfu if summary else None,
            "step_time_s": summary.mean_step_time_s if summary else None,
            "peak_mem_bytes": summary.peak_mem_bytes if summary else None,
            "loss_last": summary.loss_last if summary else None,
        }
        store.finish(number, speedup if status == "passed" else None, figures)
        self.reporter.row(Row(key, number, change, status, figures["tokens_per_s"], speedup, figures["loss"],
                              proposal.rationale, proposal.source, cause))
        node = tree.add(recipe, parent, status, value, speedup=speedup, cause=cause, rationale=proposal.rationale,
                        source=proposal.source, trial=number, result=result)
        store.set_meta("search_elapsed_s", self.elapsed())
        self.reporter.best(tree.best(), self.baseline)
        return node

    # loops -----------------------------------------------------------------------------------

    def mcts(self, proposer: Proposer) -> None:
        tree = self.tree
        assert tree is not None
        context = SearchContext(self.workload, self.baseline, self.p.space, tree, self.cfg.seed)
        while self.budget_left():
            node = tree.select()
            if node is None:
                failed = f" ({len(context.failed)} of its nodes only because every answer failed)" \
                    if context.failed else ""
                self.reporter.phase(f"the tree is exhausted: no proposer has anything new to try{failed}")
                return
            proposals = proposer.propose(node, context, self.cfg.children)
            self.record_rejections(context)
            # Proposers skip what was tried; this holds for any proposer, so a node can only be
            # selected again if it produced something new.
            proposals = [p for p in proposals if self.couple(node.recipe.with_(**p.edits))[0] not in tree]
            if not proposals:
                node.exhausted = True
                if node.id in context.failed:  # a failed Researcher, not one with nothing new: say so
                    self.reporter.phase(f"{proposer.name} proposer failed at "
                                        f"{node.recipe.describe_diff(self.baseline)}: {context.failed[node.id]}")
                continue
            for proposal in proposals:
                if not self.budget_left():
                    return
                recipe, coupled = self.couple(node.recipe.with_(**proposal.edits))
                if recipe not in tree:  # two proposals of one round may coincide
                    self.evaluate(recipe, node, proposal, coupled=coupled)

    def optuna(self) -> None:
        tree = self.tree
        assert tree is not None
        strategy = OptunaStrategy(self.cfg.strategy, self.store, self.p.space, self.baseline,
                                  self.workload.relations())
        repeats = 0
        while self.budget_left():
            if strategy.exhausted() or len(tree) >= strategy.space_size() or repeats > 100:
                self.reporter.phase("the search space is exhausted")
                return
            trial, recipe = strategy.ask()
            edits = {n: new for n, (_, new) in recipe.diff(self.baseline).items()}
            proposal = Proposal(edits, f"{self.cfg.strategy} sampler", self.cfg.strategy)
            recipe, coupled = self.couple(recipe)
            if recipe in tree:
                # The sampler must hear the outcome to move on; the recipe is not run again.
                repeats += 1
                prior = tree.nodes[recipe.id]
                number = self.store.begin(recipe, self.dists, {"parent": tree.root.id, "proposer": self.cfg.strategy,
                                                               "duplicate_of": prior.trial}, trial)
                value = prior.speedup if prior.status in ("passed", "baseline") else None
                same = "the baseline" if prior is tree.root else f"trial {prior.trial}"
                self.store.finish(number, value,
                                  {"status": "duplicate", "ran": False, "cause": f"same recipe as {same}"})
                continue
            repeats = 0
            self.evaluate(recipe, tree.root, proposal, trial, coupled)

    def record_rejections(self, context: SearchContext) -> None:
        for i, rej in enumerate(context.drain()):
            self.store.append_jsonl("rejected_proposals.jsonl", {"time": time.time(), **vars(rej)})
            self.reporter.row(Row(f"x{time.monotonic_ns()}-{i}", None, "(not a recipe)", "invalid",
                                  rationale=rej.raw[:200], source=rej.source, cause=rej.reason))

    # the decision ----------------------------------------------------------------------------

    def decide(self) -> Outcome:
        tree, store = self.tree, self.store
        assert tree is not None
        finalists = [n for n in tree.ranked() if (n.speedup or 0) > 1.0][: self.cfg.finalists]
        if not finalists:
            reasons = ["no candidate passed screening with a speed-up above 1.0x"]
            return self.conclude(Outcome("KEEP BASELINE", reasons, tree, runs=self.runs))
        previous = {v["candidate_id"]: v for v in store.read_json("verdicts.json") or []}
        verdicts: list[tuple[Node, Any]] = []
        saved: list[dict[str, Any]] = []
        for n in finalists:
            if n.id in previous:
                verdict = SimpleVerdict(previous[n.id]["verdict"])
            else:
                self.reporter.phase(f"final verdict for {n.recipe.describe_diff(self.baseline)} "
                                    f"(screened {n.speedup:.2f}x)")
                verdict = self.guard.final_verdict(
                    self.workload, self.baseline, n.recipe, self.settings, store.folder / "final" / n.id,
                    allow_semantic=self.allowed(n.recipe), profile=self.profile, progress=self.reporter.phase,
                )
            verdicts.append((n, verdict))
            saved.append({"candidate_id": n.id, "trial": n.trial, "screened_speedup": n.speedup,
                          "verdict": _dump(verdict)})
            store.write_json("verdicts.json", saved)  # after each: a resume does not redo a finished verdict
        approved = [(n, v) for n, v in verdicts if v.decision == "APPROVED"]
        if not approved:
            reasons = [f"{n.recipe.describe_diff(self.baseline)}: {v.decision}: {'; '.join(v.reasons)}"
                       for n, v in verdicts]
            return self.conclude(Outcome("KEEP BASELINE", reasons, tree, verdicts=verdicts, runs=self.runs))
        winner, verdict = max(approved, key=lambda nv: nv[1].speedup or 0.0)
        outcome = Outcome("APPROVED", list(verdict.reasons), tree, winner, verdict, verdicts, runs=self.runs)
        return self.conclude(outcome)

    def conclude(self, outcome: Outcome) -> Outcome:
        store = self.store
        winner = outcome.winner
        if winner is not None:
            outcome.approved_file = self.write_approved(winner.recipe, outcome.verdict)
            outcome.launch = launch_commands(self.campaign, winner.recipe, outcome.approved_file)
        store.write_json("verdict.json", {
            "decision": outcome.decision, "reasons": outcome.reasons,
            "baseline": dict(self.baseline), "baseline_id": self.baseline.id,
            "recipe": dict(winner.recipe) if winner else dict(self.baseline),
            "recipe_id": winner.id if winner else self.baseline.id,
            "change": winner.recipe.describe_diff(self.baseline) if winner else "(baseline)",
            "trial": winner.trial if winner else None,
            "verdict": _dump(outcome.verdict) if outcome.verdict is not None else None,
            "runs": outcome.runs, "trials": len(store.records()),
            "approved_file": str(outcome.approved_file) if outcome.approved_file else None,
            "launch": outcome.launch,
        })
        store.set_meta("decision", outcome.decision)
        return outcome

    def write_approved(self, recipe: Recipe, verdict: Any) -> Path:
        """A campaign file whose baseline is the approved recipe: ``recipetune run approved.yaml``."""
        cfg = self.campaign.config
        workload = cfg.workload.model_dump(mode="json", exclude_none=True)
        if workload.get("kind") == "command":
            # The file lives in the campaign folder: anchor a relative working directory to the original.
            cwd = Path(workload.get("cwd") or ".")
            workload["cwd"] = str(cwd if cwd.is_absolute() else (self.campaign.path.resolve().parent / cwd).resolve())
        doc = {"workload": workload, "baseline": dict(recipe), "run": cfg.run.model_dump(mode="json")}
        ci = ""
        if getattr(verdict, "ci_low", None) is not None and getattr(verdict, "ci_high", None) is not None:
            ci = f" (95% CI {verdict.ci_low:.3f}-{verdict.ci_high:.3f})"
        header = (f"# Approved by `recipetune tune {self.campaign.path}` on {time.strftime('%Y-%m-%d %H:%M')}.\n"
                  f"# Change from baseline {self.baseline.id}: {recipe.describe_diff(self.baseline)}\n"
                  f"# Speed-up {getattr(verdict, 'speedup', 0) or 0:.3f}x{ci}; evidence in verdict.json.\n")
        path = self.store.folder / "approved.yaml"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(header + yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(path)
        return path


class SimpleVerdict:
    """A verdict read back from verdicts.json (attribute access like the guard's model)."""

    def __init__(self, data: dict[str, Any]):
        self._data = data
        self.__dict__.update(data)

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return self._data


def _dump(obj: Any) -> Any:
    return obj.model_dump(mode="json") if hasattr(obj, "model_dump") else obj


def launch_commands(campaign: Campaign, recipe: Recipe, approved_file: Path) -> list[str]:
    """How to launch the approved recipe: through recipetune, and the trainer's own command line."""
    out = [f"recipetune run {shlex.quote(str(approved_file))}"]
    run_dir = approved_file.parent / "approved-run"
    with contextlib.suppress(Exception):  # a workload that cannot render its argv still has the first line
        argv = campaign.workload.command(recipe, campaign.config.run.steps, run_dir)
        if campaign.workload.kind != "reference":  # the reference trainer's argv needs recipe.json: use the line above
            out.append(shlex.join(argv))
    return out


def _kill_orphans(run_dir: str | None) -> None:
    """A campaign killed with SIGKILL leaves its running trainer behind: it would steal the hardware
    from every later measurement. Find processes whose command line names that trial's folder."""
    if not run_dir or not Path("/proc").is_dir():
        return
    needle = run_dir.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def run(p: Plan, guard: Guard | None = None, executor: Executor | None = None,
        reporter: Reporter | None = None) -> Outcome:
    """Run (or resume) a planned campaign to its decision. Ctrl-C leaves it resumable."""
    search = Search(p, guard or real_guard(), executor or LocalExecutor(), reporter or Reporter())
    try:
        search.start()
        if p.campaign.config.search.strategy == "mcts":
            assert p.proposer is not None
            search.mcts(p.proposer)
        else:
            search.optuna()
        search.store.set_meta("search_elapsed_s", search.elapsed())
        return search.decide()
    except KeyboardInterrupt:
        if search.store.opened:
            search.store.fail_interrupted()
            search.store.set_meta("search_elapsed_s", search.elapsed())
        raise


def default_folder(campaign_file: Path) -> Path:
    return Path("campaigns") / campaign_file.stem

