"""Campaign storage: an Optuna study plus artifact files, read back exactly as written."""

from __future__ import annotations

import json

import optuna
import pytest
import sqlalchemy as sa

from recipetune.core.recipe import Knob, KnobSet, Recipe, SearchSpace
from recipetune.engine.drivers import INTERRUPTED
from recipetune.engine.samplers import distributions
from recipetune.engine.store import CampaignStore

KNOBS = KnobSet([Knob("mbs", 1, choices=(1, 2, 4, 8)), Knob("impl", "loop", choices=("loop", "foreach")),
                 Knob("pin", False, choices=(False, True))])
BASE = KNOBS.resolve({})
SPACE = SearchSpace.from_lists(KNOBS, {"mbs": [2, 4], "impl": ["loop", "foreach"], "pin": [True]})


def test_distributions_cover_the_space_and_the_baseline():
    d = distributions(SPACE, BASE)
    assert d["mbs"].choices == (1, 2, 4)  # the baseline's 1 is not listed in the space but must be representable
    assert d["impl"].choices == ("loop", "foreach")
    assert d["pin"].choices == (False, True)


def test_round_trip(tmp_path):
    folder = tmp_path / "c"
    store = CampaignStore(folder)
    assert not store.exists() and not folder.exists()  # asking does not create anything
    store.create({"baseline_id": BASE.id, "space": {"mbs": [2, 4]}})
    dists = distributions(SPACE, BASE)

    good = BASE.with_(mbs=4, impl="foreach")
    n0 = store.begin(good, dists, {"parent": BASE.id, "proposer": "analyst", "rationale": "bigger"})
    store.set_running(n0, {"run_dir": str(store.run_dir(n0, good)), "ran": True})
    store.finish(n0, 1.8, {"status": "passed", "speedup": 1.8, "screening": {"passed": True, "gap": float("nan")}})
    bad = BASE.with_(pin=True)
    n1 = store.begin(bad, dists, {"parent": good.id, "proposer": "llm", "rationale": "pin it"})
    store.finish(n1, None, {"status": "failed", "cause": "crash: exit code 1"})
    n2 = store.begin(BASE.with_(mbs=2), dists, {"parent": BASE.id, "proposer": "analyst", "rationale": "r"})
    assert (n0, n1, n2) == (0, 1, 2)
    store.write_json("baseline_profile.json", {"tokens_per_s": 123.0})
    store.append_jsonl("rejected_proposals.jsonl", {"reason": "unknown knob 'x'"})
    store.append_jsonl("rejected_proposals.jsonl", {"reason": "malformed JSON"})

    # A second process (a resume) reads everything back.
    again = CampaignStore(folder)
    assert again.exists()
    meta, n = again.peek()
    assert meta["baseline_id"] == BASE.id and n == 3
    recs = again.records()
    assert [r.state for r in recs] == ["COMPLETE", "FAIL", "RUNNING"]
    assert recs[0].value == pytest.approx(1.8) and recs[0].recipe == good and recs[0].status == "passed"
    assert recs[0].attrs["screening"] == {"passed": True, "gap": None}  # NaN is not JSON: stored as null
    assert recs[1].attrs["cause"] == "crash: exit code 1" and recs[1].attrs["parent"] == good.id
    assert Recipe(recs[1].attrs["recipe"]).id == recs[1].attrs["recipe_id"] == bad.id
    interrupted = again.drivers.fail_interrupted()
    assert [r.number for r in interrupted] == [2]
    assert again.records()[2].state == "FAIL" and again.records()[2].attrs["cause"] == INTERRUPTED
    assert again.read_json("baseline_profile.json") == {"tokens_per_s": 123.0}
    lines = (folder / "rejected_proposals.jsonl").read_text().splitlines()
    assert [json.loads(x)["reason"] for x in lines] == ["unknown knob 'x'", "malformed JSON"]

    # Plain Optuna sees the knob values as parameters (what optuna-dashboard shows).
    study = optuna.load_study(study_name="recipetune", storage=f"sqlite:///{folder / 'study.db'}")
    assert study.trials[0].params == {"mbs": 4, "impl": "foreach", "pin": False}
    assert study.best_trial.number == 0


def test_any_sqlalchemy_url(tmp_path):
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    store = CampaignStore(tmp_path / "c", url)
    store.create({})
    n = store.begin(BASE, distributions(SPACE, BASE), {"parent": ""})
    store.finish(n, 1.0, {"status": "passed"})
    assert (tmp_path / "elsewhere.db").exists() and not (tmp_path / "c" / "study.db").exists()
    assert CampaignStore(tmp_path / "c", url).records()[0].value == 1.0


def test_ask_lets_the_sampler_choose(tmp_path):
    store = CampaignStore(tmp_path, sampler=optuna.samplers.RandomSampler(seed=1))
    store.create({})
    dists = distributions(SPACE, BASE)
    trial = store.ask(dists)
    recipe = BASE.with_(**trial.params)
    n = store.begin(recipe, dists, {"parent": BASE.id}, trial)
    store.finish(n, 1.1, {"status": "passed"})
    assert store.records()[0].recipe == recipe


