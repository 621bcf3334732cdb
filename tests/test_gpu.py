"""GPU-only checks (``pytest -m gpu``, run by benchmarks/gpu_check.sh); skipped without CUDA.

bf16 autocast, the fused optimizer, torch.compile, activation checkpointing's memory saving, FSDP2
and tensor parallelism over NCCL (with >= 2 GPUs), float8 (with torchao on compute capability >= 8.9).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from recipetune.core.measure import gpu_peak_flops
from recipetune.workloads.reference import ReferenceWorkload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
BASE = {"model": "small", "seq_len": 256, "global_batch_size": 16, "micro_batch_size": 16, "lr": 1e-3,
        "warmup_steps": 2, "eval_batches": 1, "device": "cuda", "matmul_precision": "high"}


def run(tmp_path, name: str, steps: int = 8, **knobs):
    w = ReferenceWorkload()
    result = w.run(w.resolve({**BASE, **knobs}), steps, tmp_path / name, timeout_s=300)
    assert result.status == "ok", (name, result.cause, result.stderr_tail[-3000:])
    return result


def test_bf16_fused_optimizer_trains_and_reports_mfu(tmp_path):
    result = run(tmp_path, "bf16", dtype="bf16", optimizer_impl="fused", steps=12)
    losses = result.losses()
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    s = result.summary()
    assert s.peak_mem_bytes and s.peak_mem_bytes > 0
    if gpu_peak_flops(torch.cuda.get_device_name(), "bf16") is not None:  # a GPU kind in the table
        assert result.peak_flops_per_device == gpu_peak_flops(torch.cuda.get_device_name(), "bf16")
        assert s.mfu is not None and 0 < s.mfu < 1


def test_compile_regional_and_model_match_eager(tmp_path):
    eager = run(tmp_path, "eager", steps=6)
    for mode in ("regional", "model"):
        compiled = run(tmp_path, mode, steps=6, compile=mode)
        assert compiled.losses() == pytest.approx(eager.losses(), rel=2e-3), mode


def test_activation_checkpointing_lowers_peak_memory(tmp_path):
    peaks = {mode: run(tmp_path, mode, steps=3, seq_len=512, activation_checkpointing=mode).summary().peak_mem_bytes
             for mode in ("none", "selective", "full")}
    assert peaks["full"] < peaks["selective"] < peaks["none"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL layouts need >= 2 GPUs")
def test_nccl_layouts_match_one_gpu(tmp_path):
    single = run(tmp_path, "single", steps=6, micro_batch_size=8)
    for name, knobs in {"ddp": dict(nproc=2, micro_batch_size=8), "fsdp": dict(nproc=2, dp_shard=2, micro_batch_size=8),
                        "tp-sp": dict(nproc=2, tp=2, sequence_parallel=True)}.items():
        result = run(tmp_path, name, steps=6, **knobs)
        assert result.losses() == pytest.approx(single.losses(), rel=2e-3), name


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="float8 needs torchao")
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                    reason="float8 needs compute capability >= 8.9")
def test_float8_trains_close_to_bf16(tmp_path):
    bf16 = run(tmp_path, "bf16", steps=6, dtype="bf16")
    fp8 = run(tmp_path, "fp8", steps=6, dtype="bf16", float8="tensorwise")
    assert fp8.losses() == pytest.approx(bf16.losses(), rel=5e-2)
