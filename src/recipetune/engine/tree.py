"""The experiment tree searched with MCTS (as in TREX, arXiv 2604.14116).

The root is the baseline; every other node is one recipe that was proposed, checked and (unless
the guard rejected it before running) measured. A round selects a node by UCT, asks the proposer
for a few children, runs them and backpropagates their rewards along the path to the root.

The tree is the same for every job: a node's ``score`` is the job's figure of merit and its reward
the job's normalised gain over the baseline, both computed by the job (speed: speed/job.py
``reward``, quality: finetune/decide.py ``metric_reward``). Rewards lie in [0, 1] and the baseline
earns 0.5; a rejected or failed trial earns the penalty (0 by default). On rewards in [0, 1] the
classic exploration constant is c = 1/sqrt(2) (Kocsis & Szepesvari 2006).

What a subtree is worth to UCT (``backup``):

- ``mean``: the mean reward of its experiments, as in classic UCT, which estimates an arm's
  expected payoff. A branch whose one excellent node sits among poor siblings scores below a branch
  of uniformly fair ones, though the campaign's result is its single best node.
- ``max``: the best reward in the subtree, scaled to [0, 1] between the lowest and highest reward in
  the tree (min-max, as MuZero normalises its values). The best node is what a campaign returns, so
  the branch that holds it is the one to deepen; and the scaling keeps the exploration term in
  proportion, where rewards near the baseline differ by hundredths and c * sqrt(ln N / n) by tenths.
  The measured case is in docs/benchmarks.md (the TREX ablation at 20 experiments).

Parallel search uses virtual loss (Chaslot et al. 2008): while a trial runs, every node on its
parent's path counts one more visit with reward 0 (``pending``), so the next selection sees that
path as less promising and spreads the other workers over the tree instead of picking the same
node N times. When the trial ends, the virtual visit is taken back and its real reward
backpropagated.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from recipetune.core.recipe import Recipe
from recipetune.engine.record import Evidence
from recipetune.engine.status import NodeStatus, Status

Backup = Literal["mean", "max"]


@dataclass(eq=False)
class Node:
    recipe: Recipe
    parent: Node | None
    status: NodeStatus
    score: float | None = None  # the job's figure of merit (speed: screened speed-up; quality: validation metric)
    cause: str = ""  # why it was rejected or failed
    rationale: str = ""
    source: str = ""  # which proposer suggested it
    trial: int | None = None  # the study's trial number
    result: Any = None  # what its run reported, for the proposer: a RunResult, an ExperimentReport
    evidence: Evidence | None = None  # what it measured of its speed (engine/effects.py learns from it)
    children: list[Node] = field(default_factory=list)
    reward: float | None = None  # its own reward; None for a recipe that never ran
    visits: int = 0
    total: float = 0.0
    best: float = -math.inf  # the highest reward in its subtree
    pending: int = 0  # trials in flight below this node: virtual visits with reward 0
    exhausted: bool = False  # the proposer had nothing new to offer here

    @property
    def id(self) -> str:
        return self.recipe.id

    @property
    def q(self) -> float:
        return self.total / self.visits if self.visits else 0.0

    @property
    def expandable(self) -> bool:
        # Failed and rejected recipes are dead ends: children would inherit what broke them; a pruned
        # one was losing to the others when it stopped.
        return self.status in (Status.BASELINE, Status.PASSED) and not self.exhausted

    def depth(self) -> int:
        return 0 if self.parent is None else 1 + self.parent.depth()


def uct(q: float, visits: int, parent_visits: int, c: float) -> float:
    """Q/N + c*sqrt(ln N_parent / N); an unvisited option is tried first."""
    if visits == 0:
        return math.inf
    return q + c * math.sqrt(math.log(max(parent_visits, 1)) / visits)


class Tree:
    """Every recipe a campaign tried, by id; a recipe is never added (hence never run) twice."""

    def __init__(self, baseline: Recipe, result: Any = None, exploration: float = 1 / math.sqrt(2),
                 score: float | None = None, backup: Backup = "mean"):
        self.exploration, self.backup = exploration, backup
        self.low, self.high = math.inf, -math.inf  # the range of the rewards so far (backup: max)
        self.root = Node(baseline, None, "baseline", score=score, result=result)
        self.nodes: dict[str, Node] = {baseline.id: self.root}
        self.backpropagate(self.root, 0.5)  # the baseline's reward in every job

    def __contains__(self, recipe: Recipe) -> bool:
        return recipe.id in self.nodes

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    def __len__(self) -> int:
        return len(self.nodes)

    def add(self, recipe: Recipe, parent: Node, status: NodeStatus, value: float | None = None, **info) -> Node:
        """Attach a tried recipe under ``parent``; ``value`` (its reward) is backpropagated when given.

        A proposal the guard rejected before running carries no measurement: it is kept so it is
        never proposed again, but gets no reward.
        """
        if recipe.id in self.nodes:
            raise ValueError(f"recipe {recipe.id} is already in the tree")
        node = Node(recipe, parent, status, **info)
        parent.children.append(node)
        self.nodes[recipe.id] = node
        if value is not None:
            self.backpropagate(node, value)
        return node

    def backpropagate(self, node: Node, value: float) -> None:
        node.reward = value
        self.low, self.high = min(self.low, value), max(self.high, value)
        walk: Node | None = node
        while walk is not None:
            walk.visits += 1
            walk.total += value
            walk.best = max(walk.best, value)
            walk = walk.parent

    def scaled(self, value: float) -> float:
        """``value`` min-max scaled over the tree's rewards; 0.5 while they are all equal."""
        return (value - self.low) / (self.high - self.low) if self.high > self.low else 0.5

    def value(self, node: Node) -> float:
        """What ``node``'s subtree is worth to UCT (``backup``), visits in flight counted as losses."""
        n = node.visits + node.pending
        if not node.visits:
            return 0.0
        if self.backup == "max":
            return self.scaled(node.best) * node.visits / n
        return node.total / n

    def own_value(self, node: Node) -> float:
        """What expanding ``node`` once more is worth: its subtree's mean (backup: mean), or its own
        scaled reward (backup: max: its subtree's best is its children's to claim)."""
        if self.backup == "max":
            return self.scaled(node.reward) if node.reward is not None else 0.0
        return self.value(node)

    def reserve(self, node: Node) -> None:
        """A trial under ``node`` started: a virtual loss on its path until ``release``."""
        for n in self.path(node):
            n.pending += 1

    def release(self, node: Node) -> None:
        for n in self.path(node):
            n.pending -= 1

    def live(self, node: Node) -> bool:
        """Whether the subtree under ``node`` still has a node that can be expanded."""
        return node.expandable or any(self.live(c) for c in node.children)

    def select(self, policy: str = "uct") -> Node | None:
        """The node to expand next, or None when the whole tree is exhausted.

        ``policy`` is ``uct`` (MCTS, below), or one of the baselines of TREX's ablation: ``greedy``
        (best-first: the expandable node with the highest score, the latest on a tie) or ``sequential``
        (a chain: the latest expandable node, so each experiment is a child of the last that ran).

        From the root, descend to the child with the best UCT among those with a live subtree.
        Expanding the current node again competes as one more option (progressive widening): it
        scores the node's own mean reward with the exploration term of a child visited
        ``1 + len(children)`` times, so a node with few, poor children gets fresh ideas before a
        well-explored one does.
        """
        if policy != "uct":
            open_ = [n for n in self.nodes.values() if n.expandable]  # insertion order: oldest first
            if not open_:
                return None
            if policy == "sequential":
                return open_[-1]
            return max(reversed(open_), key=lambda n: -math.inf if n.score is None else n.score)
        node = self.root
        if not self.live(node):
            return None
        c = self.exploration

        def score(k: Node, parent_visits: int) -> float:
            return uct(self.value(k), k.visits + k.pending, parent_visits, c)

        while True:
            kids = [k for k in node.children if self.live(k)]
            if not kids:
                return node  # live with no live children: the node itself is expandable
            n_parent = node.visits + node.pending
            best = max(kids, key=lambda k: score(k, n_parent))
            if node.expandable:
                widen = uct(self.own_value(node), 1 + len(node.children) + node.pending, n_parent, c)
                if widen > score(best, n_parent):
                    return node
            node = best

    def path(self, node: Node) -> list[Node]:
        """Root first, ``node`` last."""
        out = []
        walk: Node | None = node
        while walk is not None:
            out.append(walk)
            walk = walk.parent
        return out[::-1]

    def siblings(self, node: Node) -> list[Node]:
        return [] if node.parent is None else [n for n in node.parent.children if n is not node]

    def ranked(self) -> list[Node]:
        """Passed candidates, highest score first."""
        passed = [n for n in self.nodes.values() if n.status == Status.PASSED and n.score is not None]
        return sorted(passed, key=lambda n: n.score, reverse=True)  # type: ignore[arg-type,return-value]

    def best(self) -> Node | None:
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def failures(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.status in ("rejected", "failed")]
