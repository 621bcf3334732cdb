"""The typed trial record (engine/record.py): what a trial stores, read back as one model.

A campaign written before the record resumes unchanged: the keys stay the ones campaigns have always
written, and a speed campaign that predates the engine's ``score`` key is read through its
``speedup`` (the loop's old fallback, now the speed job's ``LEGACY_SCORE``).
"""

from __future__ import annotations

from recipetune.engine.record import Figures, Trial
from recipetune.finetune.job import QualityFigures
from recipetune.speed.job import SpeedFigures

# What speed/job.py: land stored before the record (the keys of its figures dict, and the loop's own).
OLD_SPEED_PASSED = {
    "recipe": {"micro_batch_size": 8}, "recipe_id": "abc", "parent": "root", "proposer": "analyst",
    "rationale": "bigger micro-batches", "status": "passed", "cause": "", "ran": True, "run_dir": "/tmp/t/0001",
    "reward": 0.62, "speedup": 1.31, "run_status": "ok", "loss": "ok", "tokens_per_s": 1234.5, "mfu": 0.31,
    "step_time_s": 0.2, "peak_mem_bytes": 123456789, "loss_last": 5.1,
    "screening": {"passed": True, "speedup": 1.31, "reasons": []}, "driver": "host:1", "edits": {"a": 1},
}


def test_a_speed_trial_written_before_the_score_key_reads_its_speedup_as_its_score():
    t = Trial[SpeedFigures].model_validate(OLD_SPEED_PASSED)
    assert t.score == 1.31 and t.status == "passed" and t.ran and t.parent == "root"
    assert t.figures.speedup == 1.31 and t.figures.tokens_per_s == 1234.5 and t.figures.loss == "ok"


def test_a_stored_score_wins_even_when_it_is_none():
    # a trial of a newer campaign that did not pass stores score None beside its screened speed-up
    t = Trial[SpeedFigures].model_validate({**OLD_SPEED_PASSED, "status": "rejected", "score": None})
    assert t.score is None and t.figures.speedup == 1.31


def test_the_quality_job_has_no_older_key_and_a_missing_score_stays_none():
    t = Trial[QualityFigures].model_validate({"status": "passed", "value": 0.7, "speedup": 1.5})
    assert t.score is None and t.figures.value == 0.7


def test_the_figures_store_the_keys_the_job_always_wrote():
    f = SpeedFigures(speedup=None, run_status="crash", screening=None, loss="", tokens_per_s=None, mfu=None,
                     step_time_s=None, peak_mem_bytes=None, loss_last=None)
    assert set(f.stored()) == {"speedup", "run_status", "screening", "loss", "tokens_per_s", "mfu",
                               "step_time_s", "peak_mem_bytes", "loss_last"}  # None kept, as before
    assert SpeedFigures(run_status="pruned", pruned_at=2, speedup_at_prune=0.8).stored() == {
        "run_status": "pruned", "pruned_at": 2, "speedup_at_prune": 0.8}
    assert Figures(run_status="lost").stored() == {"run_status": "lost"}


def test_a_running_trial_with_no_figures_reads_as_empty_ones():
    t = Trial[SpeedFigures].model_validate({"status": "running", "parent": "root"})
    assert t.figures.speedup is None and t.reward is None and not t.ran
