"""The guard on a real trainer it was not built for, against poisons at the edge of detection.

tests/fixtures/edge_trainer.py (a command workload with JSONL metrics, a seed flag, batch
fingerprints, a replaying sampler): each poison moves the loss by 1.5-3 times the baseline's
seed-to-seed spread at the campaign's 150 steps (benchmarks/results/poison_calibration.txt), beside
equivalent recipes (another micro-batch split, another sample order) and an A/A. At default guard
settings, every poison whose effect exceeds T is REJECTED, none is approved, no equivalent recipe is
rejected. The parity evidence only (looks included); the speed decision is tested elsewhere. The
figures of the whole verdicts are in docs/guard.md (benchmarks/guard_poisons.py).
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


def parity(edge, name: str, max_seeds: int | None = None, **edits):
    c, profile, folder = edge
    cand = c.workload.resolve({**dict(c.baseline), **edits})
    settings = c.config.guard
    if max_seeds is not None:  # fewer looks: a test's time, not the standard, is what changes
        settings = settings.model_copy(update={"parity": settings.parity.model_copy(update={"max_seeds": max_seeds})})
    got = gather(c.workload, profile, c.baseline, cand, profile.steps, settings, folder / name, False)
    assert got.evidence is not None, got.failure
    return got.evidence


@pytest.mark.slow
@pytest.mark.parametrize("split", [FAST, {"micro_batch": 64, "grad_accum": 1}], ids=["16x4", "64x1"])
def test_another_micro_batch_split_replays_and_holds(edge, split):
    ev = parity(edge, f"split-{split['micro_batch']}", **split)
    assert ev.mode == "same batches" and "fingerprints" in ev.mode_reason
    assert ev.outcome == "holds", ev.reasons
    assert ev.detectable <= ev.tolerance and abs(ev.mean_diff) < 0.1 * ev.tolerance


@pytest.mark.slow
def test_another_sample_order_is_not_rejected(edge):
    ev = parity(edge, "order", max_seeds=3, order_seed=7)  # resolving T takes 24 seeds (docs/guard.md)
    assert ev.mode == "other batches" and ev.outcome != "fails", ev.reasons


@pytest.mark.slow
def test_aa_holds_exactly(edge):
    ev = parity(edge, "aa")
    assert ev.outcome == "holds" and ev.mean_diff == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("poison", ["drop", "short", "stale", "lr10"])
def test_a_poison_at_the_edge_is_rejected(edge, poison):
    ev = parity(edge, poison, poison=poison, **FAST)
    assert ev.mode == "same batches"
    assert ev.outcome == "fails", (ev.reasons, ev.notes)
    assert "trains differently" in ev.reasons[0]
