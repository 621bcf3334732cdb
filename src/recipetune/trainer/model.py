"""A decoder-only transformer: dense (Llama-style) or mixture-of-experts (Mixtral-style).

The model only computes logits and the MoE load-balancing loss. How it is executed (activation
checkpointing, torch.compile, DDP) lives in parallel.py, and the loss lives in the training loop,
which needs reduction="sum" cross-entropy for exact gradient accumulation.
"""

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from recipetune.trainer.moe_kernels import IMPLS as EXPERT_KERNELS
from recipetune.trainer.moe_kernels import experts_segmented
from recipetune.trainer.presets import PRESETS, ModelConfig, count_params, flops_per_token, get_model_config

__all__ = ["PRESETS", "Experts", "ModelConfig", "MoE", "Transformer", "count_params", "flops_per_token",
           "get_model_config"]

ATTENTION_BACKENDS = ("sdpa", "math")
EXPERT_IMPLS = tuple(EXPERT_KERNELS)  # loop, grouped (padded), segmented


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in fp32: bf16 sums of squares lose too much precision
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # [T, head_dim/2]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [B, H, T, D]; rotate the pairs (x[i], x[i + D/2]) ("rotate half", as in HF Llama)
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: str) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.backend = backend
        self.wq = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # -1 heads: a tensor-parallel run holds only its share of the heads (parallel.py)
        q = self.wq(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        # the tables cover the longest sequence; a pipeline stage under sequence parallelism only knows
        # the sequence's length here, once it is gathered
        q, k = apply_rope(q, cos[:T], sin[:T]), apply_rope(k, cos[:T], sin[:T])
        # GQA: each kv head serves n_head / n_kv_head consecutive query heads
        rep = q.shape[1] // k.shape[1]
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if self.backend == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).float().softmax(dim=-1).type_as(q)
            y = att @ v
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, hidden, bias=False)
        self.w3 = nn.Linear(d_model, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _local(w: torch.Tensor) -> torch.Tensor:
    # Under expert parallelism the stacked weights are DTensors sharded over the experts (parallel.py);
    # each rank computes with its own experts' slice.
    return w.to_local() if hasattr(w, "to_local") else w


class Experts(nn.Module):
    """The SwiGLU experts of one MoE layer, their weights stacked: w1, w3 [E, hidden, d], w2 [E, d, hidden].

    ``forward(x, counts)`` takes tokens already sorted by expert (``counts[e]`` rows each) and returns
    each row through its expert. ``impl`` is how, with the same maths (moe_kernels.py): "loop", one pair
    of matmuls per expert in a Python loop; "grouped", batched matmuls (bmm) over the groups padded to
    the largest; "segmented", no padding: grouped GEMMs (torch._grouped_mm) in bf16, the loop's per-segment
    matmuls otherwise. ``grouped_mm`` forces segmented's choice (None: decided per call; the tests set it).
    Expert parallelism (parallel.py) wraps this module: the all-to-all brings a rank the tokens of its own
    experts, and ``counts`` then counts those.
    """

    def __init__(self, n_experts: int, d_model: int, hidden: int, impl: str = "loop") -> None:
        super().__init__()
        if impl not in EXPERT_IMPLS:
            raise ValueError(f"expert_impl must be one of {EXPERT_IMPLS}, got {impl!r}")
        self.impl = impl
        self.grouped_mm: bool | None = None
        self.w1 = nn.Parameter(torch.empty(n_experts, hidden, d_model))
        self.w3 = nn.Parameter(torch.empty(n_experts, hidden, d_model))
        self.w2 = nn.Parameter(torch.empty(n_experts, d_model, hidden))

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        w1, w3, w2 = _local(self.w1), _local(self.w3), _local(self.w2)
        if self.impl == "segmented":
            return experts_segmented(x, counts, w1, w3, w2, self.grouped_mm)
        return EXPERT_KERNELS[self.impl](x, counts, w1, w3, w2)


class MoE(nn.Module):
    """Top-k routed SwiGLU experts (Mixtral-style), with an optional capacity per expert.

    ``capacity_factor`` 0: no limit, no token is ever dropped. Otherwise each expert takes at most
    ``ceil(capacity_factor * T * top_k / n_experts)`` routing slots of each sequence of T tokens, top-1
    choices first, then by position (GShard/Switch); the slots beyond it are dropped (the token keeps
    only its residual for that slot). The limit is per sequence, so which slots are dropped depends on
    neither the micro-batch nor the layout: dropping changes what is learned, never by how it is run.
    """

    def __init__(self, cfg: ModelConfig, expert_impl: str = "loop") -> None:
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = cfg.n_experts, cfg.top_k, cfg.capacity_factor
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = Experts(cfg.n_experts, cfg.d_model, cfg.ffn_hidden, expert_impl)
        # Routing counts since the last reset_stats(), for the metrics stream: not buffers, so no
        # data-parallel wrapper broadcasts or syncs them. [n_experts] slots routed, then dropped, kept.
        self.stats: torch.Tensor | None = None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [N, C] -> (weights [N, k] summing to 1, expert ids [N, k], router probs [N, E])."""
        probs = self.router(x).float().softmax(dim=-1)  # fp32: the aux loss and top-k need it
        weights, ids = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids, probs

    def capacity(self, seq_len: int) -> int:
        """Routing slots one expert takes from one sequence (seq_len * top_k when unlimited)."""
        if self.capacity_factor <= 0:
            return seq_len * self.top_k
        return math.ceil(self.capacity_factor * seq_len * self.top_k / self.n_experts)

    def kept(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T, k] -> bool [B, T, k]: the slots within their expert's capacity for their sequence."""
        B, T, k = ids.shape
        if self.capacity(T) >= T * k:
            return torch.ones_like(ids, dtype=torch.bool)
        order = ids.transpose(1, 2).reshape(B, k * T)  # priority: every top-1 choice, then top-2, ...
        onehot = F.one_hot(order, self.n_experts)
        rank = (onehot.cumsum(dim=1) * onehot).sum(-1)  # 1-based place of each slot in its expert's queue
        return (rank <= self.capacity(T)).view(B, k, T).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, C = x.shape
        flat = x.reshape(B * T, C)
        weights, ids, probs = self.route(flat)
        keep = self.kept(ids.view(B, T, self.top_k)).reshape(-1)
        # the kept slots sorted by expert (stable: a token's slots stay in expert order)
        expert = ids.reshape(-1)[keep]
        order = torch.argsort(expert, stable=True)
        token = torch.arange(B * T, device=x.device).repeat_interleave(self.top_k)[keep][order]
        counts = torch.bincount(expert, minlength=self.n_experts)
        y = self.experts(flat.index_select(0, token), counts)
        y = y * weights.reshape(-1)[keep][order].unsqueeze(-1).to(y.dtype)
        out = torch.zeros_like(flat).index_add_(0, token, y.to(flat.dtype))
        # Switch/Mixtral balance loss: E * sum_i f_i * P_i, f_i = share of the N*k routing slots sent
        # to expert i before any drop (not differentiable), P_i = mean router prob (carries the
        # gradient); 1.0 when uniform
        routed = torch.bincount(ids.reshape(-1), minlength=self.n_experts)
        aux = self.n_experts * (routed.float() / ids.numel() * probs.mean(dim=0)).sum()
        self._count(routed, counts)
        return out.view(B, T, C), aux

    @torch.no_grad()
    def _count(self, routed: torch.Tensor, kept: torch.Tensor) -> None:
        step = torch.stack([routed, kept]).to(torch.float64)
        self.stats = step if self.stats is None else self.stats + step

    def reset_stats(self) -> None:
        self.stats = None


class Block(nn.Module):
    """Pre-norm residual block. Returns (x, aux_loss) so MoE balance losses can be summed by the caller."""

    def __init__(self, cfg: ModelConfig, attention: str, expert_impl: str = "loop") -> None:
        super().__init__()
        self.aux_loss_coef = cfg.aux_loss_coef
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, attention)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = MoE(cfg, expert_impl) if cfg.n_experts else MLP(cfg.d_model, cfg.ffn_hidden)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        if isinstance(self.ffn, MoE):
            h, aux = self.ffn(self.ffn_norm(x))
            return x + h, self.aux_loss_coef * aux
        return x + self.ffn(self.ffn_norm(x)), x.new_zeros((), dtype=torch.float32)


