"""How the model is executed, kept apart from what it computes (torchtitan style).

Each function takes a built Transformer (or a pipeline stage of one: pipeline.py) and changes how it
runs, in torchtitan's order: float8 linears, tensor parallelism (DTensor, over a DeviceMesh), expert
parallelism (expert_parallel.py), activation checkpointing, torch.compile, then FSDP2 (or HSDP) or
DDP. ``parallelize`` applies them all from a recipe; the model never knows about meshes. Context
parallelism is applied per micro-batch (``context_parallel``), gradient clipping over every mesh here.
"""

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
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

from recipetune.trainer.expert_parallel import A2ATimer, ExpertParallel
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
    for key, layer in list(model.layers.items()):
        block = layer.block if isinstance(layer, CheckpointedBlock) else layer
        wrap = mode == "full" or (mode == "selective" and int(key) % 2 == 0)
        model.layers[key] = CheckpointedBlock(block) if wrap else block


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
        for layer in model.layers.values():
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
    # every parameter gets a gradient every step: MoE experts are stacked tensors, used even by an
    # expert that got no token (model.py), so DDP needs no graph walk for unused ones
    return DistributedDataParallel(
        model,
        device_ids=device_ids,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
    )


# --- the mesh: FSDP2, HSDP and tensor parallelism (torchtitan's parallelize order) --------------------

FSDP_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


MESH_DIMS = ("pp", "dp_replicate", "dp_shard_mod_ep", "ep", "cp", "tp")


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """The world as a (pp, dp_replicate, dp_shard, cp, tp) mesh, tp varying fastest (a TP group is one node).

    dp_shard is itself (dp_shard_mod_ep, ep): expert parallelism borrows its ranks from FSDP's, as in
    torchtitan. Flattened dimensions: "dp_shard" (dp_shard_mod_ep x ep) and "fsdp" (dp_shard x cp: the
    ranks that hold different tokens of one data-parallel replica shard the parameters).
    """
    sizes = (layout.pp, layout.dp_replicate, layout.dp_shard // layout.ep, layout.ep, layout.cp, layout.tp)
    mesh = init_device_mesh(device_type, sizes, mesh_dim_names=MESH_DIMS)
    mesh["dp_shard_mod_ep", "ep"]._flatten("dp_shard")
    mesh["dp_shard_mod_ep", "ep", "cp"]._flatten("fsdp")
    return mesh


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
    tied = model.lm_head is not None and model.tok_emb is not None and model.lm_head.weight is model.tok_emb.weight
    outer = {  # a pipeline stage holds only some of them
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "norm": norm,
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Replicate()),
    }
    parallelize_module(model, tp_mesh, {k: v for k, v in outer.items() if getattr(model, k) is not None})
    if tied:
        model.lm_head.weight = model.tok_emb.weight
    for block in model.layers.values():
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


def apply_ep(model: Transformer, ep_mesh: DeviceMesh, timer: A2ATimer) -> None:
    """Expert parallelism: each MoE layer's experts sharded over ``ep_mesh`` (expert_parallel.py)."""
    for moe in model.moe_layers().values():
        parallelize_module(moe.experts, ep_mesh, ExpertParallel(timer))


def apply_fsdp(model: Transformer, dp_mesh: DeviceMesh, param_dtype: str, reduce_dtype: str,
               reshard_after_forward: bool, experts_mesh: DeviceMesh | None = None) -> None:
    """FSDP2: each block is one all-gather / reduce-scatter group, the rest (embedding, head) the root's.

    A 2-D ``dp_mesh`` (dp_replicate, dp_shard) gives HSDP: sharded within a group, all-reduced across.
    The root keeps its parameters after forward (torchtitan): backward needs them first anyway.
    With expert parallelism the experts are their own group on ``experts_mesh`` (the data-parallel
    ranks that hold the same experts); ``scale_expert_grads`` finishes their gradient.
    """
    mp = MixedPrecisionPolicy(param_dtype=FSDP_DTYPES[param_dtype], reduce_dtype=FSDP_DTYPES[reduce_dtype])
    for layer in model.layers.values():
        if experts_mesh is not None:
            for moe in layer.modules():
                if isinstance(moe, MoE):
                    fully_shard(moe.experts, mesh=experts_mesh, mp_policy=mp,
                                reshard_after_forward=reshard_after_forward)
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=False)


