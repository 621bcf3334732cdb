"""Loss parity and screening on synthetic loss curves shaped like real ones (no training runs).

A loss curve here is a shared descent, plus a per-batch difficulty that depends on the sample order
(the data seed), plus a slow per-seed offset from the initialisation.
"""

from __future__ import annotations

import numpy as np
import pytest

from recipetune.guard.baseline import build_profile
from recipetune.guard.config import GuardConfig
from recipetune.guard.parity import compare
from recipetune.guard.screen import screen
from recipetune.measure import EvalRecord, RunResult, StepRecord
from recipetune.recipe import Recipe
from recipetune.workloads.reference import ReferenceWorkload

STEPS = 60
SETTINGS = GuardConfig.model_validate({"parity": {"steps": STEPS, "seeds": 3, "window": 10}})
WORKLOAD = ReferenceWorkload()
BASE = WORKLOAD.resolve({"model": "nano", "seq_len": 64, "global_batch_size": 16, "micro_batch_size": 4})


def curve(data_seed: int, init_seed: int, extra: np.ndarray | float = 0.0) -> np.ndarray:
    t = np.arange(STEPS)
    batch = np.random.default_rng([data_seed, 1]).normal(0, 0.12, STEPS)
    init = np.random.default_rng([init_seed, 2]).normal(0, 0.03) * np.exp(-t / 30)
    return 2.3 + 3.0 * np.exp(-t / 12) + batch + init + extra


def run(losses: np.ndarray, recipe: Recipe, val: float | None = None, tokens: int = 1024) -> RunResult:
    steps = [StepRecord(step=i + 1, loss=float(x), tokens=tokens, step_time_s=0.01) for i, x in enumerate(losses)]
    evals = [EvalRecord(step=len(steps), val_loss=val if val is not None else float(np.mean(losses[-10:])))]
    return RunResult(recipe=dict(recipe), recipe_id=recipe.id, status="ok", steps=steps, evals=evals)


@pytest.fixture(scope="module")
def profile():
    runs = [run(curve(s, s), BASE.with_(seed=s)) for s in range(3)]
    return build_profile(WORKLOAD, BASE, runs, [0, 1, 2], STEPS, SETTINGS)


def test_profile_reference_is_the_seed_to_seed_spread(profile):
    assert profile.loss_reference_kind == "seeds"
    assert 0.02 < profile.loss_reference < 0.2
    assert profile.loss_tolerance == pytest.approx(0.25 * profile.loss_reference)
    assert profile.loss_margin > 0 and len(profile.final_losses) == 3


def test_an_equivalent_candidate_passes(profile):
    rng = np.random.default_rng(7)
    cands = [run(curve(s, s) + rng.normal(0, 1e-3, STEPS), BASE.with_(seed=s, micro_batch_size=16))
             for s in range(3)]
    ev = compare(profile, cands, SETTINGS.parity)
    assert ev.passed, ev.reasons
    assert ev.gap < ev.tolerance and ev.p_value < 0.05


@pytest.mark.parametrize("name, make", [
    ("sample order", lambda s: curve(s + 100, s)),
    ("slower descent", lambda s: curve(s, s, extra=np.linspace(0, 0.15, STEPS))),
    ("diverging", lambda s: curve(s, s, extra=0.002 * np.arange(STEPS) ** 1.3)),
])
def test_a_candidate_that_trains_differently_fails(profile, name, make):
    cands = [run(make(s), BASE.with_(seed=s)) for s in range(3)]
    ev = compare(profile, cands, SETTINGS.parity)
    assert not ev.passed, name
    assert ev.gap > ev.tolerance
    assert "departs" in ev.reasons[0]


def test_screen_checks_one_run_at_the_baseline_seed(profile):
    same = screen(profile, run(curve(0, 0), BASE.with_(micro_batch_size=16)), SETTINGS)
    assert same.passed and same.loss_gap == 0.0 and same.speedup == pytest.approx(1.0)
    other = screen(profile, run(curve(5, 0), BASE.with_(micro_batch_size=16)), SETTINGS)
    assert not other.passed and other.loss_gap > other.loss_tolerance


def test_screen_of_a_shorter_trial_compares_the_common_steps(profile):
    short = screen(profile, run(curve(0, 0)[:30], BASE), SETTINGS)
    assert short.passed, short.reasons
    assert short.loss_tolerance != profile.loss_tolerance  # the reference over the first 30 steps


def test_screen_rejects_a_failed_run_and_a_foreign_seed(profile):
    crashed = run(curve(0, 0)[:5], BASE).model_copy(update={"status": "oom", "cause": "out of memory"})
    res = screen(profile, crashed, SETTINGS)
    assert not res.passed and "oom" in res.reasons[0]
    res = screen(profile, run(curve(3, 3), BASE.with_(seed=3)), SETTINGS)
    assert not res.passed and "seed" in res.reasons[0]


def test_allowed_semantic_change_is_judged_at_equal_tokens(profile):
    # Twice the global batch: half the steps for the same tokens, each step's loss a bit lower.
    big = BASE.with_(global_batch_size=32)
    good = [run(curve(s, s)[1::2] - 0.01, big.with_(seed=s), val=r.evals[-1].val_loss - 0.01, tokens=2048)
            for s, r in zip(range(3), profile.runs, strict=True)]
    ev = compare(profile, good, SETTINGS.parity, equal_tokens=True)
    assert ev.mode == "equal tokens" and ev.tolerance is None
    assert ev.passed, ev.reasons
    worse = [run(curve(s, s)[1::2] + 0.3, big.with_(seed=s), val=r.evals[-1].val_loss + 0.3, tokens=2048)
             for s, r in zip(range(3), profile.runs, strict=True)]
    ev = compare(profile, worse, SETTINGS.parity, equal_tokens=True)
    assert not ev.passed and "margin" in ev.reasons[0]


def test_one_seed_profile_uses_the_batch_noise_of_the_run():
    one = GuardConfig.model_validate({"parity": {"steps": STEPS, "seeds": 1, "window": 10}})
    p = build_profile(WORKLOAD, BASE, [run(curve(0, 0), BASE)], [0], STEPS, one)
    assert p.loss_reference_kind == "batch noise" and p.loss_reference > 0
    assert screen(p, run(curve(0, 0), BASE), one).passed
    assert not screen(p, run(curve(9, 0), BASE), one).passed
