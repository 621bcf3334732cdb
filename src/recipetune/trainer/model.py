"""A decoder-only transformer: dense (Llama-style) or mixture-of-experts (Mixtral-style).

The model only computes logits and the MoE load-balancing loss. How it is executed (activation
checkpointing, torch.compile, DDP) lives in parallel.py, and the loss lives in the training loop,
which needs reduction="sum" cross-entropy for exact gradient accumulation.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from recipetune.trainer.presets import PRESETS, ModelConfig, count_params, flops_per_token, get_model_config

__all__ = ["PRESETS", "ModelConfig", "Transformer", "count_params", "flops_per_token", "get_model_config"]

ATTENTION_BACKENDS = ("sdpa", "math")


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