def float8_eligible(module: nn.Module, fqn: str) -> bool:
    """Which linear layers torchao converts: not the output head (its logits feed the loss, where float8's
    rounding hurts most; torchtitan keeps it too), and only layers whose both dimensions are multiples of
    16, as float8 matmuls need (the router, n_experts wide, stays in high precision). The experts' stacked
    weights are not linear layers: they stay in the compute dtype."""
    return (fqn.split(".")[-1] != "lm_head" and isinstance(module, nn.Linear)
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def apply_float8(model: Transformer, recipe_name: str) -> None:
    """torchao float8 training (tensorwise or rowwise scaling) for the block linears ``float8_eligible`` picks."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe_name),
                               module_filter_fn=float8_eligible)


def parallelize(model: Transformer, r: dict[str, Any], layout: Layout, device: torch.device,
                mesh: DeviceMesh | None = None, a2a: A2ATimer | None = None) -> nn.Module:
    """Apply every execution knob in torchtitan's order: float8, TP, EP, AC, compile, FSDP or DDP.

    Returns the module to call in the training loop: ``model`` itself (changed in place), or a DDP
    wrapper around it. Keep ``model`` for the optimizer, state_dict and evaluation. ``mesh`` is
    ``build_mesh``'s, for any sharded layout (FSDP, TP, EP, CP, PP); None runs plain or under DDP.
    """
    if r.get("float8", "none") != "none":
        apply_float8(model, r["float8"])
    if mesh is not None and layout.tp > 1:
        apply_tp(model, mesh["tp"], bool(r.get("sequence_parallel", False)))
    if mesh is not None and layout.ep > 1:
        apply_ep(model, mesh["ep"], a2a or A2ATimer())
    apply_activation_checkpointing(model, r["activation_checkpointing"])
    apply_compile(model, r["compile"], r.get("compile_mode", "default"))
    if mesh is None:
        return wrap_ddp(model, device, r["ddp_bucket_cap_mb"], r["gradient_as_bucket_view"])
    if layout.dp * layout.cp > 1:  # FSDP, or HSDP when replicated too (a shard group of 1 is plain replication)
        dp_mesh = mesh["dp_replicate", "fsdp"] if layout.dp_replicate > 1 else mesh["fsdp"]
        experts_mesh = None
        if layout.ep > 1:  # the ranks that hold the same experts
            experts_mesh = (mesh["dp_replicate", "dp_shard_mod_ep"] if layout.dp_replicate > 1
                            else mesh["dp_shard_mod_ep"])
        apply_fsdp(model, dp_mesh, r.get("fsdp_param_dtype", "fp32"), r.get("fsdp_reduce_dtype", "fp32"),
                   bool(r.get("reshard_after_forward", True)), experts_mesh)
    return model


def context_parallel(mesh: DeviceMesh | None, model: Transformer, x: torch.Tensor,
                     y: torch.Tensor) -> AbstractContextManager:
    """Context parallelism for one micro-batch: the sequence of ``x``, ``y`` and the RoPE tables split
    over the ``cp`` ranks (load-balanced for causal attention), attention as ring attention.

    torch's context_parallel swaps the CUDA SDPA kernels (flash, efficient, cudnn) for ring attention;
    the CPU kernel has no such rule in torch 2.13, which is why layout.py refuses cp > 1 on CPU.
    """
    if mesh is None or mesh["cp"].size() == 1:
        return nullcontext()
    from torch.distributed.tensor.experimental import context_parallel as cp_context

    return cp_context(mesh["cp"], buffers=[x, y, model.rope_cos, model.rope_sin], buffer_seq_dims=[1, 1, 0, 0],
                      no_restore_buffers={x, y})


def scale_expert_grads(modules: list[Transformer], ep: int) -> None:
    """Divide the experts' gradients by ``ep`` once they are reduced.

    An expert's gradient on its rank already sums the tokens the whole ep group sent it, and FSDP
    averages it over the ranks holding the same expert (dp / ep of them): the average over all dp
    ranks that every other gradient gets is that divided by ep. (FSDP2's set_gradient_divide_factor
    would do it inside the reduction, but its PREMUL_SUM does not exist on gloo.)
    """
    if ep == 1:
        return
    for model in modules:
        for moe in model.moe_layers().values():
            for p in moe.experts.parameters():
                if p.grad is not None:
                    p.grad.div_(ep)


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


def clip_grad_norm(params: list[torch.Tensor], max_norm: float, pp_group: dist.ProcessGroup | None = None,
                   not_counted: frozenset[int] = frozenset()) -> float:
    """Clip by the global gradient norm, DTensor gradients reduced over their meshes first.

    Parameters on different meshes (the experts' under expert parallelism) are normed apart and
    their squares summed; with pipeline parallelism each stage holds other parameters, so the
    squares are summed over ``pp_group`` too. ``not_counted``: ids of parameters whose gradient
    another one already counts (a tied embedding's copy on the last stage).
    """
    by_mesh: dict[Any, list[torch.Tensor]] = {}  # mesh (None: plain tensors) -> parameters
    for p in params:
        if p.grad is not None:
            by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
    norms = []
    for group in by_mesh.values():
        counted = [p.grad for p in group if id(p) not in not_counted]
        if counted:
            norm = torch.nn.utils.get_total_norm(counted)
            # partial norms of sharded grads -> the norm of the whole gradient
            norms.append((norm.full_tensor() if isinstance(norm, DTensor) else norm).float())
    if len(norms) == 1 and pp_group is None:
        total = norms[0]
    else:
        total_sq = torch.stack(norms).square().sum() if norms else torch.zeros((), device=params[0].device)
        if pp_group is not None:
            dist.all_reduce(total_sq, group=pp_group)
        total = total_sq.sqrt()
    if math.isfinite(max_norm):
        for group in by_mesh.values():  # one call per mesh: a foreach op takes DTensors of one mesh
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return float(total)
