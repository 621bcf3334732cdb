"""The Researcher: proposers that suggest the next experiments from a node of the tree.

A proposal is data (knob edits and a rationale), never code. Everything a proposer returns is
checked against the campaign's search space here and again by the guard before anything runs.

- ``analyst`` (default): rules from a YAML playbook over the node's run profile. Where only the
  undirected rule fires (``knob: "*"``, the playbooks' ``explore``), the campaign's ``search.explore``
  chooses its children: ``model`` (``SpaceModel``: Optuna's TPE fitted to the tree's own results) or
  ``random`` (one other value of a searched knob, in a seeded order).
- ``random``: a uniform draw over the search space, seeded.
- ``llm``: any OpenAI-compatible chat endpoint (engine/llm.py), built on the pieces here, with the
  analyst (or random) as its fallback (``WithFallback``) where it has nothing usable.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol

import optuna
import yaml
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from recipetune.core.errors import validation_error
from recipetune.core.expr import ExprError, evaluate, names, parse
from recipetune.core.meanings import Glossary
from recipetune.core.recipe import KnobSet, Recipe, Scalar, SearchSpace
from recipetune.core.relations import Relations
from recipetune.engine.samplers import FeasibleSampler, StableTPE
from recipetune.engine.store import distributions
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
           keep: bool = True) -> tuple[Recipe, dict[str, Scalar], str] | None:
    """The recipe ``edits`` make from ``node`` (relations repaired), its edits from the node and the
    repair note; None when it is the node itself or already tried."""
    recipe, note = context.complete(node.recipe, edits, keep)
    if recipe == node.recipe or context.seen(recipe) or recipe.id in taken:
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


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else json.dumps(value)


def _show(edits: dict[str, Scalar]) -> str:
    return ", ".join(f"{n}={_fmt(v)}" for n, v in edits.items())


def _where(node: Node, root: Node) -> str:
    """A node as a rationale names it: the baseline, or its changes from the baseline."""
    return "the baseline" if node.parent is None else f"[{node.recipe.describe_diff(root.recipe)}]"


# ---------------------------------------------------------------------------------------------
# The analyst: rules from a playbook.


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid")

    knob: str = Field(description="a knob of the search space; '*' for every searchable knob, 'data_*' for every "
                                  "knob whose name starts with data_")
    set: Scalar | None = None
    move: Literal["up", "down"] | None = None
    each: bool = False
    to: str | None = Field(None, description="an expression over the facts, e.g. 'global_batch_size // nproc'")
    helped: bool = Field(False, description="each move (of these knobs) that raised its parent's score elsewhere "
                                            "in the tree, made on this node; the largest gain first")

    @model_validator(mode="after")
    def _one_kind(self) -> Action:
        kinds = (self.set is not None) + (self.move is not None) + self.each + (self.to is not None) + self.helped
        if kinds != 1:
            raise ValueError("an action needs exactly one of: set: VALUE, move: up|down, each: true, to: EXPR, "
                             "helped: true")
        if self.knob == "*" and not (self.each or self.helped):
            raise ValueError("knob '*' only works with each: true or helped: true")
        if self.knob.endswith("*") and self.move is not None:
            raise ValueError("a knob pattern ending in '*' works with set or each, not move")
        if self.to is not None:
            parse(self.to)
        return self

    def knobs(self, space: SearchSpace, glossary: Glossary | None = None) -> list[str]:
        """The knobs the action may change: a playbook name maps to the knob that means it."""
        if self.knob.endswith("*"):  # "*": every searchable knob; "data_*": those named data_...
            return [k for k in space.values if k.startswith(self.knob[:-1])]
        return [glossary.knob(self.knob) if glossary else self.knob]

    def edits(self, recipe: Recipe, space: SearchSpace, facts: dict[str, Any],
              glossary: Glossary | None = None) -> Iterator[dict[str, Scalar]]:
        """Edits of the workload's own knobs (``helped`` reads the tree: ``helped_moves``)."""
        if self.helped:
            return
        for knob in self.knobs(space, glossary):
            values = space.values.get(knob)
            if not values:
                continue  # not searchable in this campaign
            current = recipe.get(knob)
            target = self.set
            if self.to is not None:
                try:
                    target = evaluate(self.to, facts)
                except (ExprError, TypeError):
                    continue  # a fact it needs is unknown here
            if target is not None:
                # Only a value the space lists, in the trainer's own spelling (bf16 may be 'bfloat16').
                hit = glossary.value(knob, target, values) if glossary else next(
                    (v for v in values if member(v, (target,))), None)
                if hit is not None:
                    yield {knob: hit}
            elif self.move is not None:
                nxt = _neighbour(values, current, self.move)
                if nxt is not None:
                    yield {knob: nxt}
            else:
                for v in values:
                    if v != current:
                        yield {knob: v}


