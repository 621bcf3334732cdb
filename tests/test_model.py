import copy
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from recipetune.trainer.model import (
    PRESETS,
    MoE,
    Transformer,
    apply_rope,
    count_params,
    flops_per_token,
    get_model_config,
    rope_tables,
)
from recipetune.trainer.parallel import (
    CheckpointedBlock,
    apply_activation_checkpointing,
    apply_compile,
    wrap_ddp,
)

NANO = PRESETS["nano"]
NANO_MOE = PRESETS["nano-moe"]


def build(cfg=NANO, attention: str = "sdpa", seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg, attention=attention)


def tokens(cfg=NANO, B: int = 2, T: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def loss_of(model: Transformer, idx: torch.Tensor) -> torch.Tensor:
    logits, aux = model(idx[:, :-1])
    ce = F.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten(), reduction="sum")
    return ce + aux


# --- configs, parameter and FLOP counts -------------------------------------------------------------


def test_preset_sizes() -> None:
    assert 50_000 <= count_params(PRESETS["nano"]) <= 150_000
    assert count_params(PRESETS["tiny"]) < 1_000_000
    assert count_params(PRESETS["tiny-moe"]) < 1_000_000
    assert 5e6 <= count_params(PRESETS["small"]) <= 15e6
    assert 120e6 <= count_params(PRESETS["gpt2-124m"]) <= 130e6
    moe = PRESETS["moe-8x"]
    assert moe.n_experts == 8 and moe.top_k == 2
    assert 100e6 <= count_params(moe, active=True) <= 1e9 < count_params(moe)


@pytest.mark.parametrize("name", ["nano", "tiny", "tiny-moe"])
def test_built_model_matches_analytic_counts(name: str) -> None:
    cfg = PRESETS[name]
    model = Transformer(cfg)
    assert model.num_params() == count_params(cfg)
    assert model.num_params(non_embedding=True) == count_params(cfg, non_embedding=True)
    assert model.active_params() == count_params(cfg, active=True)
    assert model.flops_per_token(cfg.max_seq_len) == flops_per_token(cfg, cfg.max_seq_len)
    if cfg.n_experts:
        assert model.active_params() < model.num_params()


def test_llama_1b_analytic() -> None:
    cfg = get_model_config("llama-1b")
    # by hand: per layer wq,wo 2048^2 each, wk,wv 2048*512 each, SwiGLU 3*2048*8192, 2 norms;
    # the tied 128256 x 2048 embedding is counted once (as the output head matmul)
    per_layer = 2 * 2048**2 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048
    total = 16 * per_layer + 2048 + 128256 * 2048
    assert count_params(cfg) == total
    assert 1.23e9 < total < 1.24e9  # Llama-3.2-1B is 1.24B
    # 6N = 7.41e9 for the weight matmuls, 12*L*d*T = 0.81e9 for attention at T=2048
    expected = 6 * total + 12 * 16 * 2048 * 2048
    assert flops_per_token(cfg, 2048) == pytest.approx(expected)
    assert 8.1e9 < flops_per_token(cfg, 2048) < 8.4e9
    # attention FLOPs grow linearly with T
    assert flops_per_token(cfg, 4096) - flops_per_token(cfg, 2048) == pytest.approx(12 * 16 * 2048 * 2048)


def test_get_model_config() -> None:
    assert get_model_config("tiny") == PRESETS["tiny"]
    assert get_model_config("tiny", vocab_size=50304).vocab_size == 50304
    assert PRESETS["tiny"].vocab_size == 256  # the preset itself is untouched
    with pytest.raises(ValueError, match="tiny-moe"):
        get_model_config("huge")


# --- forward semantics ------------------------------------------------------------------------------


def test_forward_shapes_and_dense_aux() -> None:
    model = build()
    logits, aux = model(tokens(T=10))
    assert logits.shape == (2, 10, NANO.vocab_size)
    assert aux.dim() == 0 and aux.item() == 0.0


@pytest.mark.parametrize("cfg", [NANO, NANO_MOE], ids=["dense", "moe"])
def test_causality(cfg) -> None:
    model = build(cfg)
    idx = tokens(cfg, T=12)
    t = 5
    changed = idx.clone()
    changed[:, t + 1] = (changed[:, t + 1] + 1) % cfg.vocab_size
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, t + 1], b[:, t + 1])  # the change is visible from t+1 on


