"""The experts' three implementations (trainer/moe_kernels.py) compute the loop's maths: outputs and gradients.

``expert_impl`` is a speed knob, so "grouped" (padded bmm) and "segmented" (torch._grouped_mm, or the loop's
per-segment matmuls) must give the loop's outputs and gradients under every routing the router can make:
balanced, imbalance 4 (the H200's moe-8x layer: 2 of 8 experts take every slot), experts with no token,
top-1 and top-2. Segmented takes the grouped GEMM only in bf16; in fp32 it calls the loop itself, so a
comparison of fp32 segmented with the loop would compare the loop with itself. Its fp32 cases therefore
force the grouped GEMM (torch runs it eagerly in fp32 on CPU) and compare at fp32 precision; its own choice
is tested where it takes the grouped GEMM, in bf16 (autocast), at bf16 precision; and every case asserts
which kernel ran (``ran``).
"""

from __future__ import annotations

import copy
from dataclasses import replace
from functools import partial

import pytest
import torch

from recipetune.trainer import moe_kernels
from recipetune.trainer.model import MoE, Transformer
from recipetune.trainer.moe_kernels import (
    experts_grouped_mm,
    experts_loop,
    experts_padded,
    experts_segmented,
    grouped_mm_applies,
)
from recipetune.trainer.presets import PRESETS

# 8 top-2 experts on nano's width: imbalance 4 is reachable (2 hot experts; with 4 experts top-2 caps it at 2)
MOE8 = replace(PRESETS["nano-moe"], n_experts=8)
E, D, H = MOE8.n_experts, MOE8.d_model, MOE8.ffn_hidden
HAS_GROUPED_MM = hasattr(torch, "_grouped_mm")
needs_grouped_mm = pytest.mark.skipif(not HAS_GROUPED_MM, reason="torch._grouped_mm needs torch >= 2.8")

ROUTINGS = {  # routing slots per expert, 64 in all
    "balanced": [8] * 8,
    "imbalance-4": [32, 32, 0, 0, 0, 0, 0, 0],  # busiest / mean = 32 / 8
    "one-hot-expert": [0, 0, 0, 64, 0, 0, 0, 0],
    "ragged": [13, 0, 1, 20, 0, 7, 23, 0],
}
KERNELS = {  # each with the kernels experts_segmented hands its calls to (``ran``)
    "padded": (experts_padded, []),
    "grouped-mm": (experts_grouped_mm, []),  # torch._grouped_mm called directly, in fp32
    "segmented-grouped-mm": (partial(experts_segmented, grouped_mm=True), ["grouped-mm"]),  # forced in fp32
}


@pytest.fixture
def ran(monkeypatch) -> list[str]:
    """The kernels experts_segmented handed its calls to, in order: "loop" or "grouped-mm". The kernels
    called directly (a test's reference loop, the "loop" and "grouped" impls) are not counted."""
    calls: list[str] = []
    for name, attr in (("loop", "experts_loop"), ("grouped-mm", "experts_grouped_mm")):
        kernel = getattr(moe_kernels, attr)

        def spy(*args, _name=name, _kernel=kernel):
            calls.append(_name)
            return _kernel(*args)

        monkeypatch.setattr(moe_kernels, attr, spy)
    return calls


def weights(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(E, H, D), (E, H, D), (E, D, H)]
    return [(torch.randn(s, generator=g) * 0.1).requires_grad_() for s in shapes]


def grads_of(kernel, counts: list[int], x: torch.Tensor, ws: list[torch.Tensor]):
    x = x.detach().clone().requires_grad_()
    ws = [w.detach().clone().requires_grad_() for w in ws]
    out = kernel(x, torch.tensor(counts), *ws)
    # a gradient that is not all ones, so every row and column of the backward counts
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    return out, x.grad, [w.grad for w in ws]


