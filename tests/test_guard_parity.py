"""Loss parity and screening on synthetic loss curves shaped like real ones (no training runs).

A loss curve here is a shared descent, plus a per-batch difficulty that depends on the sample order
(the data seed), plus a per-seed offset from the initialisation that fades slowly. Every poison is
sized against the profile's own T (the baseline's seed-to-seed spread of the loss measure): the
cases built to fool the rule sit at 1.5-3 T, beside the equivalent ones it must not reject.
"""

from __future__ import annotations

import numpy as np
import pytest

from recipetune.core.measure import EvalRecord, RunResult, StepRecord
from recipetune.core.recipe import Recipe
from recipetune.guard import loss
from recipetune.guard.baseline import build_profile
from recipetune.guard.config import GuardConfig
from recipetune.guard.parity import compare
from recipetune.guard.screen import screen
from recipetune.workloads.reference import ReferenceWorkload

STEPS = 120
SETTINGS = GuardConfig.model_validate({"parity": {"steps": STEPS, "seeds": 3}})
WORKLOAD = ReferenceWorkload()
BASE = WORKLOAD.resolve({"model": "nano", "seq_len": 64, "global_batch_size": 16, "micro_batch_size": 4})
FAST = BASE.with_(micro_batch_size=16)


def curve(data_seed: int, init_seed: int, extra: np.ndarray | float = 0.0) -> np.ndarray:
    t = np.arange(STEPS)
    batch = np.random.default_rng([data_seed, 1]).normal(0, 0.12, STEPS)
    init = np.random.default_rng([init_seed, 2]).normal(0, 0.03) * np.exp(-t / 200)
    return 2.3 + 3.0 * np.exp(-t / 12) + batch + init + extra


def run(losses: np.ndarray, recipe: Recipe, val: float | None = None, tokens: int = 1024, fp: int | None = None,
        seq_len: int | None = None) -> RunResult:
    steps = [StepRecord(step=i + 1, loss=float(x), tokens=tokens, step_time_s=0.01, seq_len=seq_len,
                        batch_fp=None if fp is None else f"{fp}-{i}") for i, x in enumerate(losses)]
    evals = [] if val is None else [EvalRecord(step=len(steps), val_loss=val)]
    return RunResult(recipe=dict(recipe), recipe_id=recipe.id, status="ok", steps=steps, evals=evals)


@pytest.fixture(scope="module")
def profile():
    runs = [run(curve(s, s), BASE.with_(seed=s)) for s in range(3)]
    return build_profile(WORKLOAD, BASE, runs, [0, 1, 2], STEPS, SETTINGS)


def late(size: float) -> np.ndarray:
    """An effect that grows in over the run and is ``size`` nats over the compared tail."""
    return size * np.clip(np.arange(STEPS) / (STEPS / 2), 0, 1)


def test_profile_tolerance_is_the_seed_to_seed_spread_of_the_loss_measure(profile):
    assert 0.005 < profile.loss_reference < 0.1 and profile.loss_reference_kind == loss.ReferenceKind.SEEDS
    assert profile.loss_tolerance == pytest.approx(max(1e-3, profile.loss_reference))
    assert len(profile.final_losses) == 3


def test_one_t_rule_a_multiple_of_the_spread_at_least_the_floor_or_the_stated_margin(profile):
    # loss.tolerance_of: the verdict's T, and T wherever a spread is measured otherwise (watch without a profile)
    p = SETTINGS.parity
    assert loss.tolerance_of(0.02, p) == 0.02 and loss.tolerance_of(1e-5, p) == p.floor
    assert loss.tolerance_of(0.02, p.model_copy(update={"tolerance": 2.0})) == 0.04
    stated = p.model_copy(update={"margin": 0.05})
    assert loss.tolerance_of(0.02, stated) == 0.05 and loss.tolerance_of(1e-5, stated) == 0.05
    t = loss.tolerance(profile.runs, stated, False, None, True)
    # the margin states T; sigma is still the 3 seeds' std, and its kind says so (watch's law: t on 2)
    assert (t.T, t.sigma, t.kind) == (0.05, profile.loss_reference, loss.ReferenceKind.SEEDS)
    assert loss.spread(profile.runs, stated, False, None, True).how(stated) == "guard.parity.margin"
    derived = loss.tolerance(profile.runs, p, False, None, True)
    assert (derived.T, derived.sigma) == (profile.loss_tolerance, profile.loss_reference)


