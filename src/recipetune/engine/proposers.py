"""The proposers: the analyst (rules of a playbook over a node's facts; engine/playbook.py), random
(uniform over the space, seeded), and ``WithFallback``, a Researcher with the one that stands in
where it has nothing usable (engine/plan.py: make_proposer). engine/llm.py is the third."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from recipetune.core.expr import ExprError, evaluate, names
from recipetune.core.recipe import Scalar
from recipetune.engine.playbook import Rule
from recipetune.engine.researcher import (
    Explore,
    Proposal,
    Proposer,
    SearchContext,
    fmt_value,
    fresh_recipe,
    node_text,
    show_edits,
    with_note,
)
from recipetune.engine.space_model import SpaceModel, helped_moves
from recipetune.engine.tree import Node

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
                options = [(move, True, f"{show_edits(move)} raised {node_text(child.parent, root)} "
                                        f"{fmt_value(child.parent.score)} -> {fmt_value(child.score)} "
                                        f"(+{fmt_value(gain)}); made here on {node_text(node, root)}")
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
                    fresh = fresh_recipe(node, edits, context, taken, keep, self.name)
                    if fresh is None:
                        continue
                    recipe, edits, note = fresh
                    taken.add(recipe.id)
                    if said:  # the model's draw, a move that helped: its own account
                        out.append(Proposal(edits, with_note(f"{rule.name}: {said}", note), self.name))
                        break
                    shown = ", ".join(f"{n}={fmt_value(facts[n])}" for n in sorted(names(rule.when)) if n in facts)
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
            # any drawn knob may move to repair it
            fresh = fresh_recipe(node, draw, context, taken, keep=False, source=self.name)
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