def test_a_schema_another_process_stamped_meanwhile_is_used_not_a_crash(tmp_path, monkeypatch):
    """The race a campaign once lost on CI: `recipetune show` (or a second driver) opened the study
    file just as the campaign created it; both saw no schema version and both stamped it, and the
    second stamp failed (UNIQUE constraint failed: alembic_version.version_num)."""
    from optuna.storages._rdb.storage import _VersionManager

    real = _VersionManager._set_alembic_revision
    raced: list[str] = []

    def the_other_process_first(self, revision):  # type: ignore[no-untyped-def]
        if not raced:  # the other process's stamp lands between our look and our own insert
            raced.append(revision)
            real(self, revision)
            raise sa.exc.IntegrityError("INSERT INTO alembic_version", {}, Exception("UNIQUE constraint failed"))
        real(self, revision)

    monkeypatch.setattr(_VersionManager, "_set_alembic_revision", the_other_process_first)
    store = CampaignStore(tmp_path / "c")
    store.create({"baseline_id": BASE.id})
    assert raced and store.exists() and CampaignStore(tmp_path / "c").peek()[0]["baseline_id"] == BASE.id


def test_a_table_another_process_created_meanwhile_is_used_not_a_crash(tmp_path, monkeypatch):
    """The same race a step earlier (a fresh-clone CI run, a test polling a campaign being created):
    the other process created a table between Optuna's look and its CREATE TABLE, and SQLite said
    "table trial_user_attributes already exists"."""
    import sqlite3

    from optuna.storages._rdb import models

    metadata = models.BaseModel.metadata
    real = metadata.create_all
    raced: list[bool] = []

    def the_other_process_first(bind, **kw):  # type: ignore[no-untyped-def]
        real(bind, **kw)
        if not raced:
            raced.append(True)
            raise sa.exc.OperationalError("CREATE TABLE trial_user_attributes", {},
                                          sqlite3.OperationalError("table trial_user_attributes already exists"))

    monkeypatch.setattr(metadata, "create_all", the_other_process_first)
    store = CampaignStore(tmp_path / "c")
    store.create({"baseline_id": BASE.id})
    assert raced and store.exists() and CampaignStore(tmp_path / "c").peek()[0]["baseline_id"] == BASE.id


def test_a_schema_error_that_is_no_race_is_raised(tmp_path, monkeypatch):
    from optuna.storages._rdb import models

    def broken(bind, **kw):  # type: ignore[no-untyped-def]
        raise sa.exc.OperationalError("CREATE TABLE studies", {}, Exception("attempt to write a readonly database"))

    monkeypatch.setattr(models.BaseModel.metadata, "create_all", broken)
    with pytest.raises(sa.exc.OperationalError, match="readonly"):
        CampaignStore(tmp_path / "c").create({"baseline_id": BASE.id})


def test_an_interrupted_grid_point_goes_back_to_the_grid(tmp_path):
    # GridSampler counts a failed trial's point as visited; an interrupted trial measured nothing, so a
    # resumed grid campaign must still reach its point (found by 21 kills of a grid campaign, issue 44).
    grid = optuna.samplers.GridSampler({"mbs": [2, 4]}, seed=0)
    store = CampaignStore(tmp_path / "c", sampler=grid)
    store.create({"baseline_id": BASE.id, "space": {"mbs": [2, 4]}})
    dists = {"mbs": distributions(SPACE, BASE)["mbs"]}
    first = store.ask(dists)
    store.set_running(first.number, {"run_dir": "r0", "ran": True})
    done = store.ask(dists)
    store.finish(done.number, 1.0, {"status": "passed"})
    assert not grid.is_exhausted(store.study)  # the first point is still running

    again = CampaignStore(tmp_path / "c", sampler=optuna.samplers.GridSampler({"mbs": [2, 4]}, seed=0))
    assert [r.number for r in again.drivers.fail_interrupted()] == [first.number]
    assert not again.study.sampler.is_exhausted(again.study)  # its point was handed back
    retried = again.ask(dists)
    assert retried.params["mbs"] == first.params["mbs"]  # and it is the one drawn next


def test_a_resumed_grid_keeps_the_campaigns_order_of_points():
    # The study keeps a grid trial's id only: a resume seeded afresh must read the ids as the same points.
    from recipetune.engine.samplers import make_sampler

    first = make_sampler("grid", SPACE, BASE, seed=7, order_seed=7)
    resumed = make_sampler("grid", SPACE, BASE, seed=7 + 3, order_seed=7)
    assert resumed._all_grids == first._all_grids  # type: ignore[attr-defined]
    reseeded = make_sampler("grid", SPACE, BASE, seed=7 + 3)  # what a resume built before
    assert reseeded._all_grids != first._all_grids  # type: ignore[attr-defined]
