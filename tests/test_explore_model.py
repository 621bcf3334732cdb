"""The analyst's undirected rule with ``search.explore: model``: TPE fitted to the tree's own results
(engine/space_model.py: ``SpaceModel``) instead of a seeded uniform choice."""

from __future__ import annotations

import random
from pathlib import Path

from optuna.trial import TrialState

from recipetune.bench.replay import replay
from recipetune.bench.table import Table
from recipetune.core.recipe import Recipe, SearchSpace
from recipetune.engine.config import LLMSettings, TreeSearchConfig
from recipetune.engine.plan import build_proposer, make_proposer
from recipetune.engine.playbook import Rule
from recipetune.engine.proposers import AnalystProposer
from recipetune.engine.researcher import SearchContext, member
from recipetune.engine.samplers import distributions
from recipetune.engine.space_model import SpaceModel
from recipetune.engine.tree import Tree
from recipetune.speed.facts import BRIEFING, PLAYBOOK
from recipetune.workloads.reference import ReferenceWorkload

WORKLOAD = ReferenceWorkload()
BASE = WORKLOAD.resolve({"model": "nano", "global_batch_size": 16, "micro_batch_size": 2, "device": "cpu"})
SPACE = SearchSpace.from_lists(WORKLOAD.knobs(), {
    "micro_batch_size": [1, 2, 4, 8, 16],
    "optimizer_impl": ["for-loop", "foreach"],
    "num_threads": [1, 2],
    "dataloader_workers": [0, 1],
})
EXPLORE = Rule.model_validate({"name": "explore", "action": {"knob": "*", "each": True},
                               "why": "no profile rule applies any more; try a change not yet measured from here"})
TABLE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "table-command-fake.json"


def grown(n: int, seed: int = 0, failed: int = 0) -> SearchContext:
    """A tree of ``n`` measured recipes drawn from SPACE (and ``failed`` failed ones) where
    micro_batch_size 16 is always best: score 2.0 with it, 1.0 (the baseline's) without."""
    tree = Tree(BASE, None, score=1.0)
    rng = random.Random(seed)
    while len(tree) < 1 + n + failed:
        recipe = BASE.with_(**{k: rng.choice(v) for k, v in SPACE.values.items()})
        if recipe in tree:
            continue
        if len(tree) <= failed:
            tree.add(recipe, tree.root, "failed", value=0.0, cause="out of memory")
            continue
        score = 2.0 if recipe["micro_batch_size"] == 16 else 1.0
        tree.add(recipe, tree.root, "passed", value=0.5 * score, score=score)
    return SearchContext(WORKLOAD, BASE, SPACE, tree, seed=0, **BRIEFING)


def test_the_tree_becomes_trials_failures_below_every_score():
    ctx = grown(6, failed=2)
    dists, trials = SpaceModel().trials(ctx)
    assert set(dists) == set(SPACE.values)
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 7  # the baseline and 6 scored
    assert [t.state for t in trials].count(TrialState.PRUNED) == 2 and all(
        t.value is None for t in trials if t.state == TrialState.PRUNED)


def test_model_proposals_are_deterministic_at_a_seed_and_say_they_came_from_the_model():
    def propose(seed: int) -> list[tuple[dict, str]]:
        ctx = grown(8)
        return [(p.edits, p.rationale)
                for p in AnalystProposer([EXPLORE], seed, explore="model").propose(ctx.tree.root, ctx, 3)]

    first = propose(0)
    assert len(first) == 3 and first == propose(0)
    assert all(why.startswith("explore: model: TPE over 9 nodes (0 failed, refused or stopped) draws near the best 1 "
                              "(score >= 2)") for _, why in first)


def test_model_proposes_only_untried_recipes_within_the_space():
    ctx = grown(10, failed=3)
    node = next(n for n in ctx.tree if n.score == 2.0)
    proposals = AnalystProposer([EXPLORE], 0, explore="model").propose(node, ctx, 5)
    assert len(proposals) == 5
    recipes = [node.recipe.with_(**p.edits) for p in proposals]
    assert len({r.id for r in recipes}) == 5
    for recipe in recipes:
        assert recipe not in ctx.tree
        # a searched knob's listed values, or the baseline's
        assert all(member(recipe[k], tuple(d.choices)) for k, d in distributions(SPACE, BASE).items())


