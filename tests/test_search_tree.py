"""The experiment tree: rewards, UCT maths, selection, dead ends, never the same recipe twice."""

from __future__ import annotations

import math

import pytest

from recipetune.core.recipe import Recipe
from recipetune.engine.tree import Tree, uct
from recipetune.speed.job import reward

BASE = Recipe({"a": 1, "b": "x"})
C = 1 / math.sqrt(2)


def test_reward_is_log_speedup_clipped_to_unit_interval():
    assert reward(1.0, True) == pytest.approx(0.5)
    assert reward(4.0, True, span=4.0) == pytest.approx(1.0)
    assert reward(2.0, True, span=4.0) == pytest.approx(0.75)
    assert reward(0.25, True, span=4.0) == pytest.approx(0.0)
    assert reward(100.0, True, span=4.0) == 1.0
    assert reward(3.0, False) == 0.0  # rejected: the penalty, however fast
    assert reward(None, True, penalty=0.1) == 0.1  # failed run
    assert reward(1.5, True) > reward(1.2, True) > reward(1.0, True) > reward(0.9, True)


def test_uct_formula():
    assert uct(0.6, 2, 10, C) == pytest.approx(0.6 + C * math.sqrt(math.log(10) / 2))
    assert uct(0.0, 0, 10, C) == math.inf
    assert uct(0.5, 3, 1, C) == pytest.approx(0.5)  # ln 1 = 0: no exploration bonus


def test_backpropagation_updates_the_whole_path():
    tree = Tree(BASE)
    assert (tree.root.visits, tree.root.total) == (1, pytest.approx(0.5))
    child = tree.add(BASE.with_(a=2), tree.root, "passed", 0.8, score=1.7)
    grandchild = tree.add(child.recipe.with_(b="y"), child, "passed", 0.9, score=2.0)
    assert (grandchild.visits, grandchild.q) == (1, pytest.approx(0.9))
    assert (child.visits, child.total) == (2, pytest.approx(1.7))
    assert (tree.root.visits, tree.root.total) == (3, pytest.approx(2.2))
    assert tree.path(grandchild) == [tree.root, child, grandchild]
    assert grandchild.depth() == 2


def test_static_rejection_is_remembered_but_not_rewarded():
    tree = Tree(BASE)
    node = tree.add(BASE.with_(a=9), tree.root, "rejected", None, cause="static check: a")
    assert node.visits == 0 and tree.root.visits == 1
    assert BASE.with_(a=9) in tree


def test_a_recipe_is_never_added_twice():
    tree = Tree(BASE)
    tree.add(BASE.with_(a=2), tree.root, "passed", 0.6)
    with pytest.raises(ValueError, match="already in the tree"):
        tree.add(BASE.with_(a=2), tree.root, "passed", 0.6)
    with pytest.raises(ValueError):
        tree.add(BASE, tree.root, "passed", 0.6)  # the baseline is the root


def test_selection_follows_uct_and_skips_dead_branches():
    tree = Tree(BASE, exploration=C)
    assert tree.select() is tree.root  # nothing expanded yet
    good = tree.add(BASE.with_(a=2), tree.root, "passed", 0.9, score=2.5)
    meh = tree.add(BASE.with_(a=3), tree.root, "passed", 0.55, score=1.1)
    failed = tree.add(BASE.with_(a=4), tree.root, "failed", 0.0, cause="crash")
    # Equal visits: the higher mean wins; the failed child has the lowest Q and cannot be expanded.
    assert tree.select() is good
    assert not failed.expandable and not tree.live(failed)
    # Once `good`'s subtree is exhausted, selection moves on to the next live child.
    good.exhausted = True
    assert tree.select() is meh
    meh.exhausted = True
    # Only the root is left: it is expanded again (its children are dead ends).
    assert tree.select() is tree.root
    tree.root.exhausted = True
    assert tree.select() is None


def test_failed_branches_are_never_expanded():
    tree = Tree(BASE)
    crashed = tree.add(BASE.with_(a=2), tree.root, "failed", 0.0, cause="crash")
    rejected = tree.add(BASE.with_(a=3), tree.root, "rejected", 0.0, cause="loss")
    for _ in range(5):
        node = tree.select()
        assert node is not crashed and node is not rejected


def test_exploration_term_can_beat_a_higher_mean():
    tree = Tree(BASE, exploration=C)
    a = tree.add(BASE.with_(a=2), tree.root, "passed", 0.7)
    for i in range(6):  # a well-visited subtree under `a`
        tree.add(a.recipe.with_(b=f"v{i}"), a, "passed", 0.7).exhausted = True
    b = tree.add(BASE.with_(a=3), tree.root, "passed", 0.6)  # visited once
    n = tree.root.visits
    assert uct(b.q, b.visits, n, C) > uct(a.q, a.visits, n, C)
    assert tree.select() is b


