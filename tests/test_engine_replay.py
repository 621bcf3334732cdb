"""The one search loop, run against stored tables: the same trees as before the redesign, tables from
an older knob set brought up to date (or refused), the plain baselines through the same loop."""

from __future__ import annotations

import json
import random
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


def test_a_table_from_an_older_knob_set_is_brought_up_to_date_with_a_note():
    table = Table.load(ROOT / "benchmarks" / "table-reference.json")  # measured before tp, dp_* existed
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
    table = Table.load(ROOT / "benchmarks" / "table-command-fake.json")
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
    table = Table.load(ROOT / "benchmarks" / "table-command-fake.json")
    oracle = Oracle(table, random.Random(0), tmp_path / "runs")
    traj, outcome, store = run_replay(oracle, strategy, 10, 0, tmp_path / "campaign")
    ran = [r for r in store.records() if r.attrs.get("ran")]
    assert outcome.runs == len(ran) == len(traj.trials) <= 10
    assert len({r.attrs["recipe_id"] for r in ran}) == len(ran)  # the loop never runs a recipe twice
    assert all(r.attrs["proposer"] == strategy for r in ran)
    store.storage.engine.dispose()