def test_model_prefers_the_region_of_the_best_nodes_over_a_uniform_draw():
    # micro_batch_size 16 is one value in five; the tree says it is always better.
    def share(explore: str) -> float:
        hits = total = 0
        for seed in range(6):
            ctx = grown(12, seed=seed)
            recipes = [ctx.tree.root.recipe.with_(**p.edits) for p in
                       AnalystProposer([EXPLORE], seed, explore=explore).propose(ctx.tree.root, ctx, 3)]  # type: ignore[arg-type]
            hits += sum(r["micro_batch_size"] == 16 for r in recipes)
            total += len(recipes)
        return hits / total

    model, uniform = share("model"), share("random")
    assert model >= 0.5, model
    assert model > uniform + 0.2, (model, uniform)


def test_no_model_below_two_measured_nodes_the_seeded_choice_instead():
    for ctx in (grown(0), grown(0, failed=2)):  # the baseline alone; the baseline and two failures
        assert SpaceModel().fit(ctx.tree.root, ctx, 3) is None
        model = AnalystProposer([EXPLORE], 0, explore="model").propose(ctx.tree.root, ctx, 3)
        plain = AnalystProposer([EXPLORE], 0, explore="random").propose(ctx.tree.root, ctx, 3)
        assert model == plain and len(model) == 3
        assert not any("model:" in p.rationale for p in model)


def test_model_proposals_keep_the_relations():
    # 16 sequences per step over nproc x micro-batch: an accumulation must be whole.
    base = WORKLOAD.resolve({"model": "nano", "global_batch_size": 16, "micro_batch_size": 8})
    space = SearchSpace.from_lists(WORKLOAD.knobs(), {"micro_batch_size": [2, 4, 8, 16], "nproc": [1, 2, 4]})
    tree = Tree(base, None, score=1.0)
    for mb, nproc in ((4, 1), (2, 2), (4, 4)):
        recipe, _ = SearchContext(WORKLOAD, base, space, tree).complete(base, {"micro_batch_size": mb, "nproc": nproc})
        tree.add(recipe, tree.root, "passed", value=0.6, score=1.0 + mb / 10)
    ctx = SearchContext(WORKLOAD, base, space, tree, **BRIEFING)
    assert ctx.relations
    proposals = AnalystProposer([EXPLORE], 0, explore="model").propose(tree.root, ctx, 4)
    assert proposals and any("model:" in p.rationale for p in proposals)
    for p in proposals:
        recipe = base.with_(**p.edits)
        assert ctx.relations.feasible(recipe), p
        assert recipe not in tree


def test_the_setting_reaches_the_analyst_random_by_the_engines_default(tmp_path):
    assert TreeSearchConfig().explore == "random"  # a finetune campaign's is the model: test_finetune_search.py
    proposer = build_proposer(TreeSearchConfig(explore="model"), tmp_path / "c.yaml", builtin=PLAYBOOK)
    assert isinstance(proposer, AnalystProposer) and proposer.explore == "model"
    assert make_proposer("analyst", builtin=PLAYBOOK).explore == "random"  # type: ignore[attr-defined]
    llm = LLMSettings(base_url="http://127.0.0.1:9/v1", model="m")  # never called here
    fallback = make_proposer("llm", builtin=PLAYBOOK, llm=llm, explore="model").fallback  # type: ignore[attr-defined]
    assert fallback.explore == "model"


def test_replay_has_the_model_explore_strategy():
    table = Table.load(TABLE)
    first = replay(table, "mcts-analyst-model", 8, 0)
    assert len(first.trials) == 8
    again = replay(table, "mcts-analyst-model", 8, 0)
    assert [t.recipe_id for t in again.trials] == [t.recipe_id for t in first.trials]


def test_a_recipe_outside_the_space_is_left_out_of_the_model():
    ctx = grown(3)
    odd = BASE.with_(micro_batch_size=3)  # not a listed value, nor the baseline's
    ctx.tree.add(Recipe(odd), ctx.tree.root, "passed", value=0.5, score=5.0)
    _, trials = SpaceModel().trials(ctx)
    assert len(trials) == 4 and all(t.value != 5.0 for t in trials)