@pytest.mark.parametrize("cfg", [NANO, NANO_MOE], ids=["dense", "moe"])
def test_sdpa_matches_math(cfg) -> None:
    sdpa, math_ = build(cfg, "sdpa"), build(cfg, "math", seed=123)
    math_.load_state_dict(sdpa.state_dict())
    idx = tokens(cfg, T=20)
    with torch.no_grad():
        a, aux_a = sdpa(idx)
        b, aux_b = math_(idx)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    torch.testing.assert_close(aux_a, aux_b)


def test_rope_is_a_rotation_by_relative_position() -> None:
    cos, sin = rope_tables(head_dim=16, max_seq_len=32, theta=10000.0)
    q, k = torch.randn(16).expand(1, 1, 32, 16), torch.randn(16).expand(1, 1, 32, 16)
    rq, rk = apply_rope(q, cos, sin)[0, 0], apply_rope(k, cos, sin)[0, 0]
    torch.testing.assert_close(rq.norm(dim=-1), q[0, 0].norm(dim=-1))  # rotations keep the norm
    # the score between positions m and n depends only on m - n
    torch.testing.assert_close(rq[7] @ rk[3], rq[20] @ rk[16], rtol=1e-4, atol=1e-5)
    assert not torch.allclose(rq[7] @ rk[3], rq[7] @ rk[4])


def test_bad_attention_backend() -> None:
    with pytest.raises(ValueError, match="sdpa"):
        Transformer(NANO, attention="flash")


def test_gqa_projection_sizes() -> None:
    cfg = replace(NANO, n_head=4, n_kv_head=1)
    model = build(cfg)
    attn = model.layers["0"].attn
    assert attn.wq.weight.shape == (cfg.d_model, cfg.d_model)
    assert attn.wk.weight.shape == attn.wv.weight.shape == (cfg.head_dim, cfg.d_model)
    logits, _ = model(tokens(cfg, T=8))
    assert torch.isfinite(logits).all()


def test_residual_projection_init_is_scaled() -> None:
    model = build(PRESETS["tiny"])
    std_q = model.layers["0"].attn.wq.weight.std().item()
    std_o = model.layers["0"].attn.wo.weight.std().item()
    assert std_q == pytest.approx(0.02, rel=0.05)
    assert std_o == pytest.approx(0.02 / math.sqrt(2 * 4), rel=0.05)


def test_determinism() -> None:
    a, b = build(seed=7), build(seed=7)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(build(seed=8).tok_emb.weight, a.tok_emb.weight)


# --- mixture of experts -----------------------------------------------------------------------------


def test_moe_routing_uses_exactly_top_k_experts() -> None:
    moe = build(NANO_MOE).layers["0"].ffn
    assert isinstance(moe, MoE)
    x = torch.randn(50, NANO_MOE.d_model)
    weights, ids, probs = moe.route(x)
    assert ids.shape == weights.shape == (50, NANO_MOE.top_k)
    assert all(len(set(row.tolist())) == NANO_MOE.top_k for row in ids)  # k distinct experts per token
    torch.testing.assert_close(weights.sum(-1), torch.ones(50))
    torch.testing.assert_close(probs.sum(-1), torch.ones(50))


def test_moe_forward_matches_per_token_reference() -> None:
    moe = build(NANO_MOE).layers["0"].ffn
    x = torch.randn(1, 9, NANO_MOE.d_model)
    with torch.no_grad():
        out, _ = moe(x)
        weights, ids, _ = moe.route(x[0])
        def expert(e: int, tok: torch.Tensor) -> torch.Tensor:
            w1, w3, w2 = moe.experts.w1[e], moe.experts.w3[e], moe.experts.w2[e]
            return (F.silu(tok @ w1.T) * (tok @ w3.T)) @ w2.T

        ref = torch.stack([
            sum(w * expert(e, tok) for w, e in zip(weights[n], ids[n].tolist(), strict=True))
            for n, tok in enumerate(x[0])
        ])
    torch.testing.assert_close(out[0], ref, rtol=0, atol=1e-6)


