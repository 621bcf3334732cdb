"""Model shapes: the presets and the arithmetic on them (parameters, FLOPs), without torch.

The driver of a campaign checks recipes and counts FLOPs with these; keeping torch out of this module
keeps `import torch` (seconds) out of the driver, which never trains.
"""

from dataclasses import dataclass, replace


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
    capacity_factor: float = 0.0  # routing slots per expert per sequence over the fair share; 0 = no limit
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
    # the fastest MoE: nano with 4 top-2 experts (the expert-parallel tests)
    "nano-moe": ModelConfig(n_layer=2, n_head=4, n_kv_head=2, d_model=64, ffn_hidden=176, max_seq_len=128,
                            n_experts=4, top_k=2),
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
