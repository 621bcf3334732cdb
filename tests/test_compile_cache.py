"""Compilation paid once: the shared inductor caches, compile seconds apart from throughput, charged by plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from recipetune.core.measure import RunResult, StepRecord
from recipetune.speed.job import charge_compile, reward

# One process of a trainer: the trainer's own cache switch and compile timers around a tiny compiled model.
COMPILE_ONCE = textwrap.dedent("""
    import json, torch
    from recipetune.trainer.profile import compile_figures, use_compile_cache
    folder = use_compile_cache()
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
    model(torch.randn(4, 8)).sum().backward()
    print(json.dumps({"folder": str(folder), **compile_figures()}))
""")


def compile_in_a_fresh_process(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", COMPILE_ONCE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two cold torch.compile processes: minutes on a busy 2-core machine
def test_a_second_run_of_the_same_shapes_compiles_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    env.update(RECIPETUNE_CACHE=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(sys.path))
    first, second = compile_in_a_fresh_process(env), compile_in_a_fresh_process(env)
    assert first["folder"] == str(tmp_path / "cache" / "inductor")  # under recipetune's cache, not /tmp
    assert first["compile_cache_misses"] > 0 and first["compile_s"] > 0
    # the second process loaded every graph (forward and backward) from the shared folder
    assert second["compile_cache_misses"] == 0 and second["compile_cache_hits"] >= first["compile_cache_misses"]


def test_compile_seconds_are_apart_from_steady_throughput():
    steady = [StepRecord(step=i + 1, loss=3.0, tokens=1000, step_time_s=0.1) for i in range(20)]
    compiled = [steady[0].model_copy(update={"step_time_s": 40.1, "compile_s": 40.0}), *steady[1:]]
    a = RunResult(recipe={}, recipe_id="a", status="ok", steps=steady, warmup_steps=2).summary()
    b = RunResult(recipe={}, recipe_id="b", status="ok", steps=compiled, warmup_steps=2).summary()
    assert b.tokens_per_s == a.tokens_per_s == pytest.approx(10_000)  # the compile step is a warm-up step
    assert (a.compile_s, b.compile_s) == (0.0, 40.0)


def test_a_short_trial_does_not_make_compile_look_slow_but_the_plan_pays_it():
    # 1.3x steady, 60 s of compile: a 30-step trial would show ~0.1x if compile were in its tokens/s
    tps, per_step = 130_000.0, 32 * 1024
    assert charge_compile(1.3, tps, per_step, 60.0, 0) == 1.3  # no planned length: not charged
    assert charge_compile(1.3, tps, per_step, 0.0, 5000) == 1.3  # nothing compiled: unchanged
    long_run = charge_compile(1.3, tps, per_step, 60.0, 100_000)
    assert 1.29 < long_run < 1.3  # a long run pays compile once and keeps nearly all of the gain
    # exact: the planned run's time is its steps at the steady rate plus compile, once
    planned = 5000 * per_step / tps
    assert charge_compile(1.3, tps, per_step, 60.0, 5000) == pytest.approx(1.3 * planned / (planned + 60.0))


def test_a_short_production_run_ranks_the_uncompiled_candidate_first():
    # 1.3x compiled (600 s to compile, no cache) vs 1.1x uncompiled, for a 200-step production run
    tps, per_step = 130_000.0, 32 * 1024
    compiled = charge_compile(1.3, tps, per_step, 600.0, 200)
    assert compiled < 1.1
    assert reward(compiled, True) < reward(1.1, True)
    # the same compiled candidate over a 20,000-step run is worth its compile
    assert charge_compile(1.3, tps, per_step, 600.0, 20_000) > 1.1


def test_the_speed_job_ranks_a_trial_by_its_charged_speedup_and_keeps_the_steady_one(tmp_path):
    from types import SimpleNamespace

    from recipetune.config import SearchConfig
    from recipetune.guard.screen import Screening
    from recipetune.speed.job import SpeedJob

    def land(compile_s: float, production_steps: int):
        job = object.__new__(SpeedJob)  # only what land() reads: the search settings, the guard, the profile
        job.cfg, job.settings, job.profile = SearchConfig(production_steps=production_steps), None, object()
        job.guard = SimpleNamespace(screen=lambda *_: Screening(passed=True, reasons=[], speedup=1.3, loss_gap=0.0,
                                                                 loss_tolerance=0.1),
                                    keep_run=lambda *_: False)  # a passed trial is offered to the run store
        job.services, job.workload, job.batch = SimpleNamespace(store=SimpleNamespace(folder=tmp_path)), None, None
        steps = [StepRecord(step=i, loss=3.0, tokens=32768, step_time_s=0.25, compile_s=compile_s if i == 1 else None)
                 for i in range(1, 26)]
        result = RunResult(recipe={}, recipe_id="c", status="ok", steps=steps, warmup_steps=2)
        return job.land(result, None, tmp_path)

    charged = land(600.0, 200)
    assert charged.score == pytest.approx(charge_compile(1.3, 32768 / 0.25, 32768, 600.0, 200))
    assert charged.figures.speedup == 1.3 and charged.figures.compile_s == 600.0  # the steady figure is kept
    assert charged.reward == reward(charged.score, True)
    assert land(600.0, 0).score == 1.3  # not charged without a planned length
    assert "compile_s" not in land(0.0, 200).figures.stored()  # nothing compiled: the stored figures as before


def test_recipetune_run_shows_compile_seconds_apart():
    from rich.console import Console

    from recipetune.cli import summary_table

    steps = [StepRecord(step=i, loss=3.0, tokens=1000, step_time_s=0.1, compile_s=40.0 if i == 1 else None,
                        profiled=i > 17) for i in range(1, 21)]
    console = Console(record=True, width=120)
    console.print(summary_table(RunResult(recipe={}, recipe_id="x", status="ok", steps=steps, warmup_steps=2), "run"))
    text = console.export_text()
    assert "40.0s in torch.compile" in text and "3 step(s), excluded (profile.json)" in text
