"""The experiment tree: rewards, UCT maths, selection, dead ends, never the same recipe twice."""

from __future__ import annotations

import math

import pytest

from recipetune.core.recipe import Recipe
from recipetune.engine.tree import Tree, reward, uct

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


def test_best_is_the_highest_screened_speedup_among_passed():
    tree = Tree(BASE)
    tree.add(BASE.with_(a=2), tree.root, "passed", 0.7, score=1.4)
    tree.add(BASE.with_(a=3), tree.root, "rejected", 0.0, score=3.0)  # fast but failed screening
    top = tree.add(BASE.with_(a=5), tree.root, "passed", 0.8, score=1.9)
    assert tree.best() is top
    assert [n.score for n in tree.ranked()] == [1.9, 1.4]
