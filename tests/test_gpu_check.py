"""benchmarks/gpu_check.sh on a machine without a GPU: the dry run checks the files, the real run fails fast."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def sh(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def test_dry_run_validates_the_files_and_prints_the_plan():
    res = sh("--dry-run")
    assert res.returncode == 0, res.stderr
    for step in ("pytest -q -m gpu", "recipetune run examples/gpt2-gpu-hand.yaml",
                 "recipetune tune examples/gpt2-gpu.yaml", "layouts.py --suite moe --presets moe-8x",
                 "gpu_check_report"):
        assert step in res.stdout
    assert "720 s in all on one GPU" in res.stdout  # 12 minutes: 80 + 110 + 450 + 40 + 40
    assert "moe_kernels.py --preset moe-8x" in res.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_without_a_gpu_it_fails_fast_and_runs_nothing(tmp_path):
    res = sh(OUT=str(tmp_path / "out"))
    assert res.returncode == 1 and "no NVIDIA GPU" in res.stderr
    assert not (tmp_path / "out").exists()


def test_report_collects_the_figures(tmp_path):
    # The files a GPU run leaves (result.json, run.json), written here from a made-up 6-step run.
    from recipetune.core.measure import RunResult, StepRecord

    out = tmp_path / "check"
    (out / "run").mkdir(parents=True)
    steps = [StepRecord(step=i, loss=5.0 - 0.1 * i, tokens=32768, step_time_s=0.2, peak_mem_bytes=2**33)
             for i in range(1, 7)]
    hand = {"model": "gpt2-124m", "attention": "sdpa", "compile": "model", "micro_batch_size": 32}
    RunResult(recipe=hand, recipe_id="r", status="ok", steps=steps, warmup_steps=2,
              flops_per_token=5e8, peak_flops_per_device=989e12).save(out / "run" / "result.json")
    (out / "run" / "run.json").write_text(json.dumps({"device_name": "NVIDIA H200", "params": 85_000_000}))
    (out / "run" / "profile.json").write_text(json.dumps({"gpu_busy": 0.9, "launch_gap_share": 0.1,
                                                          "matmul_share": 0.6, "profiled_steps": 3}))
    # the campaign approved a recipe whose screening trial ran at 0.25 s a step: 0.8x the hand-tuned
    (out / "tune" / "trials" / "3").mkdir(parents=True)
    slower = [s.model_copy(update={"step_time_s": 0.25}) for s in steps]
    RunResult(recipe={**hand, "compile": "regional"}, recipe_id="w", status="ok", steps=slower, warmup_steps=2,
              flops_per_token=5e8, peak_flops_per_device=989e12).save(out / "tune" / "trials" / "3" / "result.json")
    (out / "tune" / "verdict.json").write_text(json.dumps({
        "decision": "APPROVED", "change": 'compile="regional"', "recipe_id": "w", "runs": 14, "trials": 9,
        "recipe": {**hand, "compile": "regional"}, "verdict": {"speedup": 2.1}}))
    (out / "tune.s").write_text("401.5\n")
    grouped = {"tokens_per_s": 50000.0, "peak_mem_mib": 30000.0, "losses": [5.0],
               "profile": {"expert_imbalance": 1.3, "step_time_s": 0.3}}
    (out / "layouts-moe.json").write_text(json.dumps({"figures": {"moe-8x": {"1 process, grouped experts": grouped}},
                                                      "skipped": ["moe-8x PP x2: needs 2 GPUs, 1 here"]}))
    kernel = {"dtype": "bf16", "imbalance": 4.0, "impl": "segmented", "ms": 1.25, "max_rel_error_vs_loop": 2.7e-3}
    (out / "moe-kernels.json").write_text(json.dumps({"preset": "moe-8x", "kernels": [kernel]}))
    for phase, code in (("pytest", 0), ("run", 0), ("tune", 0), ("layouts", 0), ("moe", 0)):
        (out / f"{phase}.rc").write_text(f"{code}\n")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check_report.py"), str(out)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GPU_CHECK_RESULTS": str(tmp_path / "results")})
    assert res.returncode == 0, res.stderr
    (figures,) = (tmp_path / "results").glob("gpu_check-*-NVIDIA-H200.json")
    data = json.loads(figures.read_text())
    assert data["run"]["status"] == "ok" and data["run"]["tokens_per_s"] == 163840  # 32768 / 0.2
    assert data["run"]["mfu"] == pytest.approx(163840 * 5e8 / 989e12)
    assert data["tune"]["decision"] == "APPROVED" and data["tune"]["trials"] == 9 and data["tune"]["device_s"] == 401.5
    assert data["tune"]["tokens_per_s"] == 131072
    assert data["tune"]["recipe"].startswith("attention=sdpa compile=regional")
    assert data["hand_tuned"]["tokens_per_s"] == 163840 and data["hand_tuned"]["profile"]["gpu_busy"] == 0.9
    assert data["hand_tuned"]["mfu"] == pytest.approx(163840 * 5e8 / 989e12)
    assert data["layouts"]["moe-8x"]["1 process, grouped experts"]["tokens_per_s"] == 50000.0
    assert data["moe_kernels"]["kernels"] == [kernel]
    md = figures.with_suffix(".md").read_text()
    assert "tokens/s" in md and "expert imbalance 1.30" in md and "left out: moe-8x PP x2" in md
    assert "(0.80x the hand-tuned)" in md and "launch gaps 10%" in md
    assert "moe kernels bf16, imbalance 4, segmented: 1.25 ms" in md


def test_each_phase_writes_the_same_files_from_the_first_on(tmp_path):
    # after phase 1 only the GPU list and the tests' exit code exist: the figures still go to the device's name
    out = tmp_path / "check"
    out.mkdir()
    (out / "gpus.txt").write_text("GPU 0: NVIDIA H200 (UUID: GPU-cd960c36-9a29-c2b0-b4d3-4d34e73b78a8)\n")
    (out / "pytest.rc").write_text("0\n")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check_report.py"), str(out)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GPU_CHECK_RESULTS": str(tmp_path / "results")})
    assert res.returncode == 1  # the other phases have not run
    (figures,) = (tmp_path / "results").glob("gpu_check-*.json")
    assert figures.name.endswith("-NVIDIA-H200.json")
    data = json.loads(figures.read_text())
    assert data["exit_codes"] == {"pytest": 0, "run": None, "tune": None, "layouts": None, "moe": None}
    assert data["hand_tuned"] == {}
