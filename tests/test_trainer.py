"""The reference trainer end to end: determinism, micro-batch equivalence, DDP, failure statuses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recipetune.core.measure import RunResult
from recipetune.workloads.reference import ReferenceWorkload

# The smallest settings that still train: nano model, short sequences, a few steps.
BASE = {
    "model": "nano", "seq_len": 32, "global_batch_size": 16, "micro_batch_size": 16,
    "lr": 3e-3, "warmup_steps": 2, "num_threads": 1, "eval_batches": 1,
}
STEPS = 6
RUN_GUARD_S = 3600  # a guard against a hung run, not a budget: a loaded machine is slow, not hung


@pytest.fixture(scope="module")
def workload() -> ReferenceWorkload:
    return ReferenceWorkload()


def run(workload: ReferenceWorkload, out: Path, steps: int = STEPS, **knobs):
    result = workload.run(workload.resolve({**BASE, **knobs}), steps, out, timeout_s=RUN_GUARD_S)
    assert result.status == "ok", (result.cause, result.stderr_tail)
    return result


def test_same_recipe_and_seed_gives_the_same_curve(workload, tmp_path):
    a = run(workload, tmp_path / "a")
    b = run(workload, tmp_path / "b")
    assert a.losses() == b.losses()
    assert a.evals[-1].val_loss == b.evals[-1].val_loss
    c = run(workload, tmp_path / "c", seed=1)
    assert c.losses() != a.losses()


def test_micro_batch_splits_give_the_same_losses(workload, tmp_path):
    # 1x16, 4x4 and 16x1: one update, whatever the split (the loss is normalised over the global batch).
    curves = [run(workload, tmp_path / f"mbs{m}", micro_batch_size=m).losses() for m in (1, 4, 16)]
    for curve in curves[1:]:
        assert curve == pytest.approx(curves[0], rel=1e-4, abs=1e-5)
    # and learning happened, so the comparison is not between two flat lines
    assert curves[0][-1] < curves[0][0]


def test_two_process_ddp_matches_single_process(workload, tmp_path):
    single = run(workload, tmp_path / "single", micro_batch_size=8)
    ddp = run(workload, tmp_path / "ddp", micro_batch_size=4, nproc=2)
    assert ddp.n_devices == 2
    assert ddp.losses() == pytest.approx(single.losses(), rel=1e-4, abs=1e-5)


def test_metrics_stream_and_summary(workload, tmp_path):
    result = run(workload, tmp_path / "m", steps=8, eval_interval=4, micro_batch_size=8)
    lines = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if "loss" in x]
    assert [x["step"] for x in train] == list(range(1, 9))
    assert {"step", "loss", "tokens", "step_time_s", "peak_mem_bytes", "grad_norm", "lr"} <= train[0].keys()
    assert [x["step"] for x in lines if "val_loss" in x] == [4, 8]
    s = result.summary()
    assert s.tokens_per_s > 0 and s.measured_steps == 8 - s.warmup_steps
    assert s.mfu is not None and 0 < s.mfu < 1
    convention = json.loads((tmp_path / "m" / "run.json").read_text())["mfu_convention"]
    assert convention["matmul_dtype"] == "fp32" and convention["peak_source"].startswith("measured")
    assert (tmp_path / "m" / "result.json").exists() and (tmp_path / "m" / "recipe.json").exists()


def test_nan_is_classified(workload, tmp_path):
    # An absurd learning rate without clipping blows the weights up within a few steps.
    diverging = workload.resolve({**BASE, "lr": 1e8, "grad_clip": 0.0, "warmup_steps": 0})
    result = workload.run(diverging, 30, tmp_path / "nan")
    assert result.status == "nan"
    assert "non-finite" in result.cause
    assert not math.isfinite(result.steps[-1].loss)
    assert RunResult.load(tmp_path / "nan" / "result.json").status == "nan"  # NaN survives the round trip


def test_timeout_is_classified(workload, tmp_path):
    result = workload.run(workload.resolve(BASE), 10_000, tmp_path / "slow", timeout_s=3)
    assert result.status == "timeout"


def test_invalid_recipe_exits_with_status(workload, tmp_path):
    # A recipe that slips past the config layer is still refused by the trainer itself.
    out = tmp_path / "bad"
    out.mkdir()
    (out / "r.json").write_text(json.dumps({**BASE, "micro_batch_size": 5}))
    from recipetune.trainer.__main__ import main

    assert main(["--recipe", str(out / "r.json"), "--steps", "2", "--out", str(out)]) == 2
    assert json.loads((out / "status.json").read_text())["status"] == "invalid"


def test_stop_at_target_and_continue_from_checkpoint(workload, tmp_path):
    recipe = workload.resolve({**BASE, "lr_schedule": "constant", "ewa_decay": 0.9, "eval_interval": 2})
    first = workload.run(recipe, 40, tmp_path / "a", extra_args=["--stop-at-val-loss", "5.3",
                                                                "--save-checkpoint", str(tmp_path / "ck.pt")])
    assert first.status == "ok" and "reached validation loss" in json.loads(
        (tmp_path / "a" / "status.json").read_text())["cause"]
    assert len(first.steps) < 40 and first.evals[-1].val_loss <= 5.3
    more = workload.run(recipe, 2, tmp_path / "b", extra_args=["--init-from", str(tmp_path / "ck.pt")])
    assert more.ok and more.steps[0].step == len(first.steps) + 1


def test_noise_scale_is_written(workload, tmp_path):
    result = run(workload, tmp_path / "gns", micro_batch_size=4, noise_scale=True)
    values = [s.noise_scale for s in result.steps]
    assert all(v is not None and math.isfinite(v) for v in values)
