"""Relations the search satisfies (repair, derived knobs, feasible Optuna sampling) and knob meanings
that let the analyst's playbook apply to an outside trainer (a nanoGPT-style command workload)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from recipetune.config import load_campaign
from recipetune.core.errors import ConfigError
from recipetune.core.measure import RunResult, StepRecord
from recipetune.core.recipe import SearchSpace
from recipetune.engine.playbook import load_playbook
from recipetune.engine.proposers import AnalystProposer, RandomProposer
from recipetune.engine.researcher import SearchContext
from recipetune.engine.samplers import distributions, make_sampler
from recipetune.engine.store import CampaignStore
from recipetune.engine.strategy import SamplerStrategy
from recipetune.engine.tree import Tree
from recipetune.guard.static import static_check
from recipetune.speed.facts import BRIEFING, PLAYBOOK, profile_facts
from recipetune.speed.job import run
from recipetune.speed.plan import plan
from recipetune.workloads.reference import ReferenceWorkload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_search_campaign import Recorder, fake_guard  # noqa: E402

FAKE = Path(__file__).resolve().parent / "fixtures" / "fake_trainer.py"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SIZES = [1, 2, 4, 8, 16, 32]


def nanogpt_campaign(tmp_path: Path, derive: bool = False, **search) -> Path:
    """The issue's scenario: independent --batch_size and --gradient_accumulation_steps flags,
    nanoGPT log lines, batch_size * grad_accum == 32, from 2 x 16."""
    accum = {"derive": "32 // batch_size", "low": 1, "high": 32} if derive else {"default": 16, "choices": SIZES}
    doc = {
        "workload": {
            "kind": "command",
            "argv": ["{python}", str(FAKE), "--micro-batch={batch_size}", "--grad-accum={grad_accum}",
                     "--iters={steps}", "--out={out_dir}", "--log-format=nanogpt"],
            "knobs": {"batch_size": {"default": 2, "choices": SIZES, "means": "micro_batch"},
                      "grad_accum": {**accum, "means": "grad_accum"}},
            "metrics": {"regex_preset": "nanogpt"},
            "tokens_per_step": "batch_size * grad_accum * 32",
            "invariants": [] if derive else ["batch_size * grad_accum == 32"],
        },
        "baseline": {"batch_size": 2} if derive else {"batch_size": 2, "grad_accum": 16},
        "run": {"steps": 6, "timeout_s": 60},
        "guard": {"parity": {"steps": 6}},
        "search": {"knobs": {"batch_size": SIZES} if derive else {"batch_size": SIZES, "grad_accum": SIZES},
                   "steps_per_trial": 6, "budget": {"trials": 3}, **search},
    }
    path = tmp_path / "nanogpt.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def no_memory_profile(recipe) -> RunResult:
    steps = [StepRecord(step=i, loss=2.0 - 0.01 * i, tokens=1024, step_time_s=0.04) for i in range(1, 11)]
    return RunResult(recipe=dict(recipe), recipe_id=recipe.id, status="ok", steps=steps, warmup_steps=2,
                     environment={"python": "3"})


def context_for(path: Path) -> SearchContext:
    camp = load_campaign(path)
    space = SearchSpace.from_lists(camp.workload.knobs(), camp.config.search.knobs)
    return SearchContext(camp.workload, camp.baseline, space, Tree(camp.baseline, no_memory_profile(camp.baseline)),
                         **BRIEFING)


# -- repair -------------------------------------------------------------------------------------


def test_a_proposal_breaking_the_relation_is_repaired_by_the_fewest_other_knobs(tmp_path):
    ctx = context_for(nanogpt_campaign(tmp_path))
    recipe, note = ctx.complete(ctx.baseline, {"batch_size": 32})
    assert (recipe["batch_size"], recipe["grad_accum"]) == (32, 1)
    assert "repaired: grad_accum 16 -> 1" in note and "batch_size * grad_accum == 32" in note
    recipe, _ = ctx.complete(ctx.baseline, {"grad_accum": 4})  # the other way round
    assert (recipe["batch_size"], recipe["grad_accum"]) == (8, 4)
    # Both asked for and inconsistent: nothing else may move, the guard refuses it and says why.
    recipe, note = ctx.complete(ctx.baseline, {"batch_size": 4, "grad_accum": 4})
    assert note.startswith("no repair") and "does not hold" in note
    [v] = static_check(ctx.workload, ctx.baseline, recipe)
    assert v.rule == "relation" and "batch_size=4" in v.message


def test_reference_batch_split_is_repaired_through_nproc_or_micro_batch():
    w = ReferenceWorkload()
    base = w.resolve({"model": "nano", "global_batch_size": 16, "micro_batch_size": 8})
    space = SearchSpace.from_lists(w.knobs(), {"micro_batch_size": [2, 4, 8, 16], "nproc": [1, 2, 4]})
    ctx = SearchContext(w, base, space, Tree(base), **BRIEFING)
    recipe, note = ctx.complete(base, {"nproc": 4})  # 16 / (4 x 8) is no whole accumulation
    assert (recipe["nproc"], recipe["micro_batch_size"]) == (4, 4) and "micro_batch_size 8 -> 4" in note
    recipe, note = ctx.complete(base.with_(nproc=2), {"micro_batch_size": 16})
    assert recipe["nproc"] == 1 and "nproc 2 -> 1" in note
    assert static_check(w, base, recipe) == []


def test_random_proposals_are_repaired_not_wasted(tmp_path):
    ctx = context_for(nanogpt_campaign(tmp_path))
    proposals = RandomProposer(seed=3).propose(ctx.tree.root, ctx, 5)
    assert len(proposals) == 5
    for p in proposals:
        recipe = ctx.baseline.with_(**p.edits)
        assert recipe["batch_size"] * recipe["grad_accum"] == 32, p


def test_a_repair_moves_the_coupled_relations_knobs_only_when_the_broken_ones_cannot():
    # The tiny-moe campaign's case: the analyst asks for experts over 2 ranks from a 2-stage pipeline on 2
    # processes. ep's relation has one other knob, dp_shard, and dp_shard=2 breaks the layout relation
    # (pp x dp_shard == nproc), whose pp then leaves the stage and micro-batch relations broken: the repair
    # reaches pp, its schedule and micro-batches through the relations they share, not refuse the proposal.
    ctx = context_for(EXAMPLES / "tiny-moe-campaign.yaml")
    base = ctx.baseline
    recipe, note = ctx.complete(base, {"ep": 2})
    assert {k: recipe[k] for k in ("ep", "dp_shard", "pp", "pp_microbatches", "pp_schedule", "expert_impl")} == {
        "ep": 2, "dp_shard": 2, "pp": 1, "pp_microbatches": 1, "pp_schedule": "1F1B", "expert_impl": "loop"}
    assert note.startswith("repaired:") and "dp_shard 1 -> 2" in note and "pp 2 -> 1" in note
    assert static_check(ctx.workload, base, recipe) == []
    # Beside it, the case the own knobs repair: without a pipeline, ep=2 moves dp_shard alone.
    flat = base.with_(pp=1, pp_microbatches=1, expert_impl="grouped")
    recipe, note = ctx.complete(flat, {"ep": 2})
    assert recipe.edits_from(flat) == {"ep": 2, "dp_shard": 2} and "pp" not in note.replace("dp_shard", "")
    # Where the coupled knobs are not searched, nothing reaches them: refused, and the guard says why.
    w = ctx.workload
    space = SearchSpace.from_lists(w.knobs(), {"dp_shard": [1, 2], "ep": [1, 2], "expert_impl": ["loop", "grouped"]})
    narrow = SearchContext(w, base, space, Tree(base), **BRIEFING)
    recipe, note = narrow.complete(base, {"ep": 2})
    assert note.startswith("no repair") and "dp_shard" in note
    assert [v.rule for v in static_check(w, base, recipe)][:1] == ["relation"]


# -- derived knobs ------------------------------------------------------------------------------


def test_a_derived_knob_is_computed_rendered_and_never_searched(tmp_path):
    path = nanogpt_campaign(tmp_path, derive=True)
    camp = load_campaign(path)
    assert camp.baseline["grad_accum"] == 16 and camp.workload.knobs()["grad_accum"].default == 16
    recipe = camp.workload.resolve({"batch_size": 8})
    assert recipe["grad_accum"] == 4
    assert "--grad-accum=4" in camp.workload.command(recipe, 5, tmp_path)
    # A proposal moving its input carries the derived value with it.
    ctx = context_for(path)
    recipe, _ = ctx.complete(ctx.baseline, {"batch_size": 32})
    assert recipe["grad_accum"] == 1 and static_check(ctx.workload, ctx.baseline, recipe) == []
    # Set by hand to anything else: refused by the static check, and in a campaign file.
    [v] = static_check(ctx.workload, ctx.baseline, recipe.with_(grad_accum=2))
    assert v.rule == "derived" and "32 // batch_size" in v.message
    with pytest.raises(ConfigError, match=r"baseline\.grad_accum.*derived"):
        load_campaign(path, ["grad_accum=4"])
    with pytest.raises(ConfigError, match=r"search\.knobs\.grad_accum.*derived"):
        plan(load_campaign(path, ["search.knobs={grad_accum: [1, 2]}"]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_derived_value_outside_its_domain_is_refused(tmp_path):
    path = nanogpt_campaign(tmp_path, derive=True)
    doc = yaml.safe_load(path.read_text())
    doc["workload"]["knobs"]["batch_size"]["choices"].append(64)  # 32 // 64 = 0 accumulation steps
    path.write_text(yaml.safe_dump(doc))
    camp = load_campaign(path)
    with pytest.raises(ConfigError, match=r"baseline\.grad_accum.*32 // batch_size.*outside its domain"):
        load_campaign(path, ["batch_size=64"])
    [v] = static_check(camp.workload, camp.baseline, camp.baseline.with_(batch_size=64))
    assert v.rule == "derived" and v.knob == "grad_accum"


# -- Optuna strategies sample only feasible points ----------------------------------------------


@pytest.mark.parametrize("strategy", ["tpe", "random", "grid"])
def test_optuna_strategies_sample_only_feasible_points(tmp_path, strategy):
    camp = load_campaign(nanogpt_campaign(tmp_path))
    space = SearchSpace.from_lists(camp.workload.knobs(), camp.config.search.knobs)
    rel = camp.workload.relations()
    store = CampaignStore(tmp_path / "s", sampler=make_sampler(strategy, space, camp.baseline, 0, rel))
    store.create({})
    view = SimpleNamespace(tree=Tree(camp.baseline), store=store, dists=distributions(space, camp.baseline))
    strategy_ = SamplerStrategy(view, strategy, rel)
    assert strategy_.space_size() == 6  # of 36 points, the six splits of 32
    seen = set()
    for i in range(12 if strategy != "grid" else 6):
        trial, recipe = strategy_.draw()
        assert recipe["batch_size"] * recipe["grad_accum"] == 32, trial.params
        seen.add(recipe.id)
        store.study.tell(trial, float(recipe["batch_size"]) + 0.01 * i)  # bigger micro-batches are faster
    if strategy == "grid":
        assert len(seen) == 6 and strategy_.grid_done()


# -- meanings: the playbook on an outside trainer ------------------------------------------------


def test_meanings_give_the_analyst_its_facts_and_unknown_facts_stay_unknown(tmp_path):
    ctx = context_for(nanogpt_campaign(tmp_path))
    facts = profile_facts(ctx.tree.root, ctx)
    assert facts["micro_batch_size"] == 2 and facts["accum_steps"] == 16 and facts["global_batch_size"] == 32
    assert facts["nproc"] == 1 and facts["memory_reported"] is False
    assert "mem_headroom" not in facts and "dtype" not in facts  # the trainer reports neither
    fired = {r.name for r in AnalystProposer(load_playbook(builtin=PLAYBOOK)).fired(facts)}
    assert "no-accumulation-memory-unknown" in fired
    assert not fired & {"no-accumulation", "larger-micro-batch", "bf16-on-cpu", "foreach-optimizer"}


@pytest.mark.parametrize("derive", [False, True])
def test_analyst_proposes_the_coupled_no_accumulation_move_first(tmp_path, derive):
    ctx = context_for(nanogpt_campaign(tmp_path, derive=derive))
    proposals = AnalystProposer(load_playbook(builtin=PLAYBOOK)).propose(ctx.tree.root, ctx, 3)
    first = proposals[0]
    assert first.edits == {"batch_size": 32, "grad_accum": 1}
    assert first.rationale.startswith("no-accumulation-memory-unknown")
    if not derive:  # a derived knob simply follows; a searched one is repaired, and the rationale says so
        assert "repaired: grad_accum 16 -> 1" in first.rationale
    for p in proposals:  # every proposal keeps the relation: none is wasted on the static check
        recipe = ctx.baseline.with_(**p.edits)
        assert recipe["batch_size"] * recipe["grad_accum"] == 32


def test_meaning_values_map_onto_the_playbook(tmp_path):
    path = nanogpt_campaign(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["workload"]["knobs"]["precision"] = {"default": "float32", "choices": ["float32", "bfloat16"],
                                             "means": "dtype"}
    doc["workload"]["knobs"]["compile"] = {"default": False, "means": "compile"}  # named like the fact
    doc["search"]["knobs"]["precision"] = ["float32", "bfloat16"]
    path.write_text(yaml.safe_dump(doc))
    ctx = context_for(path)
    facts = profile_facts(ctx.tree.root, ctx)
    assert facts["dtype"] == "fp32" and facts["compile"] == "off"
    proposals = AnalystProposer(load_playbook(builtin=PLAYBOOK)).propose(ctx.tree.root, ctx, 8)
    assert {"precision": "bfloat16"} in [p.edits for p in proposals]  # bf16-on-cpu, in the trainer's spelling


def test_an_unknown_meaning_is_bad_input(tmp_path):
    path = nanogpt_campaign(tmp_path)
    path.write_text(path.read_text().replace("means: micro_batch", "means: microbatch"))
    with pytest.raises(ConfigError, match=r"workload.*batch_size.*means.*micro_batch, grad_accum"):
        load_campaign(path)


def test_nanogpt_style_campaign_runs_the_coupled_move_in_its_first_round(tmp_path):
    """The issue's failure: 'KEEP BASELINE with 0 runs, the tree is exhausted'. Now the first round
    runs 32 x 1 (and other splits), every one repaired instead of refused."""
    camp = load_campaign(nanogpt_campaign(tmp_path))
    reporter = Recorder()
    outcome = run(plan(camp, tmp_path / "campaign"), guard=fake_guard(), reporter=reporter)
    assert outcome.runs == 3
    assert not any("exhausted" in p for p in reporter.phases)
    recipes = [(n.recipe["batch_size"], n.recipe["grad_accum"]) for n in outcome.tree if n.trial is not None]
    assert recipes[0] == (32, 1) and all(b * a == 32 for b, a in recipes)
    assert all(n.status in ("passed", "failed") for n in outcome.tree if n.trial is not None)
