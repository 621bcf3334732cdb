"""The one search loop, run against stored tables: the same trees as before the redesign, tables from
an older knob set brought up to date (or refused), the plain baselines through the same loop."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recipetune.bench.replay import Oracle, replay, run_replay
from recipetune.bench.table import Table
from recipetune.cli import app
from recipetune.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BEFORE = json.loads((ROOT / "tests" / "fixtures" / "engine_trees_8a0225a.json").read_text())


def trees(record: dict, tmp_path: Path) -> dict:
    """The study's trials of one replay, as tests/fixtures/engine_trees_8a0225a.py recorded them."""
    table = Table.load(ROOT / record["table"])
    strategy, seed = record["strategy"], record["seed"]
    oracle = Oracle(table, random.Random(f"{table.name}-{strategy}-{seed}"), tmp_path / "runs")
    name = "mcts-analyst" if strategy == "mcts" else strategy
    _, outcome, store = run_replay(oracle, name, record["budget"], seed, tmp_path / "campaign")
    trials = [{"trial": r.number, "recipe_id": r.recipe.id if "recipe" in r.attrs else None,
               "parent": r.attrs.get("parent"), "status": r.attrs.get("status"), "score": r.attrs.get("score"),
               "source": r.attrs.get("proposer")} for r in sorted(store.records(), key=lambda r: r.number)]
    store.storage.engine.dispose()
    return {**record, "runs": outcome.runs, "trials": trials}


@pytest.mark.parametrize("i", range(len(BEFORE)), ids=[f"{r['strategy']}-seed{r['seed']}" for r in BEFORE])
def test_the_same_campaign_on_the_same_seed_gives_the_same_tree_as_before(i, tmp_path):
    # Recorded by the engine of 8a0225a (Search.mcts / Search.optuna) on the same table: every trial,
    # its parent, status, score and proposer, in order; duplicates a sampler asked for included.
    before = BEFORE[i]
    assert trees(before, tmp_path) == before


def test_a_replay_hangs_neither_on_rounding_nor_on_the_clock(tmp_path, monkeypatch):
    """Another CPU rounds numpy's log and sums in their last bits otherwise, and a busy machine makes
    the loop's clock jump: neither may change the tree. A few ulps of noise on TPE's log-densities
    changed this tree from its sixth trial before TPE's ties were settled (engine/samplers.py:
    StableTPE); here the clock also jumps 10 s at every reading, so the loop syncs the study at
    every turn."""
    import time
    from types import SimpleNamespace

    import numpy as np
    from optuna.samplers._tpe.parzen_estimator import _ParzenEstimator

    from recipetune.engine import loop, stopping, trials

    ulps = np.random.default_rng(0)
    log_pdf = _ParzenEstimator.log_pdf
    monkeypatch.setattr(_ParzenEstimator, "log_pdf", lambda self, samples: log_pdf(self, samples) * (
        1 + ulps.integers(-4, 5, size=len(next(iter(samples.values())))) * np.finfo(float).eps))
    clock = iter(range(0, 10**9, 10))
    fake = SimpleNamespace(monotonic=lambda: float(next(clock)), sleep=time.sleep)
    for module in (loop, trials, stopping):  # the loop, a trial's landing, the budget: one clock
        monkeypatch.setattr(module, "time", fake)
    before = next(r for r in BEFORE if r["strategy"] == "tpe" and r["seed"] == 1)
    assert trees(before, tmp_path) == before


def test_a_table_from_an_older_knob_set_is_brought_up_to_date_with_a_note():
    table = Table.load(ROOT / "benchmarks" / "results" / "table-reference.json")  # measured before tp, dp_* existed
    workload = table.make_workload()
    assert not workload.relations().feasible(table.recipe(table.baseline_entry()))  # as stored: unusable
    current, [note] = table.up_to_date(workload)
    assert "tp" in note and "dp_shard" in note and "defaults are assumed" in note
    assert current.baseline["tp"] == 1 and workload.relations().feasible(current.recipe(current.baseline_entry()))
    assert len(current.entries) == len(table.entries) and current.baseline_entry().runs == table.baseline_entry().runs
    # every sampler now runs trials (on main before this, tpe/random/grid ran 0 and said nothing)
    for strategy in ("tpe", "grid"):
        traj = replay(table, strategy, 8, seed=0)
        assert len(traj.trials) == 8 and len({t.recipe_id for t in traj.trials}) == 8


