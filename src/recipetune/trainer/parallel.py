"""How the model is executed, kept apart from what it computes (torchtitan style).

Each function takes a built Transformer and changes how it runs, in torchtitan's order: float8 linears,
tensor parallelism (DTensor, over a DeviceMesh), activation checkpointing, torch.compile, then FSDP2
(or HSDP) or DDP. ``parallelize`` applies them all from a recipe; the model never knows about meshes.
"""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from recipetune.trainer.layout import Layout
from recipetune.trainer.model import MoE, Transformer

AC_MODES = ("none", "selective", "full")
COMPILE_MODES = ("none", "model", "regional")
COMPILE_OPTIONS = ("default", "max-autotune", "reduce-overhead")


class CheckpointedBlock(nn.Module):
    """Stores only the block's input and recomputes its activations during backward.

    The state_dict hooks drop the extra "block." level from the keys, so a checkpoint saved with
    activation checkpointing on loads into a model without it, and the other way round.
    """

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        self.register_state_dict_post_hook(_strip_block_prefix)
        self.register_load_state_dict_pre_hook(_add_block_prefix)

    def forward(self, *args: torch.Tensor) -> Any:
        # non-reentrant: works with outputs that need no grad (the dense aux loss) and with DDP
        return checkpoint(self.block, *args, use_reentrant=False)


def _strip_block_prefix(module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    for key in [k for k in state_dict if k.startswith(prefix + "block.")]:
        state_dict[prefix + key[len(prefix + "block.") :]] = state_dict.pop(key)


def _add_block_prefix(module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + "block.")]:
        state_dict[prefix + "block." + key[len(prefix) :]] = state_dict.pop(key)


def apply_activation_checkpointing(model: Transformer, mode: str) -> None:
    """Trade compute for memory: "full" recomputes every block in backward, "selective" every other one.

    Idempotent and reversible: blocks are unwrapped first, so "none" undoes an earlier call.
    """
    if mode not in AC_MODES:
        raise ValueError(f"activation checkpointing mode must be one of {AC_MODES}, got {mode!r}")
    for i, layer in enumerate(model.layers):
        block = layer.block if isinstance(layer, CheckpointedBlock) else layer
        wrap = mode == "full" or (mode == "selective" and i % 2 == 0)
        model.layers[i] = CheckpointedBlock(block) if wrap else block


def apply_compile(model: Transformer, mode: str, compile_mode: str = "default") -> None:
    """torch.compile in place: "model" the whole forward, "regional" each block on its own.

    Regional compilation compiles one block and reuses the code for the others (same shapes), so it
    compiles in a fraction of the time and composes with FSDP's per-block hooks (torchtitan's way).
    ``Module.compile`` keeps the module tree, so state_dict keys do not change. ``compile_mode`` is
    torch.compile's mode ("default" is mode=None).
    """
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {mode!r}")
    if compile_mode not in COMPILE_OPTIONS:
        raise ValueError(f"compile_mode must be one of {COMPILE_OPTIONS}, got {compile_mode!r}")
    options = {"mode": None if compile_mode == "default" else compile_mode}
    if mode == "model":
        model.compile(**options)
    elif mode == "regional":
        for layer in model.layers:
            layer.compile(**options)


def wrap_ddp(
    model: nn.Module, device: torch.device | str, bucket_cap_mb: float, gradient_as_bucket_view: bool
) -> nn.Module:
    """DistributedDataParallel when running under torch.distributed with world size > 1, else the model."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return model
    device = torch.device(device)
    device_ids = None
    if device.type == "cuda":
        device_ids = [device.index if device.index is not None else torch.cuda.current_device()]
    # MoE experts run even on zero tokens (see MoE.forward), so every param gets a grad; this is a
    # safety net against a hang should a future router skip experts, at the cost of a graph walk per step
    moe = any(isinstance(m, MoE) for m in model.modules())
    return DistributedDataParallel(
        model,
        device_ids=device_ids,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
        find_unused_parameters=moe,
    )


# --- the mesh: FSDP2, HSDP and tensor parallelism (torchtitan's parallelize order) --------------------

FSDP_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The world as a (dp_replicate, dp_shard, tp) mesh; tp varies fastest, so a TP group is one node."""
    return init_device_mesh(device_type, (layout.dp_replicate, layout.dp_shard, layout.tp),
                            mesh_dim_names=("dp_replicate", "dp_shard", "tp"))