@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_each_kernel_gives_the_loops_outputs_and_gradients(kernel, routing, ran):
    if kernel != "padded" and not HAS_GROUPED_MM:
        pytest.skip("torch._grouped_mm needs torch >= 2.8")
    counts = ROUTINGS[routing]
    x = torch.randn(sum(counts), D, generator=torch.Generator().manual_seed(1))
    ws = weights()
    fn, expected = KERNELS[kernel]
    out, gx, gw = grads_of(fn, counts, x, ws)
    assert ran == expected
    ref, rx, rw = grads_of(experts_loop, counts, x, ws)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gx, rx, rtol=1e-5, atol=1e-6)
    for name, a, b in zip(("w1", "w3", "w2"), gw, rw, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
        idle = [e for e, c in enumerate(counts) if c == 0]
        assert not a[idle].any(), f"{name}: an expert with no token has a zero gradient (DDP sees it)"


SEGMENTED_CHOICES = {  # rows' dtype, autocast to bf16, d -> the kernel experts_segmented takes (torch >= 2.8)
    "fp32": (torch.float32, False, D, "loop"),
    "fp16": (torch.float16, False, D, "loop"),
    "bf16-autocast": (torch.float32, True, D, "grouped-mm"),
    "bf16-rows": (torch.bfloat16, False, D, "grouped-mm"),  # FSDP2's bf16 policy
    "bf16-d-not-a-multiple-of-8": (torch.bfloat16, False, 12, "loop"),  # rows not 16-byte aligned
}


@pytest.mark.parametrize("case", list(SEGMENTED_CHOICES))
def test_segmented_takes_the_grouped_gemm_in_bf16_only(case, ran):
    dtype, autocast, d, expected = SEGMENTED_CHOICES[case]
    if not HAS_GROUPED_MM:
        expected = "loop"
    g = torch.Generator().manual_seed(4)
    counts = ROUTINGS["ragged"]
    x = torch.randn(sum(counts), d, generator=g).to(dtype)
    ws = [torch.randn(s, generator=g).to(dtype) for s in [(E, H, d), (E, H, d), (E, d, H)]]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = experts_segmented(x, torch.tensor(counts), *ws)
    assert ran == [expected]
    assert out.shape == x.shape


@needs_grouped_mm
def test_no_token_at_all_falls_back_and_keeps_the_weights_in_the_graph(ran):
    # an expert-parallel rank whose experts received nothing: no row out, every weight a zero gradient
    ws = weights()
    x = torch.zeros(0, D, requires_grad=True)
    out = experts_segmented(x, torch.zeros(E, dtype=torch.long), *ws, grouped_mm=True)
    assert ran == ["loop"]  # even forced: _grouped_mm's backward refuses empty operands
    assert out.shape == (0, D)
    out.sum().backward()
    assert all(w.grad is not None and not w.grad.any() for w in ws)


def hot_router(moe: MoE, hot: list[int]) -> None:
    """Route every token to the ``hot`` experts: they read feature 0, which the inputs hold at +3."""
    with torch.no_grad():
        moe.router.weight[:, 0] = -10.0
        moe.router.weight[hot, 0] = 10.0


def moe_grads(moe: MoE, x: torch.Tensor):
    moe.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    out, aux = moe(x)
    (out.square().mean() + aux).backward()
    return out, x.grad, {n: p.grad for n, p in moe.named_parameters()}


LAYER_IMPLS = {  # impl, its grouped_mm, autocast to bf16 -> the kernels experts_segmented ran, one per forward
    "grouped": ("grouped", None, False, []),
    "segmented-grouped-mm": ("segmented", True, False, ["grouped-mm"]),  # fp32: forced
    "segmented-bf16": ("segmented", None, True, ["grouped-mm"]),  # its own choice, as a bf16 run makes it
}
BF16 = {"rtol": 2e-2, "atol": 2e-3}  # bf16 rounds to 3 significant digits; the two sum in different orders


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("hot", [None, [0, 1]], ids=["router", "imbalance-4"])
@pytest.mark.parametrize("impl", list(LAYER_IMPLS))
def test_moe_layer_gives_the_loops_outputs_and_gradients(impl, hot, top_k, ran):
    name, grouped_mm, bf16, expected = LAYER_IMPLS[impl]
    if impl != "grouped" and not HAS_GROUPED_MM:
        pytest.skip("torch._grouped_mm needs torch >= 2.8")
    torch.manual_seed(0)
    loop = MoE(replace(MOE8, top_k=top_k))
    for w in (loop.experts.w1, loop.experts.w3, loop.experts.w2):
        torch.nn.init.normal_(w, std=0.05)
    x = torch.randn(3, 16, D)
    if hot is not None:
        hot_router(loop, hot)
        x[..., 0] = 3.0
    other = copy.deepcopy(loop)
    other.experts.impl, other.experts.grouped_mm = name, grouped_mm
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out, gx, gp = moe_grads(loop, x)
        out2, gx2, gp2 = moe_grads(other, x)
    assert ran == expected
    if hot is not None:  # the routing is the one meant: 2 of 8 experts take every slot (top-1: unevenly)
        routed = loop.stats[0]
        assert routed.max() / routed.mean() >= 4.0 and int((routed == 0).sum()) == 6
        assert top_k == 1 or routed.max() / routed.mean() == pytest.approx(4.0)
    tol = BF16 if bf16 else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(out2.float(), out.float(), **tol)
    torch.testing.assert_close(gx2, gx, **tol)
    for param, g in gp.items():
        torch.testing.assert_close(gp2[param], g, **tol, msg=param)


@needs_grouped_mm
def test_segmented_takes_the_grouped_gemm_in_bf16_and_matches_the_loop_there(ran):
    ws = weights()
    counts = ROUTINGS["imbalance-4"]
    x = torch.randn(sum(counts), D, generator=torch.Generator().manual_seed(2))
    assert not grouped_mm_applies(x, ws[0])  # fp32: the loop's matmuls
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert grouped_mm_applies(x, ws[0])
        out, gx, gw = grads_of(experts_segmented, counts, x, ws)
        ref, rx, rw = grads_of(experts_loop, counts, x, ws)
    assert ran == ["grouped-mm"]
    assert out.dtype == torch.bfloat16
    # bf16 rounds to 3 significant digits; the two sum in different orders
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-3)
    for a, b in zip([gx, *gw], [rx, *rw], strict=True):
        torch.testing.assert_close(a.float(), b.float(), rtol=3e-2, atol=3e-3)
    assert not grouped_mm_applies(torch.zeros(4, 12, dtype=torch.bfloat16), ws[0])  # d not a multiple of 8


