"""Search strategies replayed against a measured table, through the engine's own loop.

A replay is a campaign (engine/loop.py: ``run_search``) whose job is the table: ``TableJob`` answers
like the speed job, but instead of running a recipe a trial draws one of that recipe's measured
repeats, on the local executor (instant: the draw is the run). Its status, throughput and profile
are what the Researcher reads, its wall time is what the trial costs (a slow or failing recipe costs
time too). A recipe the table lists as infeasible is refused as the guard's static check would: no
run, no cost. The strategies are the campaign's (the tree with the analyst or random Researcher,
Optuna's samplers) and two plain baselines, greedy best-first and one knob at a time, which run
through the same loop behind the same strategy interface (engine/strategy.py).

Speed-ups are relative to the median of the baseline's repeats (the campaign's baseline profile).
The *true* speed of a recipe is the median of its repeats; a strategy's incumbent is the recipe it
*observed* fastest, so noise can mislead it, as in a real campaign.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from recipetune.bench.table import Entry, Measurement, Table
from recipetune.core import stats
from recipetune.core.measure import RunResult, StepRecord
from recipetune.core.recipe import Recipe, SearchSpace
from recipetune.core.words import Decision
from recipetune.engine import record
from recipetune.engine.config import TreeSearchConfig
from recipetune.engine.job import Checked, Finished, Landing, Outcome, Progress, Reporter, Root, Row, Services
from recipetune.engine.loop import Search, run_search
from recipetune.engine.plan import make_proposer
from recipetune.engine.record import Evidence, Figures, failure_evidence
from recipetune.engine.researcher import Explore, Proposal
from recipetune.engine.samplers import FeasibleSampler, distributions, make_pruner, make_sampler
from recipetune.engine.status import Status
from recipetune.engine.store import CampaignStore
from recipetune.engine.strategy import Candidate, Strategy, Wait
from recipetune.engine.tree import Node
from recipetune.execute.executor import LocalExecutor
from recipetune.speed.facts import BRIEFING, PLAYBOOK
from recipetune.speed.job import reward

STRATEGIES = ("mcts-analyst", "mcts-analyst-model", "mcts-analyst-max", "mcts-random", "greedy", "sequential",
              "tpe", "gp", "optuna-random", "grid")
SAMPLERS = {"tpe": "tpe", "gp": "gp", "optuna-random": "random", "grid": "grid"}


@dataclass
class Trial:
    recipe_id: str
    status: str  # passed | failed | pruned
    observed: float | None  # the speed-up this trial measured (None when it failed)
    true: float  # the recipe's median speed-up over the table's repeats (0 when it never ran ok)
    cost_s: float  # the drawn run's wall time


@dataclass
class Trajectory:
    strategy: str
    seed: int
    trials: list[Trial] = field(default_factory=list)

    def incumbent(self, n: int) -> float:
        """True speed-up of the recipe observed fastest within the first ``n`` trials (1.0: the baseline)."""
        best_obs, best_true = 1.0, 1.0
        for t in self.trials[:n]:
            if t.observed is not None and t.observed > best_obs:
                best_obs, best_true = t.observed, t.true
        return best_true

    def found(self, n: int) -> float:
        """Best true speed-up among the recipes run within the first ``n`` trials."""
        return max([1.0, *(t.true for t in self.trials[:n])])

    def to_reach(self, target: float) -> tuple[int | None, float | None]:
        """Trials and wall seconds until a recipe with true speed-up >= ``target`` had run (None: never)."""
        if target <= 1.0:
            return 0, 0.0
        wall = 0.0
        for i, t in enumerate(self.trials, 1):
            wall += t.cost_s
            if t.true >= target and t.status != "pruned":  # a pruned recipe is not one the search has
                return i, wall
        return None, None


class Oracle:
    """The table as a stand-in for running recipes: a trial draws one measured repeat. A table from an
    older knob set is brought up to date first (``Table.up_to_date``: ``notes`` says how)."""

    def __init__(self, table: Table, rng: random.Random, scratch: Path):
        self.workload = table.make_workload()
        self.table, self.notes = table.up_to_date(self.workload, table.name)
        self.rng, self.scratch = rng, scratch
        self.entries = self.table.by_id()
        base = self.table.baseline_entry().tokens_per_s()
        if not base:
            raise ValueError(f"table {table.name}: the baseline has no successful run")
        self.base_tps = base
        self.baseline = Recipe(self.table.baseline)
        self.space = SearchSpace({n: tuple(v) for n, v in self.table.space.items()})
        self.relations = self.workload.relations()
        # the baseline's A/A noise, as its profile measures it: the spread of consecutive repeats
        tps = [m.tokens_per_s for m in self.table.baseline_entry().ok_runs() if m.tokens_per_s]
        self.noise = stats.noise_margin(stats.aa_log_ratios(tps), 0.0)

    def entry(self, recipe: Recipe) -> Entry | None:
        e = self.entries.get(recipe.id)
        return e if e is not None and e.feasible and e.runs else None

    def true_speedup(self, entry: Entry) -> float:
        tps = entry.tokens_per_s()
        return tps / self.base_tps if tps else 0.0

    def best_speedup(self) -> float:
        return self.true_speedup(self.table.best())

    def draw(self, entry: Entry) -> Measurement:
        return self.rng.choice(entry.runs)

    def result(self, entry: Entry, m: Measurement) -> RunResult:
        """A RunResult with the drawn run's profile, as a proposer reads it (``profile_facts``)."""
        out_dir = self.scratch / f"{entry.id}-{m.repeat}"
        if not out_dir.exists():
            out_dir.mkdir(parents=True)
            info = {k: v for k, v in (("device", m.device), ("accumulation_steps", m.accumulation_steps)) if v}
            (out_dir / "run.json").write_text(json.dumps(info))
        steps = []
        if m.step_s and m.tokens_per_step:
            steps = [StepRecord(step=1, loss=m.loss_last if m.loss_last is not None else 0.0,
                                tokens=m.tokens_per_step, step_time_s=m.step_s, peak_mem_bytes=m.peak_mem_bytes,
                                data_s=m.data_s, compute_s=m.compute_s, optim_s=m.optim_s)]
        recipe = self.table.recipe(entry)
        return RunResult(recipe=dict(recipe), recipe_id=entry.id, status=m.status, cause=m.cause,  # type: ignore[arg-type]
                         steps=steps, warmup_steps=0, n_devices=m.n_devices, flops_per_token=m.flops_per_token,
                         peak_flops_per_device=m.peak_flops, wall_s=m.wall_s, out_dir=str(out_dir),
                         environment=self.table.environment)


