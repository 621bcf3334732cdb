"""The analyst (playbook rules over a run profile) and the random proposer."""

from __future__ import annotations

import pytest

from recipetune.core.measure import RunResult, StepRecord
from recipetune.core.recipe import SearchSpace
from recipetune.engine.plan import make_proposer
from recipetune.engine.playbook import PlaybookError, Rule, load_playbook
from recipetune.engine.proposers import AnalystProposer, RandomProposer
from recipetune.engine.researcher import SearchContext
from recipetune.engine.tree import Tree
from recipetune.speed.facts import BRIEFING, PLAYBOOK, profile_facts
from recipetune.workloads.reference import ReferenceWorkload

WORKLOAD = ReferenceWorkload()
BASE = WORKLOAD.resolve({"model": "nano", "global_batch_size": 16, "micro_batch_size": 2, "device": "cpu"})
SPACE = SearchSpace.from_lists(WORKLOAD.knobs(), {
    "micro_batch_size": [1, 2, 4, 8, 16],
    "optimizer_impl": ["for-loop", "foreach"],
    "num_threads": [1, 2],
    "dataloader_workers": [0, 1],
})


def profile(data_s: float = 0.001, compute_s: float = 0.05, optim_s: float = 0.01, mem: int = 2**28) -> RunResult:
    steps = [StepRecord(step=i, loss=5.0 - 0.1 * i, tokens=2048, step_time_s=data_s + compute_s + optim_s,
                        data_s=data_s, compute_s=compute_s, optim_s=optim_s, peak_mem_bytes=mem)
             for i in range(1, 11)]
    return RunResult(recipe=dict(BASE), recipe_id=BASE.id, status="ok", steps=steps, warmup_steps=2,
                     environment={"python": "3"})


def context(result: RunResult | None = None) -> SearchContext:
    return SearchContext(WORKLOAD, BASE, SPACE, Tree(BASE, result or profile()), seed=0, **BRIEFING)


def test_profile_facts_vocabulary():
    ctx = context(profile(data_s=0.02, compute_s=0.06, optim_s=0.02))
    facts = profile_facts(ctx.tree.root, ctx)
    assert facts["accum_steps"] == 8  # 16 / (1 process * 2 per micro-batch)
    assert facts["device"] == "cpu"
    assert facts["data_share"] == pytest.approx(0.2)
    assert facts["optim_share"] == pytest.approx(0.2)
    assert facts["step_s"] == pytest.approx(0.1)
    assert 0.0 < facts["mem_headroom"] < 1.0
    assert facts["micro_batch_size"] == 2 and facts["baseline_micro_batch_size"] == 2


def test_analyst_proposes_from_the_playbook_with_rationale():
    ctx = context(profile(data_s=0.02, compute_s=0.06, optim_s=0.02))
    proposals = AnalystProposer(load_playbook(builtin=PLAYBOOK)).propose(ctx.tree.root, ctx, 4)
    by_rule = {p.rationale.split(" ")[0].rstrip(":"): p for p in proposals}
    # Accumulation with memory to spare: no accumulation at all, and (more careful) the next larger micro-batch.
    assert by_rule["no-accumulation"].edits == {"micro_batch_size": 16}
    assert by_rule["larger-micro-batch"].edits == {"micro_batch_size": 4}
    assert "accum_steps=8" in by_rule["larger-micro-batch"].rationale
    assert by_rule["foreach-optimizer"].edits == {"optimizer_impl": "foreach"}
    assert "optim_share=0.2" in by_rule["foreach-optimizer"].rationale
    assert by_rule["more-loader-workers"].edits == {"dataloader_workers": 1}  # the data wait is 20% of the step
    assert all(p.source == "analyst" for p in proposals)
    # One proposal per fired rule, in playbook order, before any rule gets a second.
    assert list(by_rule) == ["no-accumulation", "larger-micro-batch", "foreach-optimizer", "more-loader-workers"]
    # GPU rules do not fire on a CPU profile.
    assert not any(p.rationale.startswith(("bf16-on-gpu", "fused-optimizer")) for p in proposals)