def test_unknown_impl_names_the_choices():
    with pytest.raises(ValueError, match="segmented"):
        Transformer(PRESETS["nano-moe"], expert_impl="fused")


@needs_grouped_mm
def test_a_few_training_steps_with_the_grouped_gemm_give_the_loops_losses(ran):
    # the whole model, several AdamW steps: a difference in any gradient would grow into the losses
    cfg = PRESETS["nano-moe"]
    torch.manual_seed(0)
    loop = Transformer(cfg)
    seg = copy.deepcopy(loop)
    for layer in seg.layers.values():
        layer.ffn.experts.impl, layer.ffn.experts.grouped_mm = "segmented", True
    idx = torch.randint(0, cfg.vocab_size, (4, 33), generator=torch.Generator().manual_seed(3))
    curves = []
    for model in (loop, seg):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(5):
            logits, aux = model(idx[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten()) + aux
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    assert ran == ["grouped-mm"] * (5 * cfg.n_layer)  # every forward of every layer of the segmented model
    assert curves[0][-1] < curves[0][0]  # it learns
    assert curves[1] == pytest.approx(curves[0], rel=1e-5)


@pytest.mark.slow  # two trainer launches of tiny-moe (~10 s each on a quiet 2-core machine)
def test_the_trainer_runs_segmented_experts_to_the_loops_losses(tmp_path):
    from recipetune.workloads.reference import ReferenceWorkload

    w = ReferenceWorkload()
    base = {"model": "tiny-moe", "seq_len": 64, "global_batch_size": 8, "micro_batch_size": 4,
            "warmup_steps": 1, "num_threads": 1, "eval_batches": 1}
    assert not w.check(w.resolve({**base, "expert_impl": "segmented"}))
    runs = {}
    for impl in ("loop", "segmented"):
        runs[impl] = w.run(w.resolve({**base, "expert_impl": impl}), 4, tmp_path / impl, timeout_s=3600)
        assert runs[impl].status == "ok", runs[impl].stderr_tail[-2000:]
    assert runs["segmented"].losses() == pytest.approx(runs["loop"].losses(), rel=1e-5)


@pytest.mark.slow  # two 2-process launches over gloo, bf16 on CPU (~40 s each on a loaded 2-core machine)
def test_expert_parallel_bf16_segmented_experts_give_the_loops_losses(tmp_path):
    # FSDP2's bf16 policy hands the experts bf16 rows: segmented takes torch._grouped_mm on each ep rank's
    # local experts (DTensor shards), and a rank's experts may get no token at all
    from recipetune.workloads.reference import ReferenceWorkload

    w = ReferenceWorkload()
    base = {"model": "nano-moe", "seq_len": 32, "global_batch_size": 16, "micro_batch_size": 4, "warmup_steps": 2,
            "num_threads": 1, "eval_batches": 1, "nproc": 2, "dp_shard": 2, "ep": 2, "fsdp_param_dtype": "bf16"}
    losses = {}
    for impl in ("loop", "segmented"):
        r = w.run(w.resolve({**base, "expert_impl": impl}), 4, tmp_path / impl, timeout_s=3600)
        assert r.status == "ok", r.stderr_tail[-2000:]
        losses[impl] = r.losses()
    assert losses["segmented"] == pytest.approx(losses["loop"], rel=1e-3)