def fair_branch_and_lucky_branch(backup: str) -> Tree:
    """Rewards a few hundredths apart, as near a baseline: branch ``a`` holds the best node among two
    poor siblings, branch ``b`` four fair ones. Mean-UCT prefers ``b`` (0.510 > 0.5025)."""
    tree = Tree(BASE, exploration=C, backup=backup)  # type: ignore[arg-type]
    tree.root.exhausted = True  # the choice is between the branches
    a = tree.add(BASE.with_(a=2), tree.root, "passed", 0.52)
    for i, r in enumerate((0.55, 0.47, 0.47)):
        tree.add(a.recipe.with_(b=f"a{i}"), a, "passed", r)
    b = tree.add(BASE.with_(a=3), tree.root, "passed", 0.51)
    for i in range(3):
        tree.add(b.recipe.with_(b=f"b{i}"), b, "passed", 0.51)
    return tree


def test_max_backup_deepens_the_branch_that_holds_the_best_node():
    mean, best = fair_branch_and_lucky_branch("mean"), fair_branch_and_lucky_branch("max")
    a_mean, a_best = mean.nodes[BASE.with_(a=2).id], best.nodes[BASE.with_(a=2).id]
    assert mean.path(mean.select())[1] is not a_mean  # fooled by the best node's siblings
    top = best.select()
    assert best.path(top)[1] is a_best and top.reward == 0.55  # the best node itself is expanded


@pytest.mark.parametrize("backup", ["mean", "max"])
def test_max_backup_reads_rewards_at_any_scale(backup):
    """A well-visited branch with the best rewards against one visited once with poor ones. Whether a
    gain of 0.01 or 0.45 in reward, the scaled values rank alike; mean-UCT's choice flips with the
    scale, since its exploration term does not shrink with the rewards' spread."""
    picks = []
    for eps in (0.01, 0.45):
        tree = Tree(BASE, exploration=C, backup=backup)
        tree.root.exhausted = True
        w = tree.add(BASE.with_(a=2), tree.root, "passed", 0.5 + eps)
        for i in range(5):
            tree.add(w.recipe.with_(b=f"w{i}"), w, "passed", 0.5 + eps).exhausted = True
        tree.add(BASE.with_(a=3), tree.root, "passed", 0.5 - eps)
        picks.append(tree.path(tree.select())[1].recipe["a"])
    if backup == "max":
        assert picks == [2, 2]
    else:
        assert picks == [3, 2]


def test_max_backup_still_explores_a_branch_seldom_visited():
    """The equivalent case max must not lose: a branch tried once, at the median reward, beside a
    well-explored branch with the best one, is tried again (the exploration term is not scaled away)."""
    tree = Tree(BASE, exploration=C, backup="max")
    tree.root.exhausted = True
    top = tree.add(BASE.with_(a=2), tree.root, "passed", 0.6)
    for i, r in enumerate((0.58, 0.56, 0.55, 0.54, 0.53, 0.52, 0.51, 0.5, 0.45)):
        tree.add(top.recipe.with_(b=f"t{i}"), top, "passed", r).exhausted = True
    top.exhausted = True
    once = tree.add(BASE.with_(a=3), tree.root, "passed", 0.52)
    assert tree.select() is once


def test_max_backup_keeps_the_virtual_loss():
    tree = Tree(BASE, exploration=C, backup="max")
    tree.root.exhausted = True
    a = tree.add(BASE.with_(a=2), tree.root, "passed", 0.6)
    b = tree.add(BASE.with_(a=3), tree.root, "passed", 0.6)
    first = tree.select()
    tree.reserve(first)  # a trial under it is running: the next worker goes elsewhere
    assert {first, tree.select()} == {a, b}
    tree.release(first)
    assert tree.select() is first


def test_max_backup_with_equal_rewards_is_exploration_alone():
    tree = Tree(BASE, exploration=C, backup="max")
    assert tree.scaled(0.5) == 0.5  # one reward so far: no range to scale by
    a = tree.add(BASE.with_(a=2), tree.root, "passed", 0.5)
    assert tree.value(a) == 0.5 and tree.own_value(a) == 0.5


def test_best_is_the_highest_screened_speedup_among_passed():
    tree = Tree(BASE)
    tree.add(BASE.with_(a=2), tree.root, "passed", 0.7, score=1.4)
    tree.add(BASE.with_(a=3), tree.root, "rejected", 0.0, score=3.0)  # fast but failed screening
    top = tree.add(BASE.with_(a=5), tree.root, "passed", 0.8, score=1.9)
    assert tree.best() is top
    assert [n.score for n in tree.ranked()] == [1.9, 1.4]