def test_two_tails_are_compared_step_by_step_only_where_they_logged_the_same_steps():
    # loss.aligned, the one rule of the measure (tail_measure) and of the gap's slope (guard/trend.py)
    base = run(curve(0, 0), BASE).steps
    assert loss.aligned(base, base).steps == [s.step for s in base]
    every_other = base[::2]  # half the steps: fewer than 80% of the longer tail in common
    assert loss.aligned(base, every_other) is None and loss.aligned(base[:9], base[:9]) is None  # < MIN_TAIL
    both = loss.aligned(base[:50], base[5:50])  # 45 of 50 in common
    assert both is not None and both.steps[0] == 6 and len(both.cand) == len(both.base) == 45
    # loss.matched, the pairing under it and under the other callers: common steps in order, a caller's minimum
    a, b = {3: 1.0, 1: 2.0, 2: 3.0}, {2: 5.0, 3: 6.0, 9: 7.0}
    pair = loss.matched(a, b, 2)
    assert pair is not None and pair.steps == [2, 3] and pair.base.tolist() == [3.0, 1.0]
    assert pair.cand.tolist() == [5.0, 6.0] and loss.matched(a, b, 3) is None and loss.matched(a, {}) is None


def test_an_equivalent_candidate_holds_and_says_what_it_could_detect(profile):
    rng = np.random.default_rng(7)  # float round-off of another micro-batch split
    cands = [run(curve(s, s) + rng.normal(0, 1e-4, STEPS), FAST.with_(seed=s)) for s in range(3)]
    ev = compare(profile, cands, SETTINGS.parity)
    assert ev.outcome == "holds" and ev.passed, ev.reasons
    assert ev.mode == "same batches" and "fixed" in ev.mode_reason  # the reference trainer replays
    assert ev.detectable is not None and ev.detectable < 0.1 * ev.tolerance


@pytest.mark.parametrize("name, factor", [("a slower descent", 1.5), ("a lost part of the gradient", 3.0),
                                          ("a leak: the loss too low", -1.5)])
def test_a_poison_at_the_edge_of_detection_is_rejected(profile, name, factor):
    T = profile.loss_tolerance
    cands = [run(curve(s, s, extra=late(factor * T)), FAST.with_(seed=s)) for s in range(3)]
    ev = compare(profile, cands, SETTINGS.parity)
    assert ev.outcome == "fails", (name, ev.reasons)
    assert "trains differently" in ev.reasons[0] and ("better" in ev.reasons[0]) == (factor < 0)


def test_another_sample_order_is_never_rejected(profile):
    # Batches unknown to the guard: the paired comparison stays valid, only noisier.
    settings = SETTINGS.parity.model_copy(update={"data_order": "varies"})
    cands = [run(curve(s + 100, s), FAST.with_(seed=s)) for s in range(3)]
    ev = compare(profile, cands, settings)
    assert ev.mode == "other batches" and ev.outcome != "fails", ev.reasons
    assert ev.detectable > 3 * compare(profile, [run(curve(s, s), FAST.with_(seed=s)) for s in range(3)],
                                       settings).detectable


def test_fingerprints_tell_which_batches_and_a_fixed_order_broken_is_rejected(profile):
    runs = [run(curve(s, s), BASE.with_(seed=s), fp=s) for s in range(3)]
    p = build_profile(WORKLOAD, BASE, runs, [0, 1, 2], STEPS, SETTINGS)
    same = compare(p, [run(curve(s, s), FAST.with_(seed=s), fp=s) for s in range(3)], SETTINGS.parity)
    assert same.mode == "same batches" and "fingerprints of all" in same.mode_reason and same.passed
    other = compare(p, [run(curve(s + 100, s), FAST.with_(seed=s), fp=s + 100) for s in range(3)], SETTINGS.parity)
    assert other.outcome == "fails" and "sample order is fixed" in other.reasons[0]


def test_a_loss_over_other_examples_is_not_compared(profile):
    shorter = [run(curve(s, s), FAST.with_(seed=s), seq_len=32) for s in range(3)]
    p = build_profile(WORKLOAD, BASE, [run(curve(s, s), BASE.with_(seed=s), seq_len=64) for s in range(3)],
                      [0, 1, 2], STEPS, SETTINGS)
    ev = compare(p, shorter, SETTINGS.parity)
    assert ev.outcome == "fails" and "not comparable" in ev.reasons[0] and "sequences" in ev.reasons[0]
    fewer = compare(profile, [run(curve(s, s), FAST.with_(seed=s), tokens=512) for s in range(3)], SETTINGS.parity)
    assert fewer.outcome == "fails" and "tokens" in fewer.reasons[0]