def test_moe_aux_loss_and_router_grads() -> None:
    model = build(NANO_MOE)
    _, aux = model(tokens(NANO_MOE))
    assert aux.dim() == 0 and torch.isfinite(aux) and aux.item() > 0
    # each layer's balance loss is >= 1 (1 = perfectly balanced), so the sum is >= coef * n_layer
    assert aux.item() >= NANO_MOE.aux_loss_coef * NANO_MOE.n_layer - 1e-6
    loss_of(model, tokens(NANO_MOE)).backward()
    for layer in model.layers.values():
        g = layer.ffn.router.weight.grad
        assert g is not None and g.abs().sum() > 0

    # one token visits top_k of the n_experts; the idle experts' rows of the stacked weights get a zero
    # grad, so DDP sees every param every step, in both implementations
    for impl in ("loop", "grouped"):
        for layer in model.layers.values():
            layer.ffn.experts.impl = impl
        model.zero_grad(set_to_none=True)
        loss_of(model, tokens(NANO_MOE, B=1, T=2)).backward()
        idle = [p.grad[e] for layer in model.layers.values() for p in layer.ffn.experts.parameters()
                for e in range(NANO_MOE.n_experts)]
        idle_rows = 3 * NANO_MOE.n_layer * (NANO_MOE.n_experts - NANO_MOE.top_k)  # w1, w3, w2 per expert
        assert sum(int(g.abs().sum() == 0) for g in idle) >= idle_rows


def test_grouped_experts_are_the_loops_maths() -> None:
    # expert_impl is a speed knob: batched matmuls over padded groups give the loop's outputs and grads
    loop = build(NANO_MOE)
    grouped = Transformer(NANO_MOE, expert_impl="grouped")
    grouped.load_state_dict(loop.state_dict())
    idx = tokens(NANO_MOE, B=3, T=20)
    a, b = loss_of(loop, idx), loss_of(grouped, idx)
    a.backward()
    b.backward()
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5)
    for (name, pa), pb in zip(loop.named_parameters(), grouped.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-5, atol=1e-7, msg=name)
    with pytest.raises(ValueError, match="loop"):
        Transformer(NANO_MOE, expert_impl="fused")
    # an ep rank's experts may receive no token at all (tiny-moe, pp x ep over 4 ranks did): both
    # implementations return no row, and the weights stay in the graph with a zero grad
    for impl in ("loop", "grouped"):
        experts = copy.deepcopy(loop.layers["0"].ffn.experts)
        experts.impl = impl
        x = torch.zeros(0, NANO_MOE.d_model, requires_grad=True)
        out = experts(x, torch.zeros(NANO_MOE.n_experts, dtype=torch.long))
        assert out.shape == (0, NANO_MOE.d_model), impl
        out.sum().backward()
        assert all(p.grad is not None and not p.grad.any() for p in experts.parameters()), impl


def test_capacity_keeps_top1_choices_first_within_each_sequence() -> None:
    moe = MoE(replace(NANO_MOE, capacity_factor=1.0))  # 4 experts, top-2: capacity ceil(1 * T * 2 / 4) = T / 2
    # one sequence of 4 tokens: every top-1 choice is expert 0, every top-2 choice expert 1 or 2
    ids = torch.tensor([[[0, 1], [0, 2], [0, 1], [0, 1]]])
    kept = moe.kept(ids)
    assert moe.capacity(4) == 2
    assert kept[0, :, 0].tolist() == [True, True, False, False]  # expert 0 takes the first two top-1 slots
    assert kept[0, :, 1].tolist() == [True, True, True, False]  # expert 1 takes 2 of its 3, expert 2 its 1
    # the limit is per sequence: a second sequence has its own capacity
    assert moe.kept(ids.repeat(2, 1, 1)).tolist() == [kept[0].tolist()] * 2
    assert MoE(NANO_MOE).kept(ids).all()  # capacity_factor 0: no limit


