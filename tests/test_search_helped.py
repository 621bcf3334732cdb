"""The analyst's ``helped`` action: moves that raised their parent's score elsewhere in the tree, made
on the node being expanded (engine/space_model.py: ``helped_moves``). Tested on the trees built to fool
it (a pruned child with a checkpoint's high value, a failed one, a move that hurt or changed nothing,
a move the node already has, the same move twice) and beside the case it is for: two moves that each
helped, one child apart instead of two expansions."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from test_search_proposers import BASE, SPACE, WORKLOAD

from recipetune.engine.playbook import Rule, load_playbook
from recipetune.engine.proposers import AnalystProposer
from recipetune.engine.researcher import SearchContext
from recipetune.engine.space_model import helped_moves
from recipetune.engine.tree import Tree

HELPED = Rule(name="combine", when="True", why="w", action={"knob": "*", "helped": True})


def tree() -> tuple[Tree, dict]:
    """The baseline (1.0) and its children: two moves that helped (micro-batch 4: +0.10, foreach:
    +0.04), one that hurt, one level with it, a pruned one whose checkpoint value looks best, a failed
    one with a score, and under micro-batch 4 a move that helped by more (+0.20)."""
    t = Tree(BASE, score=1.0)
    root = t.root
    n = {
        "mb4": t.add(BASE.with_(micro_batch_size=4), root, "passed", 0.6, score=1.10),
        "foreach": t.add(BASE.with_(optimizer_impl="foreach"), root, "passed", 0.55, score=1.04),
        "threads": t.add(BASE.with_(num_threads=2), root, "passed", 0.4, score=0.93),
        "level": t.add(BASE.with_(micro_batch_size=1), root, "passed", 0.5, score=1.0),
        "pruned": t.add(BASE.with_(micro_batch_size=16), root, "pruned", 0.5, score=1.9),
        "failed": t.add(BASE.with_(dataloader_workers=1), root, "failed", 0.0, score=1.5),
    }
    n["mb4-w1"] = t.add(BASE.with_(micro_batch_size=4, dataloader_workers=1), n["mb4"], "passed", 0.7, score=1.30)
    return t, n


def context(t: Tree) -> SearchContext:
    return SearchContext(WORKLOAD, BASE, SPACE, t, seed=0)


def test_only_moves_that_ran_to_their_end_and_raised_their_parent_count_largest_gain_first():
    t, n = tree()
    moves = [(move, round(gain, 6)) for move, _, gain in helped_moves(t, list(SPACE.values))]
    # the deeper move's gain is on its own parent (1.10 -> 1.30), not on the baseline
    assert moves == [({"dataloader_workers": 1}, 0.2), ({"micro_batch_size": 4}, 0.1),
                     ({"optimizer_impl": "foreach"}, 0.04)]
    # the pruned child's 1.9 is a checkpoint's value; the failed child's score is no result; a move
    # that hurt (num_threads) or changed nothing (micro-batch 1) is not one that helped
    assert all(m not in ({"micro_batch_size": 16}, {"num_threads": 2}, {"micro_batch_size": 1}) for m, _ in moves)
    assert helped_moves(t, ["optimizer_impl"]) == [({"optimizer_impl": "foreach"}, n["foreach"], pytest.approx(0.04))]


def test_the_same_move_twice_counts_once_at_its_larger_gain():
    t, n = tree()
    t.add(BASE.with_(optimizer_impl="foreach", micro_batch_size=4), n["mb4"], "passed", 0.65, score=1.22)  # +0.12
    foreach = [(child, gain) for move, child, gain in helped_moves(t, list(SPACE.values))
               if move == {"optimizer_impl": "foreach"}]
    assert len(foreach) == 1 and foreach[0][1] == pytest.approx(0.12) and foreach[0][0].parent is n["mb4"]


def test_on_a_node_that_helped_the_other_helped_moves_come_first_and_its_own_is_not_proposed_again():
    t, n = tree()
    proposals = AnalystProposer([HELPED]).propose(n["foreach"], context(t), 5)
    # foreach + workers 1 and foreach + micro-batch 4: two moves that each helped, in one child each
    assert [p.edits for p in proposals] == [{"dataloader_workers": 1}, {"micro_batch_size": 4}]
    assert proposals[1].rationale.startswith(
        "combine: micro_batch_size=4 raised the baseline 1 -> 1.1 (+0.1); made here on [optimizer_impl=\"foreach\"]")
    assert "raised [micro_batch_size=4] 1.1 -> 1.3 (+0.2)" in proposals[0].rationale


def test_a_combination_already_in_the_tree_is_not_proposed_again():
    t, n = tree()
    t.add(BASE.with_(optimizer_impl="foreach", micro_batch_size=4), n["mb4"], "passed", 0.5, score=1.0)
    edits = [p.edits for p in AnalystProposer([HELPED]).propose(n["foreach"], context(t), 5)]
    assert edits == [{"dataloader_workers": 1}]  # foreach + micro-batch 4 ran already (as mb4's child)


def test_nothing_has_helped_yet_nothing_is_proposed():
    t = Tree(BASE, score=1.0)
    child = t.add(BASE.with_(num_threads=2), t.root, "passed", 0.4, score=0.93)
    assert AnalystProposer([HELPED]).propose(child, context(t), 3) == []
    assert AnalystProposer([HELPED]).propose(t.root, context(t), 3) == []


def test_helped_moves_keep_their_order_beside_the_shuffled_exploration_rule():
    t, n = tree()
    explore = Rule(name="explore", when="True", why="w", action={"knob": "*", "each": True})
    for seed in range(5):  # the exploration rule's shuffle, at any seed, leaves the helped order alone
        out = AnalystProposer([HELPED, explore], seed=seed, explore="model").propose(n["threads"], context(t), 6)
        assert [p.edits for p in out if p.rationale.startswith("combine")] == [
            {"dataloader_workers": 1}, {"micro_batch_size": 4}, {"optimizer_impl": "foreach"}]


def test_a_helped_action_takes_no_value_and_a_playbook_may_use_it(tmp_path):
    with pytest.raises(ValidationError, match="exactly one of"):
        Rule(name="r", when="True", why="w", action={"knob": "*", "helped": True, "each": True})
    f = tmp_path / "mine.yaml"
    f.write_text("rules:\n  - {name: again, when: 'True', why: w, action: {knob: micro_batch_size, helped: true}}\n")
    (rule,) = load_playbook(f)
    t, n = tree()
    assert [p.edits for p in AnalystProposer([rule]).propose(n["foreach"], context(t), 5)] == [{"micro_batch_size": 4}]