class AuxLossInBackward(torch.autograd.Function):
    """A zero whose backward gives ``aux`` the gradient 1: added to a stage's output, it puts a loss term
    into the backward without it being part of the output (Megatron's MoE aux-loss scaler). A pipeline
    stage passes only its hidden state on, so its MoE balance loss joins the gradient here. (A new zero,
    not the hidden state passed through: zero-bubble schedules detach a stage's output in place, which a
    Function's pass-through output, a view, does not allow.)"""

    @staticmethod
    def forward(ctx, aux: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.zeros((), dtype=aux.dtype, device=aux.device)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.ones((), dtype=grad.dtype, device=grad.device)


class Transformer(nn.Module):
    """Embedding, blocks, final norm and head; ``layers`` is keyed by block number.

    A pipeline stage (pipeline.py) is a Transformer with the parts of other stages set to None and
    ``stage_batch`` set: it then returns only its output (hidden state, or logits for the last stage)
    and adds its blocks' MoE balance loss to the backward itself, weighted as the training loop
    weights it (micro-batch / ``stage_batch``, the sequences of one data-parallel rank's step).
    """

    def __init__(self, cfg: ModelConfig, attention: str = "sdpa", expert_impl: str = "loop") -> None:
        super().__init__()
        if attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, got {attention!r}")
        self.cfg = cfg
        self.tok_emb: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # a dict keyed by block number: a pipeline stage keeps its blocks' names (and so checkpointing's
        # "every other block" and the state_dict keys) when the others are taken out
        self.layers = nn.ModuleDict({str(i): Block(cfg, attention, expert_impl) for i in range(cfg.n_layer)})
        self.norm: RMSNorm | None = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head: nn.Linear | None = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.stage_batch = 0  # 0: the whole model; a pipeline stage sets it (pipeline.py)
        # non-persistent: derived from the config, so they stay out of checkpoints
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream so its variance does not
        # grow with depth (2 writes per block)
        for name, p in self.named_parameters():
            if name.endswith(("attn.wo.weight", "w2.weight", "experts.w2")):
                nn.init.normal_(p, mean=0.0, std=cfg.init_std / math.sqrt(2 * cfg.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_std)
        elif isinstance(module, Experts):
            for w in (module.w1, module.w3, module.w2):
                nn.init.normal_(w, mean=0.0, std=self.cfg.init_std)

    def forward(self, idx: torch.Tensor) -> Any:
        """idx [B, T] token ids -> (logits [B, T, V], aux_loss 0-dim: summed MoE balance loss, 0 if dense).

        A pipeline stage takes token ids or the previous stage's hidden state [B, T, C] and returns
        one tensor (see the class)."""
        seq_len = idx.shape[1]
        assert seq_len <= self.cfg.max_seq_len, f"seq_len {seq_len} > max_seq_len {self.cfg.max_seq_len}"
        cos, sin = self.rope_cos, self.rope_sin  # each attention takes the first T rows
        x = self.tok_emb(idx) if self.tok_emb is not None else idx
        aux = torch.zeros((), device=idx.device)
        for layer in self.layers.values():
            x, layer_aux = layer(x, cos, sin)
            aux = aux + layer_aux
        if self.stage_batch and aux.requires_grad:
            x = x + AuxLossInBackward.apply(aux * (x.shape[0] / self.stage_batch)).to(x.dtype)
        if self.lm_head is not None:
            x = self.lm_head(self.norm(x))
        return x if self.stage_batch else (x, aux)

    def moe_layers(self) -> dict[int, MoE]:
        """The MoE layers by block number (the blocks may be wrapped: activation checkpointing)."""
        found = {}
        for name, m in self.named_modules():
            if isinstance(m, MoE):
                found[int(name.split(".")[1])] = m  # "layers.<i>...."
        return found

    def num_params(self, non_embedding: bool = False) -> int:
        """Unique parameters (a tied head counts once); non_embedding drops the embedding and untied head."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel()
            if not self.cfg.tie_embeddings:
                n -= self.lm_head.weight.numel()
        return n

    def active_params(self) -> int:
        """Parameters one token touches: for MoE only top_k of the n_experts expert MLPs per layer."""
        n = self.num_params()
        for m in self.moe_layers().values():
            n -= (m.n_experts - m.top_k) * sum(w[0].numel() for w in (m.experts.w1, m.experts.w3, m.experts.w2))
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, counted from the built model; see module-level flops_per_token."""
        n_active_non_emb = self.active_params() - (self.num_params() - self.num_params(non_embedding=True))
        n = n_active_non_emb + self.cfg.vocab_size * self.cfg.d_model
        return 6.0 * n + 12.0 * self.cfg.n_layer * self.cfg.d_model * seq_len