def test_a_table_with_a_knob_the_workload_no_longer_has_is_refused(tmp_path):
    table = Table.load(ROOT / "benchmarks" / "results" / "table-command-fake.json")
    stale = table.model_copy(update={"baseline": {**table.baseline, "fused_adam": True}})
    with pytest.raises(ConfigError, match="fused_adam.*not knobs of the command workload now"):
        stale.up_to_date(stale.make_workload(), "t.json")
    path = tmp_path / "t.json"
    stale.save(path)
    res = CliRunner().invoke(app, ["bench", "replay", str(path), "--seeds", "1", "--out", str(tmp_path / "r.json")])
    assert res.exit_code == 2 and "fused_adam" in res.output and not (tmp_path / "r.json").exists()


def test_a_json_that_is_not_a_table_names_every_missing_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "entries": "none"}))
    res = CliRunner().invoke(app, ["bench", "replay", str(bad)])
    out = " ".join(res.output.split())
    assert res.exit_code == 2 and "Traceback" not in res.output
    for name in ("workload", "baseline", "space", "steps", "entries"):
        assert name in out, (name, out)


@pytest.mark.parametrize("strategy", ["greedy", "sequential"])
def test_the_plain_baselines_run_through_the_engine(strategy, tmp_path):
    table = Table.load(ROOT / "benchmarks" / "results" / "table-command-fake.json")
    oracle = Oracle(table, random.Random(0), tmp_path / "runs")
    traj, outcome, store = run_replay(oracle, strategy, 10, 0, tmp_path / "campaign")
    ran = [r for r in store.records() if r.attrs.get("ran")]
    assert outcome.runs == len(ran) == len(traj.trials) <= 10
    assert len({r.attrs["recipe_id"] for r in ran}) == len(ran)  # the loop never runs a recipe twice
    assert all(r.attrs["proposer"] == strategy for r in ran)
    store.storage.engine.dispose()


def test_a_replay_with_pruning_stops_only_runs_two_aa_spreads_below_the_median(tmp_path):
    """The speed job's windows in a replay (each the drawn run's rate; a table holds whole-run
    figures): a run stops only when even two A/A spreads of the baseline's repeats above its rate
    stays below the median of the finished trials at that window, and it costs only what it ran.
    command-fake's baseline repeats spread ~48%, so only a recipe near half the speed can stop."""
    import optuna

    table = Table.load(ROOT / "benchmarks" / "results" / "table-command-fake.json")
    oracle = Oracle(table, random.Random("command-fake-mcts-analyst-3"), tmp_path / "runs")
    traj, _, store = run_replay(oracle, "mcts-analyst", 10, 3, tmp_path / "campaign", pruner="median")
    trials = store.study.get_trials(deepcopy=False)
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned and len(pruned) == sum(t.status == "pruned" for t in traj.trials)
    for t in pruned:
        step = max(t.intermediate_values)
        finished = [f.intermediate_values[step] for f in trials if f.state == optuna.trial.TrialState.COMPLETE
                    and step in f.intermediate_values and f.number < t.number] + [store.reference()[step]]
        upper = t.intermediate_values[step] * (1 + 2 * oracle.noise)
        assert upper < statistics.median(finished)  # (the baseline's reference among them)
    for t in traj.trials:
        if t.status == "pruned":
            full = max(m.wall_s for m in oracle.entries[t.recipe_id].runs)
            assert t.observed is None and 0 < t.cost_s < full  # stopped early: no incumbent, less cost
    store.storage.engine.dispose()


def test_a_stopped_recipe_is_never_counted_as_reached():
    from recipetune.bench.replay import Trajectory, Trial

    traj = Trajectory("mcts-analyst", 0, [Trial("a", "pruned", None, 2.0, 1.0), Trial("b", "passed", 1.9, 2.0, 3.0)])
    assert traj.to_reach(1.99) == (2, 4.0)  # the pruned one cost its time, the second one reached it
    assert traj.incumbent(1) == 1.0


@pytest.mark.parametrize("strategy", ["tpe", "mcts-analyst"])
def test_pruning_that_stops_nothing_changes_nothing_a_search_draws(strategy, tmp_path):
    """reference's baseline repeats spread so far (3.6x to 0.5x of their median) that no window can
    be shown slower: with the pruner on, the study also holds the baseline's reference curve, and a
    model sampler must not read it as a trial (TPE counted it toward its startup trials when the
    curve was a trial of the study)."""
    table = Table.load(ROOT / "benchmarks" / "results" / "table-reference.json")
    seen = {}
    for pruner in ("none", "median"):
        oracle = Oracle(table, random.Random(f"reference-{strategy}-1"), tmp_path / pruner / "runs")
        traj, _, store = run_replay(oracle, strategy, 12, 1, tmp_path / pruner / "campaign", pruner=pruner)
        store.storage.engine.dispose()
        seen[pruner] = [(t.recipe_id, t.status, t.observed) for t in traj.trials]
    assert all(status != "pruned" for _, status, _ in seen["median"])
    assert seen["median"] == seen["none"]
