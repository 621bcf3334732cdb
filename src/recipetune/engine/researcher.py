"""The Researcher's interface: what a proposer sees (``SearchContext``), what it answers (``Proposal``).

A proposal is data (knob edits and a rationale), never code. Everything a proposer returns is
checked against the campaign's search space here and again by the guard before anything runs.

- ``analyst`` (default): rules from a YAML playbook over the node's run profile. Where only the
  undirected rule fires (``knob: "*"``, the playbooks' ``explore``), the campaign's ``search.explore``
  chooses its children: ``model`` (``SpaceModel``: Optuna's TPE fitted to the tree's own results) or
  ``random`` (one other value of a searched knob, in a seeded order).
- ``random``: a uniform draw over the search space, seeded.
- ``llm``: any OpenAI-compatible chat endpoint (engine/llm.py), built on the pieces here, with the
  analyst (or random) as its fallback (``WithFallback``) where it has nothing usable.

The proposers are in engine/proposers.py (analyst, random, the fallback composition) and
engine/llm.py; the playbook language in engine/playbook.py; the model of the space in
engine/space_model.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from recipetune.core.meanings import Glossary
from recipetune.core.recipe import KnobSet, Recipe, Scalar, SearchSpace
from recipetune.core.relations import Relations
from recipetune.engine.effects import Effects
from recipetune.engine.tree import Node, Tree

Explore = Literal["model", "random"]


@dataclass(frozen=True)
class Proposal:
    edits: dict[str, Scalar]
    rationale: str
    source: str


@dataclass(frozen=True)
class Rejection:
    """A proposal that never became a candidate, and why."""

    source: str
    reason: str
    raw: str = ""


class Subject(Protocol):
    """What a campaign tunes, as a proposer sees it: a Workload (speed), a fine-tuning experiment
    (finetune/space.py)."""

    def knobs(self) -> KnobSet: ...

    def relations(self) -> Relations: ...


Facts = Callable[["Node", "SearchContext"], dict[str, Any]]


@dataclass
class SearchContext:
    """What a proposer may look at: the campaign's space and the tree so far.

    The job's briefing fills the rest: ``facts`` names what is known of a node for the analyst's
    conditions and the LLM's context (the speed job's: speed/facts.py, the quality job's:
    finetune/analyst.py); ``goal``, ``score_name`` and ``profile`` tell the LLM what is optimised, what
    a node's score is and which facts to show it."""

    workload: Subject
    baseline: Recipe
    space: SearchSpace
    tree: Tree
    seed: int = 0
    facts: Facts | None = None
    goal: str = "improve the campaign's score"
    score_name: str = "score"  # what a node's score is, for the LLM
    details: Callable[[Node], dict[str, Any]] | None = None  # more on the selected node (worst cases ...)
    max_chars: int = 6000  # the LLM's compressed context, at most this much JSON
    profile: tuple[str, ...] = ()
    rejections: list[Rejection] = field(default_factory=list)
    # Nodes where the proposer failed (every answer unusable), as opposed to having nothing new.
    failed: dict[str, str] = field(default_factory=dict)
    # What the measured trials say of each knob value's speed: recipes predicted far slower than the
    # incumbent are set aside (engine/effects.py), never proposed while anything else is left.
    effects: Effects | None = None
    relations: Relations = field(init=False)
    glossary: Glossary = field(init=False)

    def __post_init__(self) -> None:
        self.relations = self.workload.relations()
        self.glossary = Glossary(self.workload.knobs())

    def facts_of(self, node: Node) -> dict[str, Any]:
        return (self.facts or basic_facts)(node, self)

    def seen(self, recipe: Recipe) -> bool:
        return recipe in self.tree

    def complete(self, start: Recipe, edits: dict[str, Scalar], keep: bool = True) -> tuple[Recipe, str]:
        """``start`` with ``edits``, derived knobs computed and broken relations repaired (moving
        other searched knobs; ``keep``: the edited ones stay as asked). The note says what was
        repaired, or why no repair exists (the guard's static check then refuses the recipe)."""
        recipe = start.with_(**edits)
        if not self.relations:
            return recipe, ""
        fix = self.relations.repair(recipe, set(edits) if keep else set(), self.space.values)
        return fix.recipe, fix.note if fix.ok else f"no repair: {fix.note}"

    def reject(self, source: str, reason: str, raw: Any = "") -> None:
        text = raw if isinstance(raw, str) else json.dumps(raw, default=str)
        self.rejections.append(Rejection(source, reason, text[:2000]))

    def drain(self) -> list[Rejection]:
        out, self.rejections = self.rejections, []
        return out


class Proposer(Protocol):
    name: str

    def propose(self, node: Node, context: SearchContext, k: int) -> list[Proposal]: ...


def fresh_recipe(node: Node, edits: dict[str, Scalar], context: SearchContext, taken: set[str],
           keep: bool = True, source: str = "") -> tuple[Recipe, dict[str, Scalar], str] | None:
    """The recipe ``edits`` make from ``node`` (relations repaired), its edits from the node and the
    repair note; None when it is the node itself, already tried, or set aside (predicted far slower
    than the incumbent: engine/effects.py; kept, with ``source``, for when nothing else is left)."""
    recipe, note = context.complete(node.recipe, edits, keep)
    if recipe == node.recipe or context.seen(recipe) or recipe.id in taken:
        return None
    if context.effects is not None and (aside := context.effects.judge(recipe)) is not None:
        context.effects.hold(aside, node, recipe.edits_from(node.recipe), source)
        return None
    return recipe, recipe.edits_from(node.recipe), note


def with_note(rationale: str, note: str) -> str:
    return f"{rationale} [{note}]" if note else rationale


def member(value: Scalar, values: tuple[Scalar, ...]) -> bool:
    # bool is an int: compare type-strictly so True never stands for 1.
    return any(v == value and isinstance(v, bool) == isinstance(value, bool) for v in values)


def basic_facts(node: Node, context: SearchContext) -> dict[str, Any]:
    """What any job knows of a node: its knobs, the baseline's (as ``baseline_<knob>``) and its score.
    A job names more through its briefing (the speed job: speed/facts.py)."""
    facts: dict[str, Any] = {f"baseline_{k}": v for k, v in context.baseline.items()}
    facts.update(node.recipe)
    facts["score"] = node.score
    return facts


def fmt_value(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else json.dumps(value)


def show_edits(edits: dict[str, Scalar]) -> str:
    return ", ".join(f"{n}={fmt_value(v)}" for n, v in edits.items())


def node_text(node: Node, root: Node) -> str:
    """A node as a rationale names it: the baseline, or its changes from the baseline."""
    return "the baseline" if node.parent is None else f"[{node.recipe.describe_diff(root.recipe)}]"

