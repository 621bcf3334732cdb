"""GPU checks of the MoE kernels and layouts (``pytest -m gpu``, run by benchmarks/gpu_check.sh); skipped
without CUDA, and the multi-process ones without 2 GPUs. Never run on a GPU yet (written without one).

Batched expert matmuls, and the grouped GEMM (torch._grouped_mm, expert_impl=segmented) in bf16, against the
loop on one GPU; over NCCL, expert parallelism, a pipeline and
context parallelism (ring attention on the CUDA SDPA kernels, refused on CPU) against one GPU.
"""

from __future__ import annotations

import pytest
import torch

from recipetune.workloads.reference import ReferenceWorkload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
# fp32 with full-precision matmuls: the layouts' curves agree to float tolerance, as on CPU
BASE = {"model": "tiny-moe", "seq_len": 256, "global_batch_size": 16, "micro_batch_size": 8, "lr": 3e-3,
        "warmup_steps": 2, "eval_batches": 1, "device": "cuda", "matmul_precision": "highest"}
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL layouts need >= 2 GPUs")


def run(tmp_path, name: str, steps: int = 6, **knobs):
    w = ReferenceWorkload()
    result = w.run(w.resolve({**BASE, **knobs}), steps, tmp_path / name, timeout_s=300)
    assert result.status == "ok", (name, result.cause, result.stderr_tail[-3000:])
    return result


def test_grouped_experts_match_the_loop(tmp_path):
    loop = run(tmp_path, "loop")
    grouped = run(tmp_path, "grouped", expert_impl="grouped")
    assert grouped.losses() == pytest.approx(loop.losses(), rel=1e-4)



def test_grouped_gemm_matches_the_loop_on_the_gpu_empty_groups_included():
    # torch._grouped_mm in bf16 (CUTLASS from compute capability 9.0, torch's loop below) against the loop's
    # bf16 matmuls, outputs and gradients, with 6 of 8 experts empty (imbalance 4); written without a GPU
    from recipetune.trainer.moe_kernels import experts_grouped_mm, experts_loop

    g = torch.Generator(device="cuda").manual_seed(0)
    E, d, h, counts = 8, 256, 704, torch.tensor([1024, 1024, 0, 0, 0, 0, 0, 0], device="cuda")
    shapes = [(E, h, d), (E, h, d), (E, d, h)]
    results = []
    for kernel in (experts_loop, experts_grouped_mm):
        ws = [(torch.randn(s, device="cuda", generator=g.manual_seed(i)) * 0.02).requires_grad_()
              for i, s in enumerate(shapes)]
        x = torch.randn(2048, d, device="cuda", generator=g.manual_seed(9)).requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = kernel(x, counts, *ws)
        out.float().square().mean().backward()
        results.append([out.detach().float(), x.grad, *(w.grad for w in ws)])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(b, a, rtol=3e-2, atol=3e-2 * float(a.abs().max()))
    assert not results[1][2][2:].any()  # the empty experts' gradient is zero, not garbage


def test_segmented_experts_train_to_the_loops_losses_in_bf16(tmp_path):
    loop = run(tmp_path, "loop-bf16", dtype="bf16")
    segmented = run(tmp_path, "segmented-bf16", dtype="bf16", expert_impl="segmented")
    assert segmented.losses() == pytest.approx(loop.losses(), rel=2e-2)

@TWO_GPUS
def test_expert_and_pipeline_layouts_match_one_gpu(tmp_path):
    one = run(tmp_path, "one", micro_batch_size=4, expert_impl="grouped")
    for name, knobs in {"ep": dict(nproc=2, dp_shard=2, ep=2, micro_batch_size=4, expert_impl="grouped"),
                        "pp": dict(nproc=2, pp=2, pp_microbatches=2, expert_impl="grouped"),
                        "pp-zbv": dict(nproc=2, pp=2, pp_schedule="ZBVZeroBubble", micro_batch_size=16,
                                       pp_microbatches=4, expert_impl="grouped")}.items():
        assert run(tmp_path, name, **knobs).losses() == pytest.approx(one.losses(), rel=1e-4), name


@TWO_GPUS
def test_context_parallel_matches_one_gpu(tmp_path):
    dense = dict(model="small", seq_len=512)
    one = run(tmp_path, "one", **dense)
    cp = run(tmp_path, "cp", nproc=2, cp=2, **dense)
    assert cp.losses() == pytest.approx(one.losses(), rel=1e-3)