class ReplicateParallel(ParallelStyle):
    """Replicated parameters as DTensors on the TP mesh, plain tensors in and out.

    Used for the norms when the sequence is not sharded: every parameter of a tensor-parallel model
    is then a DTensor on the same mesh, which FSDP and gradient clipping need.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def to_dtensor(_: nn.Module, inputs: tuple, mesh: DeviceMesh) -> tuple:
            return tuple(DTensor.from_local(t, mesh, [Replicate()], run_check=False) for t in inputs)

        return distribute_module(module, device_mesh, input_fn=to_dtensor,
                                 output_fn=lambda _m, out, _mesh: out.to_local())


def apply_tp(model: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style tensor parallelism over attention heads and the MLP's hidden units.

    q, k, v, w1, w3 are split by output columns (whole heads), wo and w2 by input rows, so each block
    needs one all-reduce forward and one backward per sublayer. The embedding is split over the
    vocabulary and the output head over its columns (the tied weight stays tied: both are Shard(0)).
    With ``sequence_parallel`` the norms and residual stream are split over the sequence instead of
    replicated: the all-reduces become reduce-scatter + all-gather and activations take 1/tp memory.
    """
    seq = Shard(1) if sequence_parallel else Replicate()
    norm = SequenceParallel() if sequence_parallel else ReplicateParallel()
    tied = model.lm_head.weight is model.tok_emb.weight
    parallelize_module(model, tp_mesh, {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "norm": norm,
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
    })
    if tied:
        model.lm_head.weight = model.tok_emb.weight
    for block in model.layers:
        plan: dict[str, ParallelStyle] = {
            "attn_norm": norm,
            "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(output_layouts=seq),
            "ffn_norm": norm,
            "ffn.w1": ColwiseParallel(), "ffn.w3": ColwiseParallel(),
            "ffn.w2": RowwiseParallel(output_layouts=seq),
        }
        if sequence_parallel:  # gather the sequence before the column-split matmuls
            plan["attn"] = PrepareModuleInput(input_layouts=(seq, None, None),
                                              desired_input_layouts=(Replicate(), None, None))
            plan["ffn"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
        parallelize_module(block, tp_mesh, plan)


def apply_fsdp(model: Transformer, dp_mesh: DeviceMesh, param_dtype: str, reduce_dtype: str,
               reshard_after_forward: bool) -> None:
    """FSDP2: each block is one all-gather / reduce-scatter group, the rest (embedding, head) the root's.

    A 2-D ``dp_mesh`` (dp_replicate, dp_shard) gives HSDP: sharded within a group, all-reduced across.
    The root keeps its parameters after forward (torchtitan): backward needs them first anyway.
    """
    mp = MixedPrecisionPolicy(param_dtype=FSDP_DTYPES[param_dtype], reduce_dtype=FSDP_DTYPES[reduce_dtype])
    for layer in model.layers:
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=False)


def apply_float8(model: Transformer, recipe_name: str) -> None:
    """torchao float8 training for the block linears (the output head stays in high precision)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def eligible(module: nn.Module, fqn: str) -> bool:
        # float8 matmuls need both dimensions divisible by 16
        return fqn != "lm_head" and module.in_features % 16 == 0 and module.out_features % 16 == 0

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe_name),
                               module_filter_fn=eligible)


def parallelize(model: Transformer, r: dict[str, Any], layout: Layout, device: torch.device) -> nn.Module:
    """Apply every execution knob in torchtitan's order: float8, TP, AC, compile, FSDP or DDP.

    Returns the module to call in the training loop: ``model`` itself (changed in place), or a DDP
    wrapper around it. Keep ``model`` for the optimizer, state_dict and evaluation.
    """
    if r.get("float8", "none") != "none":
        apply_float8(model, r["float8"])
    mesh = build_mesh(layout, device.type) if layout.sharded else None
    if mesh is not None and layout.tp > 1:
        apply_tp(model, mesh["tp"], bool(r.get("sequence_parallel", False)))
    apply_activation_checkpointing(model, r["activation_checkpointing"])
    apply_compile(model, r["compile"], r.get("compile_mode", "default"))
    if mesh is None:
        return wrap_ddp(model, device, r["ddp_bucket_cap_mb"], r["gradient_as_bucket_view"])
    if layout.dp > 1:  # FSDP, or HSDP when replicated too (a shard group of 1 is plain replication)
        dp_mesh = mesh["dp_replicate", "dp_shard"] if layout.dp_replicate > 1 else mesh["dp_shard"]
        apply_fsdp(model, dp_mesh, r.get("fsdp_param_dtype", "fp32"), r.get("fsdp_reduce_dtype", "fp32"),
                   bool(r.get("reshard_after_forward", True)))
    return model


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the data-parallel gradient reduction for all but the last micro-batch of a step."""
    if enabled:
        yield
    elif isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:  # tensor parallelism alone: no data-parallel reduction to skip
        yield


def reshard(model: nn.Module) -> None:
    """Free FSDP's gathered parameters, e.g. after a forward without backward (evaluation)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """Clip by the global gradient norm, with DTensor gradients reduced over their mesh first."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads)
    if isinstance(total, DTensor):
        total = total.full_tensor()  # partial norms of sharded grads -> the norm of the whole gradient
    if math.isfinite(max_norm):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)
