"""MFU's convention: every matmul counted (nanoGPT's estimate_mfu agrees), against a named dense peak."""

from __future__ import annotations

import pytest
import torch

from recipetune.core.measure import RunResult, StepRecord, gpu_peak, gpu_peak_flops, matmul_dtype, peak_source
from recipetune.trainer.model import Transformer, flops_per_token, get_model_config
from recipetune.trainer.profile import compute_dtype


def nanogpt_estimate_mfu(n_params: int, n_layer: int, n_head: int, n_embd: int, block_size: int,
                         fwdbwd_per_iter: int, dt: float, peak: float) -> float:
    """nanoGPT model.py GPT.estimate_mfu as published (github.com/karpathy/nanoGPT), with its inputs made
    arguments: N from get_num_params() (tied head counted once, no position table in a RoPE model)."""
    N = n_params
    L, H, Q, T = n_layer, n_head, n_embd // n_head, block_size
    flops_per_token = 6 * N + 12 * L * H * Q * T
    flops_per_fwdbwd = flops_per_token * T
    flops_per_iter = flops_per_fwdbwd * fwdbwd_per_iter
    flops_achieved = flops_per_iter * (1.0 / dt)
    return flops_achieved / peak


def test_flops_per_token_is_nanogpts_for_gpt2_124m():
    cfg = get_model_config("gpt2-124m")
    with torch.device("meta"):  # the parameter count without allocating 124M weights
        model = Transformer(cfg)
    n = model.num_params()  # tied: the head is the embedding, counted once, as nanoGPT does
    T = 1024
    nanogpt = 6 * n + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * T
    assert flops_per_token(cfg, T) == pytest.approx(nanogpt, rel=1e-12)
    assert model.flops_per_token(T) == pytest.approx(nanogpt, rel=1e-12)
    # the attention term is counted (it is ~7% of the total at T=1024): leaving it out would be caught here
    assert flops_per_token(cfg, T) - 6 * n == pytest.approx(12 * 12 * 768 * 1024)


def test_a_runs_mfu_is_nanogpts_estimate():
    cfg = get_model_config("gpt2-124m")
    with torch.device("meta"):
        n = Transformer(cfg).num_params()
    batch, T, dt, peak = 32, 1024, 0.25, gpu_peak_flops("NVIDIA H200", "bf16")
    steps = [StepRecord(step=i + 1, loss=3.0, tokens=batch * T, step_time_s=dt) for i in range(10)]
    result = RunResult(recipe={}, recipe_id="x", status="ok", steps=steps, flops_per_token=flops_per_token(cfg, T),
                       peak_flops_per_device=peak)
    expected = nanogpt_estimate_mfu(n, cfg.n_layer, cfg.n_head, cfg.d_model, T, batch, dt, peak)
    assert result.summary().mfu == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("name", "bf16", "tf32"), [
    ("NVIDIA H200", 989.4e12, 494.7e12),
    ("NVIDIA H100 80GB HBM3", 989.4e12, 494.7e12),
    ("NVIDIA H100 PCIe", 756e12, 378e12),
    ("NVIDIA A100-SXM4-80GB", 312e12, 156e12),
    ("NVIDIA B200", 2.25e15, 1.1e15),
    ("NVIDIA L4", 121e12, 60e12),
    ("NVIDIA GeForce RTX 4090", 165.2e12, 82.6e12),
])
def test_the_peak_table_is_dense_and_names_its_source(name, bf16, tf32):
    row = gpu_peak(name)
    assert row is not None and "dense" in row.source
    assert (gpu_peak_flops(name, "bf16"), gpu_peak_flops(name, "tf32")) == (bf16, tf32)
    assert peak_source("cuda", name) == row.source


def test_look_alike_names_are_not_confused():
    # A10 is not A100 nor A10G (whose figures are unpublished); L4 is not L40S; an unknown GPU has no peak
    assert gpu_peak_flops("NVIDIA A10", "bf16") == 125e12
    assert gpu_peak("NVIDIA A10G") is None and gpu_peak("Tesla T4") is None
    assert gpu_peak_flops("NVIDIA L40S", "bf16") == 362.05e12
    assert "not in" in peak_source("cuda", "Tesla T4")


def test_the_peak_follows_the_dtype_the_matmuls_run_in():
    base = {"dtype": "fp32", "matmul_precision": "highest", "fsdp_param_dtype": "fp32", "float8": "none"}
    assert compute_dtype(base) == "fp32"
    assert compute_dtype({**base, "matmul_precision": "high"}) == "tf32"  # TF32: 7x fp32's peak on an H100
    assert compute_dtype({**base, "matmul_precision": "medium"}) == "bf16"
    assert compute_dtype({**base, "dtype": "bf16", "matmul_precision": "high"}) == "bf16"  # autocast decides
    assert compute_dtype({**base, "fsdp_param_dtype": "bf16"}) == "bf16"
    assert matmul_dtype("fp16", "high") == "fp16"
