"""The set-aside rule (engine/effects.py): each knob value's effect learned from every trial measured with
it, a timeout or an OOM as a bound, and a recipe predicted with confidence far slower than the incumbent
set aside until nothing else is left; each case beside the one built to fool it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recipetune.bench.replay import replay
from recipetune.bench.table import Table
from recipetune.core.recipe import Recipe, SearchSpace
from recipetune.engine.effects import Effects
from recipetune.engine.record import Evidence, Trial, failure_evidence
from recipetune.engine.tree import Tree

ROOT = Path(__file__).resolve().parents[1]
BASE = Recipe({"a": "a0", "b": "b0", "c": "c0", "d": "d0"})
SPACE = SearchSpace({"a": ("a0", "a1"), "b": ("b0", "b1"), "c": ("c0", "c1"), "d": ("d0", "d1")})
NOISE = 0.05  # the baseline's A/A noise the rule is told


def tree_of(*measured: tuple[dict, Evidence]) -> Tree:
    tree = Tree(BASE, None, score=1.0)
    for i, (edits, evidence) in enumerate(measured):
        ratio = evidence.ratio if not evidence.censored else None
        tree.add(BASE.with_(**edits), tree.root, "passed" if ratio else "failed", 0.5, score=ratio, trial=i,
                 evidence=evidence)
    return tree


def effects(tree: Tree, noise: float = NOISE) -> Effects:
    return Effects(tree, SPACE, noise, 0.5)


def test_one_timeout_sets_aside_the_value_next_to_other_knobs_not_the_knobs_themselves():
    # a1 timed out (at most 0.015x): the engineer's "bf16 is hopeless on this CPU", from one trial
    tree = tree_of(({"b": "b1"}, Evidence(1.3)), ({"a": "a1"}, Evidence(0.015, "timeout")))
    rule = effects(tree)
    aside = rule.judge(BASE.with_(a="a1", b="b1", c="c1"))
    assert aside is not None and aside.values == {"a": "a1"}
    assert [(m.trial, m.evidence.ratio, m.evidence.censored) for m in aside.measurements] == [(1, 0.015, "timeout")]
    assert "trial 1" in aside.line() and "at most 0.015x (timeout)" in aside.line()
    # what the slow value is not in may run: b1, c1 and their combination
    assert rule.judge(BASE.with_(b="b1", c="c1")) is None
    assert rule.judge(BASE.with_(c="c1")) is None  # never measured: no evidence, nothing set aside


def test_a_value_measured_slightly_slower_within_noise_is_never_set_aside_beside_one_far_slower():
    # 1-3 noise widths slower, in three contexts each: the mild one stays, the far one goes
    mild = math.exp(-2 * NOISE)
    tree = tree_of(({"a": "a1"}, Evidence(mild)), ({"a": "a1", "b": "b1"}, Evidence(mild * 1.2)),
                   ({"b": "b1"}, Evidence(1.2)), ({"c": "c1"}, Evidence(0.05)),
                   ({"c": "c1", "b": "b1"}, Evidence(0.06)), ({"d": "d1"}, Evidence(1.0)))
    rule = effects(tree)
    assert rule.judge(BASE.with_(a="a1", d="d1")) is None
    assert rule.judge(BASE.with_(a="a1", b="b1", d="d1")) is None
    assert rule.judge(BASE.with_(c="c1", d="d1")) is not None
    # the same slow trials under a noise as wide as the effect: nothing is certain enough
    assert effects(tree, noise=3.0).judge(BASE.with_(c="c1", d="d1")) is None


def test_an_interaction_a_value_slow_with_one_knob_is_still_tried_with_another():
    # a1 measured 0.35x next to b0; b1 alone is even. a1 with b1 may be the fastest (the interaction):
    # one measurement within the allowance for interactions does not set it aside ...
    tree = tree_of(({"a": "a1"}, Evidence(0.35)), ({"b": "b1"}, Evidence(1.0)))
    assert effects(tree).judge(BASE.with_(a="a1", b="b1")) is None
    # ... and where the measured trials show an interaction, the allowance grows with it
    inter = tree_of(({"a": "a1"}, Evidence(0.35)), ({"b": "b1"}, Evidence(1.0)), ({"c": "c1"}, Evidence(1.0)),
                    ({"a": "a1", "c": "c1"}, Evidence(0.35)), ({"b": "b1", "c": "c1"}, Evidence(1.0)),
                    ({"a": "a1", "d": "d1"}, Evidence(2.5)), ({"d": "d1"}, Evidence(1.0)))
    plain = tree_of(({"a": "a1"}, Evidence(0.35)), ({"b": "b1"}, Evidence(1.0)), ({"c": "c1"}, Evidence(1.0)),
                    ({"a": "a1", "c": "c1"}, Evidence(0.35)), ({"b": "b1", "c": "c1"}, Evidence(1.0)),
                    ({"a": "a1", "d": "d1"}, Evidence(0.35)), ({"d": "d1"}, Evidence(1.0)))
    assert effects(inter).fit().tau2 > effects(plain).fit().tau2  # type: ignore[union-attr]


def test_an_oom_is_evidence_of_a_recipe_too_big_and_a_crash_is_none():
    assert failure_evidence("oom", None) == Evidence(0.1, "oom")
    assert failure_evidence("timeout", 0.02) == Evidence(0.02, "timeout")
    assert failure_evidence("crash", 0.02) is None and failure_evidence("nan", None) is None
    tree = tree_of(({"a": "a1", "b": "b1"}, Evidence(0.1, "oom")), ({"b": "b1"}, Evidence(1.2)),
                   ({"d": "d1"}, Evidence(1.0)))
    assert effects(tree).judge(BASE.with_(a="a1", b="b1", d="d1")) is not None


def test_the_incumbent_raises_the_bar_and_zero_turns_the_rule_off():
    # 0.3x is above half the baseline's speed's optimistic end, but far below half of a 3x incumbent
    slow = (({"a": "a1"}, Evidence(0.3)), ({"a": "a1", "c": "c1"}, Evidence(0.3)), ({"c": "c1"}, Evidence(1.0)),
            ({"d": "d1"}, Evidence(1.0)))
    alone = tree_of(*slow)
    assert effects(alone).judge(BASE.with_(a="a1", d="d1")) is None
    fast = tree_of(*slow, ({"b": "b1"}, Evidence(3.0)), ({"b": "b1", "c": "c1"}, Evidence(3.0)))
    assert effects(fast).judge(BASE.with_(a="a1", d="d1")) is not None
    assert Effects(fast, SPACE, NOISE, 0.0).judge(BASE.with_(a="a1", d="d1")) is None


def test_a_trial_keeps_its_evidence_and_a_resume_reads_it_back():
    stored = {"status": "failed", **Evidence(0.02, "timeout").stored()}
    assert Trial[Trial.model_fields["figures"].annotation].model_validate(  # type: ignore[name-defined]
        {**stored, "figures": {}}).evidence() == Evidence(0.02, "timeout")
    assert Trial.model_validate({"status": "passed", "figures": {}}).evidence() is None  # written before: none


# -- through the engine's loop, against a planted table -------------------------------------------


def planted(speed) -> Table:  # noqa: ANN001
    """The reference table's space, every recipe's three repeats at ``speed(values)`` times the baseline's
    (within 2%)."""
    return Table.load(ROOT / "benchmarks" / "results" / "table-reference.json").planted(speed)


def common(v: dict) -> float:
    return ({1: 1.0, 4: 1.25, 16: 1.4}[v["micro_batch_size"]] * (1.05 if v["optimizer_impl"] == "foreach" else 1.0)
            * (0.9 if v["activation_checkpointing"] == "selective" else 1.0)
            * (0.97 if v["dataloader_workers"] == 1 else 1.0))


@pytest.mark.slow
def test_a_search_tries_a_value_far_slower_once(tmp_path):
    # math attention 25x slower everywhere (bf16 on this CPU): 5 and 6 of 20 trials on it without the rule
    table = planted(lambda v: common(v) * (0.04 if v["attention"] == "math" else 1.0))
    for seed in (0, 1):
        before = replay(table, "mcts-analyst", 20, seed, set_aside=0.0)
        after = replay(table, "mcts-analyst", 20, seed)
        assert sum(t.true < 0.5 for t in before.trials) >= 4
        assert sum(t.true < 0.5 for t in after.trials) == 1
        best = table.best().tokens_per_s() / table.baseline_entry().tokens_per_s()
        assert after.to_reach(0.98 * best)[0] == before.to_reach(0.98 * best)[0]


@pytest.mark.slow
def test_an_interaction_found_without_the_rule_is_found_with_it(tmp_path):
    # math attention is 0.3x with activation checkpointing off, 1.6x with it on: the best recipe has both
    def speed(v: dict) -> float:
        math_ = 1.6 if v["activation_checkpointing"] == "selective" else 0.3
        return common(v) * (math_ if v["attention"] == "math" else 1.0)

    table = planted(speed)
    best = table.best().tokens_per_s() / table.baseline_entry().tokens_per_s()
    for seed in (0, 2):
        before, after = (replay(table, "tpe", 20, seed, set_aside=s) for s in (0.0, 0.5))
        reached = after.to_reach(0.98 * best)[0]
        assert reached is not None and reached == before.to_reach(0.98 * best)[0]


@pytest.mark.slow
def test_set_aside_recipes_run_when_nothing_else_is_left(tmp_path):
    # a budget larger than the space: what was set aside runs last, so every feasible recipe runs
    table = planted(lambda v: common(v) * (0.04 if v["attention"] == "math" else 1.0))
    n = sum(1 for e in table.entries if e.feasible and e.runs) - 1
    trials = replay(table, "mcts-random", n + 5, 0).trials
    assert len({t.recipe_id for t in trials}) == n
    slow = [i for i, t in enumerate(trials) if t.true < 0.5]
    early = [i for i in slow if i < len(trials) - len(slow)]  # before the end: what taught the rule
    # random draws move several knobs at once: two of them before the model can tell which value is slow
    assert 1 <= len(early) <= 2 and slow[len(early):] == list(range(len(trials) - len(slow) + len(early), len(trials)))


def test_the_report_lists_what_was_set_aside_and_on_which_trials(tmp_path):
    from recipetune.core.filenames import SET_ASIDE
    from recipetune.report.model import set_aside_rows
    from recipetune.report.sources import CampaignFiles
    from recipetune.report.terminal import set_aside_lines

    tree = tree_of(({"b": "b1"}, Evidence(1.3)), ({"a": "a1"}, Evidence(0.015, "timeout")))
    aside = effects(tree).judge(BASE.with_(a="a1", b="b1"))
    assert aside is not None
    lines = [json.dumps({"source": "analyst", **aside.record()})] * 2  # announced twice: listed once
    (tmp_path / SET_ASIDE).write_text("\n".join(lines) + "\n")
    files = CampaignFiles(tmp_path, {}, {}, {}, [], {}, None, [], None, [],
                          set_aside=[json.loads(line) for line in lines])
    rows = set_aside_rows(files)
    assert len(rows) == 1 and rows[0].values == 'a="a1"'
    assert rows[0].measured == 'trial 1 (a="a1"): at most 0.015x (timeout)'
    from recipetune.report.model import Report  # noqa: F401 (the field the HTML and terminal read)
    text = " ".join(str(t) for t in set_aside_lines(type("R", (), {"set_aside": rows})()))  # type: ignore[arg-type]
    assert "trial 1" in text and 'a="a1"' in text


def test_a_timeout_bounds_the_trial_by_its_own_tokens_and_what_its_steps_measured(tmp_path):
    # speed/job.py: SpeedJob.bound. A trial that timed out trained fewer than its tokens in run.timeout_s: its
    # speed-up is at most tokens / timeout over the baseline's rate, counted with the trial's own tokens a step
    # (not the baseline's), raised to what its measured steps showed before the kill
    import test_search_campaign as t

    from recipetune.core.measure import RunResult, StepRecord
    from recipetune.speed.job import SpeedJob

    camp = t.make_campaign(tmp_path, {"speed": [1, 2]})
    job = SpeedJob(t.plan(camp, tmp_path / "campaign", False), t.FakeGuard())
    base = RunResult(recipe=dict(camp.baseline), recipe_id=camp.baseline.id, status="ok",
                     steps=[StepRecord(step=i, loss=1.0, tokens=100, step_time_s=0.01) for i in range(1, 5)])
    job.profile = t.Profile(recipe=dict(camp.baseline), runs=[base], tokens_per_s=10_000.0)
    recipe = camp.baseline.with_(speed=2)
    timeout, steps = camp.config.run.timeout_s, camp.config.search.steps_per_trial
    silent = RunResult(recipe=dict(recipe), recipe_id=recipe.id, status="timeout")
    assert job.bound(silent, recipe) == pytest.approx(steps * 100 / timeout / 10_000)
    bigger = [StepRecord(step=i, loss=1.0, tokens=400, step_time_s=1.0) for i in range(1, 3)]
    started = silent.model_copy(update={"steps": bigger, "warmup_steps": 2})  # 4x the tokens a step: 4x the bound
    assert job.bound(started, recipe) == pytest.approx(4 * steps * 100 / timeout / 10_000)
    fast = [StepRecord(step=i, loss=1.0, tokens=400, step_time_s=0.001) for i in range(1, 31)]
    measured = silent.model_copy(update={"steps": fast, "warmup_steps": 2})  # killed after a slow start
    assert job.bound(measured, recipe) == pytest.approx(400_000 / 10_000, rel=0.01)


# -- a running trial its own reports show far slower (Effects.stop) -----------------------------------


def test_a_running_trial_is_stopped_only_when_its_own_optimistic_end_is_below_the_bar():
    # the incumbent measured 1.8x: the bar is 0.9x the baseline's speed. A report's ``upper`` is its
    # optimistic end (speed/job.py: SpeedJob.windows, two spreads above what it read)
    fast = tree_of(({"b": "b1"}, Evidence(1.8)), ({"b": "b1", "c": "c1"}, Evidence(1.8)))
    rule = effects(fast)
    rule.settle()
    bar = 0.5 * rule.settled
    assert 1.6 < rule.settled < 1.8  # the pessimistic end of the incumbent's estimate, not its best draw
    assert rule.stop(0.98 * bar) and "below 0.5 of the incumbent's" in rule.stop(0.98 * bar)
    assert rule.stop(1.02 * bar) == ""  # could still be half the incumbent's speed: it runs on
    # one lucky draw of 1.9x beside trials that say 1.0x raises the bar far less than to 1.9x
    lucky = effects(tree_of(({"b": "b1"}, Evidence(1.9)), ({"c": "c1"}, Evidence(1.0))), noise=0.48)
    lucky.settle()
    assert lucky.settled < 1.2
    # with the baseline the only incumbent, the bar is half its speed: a trial read at 0.45x whose
    # optimistic end reaches 0.55x runs on; one whose end is 0.49x stops
    alone = effects(tree_of())
    alone.settle()
    assert alone.stop(0.55) == "" and alone.stop(0.49)
    assert Effects(fast, SPACE, NOISE, 0.0).stop(0.01) == ""  # the rule off: nothing stops


@pytest.mark.parametrize(("slower", "stops"), [(0.25, True), (0.45, True), (0.52, False), (1.0, False)])
def test_a_speed_report_at_the_edge_of_the_bar(slower, stops):
    # SpeedJob.windows at 2% A/A noise and steady steps: a trial read at 0.45x has an optimistic end under
    # half the baseline's speed and stops; one at 0.52x could be half as fast and runs on
    import test_pruning

    from recipetune.core.measure import StepRecord

    steps = [StepRecord(step=i, loss=1.0, tokens=100, step_time_s=0.1 / slower) for i in range(1, 41)]
    rule = effects(tree_of())
    rule.settle()
    assert all(bool(rule.stop(r["upper"])) == stops for r in test_pruning.speed_reports(steps))


def test_without_a_pruner_a_speed_trial_far_slower_is_stopped_as_it_runs_and_an_equal_one_is_not(tmp_path):
    from test_pruning import delay_trials, steps_run

    trials = delay_trials(tmp_path, "")  # the defaults: no pruner, search.set_aside 0.5
    slow = [r for (delay, _), r in trials.items() if delay == 0.04]
    assert slow and all(r.status == "pruned" for r in slow)  # 4x slower: stopped by the set-aside rule
    assert all("set aside as it ran" in r.attrs["cause"] for r in slow)
    assert all(steps_run(r) < 40 for r in slow)
    assert trials[(0.01, "b")].status == "passed"  # as fast as the baseline: never stopped