def _neighbour(values: tuple[Scalar, ...], current: Scalar | None, move: str) -> Scalar | None:
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if numeric and isinstance(current, int | float) and not isinstance(current, bool):
        bigger, smaller = [v for v in values if v > current], [v for v in values if v < current]
        if move == "up":
            return min(bigger) if bigger else None
        return max(smaller) if smaller else None
    if current not in values:
        return None
    i = values.index(current) + (1 if move == "up" else -1)
    return values[i] if 0 <= i < len(values) else None


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    when: str = "True"
    action: Action
    why: str

    @field_validator("when")
    @classmethod
    def _parses(cls, text: str) -> str:
        parse(text)  # ExprError is a ValueError: pydantic reports it with the field
        return text


class Playbook(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[Rule]


class PlaybookError(ValueError):
    def __init__(self, file: str, field: str, message: str):
        super().__init__(f"{file}: {field}: {message}" if field else f"{file}: {message}")
        self.file, self.field, self.message = file, field, message


def load_playbook(path: str | Path | None = None, builtin: str | None = None) -> list[Rule]:
    """The rules of a playbook file; a job's built-in one (``package:file``) when ``path`` is None."""
    if path is None:
        if builtin is None:
            raise PlaybookError("playbook", "", "no playbook: give a file or the job's built-in one")
        package, _, name = builtin.partition(":")
        text, where = resources.files(package).joinpath(name).read_text(), name
    else:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise PlaybookError(where, "", f"cannot read: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise PlaybookError(where, "", f"not a text file: byte {e.start} is not UTF-8") from None
    try:
        raw = yaml.safe_load(text)
        return Playbook.model_validate(raw).rules
    except yaml.YAMLError as e:
        raise PlaybookError(where, "", f"malformed YAML: {getattr(e, 'problem', e)}") from None
    except RecursionError:
        raise PlaybookError(where, "", "nested too deeply to be a playbook") from None
    except ValidationError as e:
        raise validation_error(e, where, error=PlaybookError) from None


def helped_moves(tree: Tree, knobs: list[str]) -> list[tuple[dict[str, Scalar], Node, float]]:
    """Every move in the tree that raised its parent's score: (the knobs it changed, as the child
    has them; the child; its gain on the parent), the largest gain first, each move once (at its
    largest gain). Only a node that ran to its end counts: a pruned child's value is from a
    checkpoint, a failed or refused one has none. Only moves within ``knobs``.

    Made on another node, such a move is a step the tree has already seen pay off: where two moves
    each helped on their own, their combination is one child away instead of two expansions deep."""
    best: dict[str, tuple[dict[str, Scalar], Node, float]] = {}
    allowed = set(knobs)
    for child in tree:
        parent = child.parent
        if (parent is None or child.status != "passed" or child.score is None or parent.score is None
                or not math.isfinite(child.score) or not math.isfinite(parent.score)):
            continue
        gain = child.score - parent.score
        move = child.recipe.edits_from(parent.recipe)
        if gain <= 0 or not move or not set(move) <= allowed:
            continue
        key = json.dumps(move, sort_keys=True, default=str)
        if key not in best or gain > best[key][2]:
            best[key] = (move, child, gain)
    return sorted(best.values(), key=lambda m: -m[2])


def _gamma(n: int) -> int:
    """How many of ``n`` nodes TPE counts as good: Optuna's default ``gamma``, for the rationale."""
    return min(math.ceil(0.1 * n), 25)


class SpaceModel:
    """A model of the space fitted to the tree's own results: Optuna's TPE over the nodes measured so
    far (each node's values of the searched knobs; its score, or a poor result where it failed, was
    refused or was pruned), in an in-memory study, asked for points anywhere in the space. Where knobs
    are related it draws only feasible points (engine/samplers.py: ``FeasibleSampler``). Seeded by the
    campaign's seed, the node and the tree's size: the same tree gets the same draws, a resumed campaign
    the ones the uninterrupted one would have. Below ``min_scored`` nodes with a score it has no model
    (``fit`` returns None): the analyst falls back to the seeded uniform choice."""

    def __init__(self, seed: int = 0, min_scored: int = 2, asks: int = 4):
        self.seed, self.min_scored, self.asks = seed, min_scored, asks

    def trials(self, context: SearchContext) -> tuple[dict[str, BaseDistribution], list[FrozenTrial]]:
        """The tree as Optuna trials: a scored node COMPLETE with its score, every other one that
        is done (failed, refused, pruned) PRUNED without a value, which TPE ranks below every score."""
        dists = distributions(context.space, context.baseline)
        out = []
        for node in context.tree:
            params = {n: node.recipe.get(n) for n in dists}
            if any(not member(v, tuple(d.choices)) for v, d in  # type: ignore[attr-defined]
                   zip(params.values(), dists.values(), strict=True)):
                continue  # a value outside the space (a derived or repaired knob): not a point of it
            if node.status in ("baseline", "passed") and node.score is not None and math.isfinite(node.score):
                out.append(create_trial(params=params, distributions=dists, value=float(node.score)))
            else:
                out.append(create_trial(params=params, distributions=dists, state=TrialState.PRUNED))
        return dists, out

    def fit(self, node: Node, context: SearchContext, k: int) -> tuple[list[dict[str, Scalar]], str] | None:
        """Up to ``asks * k + 8`` distinct draws of TPE, and what the model was (for the rationale)."""
        dists, trials = self.trials(context)
        scored = sorted((t.value for t in trials if t.state == TrialState.COMPLETE), reverse=True)
        if len(scored) < self.min_scored or not dists:
            return None
        seed = random.Random(f"{self.seed}-model-{node.id}-{len(context.tree)}").getrandbits(32)
        sampler: optuna.samplers.BaseSampler = StableTPE(seed=seed, n_startup_trials=0)
        if context.relations:
            sampler = FeasibleSampler(sampler, dists, context.relations, context.baseline)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.add_trials(trials)
        draws: list[dict[str, Scalar]] = []
        for _ in range(self.asks * k + 8):
            draw = dict(study.ask(dists).params)
            if draw not in draws:
                draws.append(draw)
        good = _gamma(len(trials))
        failed = len(trials) - len(scored)
        note = (f"model: TPE over {len(trials)} nodes ({failed} failed, refused or stopped) draws near the best "
                f"{good} (score >= {_fmt(scored[min(good, len(scored)) - 1])})")
        return draws, note


# One child an analyst rule offers: the edits, whether those knobs stay as asked when relations are
# repaired, and its own account where the model drew it or it is a move that helped elsewhere.
Option = tuple[dict[str, Scalar], bool, str]


class AnalystProposer:
    """Rules over the node's profile, in playbook order, one proposal per fired rule per pass.

    A ``helped`` rule proposes, on this node, the moves that raised their parent's score elsewhere in
    the tree (``helped_moves``; its rationale names the move, where it helped and by how much).

    The undirected rule (``knob: "*"``, the playbooks' last, ``explore``) proposes, with ``explore:
    model``, what ``SpaceModel`` draws first (its rationale says so), then, as with ``random``, one
    other value of a searched knob in a seeded order."""

    name = "analyst"

    def __init__(self, rules: list[Rule], seed: int = 0, explore: Explore = "random"):
        self.rules, self.seed, self.explore = rules, seed, explore
        self.model = SpaceModel(seed)

    def fired(self, facts: dict[str, Any]) -> list[Rule]:
        out = []
        for rule in self.rules:
            try:
                if evaluate(rule.when, facts):
                    out.append(rule)
            except (ExprError, TypeError):
                continue  # a fact this workload or run does not have: the rule does not apply
        return out

    def propose(self, node: Node, context: SearchContext, k: int) -> list[Proposal]:
        facts = context.facts_of(node)
        rng = random.Random(f"{self.seed}-{node.id}-{len(context.tree)}")
        queues: list[tuple[Rule, list[Option]]] = []
        for rule in self.fired(facts):
            options: list[Option] = [(e, True, "") for e in
                                     rule.action.edits(node.recipe, context.space, facts, context.glossary)]
            if rule.action.helped:
                root = context.tree.root
                options = [(move, True, f"{_show(move)} raised {_where(child.parent, root)} "
                                        f"{_fmt(child.parent.score)} -> {_fmt(child.score)} (+{_fmt(gain)}); "
                                        f"made here on {_where(node, root)}")
                           for move, child, gain in helped_moves(context.tree,
                                                                 rule.action.knobs(context.space, context.glossary))
                           if child.parent is not None]
            if rule.action.knob.endswith("*") and rule.action.each:
                rng.shuffle(options)  # undirected exploration: no knob goes first by accident
            if rule.action.knob == "*" and rule.action.each and self.explore == "model":
                fitted = self.model.fit(node, context, k)
                if fitted is not None:
                    draws, note = fitted
                    # any drawn knob may move to repair a relation, as with the random proposer
                    options = [(d, False, note) for d in draws] + options
            queues.append((rule, options))
        out: list[Proposal] = []
        taken: set[str] = set()
        while len(out) < k and any(opts for _, opts in queues):
            for rule, options in queues:  # round-robin: diverse children before a second idea per rule
                while options and len(out) < k:
                    edits, keep, said = options.pop(0)
                    fresh = fresh_recipe(node, edits, context, taken, keep)
                    if fresh is None:
                        continue
                    recipe, edits, note = fresh
                    taken.add(recipe.id)
                    if said:  # the model's draw, a move that helped: its own account
                        out.append(Proposal(edits, with_note(f"{rule.name}: {said}", note), self.name))
                        break
                    shown = ", ".join(f"{n}={_fmt(facts[n])}" for n in sorted(names(rule.when)) if n in facts)
                    why = " ".join(rule.why.split())
                    facts_text = f" [{shown}]" if shown else ""
                    out.append(Proposal(edits, with_note(f"{rule.name}{facts_text}: {why}", note), self.name))
                    break
        return out


# ---------------------------------------------------------------------------------------------
# Random: uniform over the space.


class RandomProposer:
    name = "random"

    def __init__(self, seed: int = 0, max_draws: int = 200):
        self.seed, self.max_draws = seed, max_draws

    def propose(self, node: Node, context: SearchContext, k: int) -> list[Proposal]:
        # Seeded by the tree's size: a resumed campaign draws what the uninterrupted one would have.
        rng = random.Random(f"{self.seed}-{len(context.tree)}")
        out: list[Proposal] = []
        taken: set[str] = set()
        for _ in range(self.max_draws):
            if len(out) == k:
                break
            draw = {name: rng.choice(values) for name, values in context.space.values.items()}
            fresh = fresh_recipe(node, draw, context, taken, keep=False)  # any drawn knob may move to repair it
            if fresh is None:
                continue
            recipe, edits, note = fresh
            taken.add(recipe.id)
            out.append(Proposal(edits, with_note("uniform draw over the search space", note), self.name))
        return out


# ---------------------------------------------------------------------------------------------
# Composition: a Researcher and the one that stands in where it has nothing.


def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


class WithFallback:
    """The primary Researcher (the LLM), and a fallback for the nodes where it has nothing.

    Where every answer of the primary was unusable (it says so in ``context.failed``), or it
    honestly had nothing new (an empty answer), the fallback proposes, and each of its proposals
    says so in its source (``analyst (llm fallback: <why>)``, ``analyst (llm: nothing new)``), its
    rationale its own. The primary's rejections stay in the context: the record shows what it said.
    A node is exhausted only when both have nothing; then ``context.failed`` still names the
    primary's failure, if it failed, so the loop can say why."""

    def __init__(self, primary: Proposer, fallback: Proposer):
        self.primary, self.fallback = primary, fallback
        self.name = primary.name  # the campaign's proposer, as the loop and the record name it

    def propose(self, node: Node, context: SearchContext, k: int) -> list[Proposal]:
        out = self.primary.propose(node, context, k)
        if out:
            return out
        failed = context.failed.get(node.id)
        backup = self.fallback.propose(node, context, k)
        if not backup:
            if failed:
                context.failed[node.id] = f"{failed}; the {self.fallback.name} fallback has nothing new either"
            return []
        # The node did not fail: the fallback delivered. (The loop's "exhausted" tally reads failed.)
        context.failed.pop(node.id, None)
        why = f"{self.primary.name} fallback: {_short(failed)}" if failed else f"{self.primary.name}: nothing new"
        return [replace(p, source=f"{p.source} ({why})") for p in backup]
