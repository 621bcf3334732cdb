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
    for step in ("pytest -q -m gpu", "recipetune run examples/gpt2-gpu.yaml", "recipetune tune", "gpu_check_report"):
        assert step in res.stdout


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_without_a_gpu_it_fails_fast_and_runs_nothing(tmp_path):
    res = sh(OUT=str(tmp_path / "out"))
    assert res.returncode == 1 and "no NVIDIA GPU" in res.stderr
    assert not (tmp_path / "out").exists()


def test_report_collects_the_figures(tmp_path):
    # A real (CPU) run stands in for the GPU run; the report reads the same files.
    from recipetune.workloads.reference import ReferenceWorkload

    out = tmp_path / "check"
    w = ReferenceWorkload()
    w.run(w.resolve({"model": "nano", "seq_len": 32, "global_batch_size": 8, "micro_batch_size": 8,
                     "num_threads": 1, "eval_batches": 1}), 4, out / "run")
    (out / "tune").mkdir()
    (out / "tune" / "verdict.json").write_text(json.dumps({"decision": "KEEP BASELINE", "change": "(baseline)",
                                                           "runs": 3, "verdict": None}))
    for phase, code in (("pytest", 0), ("run", 0), ("tune", 0)):
        (out / f"{phase}.rc").write_text(f"{code}\n")
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check_report.py"), str(out)],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GPU_CHECK_RESULTS": str(tmp_path / "results")})
    assert res.returncode == 0, res.stderr
    (figures,) = (tmp_path / "results").glob("gpu_check-*-cpu.json")
    data = json.loads(figures.read_text())
    assert data["run"]["status"] == "ok" and data["run"]["tokens_per_s"] > 0
    assert data["tune"]["decision"] == "KEEP BASELINE"
    assert "tokens/s" in figures.with_suffix(".md").read_text()