def test_the_validation_loss_is_preferred_when_independent_repeats_measure_its_noise(profile):
    vals = [2.50, 2.51, 2.49]
    runs = [run(curve(s, s), BASE.with_(seed=s), val=v) for s, v in enumerate(vals)]
    p = build_profile(WORKLOAD, BASE, runs, [0, 1, 2], STEPS, SETTINGS)
    # a poison the training loss cannot see (e.g. shorter training sequences) shows in validation
    worse = compare(p, [run(curve(s, s), FAST.with_(seed=s), val=v + 0.05) for s, v in enumerate(vals)],
                    SETTINGS.parity)
    assert worse.final_metric == "validation loss" and worse.outcome == "fails"
    train, val = worse.measures  # both measures are tested; parity needs both to hold
    assert train.outcome == "holds" and val.outcome == "fails" and "trains differently" in worse.reasons[0]
    same = compare(p, [run(curve(s, s), FAST.with_(seed=s), val=v) for s, v in enumerate(vals)], SETTINGS.parity)
    assert same.outcome == "holds" and [m.outcome for m in same.measures] == ["holds", "holds"]


def test_screen_checks_one_run_at_the_baseline_seed(profile):
    same = screen(profile, run(curve(0, 0), FAST), SETTINGS)
    assert same.passed and same.loss_gap == 0.0 and same.speedup == pytest.approx(1.0)
    poisoned = screen(profile, run(curve(0, 0, extra=late(3 * profile.loss_tolerance)), FAST), SETTINGS)
    assert not poisoned.passed and poisoned.loss_gap > poisoned.loss_tolerance


def test_screen_of_a_shorter_trial_compares_the_common_tokens(profile):
    short = screen(profile, run(curve(0, 0)[:60], BASE), SETTINGS)
    assert short.passed, short.reasons
    assert short.loss_tolerance != profile.loss_tolerance  # T over the same, shorter, run length


def test_screen_rejects_a_failed_run_and_a_foreign_seed(profile):
    crashed = run(curve(0, 0)[:5], BASE).model_copy(update={"status": "oom", "cause": "out of memory"})
    res = screen(profile, crashed, SETTINGS)
    assert not res.passed and "oom" in res.reasons[0]
    res = screen(profile, run(curve(3, 3), BASE.with_(seed=3)), SETTINGS)
    assert not res.passed and "seed" in res.reasons[0]


def test_allowed_semantic_change_is_judged_at_equal_tokens_one_sided(profile):
    # Twice the global batch: half the steps for the same tokens, each step's loss a bit lower.
    big = BASE.with_(global_batch_size=32)
    better = [run(curve(s, s)[1::2] - 0.05, big.with_(seed=s), tokens=2048) for s in range(3)]
    ev = compare(profile, better, SETTINGS.parity, equal_tokens=True)
    assert ev.mode == "equal tokens" and not ev.two_sided
    assert ev.outcome != "fails", ev.reasons  # lower is fine when the campaign allowed learning to change
    worse = [run(curve(s, s)[1::2] + 0.3, big.with_(seed=s), tokens=2048) for s in range(3)]
    ev = compare(profile, worse, SETTINGS.parity, equal_tokens=True)
    assert ev.outcome == "fails" and "trains worse" in ev.reasons[0]


def test_one_seed_profile_uses_the_noise_within_the_run():
    one = GuardConfig.model_validate({"parity": {"steps": STEPS, "seeds": 1}})
    p = build_profile(WORKLOAD, BASE, [run(curve(0, 0), BASE)], [0], STEPS, one)
    assert p.loss_reference_kind == loss.ReferenceKind.WITHIN_RUN and p.loss_reference > 0
    assert screen(p, run(curve(0, 0), BASE), one).passed
    assert not screen(p, run(curve(0, 0, extra=late(3 * p.loss_tolerance)), BASE), one).passed


def test_runs_longer_than_the_profile_do_not_wave_through_a_difference_they_show():
    # Same batches, an offset of a third of T: inside T, and shown beyond noise. At the profile's length
    # that is within the standard; measured on 4x longer runs (a trainer with identical repeats), whose
    # own spread is smaller than T, it may be an effect that fades: not approved there.
    one = GuardConfig.model_validate({"parity": {"steps": STEPS, "seeds": 1}})
    p = build_profile(WORKLOAD, BASE, [run(curve(0, 0), BASE)], [0], STEPS, one)
    cand = [run(curve(0, 0) + p.loss_tolerance / 3, FAST)]
    assert compare(p, cand, one.parity).outcome == "holds"
    longer = compare(p, cand, one.parity, longer=4)
    assert longer.outcome == "inconclusive" and "fades with training" in longer.reasons[0]
    assert compare(p, [run(curve(0, 0), FAST)], one.parity, longer=4).outcome == "holds"  # no difference: fine
