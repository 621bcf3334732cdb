"""Parallel search without a cluster: virtual loss, the resource model's arithmetic and refusals,
claims and heartbeats in the store (SQLite here; PostgreSQL in test_distributed_postgres.py)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from recipetune.core.errors import ConfigError
from recipetune.core.recipe import Recipe
from recipetune.engine.samplers import distributions
from recipetune.engine.store import CampaignStore
from recipetune.engine.tree import Tree
from recipetune.execute.config import ExecuteConfig, TrialResources

BASE = Recipe({"a": 1, "b": "x"})


def test_virtual_loss_spreads_parallel_selection_and_is_taken_back():
    tree = Tree(BASE)
    a = tree.add(BASE.with_(a=2), tree.root, "passed", 0.7)
    b = tree.add(BASE.with_(a=3), tree.root, "passed", 0.7)
    a.exhausted = b.exhausted = tree.root.exhausted = False
    first = tree.select()
    assert first in (a, b)
    tree.reserve(first)  # a trial under it is running: the next worker goes elsewhere
    second = tree.select()
    assert second is not first and second in (a, b)
    tree.reserve(second)
    assert tree.root.pending == 2 and first.pending == second.pending == 1
    tree.release(first)
    tree.release(second)
    assert tree.select() is first  # with nothing in flight, selection is what it was
    assert (tree.root.visits, a.visits, b.visits) == (3, 1, 1)  # virtual visits never became real ones


def test_placements_count_whole_bundles_per_node():
    from recipetune.execute.ray import placements

    nodes = [{"CPU": 64, "GPU": 8}, {"CPU": 64, "GPU": 8}, {"CPU": 16}]
    assert placements(TrialResources(cpus=8, gpus=4), nodes) == 4
    assert placements(TrialResources(cpus=8, gpus=8, nodes=2), nodes) == 1
    assert placements(TrialResources(cpus=8, gpus=2, nodes=2), nodes) == 4
    assert placements(TrialResources(cpus=8), nodes) == 18
    assert placements(TrialResources(cpus=1, custom={"ib": 1}), nodes) == 0


def test_capacity_refusals_name_the_knob():
    from recipetune.execute.ray import check_capacity

    nodes = [{"CPU": 64, "GPU": 8}]
    settings = ExecuteConfig(executor="ray", parallel=3, resources=TrialResources(cpus=4, gpus=4))
    with pytest.raises(ConfigError, match=r"--parallel: 3 trials in flight .* holds 2 at once"):
        check_capacity(settings, nodes, devices=4, file="c.yaml")
    with pytest.raises(ConfigError, match="execute.resources.gpus: the baseline runs on 8 devices"):
        check_capacity(settings.model_copy(update={"parallel": 1}), nodes, devices=8, file="c.yaml")
    with pytest.raises(ConfigError, match="execute.resources: no 2 node"):
        check_capacity(ExecuteConfig(resources=TrialResources(gpus=8, nodes=2)), nodes, devices=8, file="c.yaml")
    with pytest.raises(ValueError, match="whole number"):
        TrialResources(gpus=0.5)


def test_local_executor_refuses_parallel_trials(tmp_path, monkeypatch):
    from test_search_campaign import install_fakes_for, write_campaign_file

    from recipetune.cli import app

    install_fakes_for(monkeypatch)
    out = tmp_path / "campaign"
    res = CliRunner().invoke(app, ["tune", str(write_campaign_file(tmp_path)), "--parallel", "2", "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "--parallel" in res.output and "one trial at a time" in " ".join(res.output.split())
    assert not out.exists()


def test_claims_let_one_driver_have_a_recipe(tmp_path):
    store = CampaignStore(tmp_path / "c")
    store.create({})
    other = CampaignStore(tmp_path / "c")  # a second driver on the same study
    r = BASE.with_(a=5)
    assert store.drivers.claim(r) and not other.drivers.claim(r) and not store.drivers.claim(r)
    store.drivers.unclaim(r.id)
    assert other.drivers.claim(r)


def test_a_trial_without_heartbeat_is_failed_and_its_recipe_released(tmp_path):
    """A driver on another host that stops beating: its trial does not stay RUNNING."""
    store = CampaignStore(tmp_path / "c", heartbeat_s=30)
    store.create({})
    r = BASE.with_(a=7)
    assert store.drivers.claim(r)
    n = store.begin(r, distributions_for(r), {"parent": BASE.id})
    trial_id = store._open[n]._trial_id
    store.storage.set_trial_user_attr(trial_id, "driver", "another-host:4242")  # not this host: only beats tell
    live = CampaignStore(tmp_path / "c", heartbeat_s=30)
    assert live.drivers.fail_interrupted(mine=False) == []  # its last beat is fresh
    # ten minutes pass without a beat (the grace period is two beats, 60 s): the beat is made that old
    # rather than waited for, so neither a slow machine nor SQLite's whole-second stamps decide
    with store.storage.engine.begin() as conn:
        conn.execute(sa.text("UPDATE trial_heartbeats SET heartbeat = datetime(heartbeat, '-10 minutes') "
                             "WHERE trial_id = :t"), {"t": trial_id})
    failed = live.drivers.fail_interrupted(mine=False)
    assert [f.number for f in failed] == [n]
    assert failed[0].state == "FAIL" and failed[0].status == "interrupted"
    assert "another-host:4242 sent no heartbeat" in failed[0].attrs["cause"]
    assert live.drivers.claim(r)  # the recipe may run again


def distributions_for(recipe: Recipe):
    from recipetune.core.recipe import Knob, KnobSet, SearchSpace

    knobs = KnobSet([Knob("a", 1, "speed", choices=(1, 5, 7)), Knob("b", "x", "speed", choices=("x",))])
    return distributions(SearchSpace.from_lists(knobs, {"a": [1, 5, 7]}), BASE)
