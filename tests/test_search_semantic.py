"""The global batch as a searched knob, bounded by a measured critical batch size (search.global_batch).

Pure logic on the rule, bad campaign files through the CLI (exit 2, nothing written), and whole
campaigns with the real guard on an in-process workload: the reference trainer's knobs, invariants
and checks, but a run is a synthetic loss curve that depends only on the tokens seen and the seed,
and a step time that grows with sqrt(batch), so a larger batch is faster at equal loss per token.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from recipetune.cbs.table import load_table, summarize, write_summary
from recipetune.config import Campaign, CampaignConfig
from recipetune.core.batch import cbs_bound
from recipetune.core.errors import ConfigError
from recipetune.core.measure import EvalRecord, RunResult, StepRecord, default_warmup_steps
from recipetune.core.recipe import Recipe
from recipetune.engine.job import Reporter
from recipetune.speed.job import run
from recipetune.speed.plan import plan
from recipetune.speed.semantic import RULE, BatchRule, batch_rule
from recipetune.workloads.reference import ReferenceWorkload

BASELINE = {"model": "nano", "data": "stdlib", "seq_len": 32, "global_batch_size": 16, "micro_batch_size": 16,
            "lr": 0.002, "num_threads": 1}
STEPS = 40  # of the baseline profile's runs; a trial at the baseline's batch runs half


class TokenWorkload(ReferenceWorkload):
    """The reference workload's knobs and checks; a run is computed, not trained."""

    def run(self, recipe, steps, out_dir, timeout_s=None, progress=None, extra_args=None) -> RunResult:
        tokens = int(recipe["global_batch_size"]) * int(recipe["seq_len"])

        def loss(step: int) -> float:  # a function of tokens seen; each seed a little apart
            return 2.0 + 2.0 * math.exp(-step * tokens / 4096) + 0.01 * int(recipe["seed"])

        result = RunResult(
            recipe=dict(recipe), recipe_id=recipe.id, status="ok", warmup_steps=default_warmup_steps(steps),
            steps=[StepRecord(step=s, loss=loss(s), tokens=tokens,
                              step_time_s=1e-3 * math.sqrt(int(recipe["global_batch_size"])))
                   for s in range(1, steps + 1)],
            evals=[EvalRecord(step=steps, val_loss=loss(steps))], out_dir=str(out_dir),
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        result.save(out_dir / "result.json")
        return result


def write_cbs_summary(folder: Path, steps: dict[int, float]) -> Path:
    """A summary.json as `recipetune cbs fit` writes it, from steps-to-target per batch size."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "points.csv").write_text("batch_size,steps\n" + "".join(f"{b},{s}\n" for b, s in steps.items()))
    write_summary(summarize(load_table(folder / "points.csv")), folder)
    return folder / "summary.json"


# S(B) = a + b/B with a floor: B* = b/(5a) + 1.2 * 4, about 13 sequences
SATURATING = {4: 2250, 16: 690, 64: 320, 256: 235}
LINEAR_ALL_THE_WAY = {4: 2000, 16: 480, 64: 110, 256: 20}  # no floor in range: B* unbounded


def make_campaign(tmp_path: Path, knobs: dict[str, list], **search: Any) -> Campaign:
    config = CampaignConfig.model_validate({
        "baseline": BASELINE, "run": {"steps": STEPS},
        "guard": {"parity": {"steps": STEPS, "seeds": 3}, "speed": {"pairs": 3, "steps": 8}},
        "search": {"knobs": knobs, "steps_per_trial": STEPS // 2, "budget": {"trials": 6}, **search},
    })
    workload = TokenWorkload()
    return Campaign(tmp_path / "camp.yaml", config, workload, workload.resolve(BASELINE))


# -- the rule ------------------------------------------------------------------------------------------


RULE_16 = BatchRule("global_batch_size", "lr", b0=16, lr0=0.002, bound=64, source="search.global_batch.max",
                    scaling="sqrt")
BASE = TokenWorkload().resolve(BASELINE)


@pytest.mark.parametrize(("scaling", "factor"), [("sqrt", 2.0), ("linear", 4.0), ("none", 1.0)])
def test_lr_follows_the_batch(scaling, factor):
    rule = BatchRule(**{**vars(RULE_16), "scaling": scaling})
    coupled, note = rule.couple(BASE.with_(global_batch_size=64))
    assert coupled["lr"] == pytest.approx(0.002 * factor) and coupled["global_batch_size"] == 64
    assert (note == "") == (scaling == "none")
    if note:
        assert f"lr 0.002 -> {0.002 * factor:.6g}" in note and scaling in note and "16 -> 64" in note
    assert rule.couple(coupled) == (coupled, "")  # idempotent: a coupled recipe is left alone
    assert rule.couple(BASE) == (BASE, "")  # k = 1: nothing to do


def test_only_the_exact_coupled_lr_is_allowed():
    coupled, _ = RULE_16.couple(BASE.with_(global_batch_size=32))
    assert RULE_16.allow(coupled, ["global_batch_size"]) == ["global_batch_size", "lr"]
    assert RULE_16.allow(coupled.with_(lr=0.003), ["global_batch_size"]) == ["global_batch_size"]
    assert RULE_16.allow(BASE.with_(lr=0.003), ["global_batch_size"]) == ["global_batch_size"]
    assert RULE_16.trial_steps(BASE.with_(micro_batch_size=8), 20, 60) == 20  # the baseline's batch: as asked
    assert RULE_16.trial_steps(coupled, 20, 60) == 30  # else the profile's tokens
    assert RULE_16.trial_steps(BASE.with_(global_batch_size=4096), 20, 60) == 2


def test_a_global_batch_above_the_bound_is_a_violation():
    assert RULE_16.violations(BASE.with_(global_batch_size=64)) == []
    [v] = RULE_16.violations(BASE.with_(global_batch_size=128))
    assert (v.knob, v.rule) == ("global_batch_size", "above-critical-batch-size")
    assert "128" in v.message and "64" in v.message and "search.global_batch.max" in v.message
    # A baseline already above the bound may shrink towards it, never grow.
    above = BatchRule(**{**vars(RULE_16), "b0": 128})
    assert above.violations(BASE.with_(global_batch_size=96)) == []
    assert above.violations(BASE.with_(global_batch_size=256))[0].rule == RULE


# -- the campaign file --------------------------------------------------------------------------------


def test_the_bound_is_read_from_a_cbs_summary(tmp_path):
    summary = write_cbs_summary(tmp_path / "cbs", SATURATING)
    camp = make_campaign(tmp_path, {"global_batch_size": [16, 32]}, allow_semantic=["global_batch_size"],
                         global_batch={"cbs_summary": "cbs/summary.json"})  # relative to the campaign file
    rule = batch_rule(camp)
    g = json.loads(summary.read_text())["groups"][0]
    assert rule is not None and rule.bound == cbs_bound(summary) == math.floor(g["b_star_ci95"][0])
    assert str(summary) in rule.source and "95% CI" in rule.source and (rule.b0, rule.lr0) == (16, 0.002)
    loose = make_campaign(tmp_path, {"global_batch_size": [16, 32]}, allow_semantic=["global_batch_size"],
                          global_batch={"cbs_summary": str(summary), "conservative": False})
    assert batch_rule(loose).bound == math.floor(g["b_star"]) >= rule.bound
    given = make_campaign(tmp_path, {"global_batch_size": [16, 32]}, allow_semantic=["global_batch_size"],
                          global_batch={"cbs_summary": "missing.json", "max": 48})
    assert (batch_rule(given).bound, batch_rule(given).source) == (48, "search.global_batch.max")  # max wins
    assert batch_rule(make_campaign(tmp_path, {"micro_batch_size": [8, 16]})) is None


def write_campaign_file(tmp_path: Path, **search: Any) -> Path:
    f = tmp_path / "camp.yaml"
    f.write_text(yaml.safe_dump({
        "baseline": BASELINE, "run": {"steps": 4},
        "search": {"knobs": {"global_batch_size": [16, 32]}, "allow_semantic": ["global_batch_size"], **search},
    }))
    return f


@pytest.mark.parametrize(("search", "field", "says"), [
    ({"global_batch": None}, "search.allow_semantic", "critical batch size"),
    ({"global_batch": {"lr_scaling": "sqrt"}}, "search.allow_semantic", "search.global_batch.max"),
    ({"global_batch": {"cbs_summary": "nowhere/summary.json"}}, "search.global_batch.cbs_summary", "no such file"),
    ({"global_batch": {"cbs_summary": "unbounded/summary.json"}}, "search.global_batch.cbs_summary", "not finite"),
    ({"global_batch": {"max": 64, "lr_scaling": "cubic"}}, "search.global_batch.lr_scaling", "sqrt"),
    ({"global_batch": {"max": 0}}, "search.global_batch.max", "must be >= 1 (got 0)"),
    ({"global_batch": {"max": 64}, "allow_semantic": [], "knobs": {"micro_batch_size": [8, 16]}},
     "search.global_batch", "no effect unless"),
    ({"global_batch": {"max": 64}, "knobs": {"global_batch_size": [16, 32], "lr": [0.001, 0.002]},
      "allow_semantic": ["global_batch_size", "lr"]}, "search.knobs.lr", "lr_scaling: none"),
    ({"global_batch": {"max": 64, "lr_knob": "learning_rate"}}, "search.global_batch.lr_knob", "learning_rate"),
])
def test_bad_global_batch_settings_exit_2_naming_the_field(tmp_path, search, field, says):
    from recipetune.cli import app

    write_cbs_summary(tmp_path / "unbounded", LINEAR_ALL_THE_WAY)
    out = tmp_path / "campaign"
    res = CliRunner().invoke(app, ["tune", str(write_campaign_file(tmp_path, **search)), "--out", str(out)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert field in text and says in text and not out.exists()


# -- whole campaigns with the real guard ---------------------------------------------------------------


def test_campaign_scales_lr_rejects_above_the_cbs_and_judges_at_equal_tokens(tmp_path):
    camp = make_campaign(tmp_path, {"global_batch_size": [16, 32, 128, 256]}, strategy="grid",
                         allow_semantic=["global_batch_size"], global_batch={"max": 128})
    p = plan(camp, tmp_path / "campaign")
    outcome = run(p, reporter=Reporter())
    recs = {r.attrs["recipe"]["global_batch_size"]: r for r in p.store.records() if r.status != "duplicate"}
    assert set(recs) == {32, 128, 256}

    rejected = recs[256].attrs
    assert rejected["status"] == "rejected" and not rejected["ran"]
    assert [v["rule"] for v in rejected["violations"]] == [RULE]
    assert "256" in rejected["cause"] and "bound 128" in rejected["cause"]

    for batch in (32, 128):
        a = recs[batch].attrs
        k = batch / 16
        assert a["recipe"]["lr"] == pytest.approx(0.002 * math.sqrt(k))  # set before the static check
        assert a["coupled"] in a["rationale"] and "sqrt rule" in a["coupled"]
        assert a["status"] == "passed" and a["steps"] == STEPS // k  # the tokens of the baseline profile
        assert a["screening"]["mode"] == "equal tokens"
        assert len(RunResult.load(Path(a["run_dir"]) / "result.json").steps) == STEPS // k

    assert outcome.decision == "APPROVED" and outcome.winner.recipe["global_batch_size"] == 128
    verdict = outcome.verdict
    assert verdict.allowed_semantic == ["global_batch_size", "lr"] and verdict.parity["mode"] == "equal tokens"
    assert json.loads((p.store.folder / "verdict.json").read_text())["recipe"]["lr"] == pytest.approx(0.002 * 8**0.5)

    # The bound is part of the campaign: a resume under another one is refused.
    changed = make_campaign(tmp_path, {"global_batch_size": [16, 32, 128, 256]}, strategy="grid",
                            allow_semantic=["global_batch_size"], global_batch={"max": 64})
    with pytest.raises(ConfigError, match="global_batch"):
        plan(changed, tmp_path / "campaign", resume=True)


def test_tree_search_couples_before_it_deduplicates(tmp_path):
    camp = make_campaign(tmp_path, {"global_batch_size": [16, 32, 64], "micro_batch_size": [8, 16]},
                         allow_semantic=["global_batch_size"], global_batch={"max": 32}, proposer="random",
                         budget={"trials": 4}, finalists=1)
    p = plan(camp, tmp_path / "campaign")
    outcome = run(p, reporter=Reporter())
    ran = [r.attrs for r in p.store.records() if r.attrs.get("ran")]
    recipes = [Recipe(a["recipe"]) for a in ran]
    assert len({r.id for r in recipes}) == len(recipes)  # no coupled recipe ran twice
    for r in recipes:
        assert r["lr"] == pytest.approx(0.002 * math.sqrt(r["global_batch_size"] / 16))
        assert r["global_batch_size"] <= 32
    assert all(r.attrs["violations"][0]["rule"] == RULE for r in p.store.records()
               if r.attrs.get("recipe", {}).get("global_batch_size") == 64 and r.attrs.get("status") == "rejected")
    assert outcome.decision in ("APPROVED", "KEEP BASELINE")