def test_analyst_rules_follow_the_profile():
    ctx = context(profile(data_s=0.0, compute_s=0.05, optim_s=0.0))  # no optimizer or data time to win
    rules = {p.rationale.split(" ")[0].rstrip(":")
             for p in AnalystProposer(load_playbook(builtin=PLAYBOOK)).propose(ctx.tree.root, ctx, 3)}
    assert "foreach-optimizer" not in rules and "more-loader-workers" not in rules
    assert "larger-micro-batch" in rules


def test_analyst_never_proposes_a_recipe_already_tried():
    ctx = context()
    ctx.tree.add(BASE.with_(micro_batch_size=4), ctx.tree.root, "failed", 0.0)
    proposals = AnalystProposer(load_playbook(builtin=PLAYBOOK)).propose(ctx.tree.root, ctx, 10)
    recipes = [BASE.with_(**p.edits) for p in proposals]
    assert BASE.with_(micro_batch_size=4) not in recipes
    assert len({r.id for r in recipes}) == len(recipes)
    assert all(all(v in SPACE.values[k] for k, v in p.edits.items()) for p in proposals)


def test_to_action_evaluates_an_expression_and_needs_the_value_in_the_space():
    ctx = context()
    rule = Rule(name="r", when="True", why="w", action={"knob": "micro_batch_size", "to": "micro_batch_size * 4"})
    assert [p.edits for p in AnalystProposer([rule]).propose(ctx.tree.root, ctx, 3)] == [{"micro_batch_size": 8}]
    rule = Rule(name="r", when="True", why="w", action={"knob": "micro_batch_size", "to": "micro_batch_size * 3"})
    assert AnalystProposer([rule]).propose(ctx.tree.root, ctx, 3) == []  # 6 is not in the space


def test_user_playbook_rules_come_first(tmp_path):
    extra = tmp_path / "mine.yaml"
    extra.write_text("rules:\n  - name: two-threads\n    when: \"device == 'cpu'\"\n"
                     "    action: {knob: num_threads, set: 2}\n    why: my machine likes it\n")
    proposer = make_proposer("analyst", playbook=extra, builtin=PLAYBOOK)
    ctx = context()
    first = proposer.propose(ctx.tree.root, ctx, 1)[0]
    assert first.edits == {"num_threads": 2}
    assert first.rationale == "two-threads [device=\"cpu\"]: my machine likes it"


@pytest.mark.parametrize(("text", "field"), [
    ("rules:\n  - name: x\n    when: \"__import__('os')\"\n    action: {knob: a, set: 1}\n    why: y\n",
     "rules.0.when"),
    ("rules:\n  - name: x\n    action: {knob: a, set: 1, move: up}\n    why: y\n", "rules.0.action"),
    ("rules:\n  - name: x\n    action: {knob: a, set: 1}\n", "rules.0.why"),
    ("rules: [\n", ""),
])
def test_bad_playbook_names_the_field(tmp_path, text, field):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(PlaybookError) as err:
        load_playbook(bad)
    assert err.value.field == field and str(bad) in str(err.value)


def test_random_proposer_is_seeded_and_stays_in_the_space():
    a = RandomProposer(seed=7).propose(context().tree.root, context(), 4)
    b = RandomProposer(seed=7).propose(context().tree.root, context(), 4)
    c = RandomProposer(seed=8).propose(context().tree.root, context(), 4)
    assert [p.edits for p in a] == [p.edits for p in b]
    assert [p.edits for p in a] != [p.edits for p in c]
    for p in a:
        assert p.edits and all(v in SPACE.values[k] for k, v in p.edits.items())
    assert len({BASE.with_(**p.edits).id for p in a}) == 4


def test_random_proposer_stops_when_the_space_is_exhausted():
    small = SearchSpace.from_lists(WORKLOAD.knobs(), {"num_threads": [1, 2]})
    ctx = SearchContext(WORKLOAD, BASE, small, Tree(BASE, profile()), **BRIEFING)
    first = RandomProposer().propose(ctx.tree.root, ctx, 5)
    assert len(first) == 2  # threads 1 and 2 (0, the baseline's, is the root)
    for p in first:
        ctx.tree.add(BASE.with_(**p.edits), ctx.tree.root, "passed", 0.5)
    assert RandomProposer().propose(ctx.tree.root, ctx, 5) == []