# -- the table as a job -----------------------------------------------------------------------------


class TableFigures(Figures):
    """What a replayed trial stores: the recipe's true speed-up in the table, what its run cost."""

    true: float | None = None
    cost_s: float | None = None


class TableJob:
    """The speed job against a table: the baseline's first good repeat is the root, an infeasible
    recipe is refused, a run is a drawn repeat, judged as screening would (ok and measured: passed,
    the observed speed-up its score and the log speed-up its reward)."""

    name = "table"
    figures = TableFigures

    def __init__(self, oracle: Oracle, cfg: TreeSearchConfig, reward_span: float = 4.0):
        self.oracle, self.cfg, self.reward_span = oracle, cfg, reward_span
        self.baseline, self.space, self.subject = oracle.baseline, oracle.space, oracle.workload
        self.briefing = BRIEFING  # the speed job's Researcher
        self.trajectory = Trajectory("", 0)
        self.services: Services | None = None

    def start(self, services: Services) -> Root:
        self.services = services
        e = self.oracle.table.baseline_entry()
        n = self.cfg.pruning.reports
        return Root(self.oracle.result(e, e.ok_runs()[0]), 1.0, noise=self.oracle.noise,
                    curve={k: 1.0 for k in range(1, n + 1)}, speed_reports=True)

    def check(self, recipe: Recipe) -> Checked:
        if self.oracle.entry(recipe) is None:
            return Checked(recipe, refusal="static check: infeasible in the table")
        return Checked(recipe)

    def submit(self, recipe: Recipe, run_dir: Path, plan: dict[str, Any], progress: Progress) -> Future:
        assert self.services is not None
        entry = self.oracle.entry(recipe)
        assert entry is not None
        return self.services.executor.call(lambda: self.run(entry, progress), None)  # type: ignore[arg-type]

    def run(self, entry: Entry, progress: Progress) -> tuple[Entry, Measurement, int | None]:
        """A drawn repeat; with pruning or the set-aside rule, its throughput windows go to them as the
        speed job's do (speed/job.py: windows), each the run's own rate (a table holds whole-run figures, so
        no report has a spread of its own), its upper bound two A/A spreads above. A run stopped
        at window k of N cost its start and k/(N+1) of its measured steps."""
        m = self.oracle.draw(entry)
        n = self.cfg.speed_reports
        if not n or m.status != "ok" or not m.tokens_per_s:
            return entry, m, None
        value = m.tokens_per_s / self.oracle.base_tps
        for k in range(1, n + 1):
            if progress.report(k, value, value * (1 + 2 * self.oracle.noise)):
                left = m.measured_steps - round(k * m.measured_steps / (n + 1)) if m.measured_steps else 0
                cost = max(0.0, m.wall_s - left * (m.step_s or 0.0))
                return entry, m.model_copy(update={"wall_s": cost}), k
        return entry, m, None

    def land(self, result: tuple[Entry, Measurement, int | None], recipe: Recipe, run_dir: Path) -> Landing:
        entry, m, stopped_at = result
        true = self.oracle.true_speedup(entry)
        if stopped_at is not None:  # what it showed is its reward; it is no incumbent
            shown = m.tokens_per_s / self.oracle.base_tps  # type: ignore[operator]
            self.trajectory.trials.append(Trial(entry.id, Status.PRUNED, None, true, m.wall_s))
            return Landing(Status.PRUNED, None, reward(shown, True, self.reward_span, self.cfg.failure_penalty),
                           f"pruned at window {stopped_at}: {shown:.2f}x", TableFigures(true=true, cost_s=m.wall_s),
                           self.oracle.result(entry, m), Evidence(shown))
        ok = m.status == "ok" and bool(m.tokens_per_s)
        observed = m.tokens_per_s / self.oracle.base_tps if ok else None  # type: ignore[operator]
        self.trajectory.trials.append(Trial(entry.id, Status.PASSED if ok else Status.FAILED, observed, true, m.wall_s))
        return Landing(Status.PASSED if ok else Status.FAILED, observed,
                       reward(observed, ok, self.reward_span, self.cfg.failure_penalty), "" if ok else m.cause,
                       TableFigures(true=true, cost_s=m.wall_s), self.oracle.result(entry, m),
                       Evidence(observed) if observed else failure_evidence(m.status, None))

    def load(self, run_dir: Path) -> None:
        return None  # a replay is never resumed

    def row(self, key: str, number: int | None, recipe: Recipe, trial: record.Trial[TableFigures]) -> Row:
        return Row(key, number, recipe.describe_diff(self.baseline), trial.status)

    def decide(self, finished: Finished) -> Outcome:
        return Outcome(Decision.KEEP_BASELINE, ["a replay measures the search, not a decision"], finished.tree,
                       runs=finished.runs)


