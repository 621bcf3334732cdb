"""The parallel layout of a run: how ``nproc`` processes split into data and tensor parallelism.

Torchtitan style: the world is a mesh ``(dp_replicate, dp_shard, tp)``, the product of the degrees
is ``nproc``. Ranks that share a data-parallel coordinate (they differ only in ``tp``) see the
same batch; the global batch is split over the ``dp_replicate * dp_shard`` data-parallel ranks.
This module only reasons about numbers (no torch import at module level): the campaign checks
recipes with it before anything runs, and the trainer builds its mesh from it (parallel.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The relation the degrees must satisfy, as an expression over knobs (recipetune.core.expr): declared by
# the reference workload as a "holds" invariant, so the search sees and can repair it.
LAYOUT_RELATION = "dp_replicate * dp_shard * tp == nproc or (dp_replicate == 0 and nproc % (dp_shard * tp) == 0)"


@dataclass(frozen=True)
class Layout:
    dp_replicate: int
    dp_shard: int
    tp: int

    @classmethod
    def of(cls, recipe: dict[str, Any]) -> Layout:
        """The layout a recipe asks for; ``dp_replicate=0`` takes whatever ``nproc`` leaves."""
        shard, tp, nproc = int(recipe.get("dp_shard", 1)), int(recipe.get("tp", 1)), int(recipe["nproc"])
        replicate = int(recipe.get("dp_replicate", 0)) or max(1, nproc // (shard * tp))
        return cls(replicate, shard, tp)

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different slices of the global batch are processed."""
        return self.dp_replicate * self.dp_shard

    def dp_rank(self, rank: int) -> int:
        # mesh order (dp_replicate, dp_shard, tp): tp is the fastest-varying coordinate
        return rank // self.tp

    @property
    def sharded(self) -> bool:
        """Parameters are DTensors (FSDP2 and/or TP), not plain tensors under DDP."""
        return self.dp_shard > 1 or self.tp > 1

    def describe(self) -> str:
        parts = [f"{name}={n}" for name, n in
                 (("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard), ("tp", self.tp)) if n > 1]
        return " x ".join(parts) or "single process"


def check_layout(recipe: dict[str, Any], n_head: int | None = None, n_kv_head: int | None = None,
                 moe: bool = False) -> list[str]:
    """Problems with a recipe's parallel knobs, each naming the knobs and what is allowed."""
    problems: list[str] = []
    nproc, shard, tp = int(recipe["nproc"]), int(recipe.get("dp_shard", 1)), int(recipe.get("tp", 1))
    replicate = int(recipe.get("dp_replicate", 0))
    if replicate and replicate * shard * tp != nproc:
        problems.append(f"dp_replicate={replicate} * dp_shard={shard} * tp={tp} = {replicate * shard * tp} "
                        f"must equal nproc={nproc} (relation: {LAYOUT_RELATION})")
    elif not replicate and nproc % (shard * tp):
        problems.append(f"dp_shard={shard} * tp={tp} = {shard * tp} does not divide nproc={nproc}; "
                        f"with dp_replicate=0 (auto) nproc must be a multiple (relation: {LAYOUT_RELATION})")
    if tp > 1:
        for name, heads in (("n_head", n_head), ("n_kv_head", n_kv_head)):
            if heads is not None and heads % tp:
                problems.append(f"tp={tp} does not divide the model's {name}={heads} "
                                f"(model {recipe.get('model')!r}): tensor parallelism splits whole heads")
        if moe:
            problems.append(f"tp={tp}: tensor parallelism is not implemented for mixture-of-experts models "
                            f"(model {recipe.get('model')!r}); use dp_shard or dp_replicate")
    if recipe.get("sequence_parallel") and tp == 1:
        problems.append("sequence_parallel=true needs tp > 1 (it shards the sequence over the tp ranks)")
    if shard == 1:
        for knob, default in (("reshard_after_forward", True), ("fsdp_param_dtype", "fp32"),
                              ("fsdp_reduce_dtype", "fp32")):
            if recipe.get(knob, default) != default:
                problems.append(f"{knob}={recipe[knob]!r} has no effect without FSDP: set dp_shard > 1")
    if shard > 1 or tp > 1:
        # These paths use plain-tensor collectives or a gradient scaler that DTensor parameters do not support.
        if recipe.get("dtype") == "fp16":
            problems.append("dtype=fp16 (gradient scaler) is not supported with dp_shard > 1 or tp > 1; use bf16")
        if recipe.get("compile") == "model":
            problems.append("compile='model' is not combined with dp_shard > 1 or tp > 1: use compile='regional' "
                            "(per-block compilation composes with FSDP2's and TP's per-block hooks)")
        if tp > 1 and recipe.get("compile", "none") != "none":
            problems.append(f"compile={recipe['compile']!r} with tp={tp}: compiled blocks break DTensor's backward "
                            "here (torch 2.13); use compile='none' with tensor parallelism")
        if recipe.get("noise_scale"):
            problems.append("noise_scale=true is only measured under DDP; it needs dp_shard=1 and tp=1")
    problems += check_float8(recipe)
    return problems


def check_float8(recipe: dict[str, Any]) -> list[str]:
    """float8 linear layers need torchao and a GPU with float8 tensor cores (compute capability >= 8.9)."""
    mode = recipe.get("float8", "none")
    if mode == "none":
        return []
    import importlib.util

    if importlib.util.find_spec("torchao") is None:
        return [f"float8={mode!r} needs the torchao package (pip install torchao), which is not installed"]
    if recipe.get("device") == "cpu":
        return [f"float8={mode!r} needs a CUDA GPU; this recipe runs on device='cpu'"]
    import torch

    if not torch.cuda.is_available():
        return [f"float8={mode!r} needs a CUDA GPU with compute capability >= 8.9; none is available here"]
    if torch.cuda.get_device_capability() < (8, 9):
        name = torch.cuda.get_device_name()
        return [f"float8={mode!r} needs compute capability >= 8.9 (H100, L4, RTX 4090...); {name} has "
                f"{'.'.join(map(str, torch.cuda.get_device_capability()))}"]
    if int(recipe.get("tp", 1)) > 1:
        return [f"float8={mode!r} is not combined with tp > 1 here; use dp_shard for parallelism"]
    return []
