"""The training recipe of a fine-tuning experiment, and the base model it starts from.

``TrainRecipe`` is flat (every value a scalar), so it maps onto the search's ``Recipe`` (canonical
JSON identity) and a proposal can change one knob at a time. LoRA target modules are one string for
the same reason: a preset (``attention``, ``mlp``, ``all_linear``) resolved per architecture by
``lora_modules``, or comma-separated module names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# A search knob data_<name> switches the campaign's optional data step <name> on (finetune/space.py).
# Here, not there, so the report can word a change without importing torch.
DATA_PREFIX = "data_"


def knob_text(knob: str, value: Any) -> str:
    """``lr=0.01``, or ``+near_dedup`` / ``-near_dedup`` for a data step switched on / off."""
    if knob.startswith(DATA_PREFIX):
        return ("+" if value else "-") + knob.removeprefix(DATA_PREFIX)
    return f"{knob}={value}"


# Module names per architecture (``config.model_type``; ``reference`` is the reference trainer's model).
# ``default`` is what an empty lora_targets means: the query and value projections, LoRA's usual choice.
_LLAMA = {"default": ["q_proj", "v_proj"], "attention": ["q_proj", "k_proj", "v_proj", "o_proj"],
          "mlp": ["gate_proj", "up_proj", "down_proj"]}
LORA_MODULES: dict[str, dict[str, list[str]]] = {
    "reference": {"default": ["wq", "wv"], "attention": ["wq", "wk", "wv", "wo"], "mlp": ["w1", "w2", "w3"]},
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2"), _LLAMA),
    # GPT-2 names both its attention and its MLP output c_proj: the parent's name tells them apart
    "gpt2": {"default": ["attn.c_attn"], "attention": ["attn.c_attn", "attn.c_proj"],
             "mlp": ["mlp.c_fc", "mlp.c_proj"]},
    "gpt_neox": {"default": ["query_key_value"], "attention": ["query_key_value", "attention.dense"],
                 "mlp": ["dense_h_to_4h", "dense_4h_to_h"]},
}
LORA_PRESETS = ("attention", "mlp", "all_linear")


def lora_modules(targets: str, model_type: str) -> list[str] | str:
    """What peft's ``target_modules`` gets: a preset resolved for the architecture, or the names given.
    Raises ValueError for a preset of an architecture not in ``LORA_MODULES`` (but ``all_linear`` is
    then peft's own ``all-linear``: every linear layer but the output head)."""
    names = [t.strip() for t in targets.split(",") if t.strip()]
    if len(names) > 1 or (names and names[0] not in LORA_PRESETS):
        return names
    preset = names[0] if names else "default"
    table = LORA_MODULES.get(model_type)
    if table is None:
        if preset == "all_linear":
            return "all-linear"
        if preset == "default":
            return _LLAMA["default"]  # the most common names; the route checks they exist
        raise ValueError(f"no '{preset}' preset for model type '{model_type}' (presets exist for "
                         f"{', '.join(LORA_MODULES)}); name the modules instead, e.g. lora_targets: q_proj,v_proj")
    return table["attention"] + table["mlp"] if preset == "all_linear" else table[preset]


def describe_change(changes: Iterable[tuple[str, Any]]) -> str:
    """(knob, new value) pairs from the baseline, as one line."""
    return ", ".join(knob_text(k, v) for k, v in changes) or "(baseline)"


class TrainRecipe(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-3, gt=0.0, le=1.0, description="peak learning rate")
    epochs: float = Field(1.0, gt=0.0, le=1000.0, description="passes over the training rows (unless max_steps)")
    max_steps: int = Field(0, ge=0, description="optimizer steps; 0 = from epochs")
    batch_size: int = Field(16, ge=1, le=4096, description="examples (or packed windows) per micro-batch")
    grad_accum: int = Field(1, ge=1, le=1024, description="micro-batches per optimizer step")
    warmup_ratio: float = Field(0.05, ge=0.0, lt=1.0, description="share of steps with linear warm-up")
    scheduler: Literal["constant", "linear", "cosine"] = "cosine"
    weight_decay: float = Field(0.0, ge=0.0, le=10.0)
    max_seq_len: int = Field(128, ge=8, le=32768, description="tokens per training sequence (prompt cut on the left)")
    packing: bool = Field(False, description="concatenate examples into full windows instead of padding")
    completion_only: bool = Field(True, description="loss on the answer tokens only")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    method: Literal["full", "lora"] = "full"
    lora_rank: int = Field(8, ge=1, le=1024)
    lora_alpha: float = Field(16.0, gt=0.0)
    lora_dropout: float = Field(0.0, ge=0.0, lt=1.0)
    lora_targets: str = Field("", description="a preset (attention | mlp | all_linear, resolved per architecture) "
                              "or comma-separated module names; '' = the query and value projections")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="training precision: bf16/fp16 autocast over fp32 weights (fp16 needs CUDA)")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward: less memory, "
                                                            "~20-30% slower, the same maths")
    threads: int = Field(0, ge=0, le=1024, description="torch threads; 0 = PyTorch's default")

    @model_validator(mode="after")
    def _targets(self) -> TrainRecipe:
        names = [t.strip() for t in self.lora_targets.split(",") if t.strip()]
        if any(not n.replace(".", "").replace("_", "").isalnum() for n in names):
            raise ValueError(f"lora_targets: a preset ({', '.join(LORA_PRESETS)}) or comma-separated module "
                             "names such as 'wq,wv' or 'q_proj,v_proj'")
        return self

    def total_steps(self, batches_per_epoch: int) -> int:
        if self.max_steps:
            return self.max_steps
        return max(1, round(self.epochs * batches_per_epoch / self.grad_accum))


class ModelSpec(BaseModel):
    """``reference``: a checkpoint of the reference trainer (``base`` = the stdlib-pretrained model,
    shipped with the package where it matches, else built once and cached: finetune/base_model.py);
    ``hf``: a local Hugging Face causal-LM folder (``tiny`` = a tiny Llama with random weights and a
    tokenizer trained on stdlib text, built once and cached)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["reference", "hf"] = "reference"
    path: str = Field("base", description="reference: a .pt checkpoint or 'base'; hf: a model folder or 'tiny'")
    # how 'base' is built (reference trainer on the stdlib corpus); part of its cache key
    preset: str = "tiny"
    pretrain_steps: int = Field(400, ge=1, le=10**6)
    pretrain_seq_len: int = Field(256, ge=16, le=8192)