# -- two plain baselines, as strategies -------------------------------------------------------------


def _feasible_neighbours(oracle: Oracle, recipe: Recipe, tried: set[str]) -> list[Recipe]:
    """Untried feasible recipes that change the fewest knobs (one where possible: two when a relation
    ties knobs together, as a person who reads the relation would move them)."""
    by_distance: dict[int, list[Recipe]] = {}
    for e in oracle.table.entries:
        if not e.feasible or e.id in tried:
            continue
        r = oracle.table.recipe(e)
        by_distance.setdefault(len(r.diff(recipe)), []).append(r)
    nearest = min((d for d in by_distance if d > 0), default=None)
    return by_distance[nearest] if nearest is not None else []


class GreedyStrategy:
    """Best-first: an untried neighbour of the fastest recipe observed so far."""

    name = "greedy"

    def __init__(self, search: Search, oracle: Oracle, seed: int):
        self.search, self.oracle, self.rng = search, oracle, random.Random(seed)
        self.observed: dict[str, float] = {oracle.baseline.id: 1.0}
        self.recipes: dict[str, Recipe] = {oracle.baseline.id: oracle.baseline}
        self.tried = {oracle.baseline.id}

    def ask(self) -> Candidate | Wait | None:
        options: list[Recipe] = []
        for rid in sorted(self.observed, key=self.observed.__getitem__, reverse=True):
            options = _feasible_neighbours(self.oracle, self.recipes[rid], self.tried)
            if options:
                break
        if not options:
            return None
        recipe = self.rng.choice(options)
        self.tried.add(recipe.id)
        return _candidate(self.search, recipe, "greedy: a neighbour of the fastest so far")

    def tell(self, candidate: Candidate, node: Node | None) -> None:
        if node is not None and node.score is not None:
            self.observed[node.id], self.recipes[node.id] = node.score, node.recipe

    def exhausted(self) -> str:
        return "greedy: no untried neighbour of any recipe observed"


class SequentialStrategy:
    """One knob at a time, in the space's order: try its every value, keep the fastest, next knob;
    passes repeat until one changes nothing. A change that breaks a relation is repaired as the
    search repairs it (the fewest other knobs move)."""

    name = "sequential"

    def __init__(self, search: Search, oracle: Oracle):
        self.search, self.oracle = search, oracle
        self.current, self.speed = oracle.baseline, 1.0
        self.tried = {oracle.baseline.id}
        self.queue: list[Recipe] = []
        self.knobs = list(oracle.space.values)
        self.k = -1  # the knob being tried
        self.best, self.best_speed = self.current, self.speed
        self.changed = False  # in this pass

    def _next_knob(self) -> bool:
        """Settle the knob just tried, and queue the next one's values; False when a pass changed nothing."""
        if self.k >= 0 and self.best is not self.current:
            self.current, self.speed, self.changed = self.best, self.best_speed, True
        while True:
            self.k += 1
            if self.k == len(self.knobs):
                if not self.changed:
                    return False
                self.k, self.changed = 0, False
            knob = self.knobs[self.k]
            self.best, self.best_speed = self.current, self.speed
            self.queue = []
            for value in self.oracle.space.values[knob]:
                recipe = self.current.with_(**{knob: value})
                if self.oracle.relations:
                    recipe = self.oracle.relations.repair(recipe, {knob}, self.oracle.space.values).recipe
                if recipe.id not in self.tried and recipe.id not in {r.id for r in self.queue}:
                    self.queue.append(recipe)
            if self.queue:
                return True

    def ask(self) -> Candidate | Wait | None:
        if not self.queue and not self._next_knob():
            return None
        recipe = self.queue.pop(0)
        self.tried.add(recipe.id)
        return _candidate(self.search, recipe, f"sequential: {self.knobs[self.k]}")

    def tell(self, candidate: Candidate, node: Node | None) -> None:
        if node is not None and node.score is not None and node.score > self.best_speed:
            self.best, self.best_speed = node.recipe, node.score

    def exhausted(self) -> str:
        return "sequential: a whole pass changed nothing"


