"""A decoder-only transformer: dense (Llama-style) or mixture-of-experts (Mixtral-style).

The model only computes logits and the MoE load-balancing loss. How it is executed (activation
checkpointing, torch.compile, DDP) lives in parallel.py, and the loss lives in the training loop,
which needs reduction="sum" cross-entropy for exact gradient accumulation.
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTENTION_BACKENDS = ("sdpa", "math")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 2  # grouped-query attention: n_head must be a multiple of n_kv_head
    d_model: int = 128
    ffn_hidden: int = 352  # SwiGLU hidden size (per expert for MoE)
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    n_experts: int = 0  # 0 = dense MLP
    top_k: int = 2
    aux_loss_coef: float = 0.01
    tie_embeddings: bool = True
    init_std: float = 0.02

    def __post_init__(self) -> None:
        assert self.d_model % self.n_head == 0, "d_model must be divisible by n_head"
        assert self.n_head % self.n_kv_head == 0, "n_head must be a multiple of n_kv_head"
        assert (self.d_model // self.n_head) % 2 == 0, "RoPE needs an even head_dim"
        assert self.n_experts == 0 or 1 <= self.top_k <= self.n_experts, "need 1 <= top_k <= n_experts"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


PRESETS: dict[str, ModelConfig] = {
    # fastest unit tests
    "nano": ModelConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=64, ffn_hidden=176, max_seq_len=128),
    # the CPU example model
    "tiny": ModelConfig(n_layer=4, n_head=4, n_kv_head=2, d_model=128, ffn_hidden=352, max_seq_len=256),
    # small experts so 4 of them still fit under 1M params
    "tiny-moe": ModelConfig(
        n_layer=4, n_head=4, n_kv_head=2, d_model=128, ffn_hidden=96, max_seq_len=256, n_experts=4, top_k=2
    ),
    "small": ModelConfig(n_layer=6, n_head=6, n_kv_head=2, d_model=384, ffn_hidden=1024, max_seq_len=512),
    # GPT-2-124M scale with Llama-style blocks; 50304 = 50257 padded to a multiple of 64
    "gpt2-124m": ModelConfig(
        vocab_size=50304, n_layer=12, n_head=12, n_kv_head=12, d_model=768, ffn_hidden=2048, max_seq_len=1024
    ),
    # Llama-3.2-1B shape (the real one supports 128k context; 2048 keeps the RoPE tables small)
    "llama-1b": ModelConfig(
        vocab_size=128256, n_layer=16, n_head=32, n_kv_head=8, d_model=2048, ffn_hidden=8192,
        max_seq_len=2048, rope_theta=500000.0,
    ),
    # Mixtral-style: 8 experts, top-2; ~1.2B total, ~0.37B active
    "moe-8x": ModelConfig(
        vocab_size=50304, n_layer=16, n_head=16, n_kv_head=4, d_model=1024, ffn_hidden=2816,
        max_seq_len=2048, n_experts=8, top_k=2,
    ),
}


def get_model_config(name: str, vocab_size: int | None = None) -> ModelConfig:
    """Look up a preset; vocab_size (decided by the data's tokenizer) overrides the preset's."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
    cfg = PRESETS[name]
    if vocab_size is not None:
        cfg = replace(cfg, vocab_size=vocab_size)
    return cfg


def count_params(cfg: ModelConfig, active: bool = False, non_embedding: bool = False) -> int:
    """Parameter count computed from the config alone (no model is built).

    active: count only top_k of the n_experts expert MLPs per layer (what one token touches).
    non_embedding: leave out the token embedding table and, if untied, the output head (Kaplan et al.).
    """
    d, kv_dim = cfg.d_model, cfg.n_kv_head * cfg.head_dim
    attn = d * d + 2 * d * kv_dim + d * d  # wq, wk, wv, wo
    mlp = 3 * d * cfg.ffn_hidden  # w1, w3, w2
    if cfg.n_experts:
        mlp = d * cfg.n_experts + (cfg.top_k if active else cfg.n_experts) * mlp  # router + experts
    per_layer = attn + mlp + 2 * d  # + two RMSNorm weights
    n = cfg.n_layer * per_layer + d  # + final norm
    if not non_embedding:
        n += cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return n


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token, PaLM appendix B: 6 * N + 12 * L * d * T.

    6 * N covers every weight matmul (2 FLOPs per multiply-add forward, 4 backward). N is the active
    non-embedding parameter count plus the output head (V * d): the head is a real matmul even when it
    shares its weight with the embedding, while the embedding itself is a free lookup. For a tied dense
    model N is just the total parameter count, as in PaLM and nanoGPT. 12 * L * d * T is the attention
    score and value matmuls (QK^T and AV), which have no parameters; T is the full sequence length
    (causal masking is not discounted, the usual convention).
    """
    n = count_params(cfg, active=True, non_embedding=True) + cfg.vocab_size * cfg.d_model
    return 6.0 * n + 12.0 * cfg.n_layer * cfg.d_model * seq_len


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
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
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


class MoE(nn.Module):
    """Top-k routed SwiGLU experts, no capacity limit (no token is ever dropped)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg.d_model, cfg.ffn_hidden) for _ in range(cfg.n_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [N, C] -> (weights [N, k] summing to 1, expert ids [N, k], router probs [N, E])."""
        probs = self.router(x).float().softmax(dim=-1)  # fp32: the aux loss and top-k need it
        weights, ids = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids, probs

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, C = x.shape
        x = x.reshape(B * T, C)
        weights, ids, probs = self.route(x)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            # no early exit when an expert gets no tokens: running it on an empty batch keeps its
            # params in the graph (zero grads), so DDP and the optimizer see every param every step
            tok, slot = torch.where(ids == e)
            y = expert(x.index_select(0, tok)) * weights[tok, slot].unsqueeze(-1).to(x.dtype)
            out.index_add_(0, tok, y)
        # Switch/Mixtral balance loss: E * sum_i f_i * P_i, f_i = share of the N*k routing slots sent
        # to expert i (not differentiable), P_i = mean router prob (carries the gradient); 1.0 when uniform
        f = F.one_hot(ids, self.n_experts).float().mean(dim=(0, 1))
        aux = self.n_experts * (f * probs.mean(dim=0)).sum()
        return out.view(B, T, C), aux


class Block(nn.Module):
    """Pre-norm residual block. Returns (x, aux_loss) so MoE balance losses can be summed by the caller."""

    def __init__(self, cfg: ModelConfig, attention: str) -> None:
        super().__init__()
        self.aux_loss_coef = cfg.aux_loss_coef
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, attention)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = MoE(cfg) if cfg.n_experts else MLP(cfg.d_model, cfg.ffn_hidden)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        if isinstance(self.ffn, MoE):
            h, aux = self.ffn(self.ffn_norm(x))
            return x + h, self.aux_loss_coef * aux
        return x + self.ffn(self.ffn_norm(x)), x.new_zeros((), dtype=torch.float32)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: str = "sdpa") -> None:
        super().__init__()
        if attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, got {attention!r}")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        # non-persistent: derived from the config, so they stay out of checkpoints
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)
        # GPT-2: scale the projections that write into the residual stream so its variance does not
        # grow with depth (2 writes per block)
        for name, p in self.named_parameters():
            if name.endswith(("attn.wo.weight", "w2.weight")):
                nn.init.normal_(p, mean=0.0, std=cfg.init_std / math.sqrt(2 * cfg.n_layer))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.cfg.init_std)

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """idx [B, T] token ids -> (logits [B, T, V], aux_loss 0-dim: summed MoE balance loss, 0 if dense)."""
        seq_len = idx.shape[1]
        assert seq_len <= self.cfg.max_seq_len, f"seq_len {seq_len} > max_seq_len {self.cfg.max_seq_len}"
        cos, sin = self.rope_cos[:seq_len], self.rope_sin[:seq_len]
        x = self.tok_emb(idx)
        aux = torch.zeros((), device=idx.device)
        for layer in self.layers:
            x, layer_aux = layer(x, cos, sin)
            aux = aux + layer_aux
        return self.lm_head(self.norm(x)), aux

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
        for m in self.modules():  # not self.layers: blocks may be wrapped (activation checkpointing)
            if isinstance(m, MoE):
                n -= (m.n_experts - m.top_k) * sum(p.numel() for p in m.experts[0].parameters())
        return n

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token, counted from the built model; see module-level flops_per_token."""
        n_active_non_emb = self.active_params() - (self.num_params() - self.num_params(non_embedding=True))
        n = n_active_non_emb + self.cfg.vocab_size * self.cfg.d_model
        return 6.0 * n + 12.0 * self.cfg.n_layer * self.cfg.d_model * seq_len
