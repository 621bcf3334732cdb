"""The guard on a real trainer it was not built for, against poisons at the edge of detection.

tests/fixtures/edge_trainer.py (a command workload with JSONL metrics, a seed flag, batch
fingerprints, a replaying sampler): each poison moves the loss by 1.5-3 times the baseline's
seed-to-seed spread at the campaign's 150 steps (benchmarks/results/poison_calibration.txt), beside
equivalent recipes (another micro-batch split, another sample order) and an A/A. At default guard
settings none is approved, and each is decided at the first look (3 candidate runs) or, where a few
more seeds show it beyond T, at one more look: REJECTED where a look shows it beyond T, else stopped
for futility (not shown equivalent); no equivalent recipe is rejected. The parity evidence only
(looks included); the speed decision is tested elsewhere. The figures of the whole verdicts are in
docs/guard.md (benchmarks/guard_poisons.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recipetune.config import load_campaign
from recipetune.guard.baseline import profile_baseline
from recipetune.guard.looks import gather

CAMPAIGN = Path(__file__).resolve().parent / "fixtures" / "edge-campaign.yaml"
FAST = {"micro_batch": 16, "grad_accum": 4}


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    c = load_campaign(CAMPAIGN, [])
    folder = tmp_path_factory.mktemp("edge")
    settings = c.config.guard
    profile = profile_baseline(c.workload, c.baseline, settings.parity.steps, settings, folder / "baseline")
    return c, profile, folder


def parity(edge, name: str, **edits):
    c, profile, folder = edge
    cand = c.workload.resolve({**dict(c.baseline), **edits})
    got = gather(c.workload, profile, c.baseline, cand, profile.steps, c.config.guard, folder / name, False)
    assert got.evidence is not None, got.failure
    return got


@pytest.mark.slow
@pytest.mark.parametrize("split", [FAST, {"micro_batch": 64, "grad_accum": 1}], ids=["16x4", "64x1"])
def test_another_micro_batch_split_replays_and_holds(edge, split):
    got = parity(edge, f"split-{split['micro_batch']}", **split)
    ev = got.evidence
    assert ev.mode == "same batches" and "fingerprints" in ev.mode_reason
    assert ev.outcome == "holds", ev.reasons
    assert ev.detectable <= ev.tolerance and abs(ev.mean_diff) < 0.1 * ev.tolerance
    assert got.runs == 3  # the first look decides: the profile's baseline runs, three candidate runs


@pytest.mark.slow
def test_another_sample_order_is_not_rejected(edge):
    # T here is the runs' within-run error, a third of the 8-seed spread: another order cannot be shown
    # within it by the default budget, and the plan says so after the first look instead of buying seeds
    got = parity(edge, "order", order_seed=7)
    ev = got.evidence
    assert ev.mode == "other batches" and ev.outcome != "fails", ev.reasons
    assert got.runs <= 3 or got.plan["pairs"] <= 25


@pytest.mark.slow
def test_aa_holds_exactly(edge):
    ev = parity(edge, "aa").evidence
    assert ev.outcome == "holds" and ev.mean_diff == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("poison", ["drop", "short", "stale", "lr10"])
def test_a_poison_at_the_edge_is_never_approved_and_decided_within_twice_the_first_looks_seeds(edge, poison):
    got = parity(edge, poison, poison=poison, **FAST)
    ev = got.evidence
    assert ev.mode == "same batches"
    assert ev.outcome != "holds" and got.runs <= 9, (got.looks, ev.reasons)
    # shown beyond T: REJECTED (at the first look, or at the look a few more seeds were planned for when
    # equivalence was out of reach and the difference beyond T was not: the dropped micro-batch's first
    # three pairs scatter too widely for the first look's level); else not shown equivalent, stopped
    assert ("trains differently" in ev.reasons[0]) if ev.outcome == "fails" else got.stop in ("futility", "budget")
    assert ev.outcome == "fails" or ("not shown equivalent" in ev.reasons[0] and got.runs == 3)