def _candidate(search: Search, recipe: Recipe, why: str) -> Candidate:
    root = search.tree.root
    edits = recipe.edits_from(root.recipe)
    return Candidate(recipe, root, Proposal(edits, why, why.split(":")[0]))


# -- one replay ----------------------------------------------------------------------------------------


def sampler_for(strategy: str, oracle: Oracle, seed: int) -> optuna.samplers.BaseSampler:
    name = SAMPLERS.get(strategy, "random")  # the tree's strategies use a sampler only to satisfy the study
    relations = oracle.relations or None
    sampler = make_sampler(name, oracle.space, oracle.baseline, seed, relations)
    if name == "gp" and relations and not isinstance(sampler, FeasibleSampler):
        sampler = FeasibleSampler(sampler, distributions(oracle.space, oracle.baseline), relations, oracle.baseline)
    return sampler


def run_replay(oracle: Oracle, strategy: str, budget: int, seed: int, folder: Path,
               reporter: Reporter | None = None, pruner: str = "none", set_aside: float | None = None
               ) -> tuple[Trajectory, Outcome, CampaignStore]:
    """``strategy`` against ``oracle``'s table through the engine's loop, its study in ``folder``;
    with ``pruner`` (search.pruning.pruner), each run's throughput windows go to it; ``set_aside``:
    search.set_aside (None: the campaign's default)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # mcts-analyst-model: the analyst whose explore rule asks TPE fitted to the tree (search.explore: model);
    # mcts-analyst-max: UCT on each subtree's best reward (search.backup: max)
    name, _, mode = strategy.removeprefix("mcts-").partition("-")
    cfg = TreeSearchConfig(strategy=SAMPLERS.get(strategy, "mcts"), seed=seed,  # type: ignore[arg-type]
                           budget={"trials": budget}, pruning={"pruner": pruner},  # type: ignore[arg-type]
                           backup="max" if mode == "max" else "mean",
                           **({} if set_aside is None else {"set_aside": set_aside}))
    job = TableJob(oracle, cfg)
    job.trajectory = Trajectory(strategy, seed)
    # the pruner a campaign of these settings makes (its startup trials, the baseline's curve shown to it),
    # not Optuna's default, which a study made without one would get
    store = CampaignStore(folder, None, sampler_for(strategy, oracle, seed), pruner=make_pruner(cfg.pruning))
    services = Services(store, LocalExecutor(), reporter or Reporter())
    explore: Explore = "model" if mode == "model" else "random"
    proposer = make_proposer(name, seed, builtin=PLAYBOOK, explore=explore) if strategy.startswith("mcts-") else None
    plain: dict[str, Callable[[Search], Strategy]] = {
        "greedy": lambda search: GreedyStrategy(search, oracle, seed),
        "sequential": lambda search: SequentialStrategy(search, oracle),
    }
    outcome = run_search(job, cfg, services, meta={"job": "table", "table": oracle.table.name}, snapshot={},
                         resume=False, proposer=proposer, strategy=plain.get(strategy))
    return job.trajectory, outcome, store


def replay(table: Table, strategy: str, budget: int, seed: int, pruner: str = "none",
           set_aside: float | None = None) -> Trajectory:
    """One replay of ``strategy`` against ``table``; deterministic for a given seed (and the same
    draws with and without ``pruner``)."""
    with tempfile.TemporaryDirectory(prefix="recipetune-replay-") as scratch:
        oracle = Oracle(table, random.Random(f"{table.name}-{strategy}-{seed}"), Path(scratch) / "runs")
        trajectory, _, store = run_replay(oracle, strategy, budget, seed, Path(scratch) / "campaign",
                                          pruner=pruner, set_aside=set_aside)
        store.storage.engine.dispose()  # the study's file goes with the folder
        return trajectory
