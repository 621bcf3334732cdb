"""Futility in the steps mode (guard/looks.py: ``_steps_chance``): a trainer without a seed knob whose runs
cannot resolve T within guard.parity.max_steps_factor stops at the look that shows it, instead of running
the longer pairs to learn "cannot resolve".

Synthetic worlds (tests/test_guard_independent.py: ``ReplicaWorkload``, no training): the same verdicts
with parity.futility 0 (never stop) and at its default, over 30 worlds each, for an equivalent on other
batches and for poisons at 1.5 T and 3 T. The rule must save runs where the cap is too short, change
nothing where the cap suffices (an equivalent the longer pair would show equivalent is never stopped),
and never buy an approval: a poison that was kept or rejected is never approved.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from test_guard_independent import BASE, CAND, ReplicaWorkload, settings

from recipetune.guard.baseline import build_profile
from recipetune.guard.looks import gather

WORLDS = range(30)


def verdict(world: int, size: float, cap: int, futility: float, tmp_path: Path) -> tuple[str, str, float]:
    """(outcome, stop, steps trained in profile lengths) of one steps-mode verdict on 32 x 1 vs 2 x 16."""
    cfg = settings(seeds=3, max_steps_factor=cap, futility=futility)
    wl = ReplicaWorkload(world, jitter=0.0)
    profile = build_profile(wl, BASE, [wl.run(BASE, 100, None) for _ in range(3)], [None] * 3, 100, cfg)
    wl.offset, wl.launched = size * profile.loss_tolerance / 0.75, []
    got = gather(wl, profile, BASE, CAND, 100, cfg, tmp_path / f"{world}-{size}-{cap}-{futility}",
                 equal_tokens=False)
    return str(got.evidence.outcome), str(got.stop), sum(steps for _, steps in wl.launched) / 100


def campaign(size: float, cap: int, futility: float, tmp_path: Path) -> tuple[list[str], Counter, float]:
    rows = [verdict(w, size, cap, futility, tmp_path) for w in WORLDS]
    return [o for o, _, _ in rows], Counter(s for _, s, _ in rows), sum(c for _, _, c in rows)


def test_runs_too_short_for_t_stop_at_the_look_that_shows_it(tmp_path):
    # the cap at 4x: an equivalent on other batches needs ~6-10x, so every verdict ends "not shown"; the
    # rule stops most at the first look and spends well under two thirds of the runs, outcomes unchanged
    never, _, cost_never = campaign(0.0, 4, 0.0, tmp_path)
    stopped, stops, cost = campaign(0.0, 4, 0.1, tmp_path)
    assert stopped == never == ["inconclusive"] * len(WORLDS)
    assert stops["futility"] >= len(WORLDS) // 2 and cost < 0.6 * cost_never, (stops, cost, cost_never)


def test_an_equivalent_the_longer_pair_would_show_is_never_stopped(tmp_path):
    # the default cap (16x) suffices: every verdict is the one without the rule, run for run
    never, _, cost_never = campaign(0.0, 16, 0.0, tmp_path)
    kept, stops, cost = campaign(0.0, 16, 0.1, tmp_path)
    assert kept == never and stops["futility"] == 0 and cost == cost_never
    assert kept.count("holds") >= 0.7 * len(WORLDS)


@pytest.mark.parametrize("size", [1.5, 3.0])
def test_a_saving_never_buys_an_approval_and_a_clear_poison_is_still_rejected(tmp_path, size):
    for cap in (4, 16):
        never, _, _ = campaign(size, cap, 0.0, tmp_path)
        ruled, _, _ = campaign(size, cap, 0.1, tmp_path)
        assert "holds" not in ruled
        # a poison likely to be shown different is not stopped: at most one rejection in 30 worlds turns
        # into KEEP BASELINE (its first look read it small by chance), none into an approval
        assert ruled.count("fails") >= never.count("fails") - 1, (cap, never, ruled)


def test_a_proof_too_long_says_what_would_shorten_it_measured_from_its_runs(tmp_path):
    # nanoGPT's loss line: the last micro-batch's loss, so the baseline's (2 sequences a micro-batch) is far
    # noisier a step than the candidate's (32). With T in nats (parity.margin), a line with the step's loss on
    # both sides needs (b^2 + c^2) / (2 c^2) times fewer steps; with T measured on the baseline's own noise
    # (the default), T shrinks with that noise and the proof would get longer: no such advice
    from test_guard_independent import LossWorkload, no_seed_profile

    profile = no_seed_profile(100, settings(max_steps_factor=1))
    cfg = settings(max_steps_factor=1, margin=profile.loss_tolerance)
    got = gather(LossWorkload(), profile, BASE, CAND, 100, cfg, tmp_path / "split", equal_tokens=False)
    reason = got.evidence.reasons[-1]
    said = re.search(r"about (\d+) steps would resolve T.*about (\d+) steps", reason)
    need, shorter = (int(x) for x in said.groups())
    quiet, loud = (float(x) for x in re.search(r"noise ([\d.]+) nats a step, as the candidate's, not ([\d.]+)",
                                               reason).groups())
    assert loud > 4 * quiet and need / shorter == pytest.approx((loud**2 + quiet**2) / (2 * quiet**2), rel=0.05)
    assert "a seed knob the trainer reads" in reason
    relative = settings(max_steps_factor=1)
    got = gather(LossWorkload(), profile, BASE, CAND, 100, relative, tmp_path / "relative", equal_tokens=False)
    reason = got.evidence.reasons[-1]
    assert "the step's loss" not in reason and "a seed knob the trainer reads" in reason, reason
    # beside it, a split whose loss line's noise moves less than 1.5x (2 vs 4 sequences: 1.41x): no such advice
    near = BASE.with_(batch_size=4, grad_accum=8)
    got = gather(LossWorkload(), profile, BASE, near, 100, cfg, tmp_path / "near", equal_tokens=False)
    assert "the step's loss" not in " ".join(got.evidence.reasons)
    # and a proof that was resolved, but on longer runs, says it too: the runs it took, and what would shorten them
    got = gather(LossWorkload(), profile, BASE, CAND, 100, settings(), tmp_path / "resolved", equal_tokens=False)
    said = [n for n in got.looks if n.startswith("the proof took runs")]
    assert got.evidence.outcome == "holds" and got.plan["factor"] > 1 and said and "a seed knob" in said[0]
