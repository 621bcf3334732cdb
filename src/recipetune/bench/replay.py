"""Search strategies replayed against a measured table.

Each strategy is the project's own search code (``engine/tree.py``'s MCTS with UCT, the proposers
of ``engine/researcher.py``, the Optuna samplers of ``engine/samplers.py``) or a plain baseline
(greedy best-first, sequential one-knob-at-a-time), driven by a loop that mirrors the campaign's
(``speed/job.py``: ``Search.mcts`` and ``Search.optuna``). Instead of running a recipe, a
trial draws one of that recipe's measured repeats: its status, throughput and profile are what the
proposer reads, its wall time is what the trial costs (a slow or failing recipe costs time too). A
recipe the table lists as infeasible is refused as the guard's static check would: no run, no cost.

Speed-ups are relative to the median of the baseline's repeats (the campaign's baseline profile).
The *true* speed of a recipe is the median of its repeats; a strategy's incumbent is the recipe it
*observed* fastest, so noise can mislead it, as in a real campaign.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from recipetune.bench.table import Entry, Measurement, Table
from recipetune.core.measure import RunResult, StepRecord
from recipetune.core.recipe import KnobError, Recipe, SearchSpace
from recipetune.engine.researcher import Proposal, SearchContext, make_proposer
from recipetune.engine.tree import Node, Tree, reward

STRATEGIES = ("mcts-analyst", "mcts-random", "greedy", "sequential", "tpe", "gp", "optuna-random", "grid")


@dataclass
class Trial:
    recipe_id: str
    status: str  # passed | failed
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
            if t.true >= target:
                return i, wall
        return None, None


class Oracle:
    """The table as a stand-in for running recipes: a trial draws one measured repeat."""

    def __init__(self, table: Table, rng: random.Random, scratch: Path):
        self.table, self.rng, self.scratch = table, rng, scratch
        self.entries = table.by_id()
        base = table.baseline_entry().tokens_per_s()
        if not base:
            raise ValueError(f"table {table.name}: the baseline has no successful run")
        self.base_tps = base
        self.baseline = Recipe(table.baseline)
        self.space = SearchSpace({n: tuple(v) for n, v in table.space.items()})
        self.workload = table.make_workload()
        self.relations = self.workload.relations()

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


class Replay:
    """One strategy, one seed: trials until the budget is spent or the strategy has nothing left."""

    def __init__(self, oracle: Oracle, budget: int, seed: int, name: str):
        self.oracle, self.budget, self.seed = oracle, budget, seed
        self.trajectory = Trajectory(name, seed)

    def left(self) -> bool:
        return len(self.trajectory.trials) < self.budget

    def run(self, recipe: Recipe) -> tuple[str, float | None, RunResult | None]:
        """Status (passed, failed, rejected), observed speed-up and the run, trial recorded."""
        entry = self.oracle.entry(recipe)
        if entry is None:
            return "rejected", None, None  # the static check: not run, not counted
        m = self.oracle.draw(entry)
        ok = m.status == "ok" and bool(m.tokens_per_s)
        observed = m.tokens_per_s / self.oracle.base_tps if ok else None  # type: ignore[operator]
        self.trajectory.trials.append(Trial(entry.id, "passed" if ok else "failed", observed,
                                            self.oracle.true_speedup(entry), m.wall_s))
        return ("passed" if ok else "failed"), observed, self.oracle.result(entry, m)


# -- the tree search, as Search.mcts runs it ------------------------------------------------------


def replay_mcts(oracle: Oracle, proposer_name: str, budget: int, seed: int, children: int = 3,
                span: float = 4.0, penalty: float = 0.0) -> Trajectory:
    rp = Replay(oracle, budget, seed, f"mcts-{proposer_name}")
    proposer = make_proposer(proposer_name, seed)
    base_entry = oracle.table.baseline_entry()
    tree = Tree(oracle.baseline, oracle.result(base_entry, base_entry.ok_runs()[0]))
    context = SearchContext(oracle.workload, oracle.baseline, oracle.space, tree, seed)
    while rp.left():
        node = tree.select()
        if node is None:
            break  # the tree is exhausted
        proposals = [p for p in proposer.propose(node, context, children) if node.recipe.with_(**p.edits) not in tree]
        context.drain()
        if not proposals:
            node.exhausted = True
            continue
        for proposal in proposals:
            if not rp.left():
                break
            recipe = node.recipe.with_(**proposal.edits)
            if recipe in tree:
                continue
            _add(tree, node, recipe, proposal, rp.run(recipe), span, penalty)
    return rp.trajectory


def _add(tree: Tree, parent: Node, recipe: Recipe, proposal: Proposal,
         outcome: tuple[str, float | None, RunResult | None], span: float, penalty: float) -> Node:
    status, observed, result = outcome
    if status == "rejected":
        return tree.add(recipe, parent, "rejected", None, cause="static check", source=proposal.source)
    value = reward(observed, status == "passed", span, penalty)
    return tree.add(recipe, parent, status, value, score=observed, rationale=proposal.rationale,  # type: ignore[arg-type]
                    source=proposal.source, result=result)


# -- Optuna samplers, as Search.optuna runs them --------------------------------------------------


def replay_optuna(oracle: Oracle, strategy: str, budget: int, seed: int) -> Trajectory:
    import optuna

    from recipetune.engine.samplers import FeasibleSampler, make_sampler
    from recipetune.engine.store import distributions

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = {"optuna-random": "random"}.get(strategy, strategy)
    relations = oracle.relations or None
    dists = distributions(oracle.space, oracle.baseline)
    if name == "gp":
        sampler: optuna.samplers.BaseSampler = optuna.samplers.GPSampler(seed=seed)
        if relations:
            sampler = FeasibleSampler(sampler, dists, relations, oracle.baseline)
    else:
        sampler = make_sampler(name, oracle.space, oracle.baseline, seed, relations)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    points = relations.feasible_points(oracle.baseline, {n: d.choices for n, d in dists.items()}) \
        if relations else None  # type: ignore[attr-defined]
    size = len(points) if points is not None else math.prod(len(d.choices) for d in dists.values())  # type: ignore[attr-defined]
    rp = Replay(oracle, budget, seed, strategy)
    seen: dict[str, float | None] = {oracle.baseline.id: 1.0}
    repeats = 0
    while rp.left():
        grid_done = isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(study)
        if grid_done or len(seen) >= size or repeats > 100:
            break
        trial = study.ask(dists)
        recipe = oracle.baseline.with_(**trial.params)
        if relations:
            with contextlib.suppress(KnobError):  # as OptunaStrategy.ask: derived knobs computed
                recipe = relations.derive(recipe)
        if recipe.id in seen:  # the sampler must hear the outcome to move on; nothing runs again
            repeats += 1
            prior = seen[recipe.id]
            study.tell(trial, prior) if prior is not None else study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        repeats = 0
        status, observed, _ = rp.run(recipe)
        seen[recipe.id] = observed  # a refused recipe too: the campaign's tree keeps it, it is never asked again
        if observed is not None:
            study.tell(trial, observed)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return rp.trajectory


# -- plain baselines ------------------------------------------------------------------------------


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


def replay_greedy(oracle: Oracle, budget: int, seed: int) -> Trajectory:
    """Best-first: measure an untried neighbour of the fastest recipe observed so far."""
    rp, rng = Replay(oracle, budget, seed, "greedy"), random.Random(seed)
    observed: dict[str, float] = {oracle.baseline.id: 1.0}
    recipes: dict[str, Recipe] = {oracle.baseline.id: oracle.baseline}
    tried = {oracle.baseline.id}
    while rp.left():
        options = []
        for rid in sorted(observed, key=observed.__getitem__, reverse=True):
            options = _feasible_neighbours(oracle, recipes[rid], tried)
            if options:
                break
        if not options:
            break
        recipe = rng.choice(options)
        tried.add(recipe.id)
        status, speed, _ = rp.run(recipe)
        if speed is not None:
            observed[recipe.id], recipes[recipe.id] = speed, recipe
    return rp.trajectory


def replay_sequential(oracle: Oracle, budget: int, seed: int) -> Trajectory:
    """One knob at a time, in the space's order: try its every value, keep the fastest, next knob;
    passes repeat until one changes nothing. A change that breaks a relation is repaired as the
    search repairs it (the fewest other knobs move), or skipped when no repair exists."""
    rp = Replay(oracle, budget, seed, "sequential")
    current, current_speed = oracle.baseline, 1.0
    tried = {oracle.baseline.id}
    changed = True
    while changed and rp.left():
        changed = False
        for knob, values in oracle.space.values.items():
            best, best_speed = current, current_speed
            for value in values:
                recipe = current.with_(**{knob: value})
                if oracle.relations:
                    recipe = oracle.relations.repair(recipe, {knob}, oracle.space.values).recipe
                if recipe.id in tried or not rp.left():
                    continue
                tried.add(recipe.id)
                status, speed, _ = rp.run(recipe)
                if speed is not None and speed > best_speed:
                    best, best_speed = recipe, speed
            if best is not current:
                current, current_speed, changed = best, best_speed, True
    return rp.trajectory


def replay(table: Table, strategy: str, budget: int, seed: int) -> Trajectory:
    """One replay of ``strategy`` against ``table``; deterministic for a given seed."""
    with tempfile.TemporaryDirectory(prefix="recipetune-replay-") as scratch:
        oracle = Oracle(table, random.Random(f"{table.name}-{strategy}-{seed}"), Path(scratch))
        runners: dict[str, Callable[[], Trajectory]] = {
            "mcts-analyst": lambda: replay_mcts(oracle, "analyst", budget, seed),
            "mcts-random": lambda: replay_mcts(oracle, "random", budget, seed),
            "greedy": lambda: replay_greedy(oracle, budget, seed),
            "sequential": lambda: replay_sequential(oracle, budget, seed),
        }
        if strategy in runners:
            return runners[strategy]()
        if strategy in ("tpe", "gp", "optuna-random", "grid"):
            return replay_optuna(oracle, strategy, budget, seed)
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