def test_capacity_factor_drops_only_beyond_capacity_and_never_depends_on_the_batch() -> None:
    base = build(NANO_MOE)
    x = torch.randn(3, 24, NANO_MOE.d_model)
    moes = {cf: MoE(replace(NANO_MOE, capacity_factor=cf)) for cf in (0.0, 2.0, 0.5)}
    for moe in moes.values():
        moe.load_state_dict(base.layers["0"].ffn.state_dict())
    with torch.no_grad():
        out = {cf: moe(x)[0] for cf, moe in moes.items()}
        alone = moes[0.5](x[1:2])[0]
    # E / top_k = 2: each expert can take every token of a sequence, nothing drops, the same outputs
    torch.testing.assert_close(out[2.0], out[0.0], rtol=0, atol=0)
    routed, kept = moes[0.5].stats  # [2, E]: slots routed to each expert over both calls, and kept
    assert routed.sum() == 2 * (3 + 1) * 24 and kept.sum() < routed.sum()
    assert not torch.allclose(out[0.5], out[0.0])
    torch.testing.assert_close(alone, out[0.5][1:2], rtol=0, atol=1e-6)  # drops are per sequence
    moes[0.5].reset_stats()
    assert moes[0.5].stats is None


# --- execution: activation checkpointing, compile, DDP ----------------------------------------------


@pytest.mark.parametrize("cfg", [NANO, NANO_MOE], ids=["dense", "moe"])
def test_activation_checkpointing_is_exact(cfg) -> None:
    base = build(cfg)
    idx = tokens(cfg, T=16)
    results = {}
    for mode in ("none", "selective", "full"):
        model = copy.deepcopy(base)
        apply_activation_checkpointing(model, mode)
        loss = loss_of(model, idx)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results[mode] = (loss.detach(), grads)
    wrapped = sum(isinstance(layer, CheckpointedBlock) for layer in model.layers.values())
    assert wrapped == cfg.n_layer
    ref_loss, ref_grads = results["none"]
    for mode in ("selective", "full"):
        loss, grads = results[mode]
        torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-6)
        for (_, g), (name, g_ref) in zip(grads.items(), ref_grads.items(), strict=True):
            torch.testing.assert_close(g, g_ref, rtol=0, atol=1e-6, msg=name)


def test_full_checkpointing_recomputes_each_block_in_backward() -> None:
    model = build()
    apply_activation_checkpointing(model, "full")
    calls = []
    for layer in model.layers.values():
        layer.block.register_forward_pre_hook(lambda *_: calls.append(1))
    loss = loss_of(model, tokens())
    assert len(calls) == NANO.n_layer
    loss.backward()
    assert len(calls) == 2 * NANO.n_layer


def test_activation_checkpointing_keeps_state_dict_keys_and_is_reversible() -> None:
    model = build()
    keys = list(model.state_dict())
    apply_activation_checkpointing(model, "selective")
    assert [isinstance(layer, CheckpointedBlock) for layer in model.layers.values()] == [True, False]
    apply_activation_checkpointing(model, "full")
    assert list(model.state_dict()) == keys
    # checkpoints move between wrapped and unwrapped models both ways
    plain = build(seed=99)
    plain.load_state_dict(model.state_dict())
    assert torch.equal(plain.layers["1"].ffn.w2.weight, model.layers["1"].block.ffn.w2.weight)
    model.load_state_dict(build(seed=5).state_dict())
    assert torch.equal(model.layers["0"].block.attn.wq.weight, build(seed=5).layers["0"].attn.wq.weight)
    apply_activation_checkpointing(model, "none")
    assert not any(isinstance(layer, CheckpointedBlock) for layer in model.layers.values())
    assert list(model.state_dict()) == keys
    with pytest.raises(ValueError, match="selective"):
        apply_activation_checkpointing(model, "half")


def test_apply_compile_modes_and_bad_mode() -> None:
    model = build()
    keys = list(model.state_dict())
    apply_compile(model, "none")
    assert model._compiled_call_impl is None and all(b._compiled_call_impl is None for b in model.layers.values())
    apply_compile(model, "regional")  # each block in place (nothing compiles before a call)
    assert model._compiled_call_impl is None and all(b._compiled_call_impl is not None for b in model.layers.values())
    assert list(model.state_dict()) == keys  # in place: checkpoints keep their keys
    whole = build()
    apply_compile(whole, "model", "max-autotune")
    assert whole._compiled_call_impl is not None
    with pytest.raises(ValueError, match="regional"):
        apply_compile(model, "fast")
    with pytest.raises(ValueError, match="max-autotune"):
        apply_compile(model, "model", "fastest")


def test_wrap_ddp_is_identity_without_process_group() -> None:
    model = build()
    assert wrap_ddp(model, torch.device("cpu"), bucket_cap_mb=25, gradient_as_bucket_view=True) is model
