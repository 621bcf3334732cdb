"""The nanoGPT-style trainer end to end (tests/fixtures/nanogpt_trainer.py, examples/nanogpt-campaign.yaml).

No seed flag, batches from the global RNG (32 x 1 trains on other sequences than 2 x 16), the last
micro-batch's loss printed, a stall every 15 iterations: the coupled move is APPROVED through
``recipetune verify`` once longer runs resolve T (it trains on other batches, and the repeats are
identical: only steps add evidence); its poisoned variants are REJECTED at the first look; an A/A
comparison is not approved. Real training runs (one thread): the slowest tests of the guard.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.config import load_campaign
from recipetune.guard.baseline import profile_baseline
from recipetune.guard.verdict import final_verdict

CAMPAIGN = Path(__file__).resolve().parents[1] / "examples" / "nanogpt-campaign.yaml"
ONE_SEED = ["guard.parity.seeds=1"]  # the trainer repeats itself exactly: one run per recipe says it all


def _kept_for_timing(reason: str) -> bool:
    """A speed verdict only timing decided: the speed-up within noise, or the machine too busy to say
    (A/A noise of 102% in one CI run). Either keeps the baseline; neither is a rejection."""
    return "within noise" in reason or reason.startswith("the machine was busy")


@pytest.mark.slow
def test_verify_the_coupled_move_is_approved(tmp_path):
    # 50-step profile runs: T is that length's; the second look's pair is as long as the first says T needs
    res = CliRunner().invoke(app, ["verify", str(CAMPAIGN), str(CAMPAIGN), "batch_size=32", "grad_accum=1",
                                   *ONE_SEED, "guard.parity.steps=50", "--out", str(tmp_path / "v"), "--json"])
    verdict = json.loads(res.stdout)
    # The losses fix the parity verdict; the speed verdict is timing's, which a busy machine can make
    # too noisy to approve (a 3.4x speed-up at a 31% noise margin, CI [0.98, 11.7], in one CI run) or to
    # decide at all (A/A noise 102%, in another): the baseline is kept and the verdict says why (exit 3).
    if verdict["decision"] == "APPROVED":
        assert res.exit_code == 0
    else:
        assert res.exit_code == 3 and verdict["decision"] == "KEEP BASELINE", verdict["reasons"]
        assert verdict["speedup"] > 1 and _kept_for_timing(verdict["reasons"][0]), verdict["reasons"]
    par = verdict["parity"]
    assert par["outcome"] == "holds"
    assert par["mode"] == "batches unknown" and "valid either way" in par["mode_reason"]
    assert par["detectable"] <= par["tolerance"] and abs(par["mean_diff"]) < par["tolerance"]
    # one 50-step run each is too noisy: longer pairs, up to the length the first look planned (a pair
    # at the geometric middle first where that is 4x or more): one run, then a pair per look
    looks = [n for n in verdict["notes"] if n.startswith("parity look ")]
    assert "parity look 1 (1x the steps" in looks[0] and "inconclusive" in looks[0]
    assert len(looks) >= 2 and verdict["cost"]["parity_runs"] == 1 + 2 * (len(looks) - 1)
    assert any("no seed knob" in n for n in verdict["notes"])
    assert verdict["parity"]["noise"]["baseline"] > 2 * verdict["parity"]["noise"]["candidate"]
    assert sum(p["baseline_stalls"] + p["candidate_stalls"] for p in verdict["pairs"]) > 0


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    # the example's 100 steps: the fixture's strong poisons (+0.1 nats and more) show at the first look
    c = load_campaign(CAMPAIGN, ONE_SEED)
    folder = tmp_path_factory.mktemp("nanogpt")
    profile = profile_baseline(c.workload, c.baseline, c.config.guard.parity.steps, c.config.guard,
                               folder / "baseline")
    return c, profile, folder


@pytest.mark.slow
@pytest.mark.parametrize("poison", ["drop", "stale", "short"])
def test_poisoned_coupled_moves_are_rejected(campaign, poison):
    c, profile, folder = campaign
    cand = c.baseline.with_(batch_size=32, grad_accum=1, poison=poison)
    v = final_verdict(c.workload, c.baseline, cand, c.config.guard, folder / poison, profile=profile)
    assert v.decision == "REJECTED" and v.parity["mode"] == "batches unknown", v.reasons
    assert "trains differently" in v.reasons[0] and not v.pairs  # never timed
    assert v.cost["parity_runs"] == 1  # decided at the first look


@pytest.mark.slow
def test_aa_is_not_approved(campaign):
    c, profile, folder = campaign
    settings = c.config.guard.model_copy(update={"speed": c.config.guard.speed.model_copy(update={"pairs": 2})})
    v = final_verdict(c.workload, c.baseline, c.baseline, settings, folder / "aa", profile=profile)
    assert v.decision == "KEEP BASELINE", v.reasons
    assert v.parity["mean_diff"] == 0.0 and v.parity["outcome"] == "holds"  # it repeats itself exactly


@pytest.mark.slow
def test_tune_at_the_examples_defaults_approves_less_accumulation_on_its_losses(tmp_path):
    # `recipetune tune examples/nanogpt-campaign.yaml` as it stands (issue 50): the analyst knows the flags
    # through `means:` and proposes less accumulation; the finalist, an equivalent on other batches, is never
    # judged a loss regression: its parity holds once longer pairs resolve T (the trainer has no seed knob).
    # Its speed-up is timing's, which a busy machine can make too noisy to approve (A/A ratios of -0.37 and
    # +0.43 in one CI run: a 2.9x speed-up with a 49% noise margin; 3.87x, CI [1.03, 14.6] under a 36.6%
    # margin at load 13): then the guard keeps the baseline for noise and says so, never rejects it. On a
    # quiet machine APPROVED: 5.60x, CI [3.32, 9.44], 5 parity runs in 62 s (4 since the trial's is reused),
    # 6 speed runs in 26 s, the campaign 2 min 11 s (docs/own-trainer.md); since the middle look is read from
    # the 10x pair as it runs, 2 parity runs in 39-47 s (docs/benchmarks.md, "guard-live-middle-look").
    folder = tmp_path / "campaign"
    res = CliRunner().invoke(app, ["tune", str(CAMPAIGN), "--out", str(folder)])
    assert res.exit_code == 0, res.output[-2000:]
    finalist = json.loads(next((folder / "final").glob("*/verdict.json")).read_text())
    cand = finalist["candidate"]
    assert cand["grad_accum"] < 16 and cand["batch_size"] * cand["grad_accum"] == 32, finalist["change"]
    par = finalist["parity"]
    assert par["outcome"] == "holds" and par["detectable"] <= par["tolerance"], finalist["reasons"]
    looks = [n for n in finalist["notes"] if n.startswith("parity look ")]
    # what it spent: its first candidate run is the search trial's (the same recipe, seed and steps), reused;
    # then a pair for each pair the looks started, the middle look read from the longer pair as it ran (the
    # trainer's log can be read while it trains), not trained as a pair of its own
    cost = finalist["cost"]
    pairs = sum("the next pair at" in n for n in finalist["notes"])
    assert len(looks) >= 2 and cost["parity_runs"] == 2 * pairs and cost["parity_reused"] == 1
    assert len(looks) < 3 or any("read as the" in n for n in looks), looks
    assert finalist["cost"]["parity_s"] > 0 and finalist["cost"]["speed_runs"] >= 6
    speed = finalist["speed"]
    if finalist["decision"] == "APPROVED":
        assert speed["ci_low"] > 1 + speed["noise_margin"]
    else:
        assert finalist["decision"] == "KEEP BASELINE" and speed["speedup"] > 1, finalist["reasons"]
        reason = finalist["reasons"][0]
        assert _kept_for_timing(reason), finalist["reasons"]
        assert "within noise" not in reason or speed["ci_low"] <= 1 + speed["noise_margin"]
    verdict = json.loads((folder / "verdict.json").read_text())
    assert verdict["decision"] == finalist["decision"]
