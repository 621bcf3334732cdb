"""The parallel layout of a run: how ``nproc`` processes split into pipeline, data, context and tensor parallelism.

Torchtitan style: the world is a mesh ``(pp, dp_replicate, dp_shard, cp, tp)``, the product of the
degrees is ``nproc``; expert parallelism borrows its ``ep`` ranks from ``dp_shard`` (each MoE layer's
experts are split over ``ep`` ranks that hold different tokens). Ranks that share a data-parallel
coordinate (they differ only in ``pp``, ``cp`` or ``tp``) see the same batch; the global batch is split
over the ``dp_replicate * dp_shard`` data-parallel ranks. This module only reasons about numbers (no
torch import at module level): the campaign checks recipes with it before anything runs, and the trainer
builds its mesh from it (parallel.py, pipeline.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from recipetune.trainer.presets import PRESETS, ModelConfig

# The relations the degrees must satisfy, as expressions over knobs (recipetune.core.expr): declared by the
# reference workload as "holds" invariants, so the static check names a broken one and the search repairs it.
LAYOUT_RELATION = ("pp * dp_replicate * dp_shard * cp * tp == nproc or "
                   "(dp_replicate == 0 and nproc % (pp * dp_shard * cp * tp) == 0)")
EP_RELATION = "ep == 1 or dp_shard % ep == 0"

# Pipeline schedules of torch.distributed.pipelining: stages per rank (1: one stage; 2: interleaved,
# rank r holding stages r and r + pp, or V-shaped, r and 2 pp - 1 - r).
SCHEDULES = {"GPipe": 1, "1F1B": 1, "Interleaved1F1B": 2, "InterleavedZeroBubble": 2, "ZBVZeroBubble": 2}
V_SHAPED = ("ZBVZeroBubble",)
DEFAULT_SCHEDULE = "1F1B"


def _stages_relation() -> str:
    """Stages divide the model's layers: the layers of the preset written out, since the model is a name."""
    by_layers: dict[int, list[str]] = defaultdict(list)
    for name, cfg in PRESETS.items():
        by_layers[cfg.n_layer].append(name)
    layers = " + ".join("(" + " or ".join(f"model == '{n}'" for n in names) + f") * {n_layer}"
                        for n_layer, names in sorted(by_layers.items()))
    multi = " or ".join(f"pp_schedule == '{s}'" for s, k in SCHEDULES.items() if k == 2)
    return (f"pp == 1 and pp_schedule == '{DEFAULT_SCHEDULE}' or "
            f"pp > 1 and ({layers}) % (pp * (1 + ({multi}))) == 0")


STAGES_RELATION = _stages_relation()
MICROBATCH_RELATION = ("pp == 1 and pp_microbatches == 1 or "
                       "pp > 1 and pp_microbatches >= pp and micro_batch_size % pp_microbatches == 0")
RELATIONS = {  # name -> expression, in the order the static check reports them
    "parallel layout": LAYOUT_RELATION,
    "expert parallelism borrows dp_shard ranks": EP_RELATION,
    "pipeline stages divide the model's layers": STAGES_RELATION,
    "pipeline micro-batches split the micro-batch": MICROBATCH_RELATION,
}


@dataclass(frozen=True)
class Layout:
    dp_replicate: int
    dp_shard: int
    tp: int
    pp: int = 1
    cp: int = 1
    ep: int = 1

    @classmethod
    def of(cls, recipe: dict[str, Any]) -> Layout:
        """The layout a recipe asks for; ``dp_replicate=0`` takes whatever ``nproc`` leaves."""
        shard, tp, nproc = int(recipe.get("dp_shard", 1)), int(recipe.get("tp", 1)), int(recipe["nproc"])
        pp, cp, ep = int(recipe.get("pp", 1)), int(recipe.get("cp", 1)), int(recipe.get("ep", 1))
        replicate = int(recipe.get("dp_replicate", 0)) or max(1, nproc // (pp * shard * cp * tp))
        return cls(replicate, shard, tp, pp, cp, ep)

    @property
    def world(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different slices of the global batch are processed."""
        return self.dp_replicate * self.dp_shard

    def dp_rank(self, rank: int) -> int:
        # mesh order (pp, dp_replicate, dp_shard, cp, tp): tp is the fastest-varying coordinate
        return (rank // (self.cp * self.tp)) % self.dp

    def pp_rank(self, rank: int) -> int:
        return rank // (self.dp * self.cp * self.tp)

    @property
    def sharded(self) -> bool:
        """Parameters are DTensors (FSDP2, TP, EP) or split (PP, CP), not plain tensors under DDP."""
        return self.dp_shard > 1 or self.tp > 1 or self.pp > 1 or self.cp > 1 or self.ep > 1

    def describe(self) -> str:
        parts = [f"{name}={n}" for name, n in (("pp", self.pp), ("dp_replicate", self.dp_replicate),
                                               ("dp_shard", self.dp_shard), ("cp", self.cp), ("tp", self.tp)) if n > 1]
        text = " x ".join(parts) or "single process"
        return text + (f" (experts over ep={self.ep} of the dp_shard ranks)" if self.ep > 1 else "")


def _check_product(nproc: int, replicate: int, shard: int, tp: int, pp: int, cp: int) -> list[str]:
    """The degrees must multiply to nproc (or divide it when dp_replicate is left to auto)."""
    degrees = f"pp={pp} * dp_shard={shard} * cp={cp} * tp={tp}" if pp * cp > 1 else f"dp_shard={shard} * tp={tp}"
    product = pp * shard * cp * tp
    if replicate and replicate * product != nproc:
        return [f"dp_replicate={replicate} * {degrees} = {replicate * product} "
                f"must equal nproc={nproc} (relation: {LAYOUT_RELATION})"]
    if not replicate and nproc % product:
        return [f"{degrees} = {product} does not divide nproc={nproc}; "
                f"with dp_replicate=0 (auto) nproc must be a multiple (relation: {LAYOUT_RELATION})"]
    return []


def _check_tensor(model: ModelConfig | None, name: Any, tp: int, moe: bool) -> list[str]:
    """Tensor parallelism splits whole heads, and is not implemented for mixture-of-experts models."""
    problems = []
    if tp > 1 and model is not None:
        for heads_name, heads in (("n_head", model.n_head), ("n_kv_head", model.n_kv_head)):
            if heads % tp:
                problems.append(f"tp={tp} does not divide the model's {heads_name}={heads} "
                                f"(model {name!r}): tensor parallelism splits whole heads")
        if moe:
            problems.append(f"tp={tp}: tensor parallelism is not implemented for mixture-of-experts models "
                            f"(model {name!r}); use ep (expert parallelism), dp_shard or dp_replicate")
    return problems


def _check_fsdp_knobs(recipe: dict[str, Any], shard: int, cp: int) -> list[str]:
    """FSDP's own knobs, set away from their defaults without FSDP, would silently do nothing."""
    problems = []
    if shard * cp == 1:  # FSDP shards over dp_shard x cp
        for knob, default in (("reshard_after_forward", True), ("fsdp_param_dtype", "fp32"),
                              ("fsdp_reduce_dtype", "fp32")):
            if recipe.get(knob, default) != default:
                problems.append(f"{knob}={recipe[knob]!r} has no effect without FSDP: set dp_shard > 1")
    return problems


def _check_sharded(recipe: dict[str, Any], tp: int, pp: int, cp: int, ep: int) -> list[str]:
    """What a sharded layout (any degree > 1) does not support: the fp16 scaler, some compile modes, noise_scale."""
    problems = []
    # These paths use plain-tensor collectives or a gradient scaler that DTensor parameters do not support.
    if recipe.get("dtype") == "fp16":
        problems.append("dtype=fp16 (gradient scaler) is not supported with dp_shard, tp, pp, cp or ep > 1; "
                        "use bf16")
    if recipe.get("compile") == "model":
        problems.append("compile='model' is not combined with dp_shard > 1 or tp > 1: use compile='regional' "
                        "(per-block compilation composes with FSDP2's and TP's per-block hooks)")
    if tp > 1 and recipe.get("compile", "none") != "none":
        problems.append(f"compile={recipe['compile']!r} with tp={tp}: compiled blocks break DTensor's backward "
                        "here (torch 2.13); use compile='none' with tensor parallelism")
    elif pp * cp * ep > 1 and recipe.get("compile", "none") != "none":
        problems.append(f"compile={recipe['compile']!r} is not combined with pp, cp or ep > 1 here (never "
                        "tested: the expert dispatch and the ring attention have data-dependent shapes); "
                        "use compile='none'")
    if recipe.get("noise_scale"):
        problems.append("noise_scale=true is only measured under DDP; it needs dp_shard=1 and tp=1 "
                        "(and pp, cp, ep = 1)")
    return problems


def check_layout(recipe: dict[str, Any], model: ModelConfig | None = None) -> list[str]:
    """Problems with a recipe's parallel knobs, each naming the knobs and what is allowed."""
    nproc, shard, tp = int(recipe["nproc"]), int(recipe.get("dp_shard", 1)), int(recipe.get("tp", 1))
    pp, cp, ep = int(recipe.get("pp", 1)), int(recipe.get("cp", 1)), int(recipe.get("ep", 1))
    replicate = int(recipe.get("dp_replicate", 0))
    moe = bool(model and model.n_experts)
    problems = _check_product(nproc, replicate, shard, tp, pp, cp)
    problems += _check_tensor(model, recipe.get("model"), tp, moe)
    problems += _check_experts(recipe, model, shard, ep)
    problems += _check_pipeline(recipe, model, pp)
    problems += _check_context(recipe, moe, cp)
    if recipe.get("sequence_parallel") and tp == 1:
        problems.append("sequence_parallel=true needs tp > 1 (it shards the sequence over the tp ranks)")
    problems += _check_fsdp_knobs(recipe, shard, cp)
    if shard > 1 or tp > 1 or pp > 1 or cp > 1 or ep > 1:
        problems += _check_sharded(recipe, tp, pp, cp, ep)
    problems += check_float8(recipe)
    return problems


def _check_experts(recipe: dict[str, Any], model: ModelConfig | None, shard: int, ep: int) -> list[str]:
    problems = []
    name = recipe.get("model")
    moe = bool(model and model.n_experts)
    if model is not None and not moe:
        for knob, default in (("ep", 1), ("expert_impl", "loop"), ("capacity_factor", 0.0)):
            if recipe.get(knob, default) != default:
                problems.append(f"{knob}={recipe[knob]!r} has no effect on the dense model {name!r}: it needs a "
                                "mixture-of-experts preset (tiny-moe, nano-moe, moe-8x)")
        return problems
    if ep > 1:
        if shard % ep:
            problems.append(f"ep={ep} must divide dp_shard={shard}: expert parallelism borrows its ranks from "
                            f"FSDP's (relation: {EP_RELATION})")
        if model is not None and model.n_experts % ep:
            problems.append(f"ep={ep} does not divide the model's n_experts={model.n_experts} (model {name!r}): "
                            "each ep rank holds the same number of whole experts")
    return problems


def _check_pipeline(recipe: dict[str, Any], model: ModelConfig | None, pp: int) -> list[str]:
    schedule, n_micro = recipe.get("pp_schedule", DEFAULT_SCHEDULE), int(recipe.get("pp_microbatches", 1))
    mbs = int(recipe.get("micro_batch_size", 1))
    if pp == 1:
        return [f"{knob}={recipe[knob]!r} has no effect without pipeline parallelism: set pp > 1"
                for knob, default in (("pp_schedule", DEFAULT_SCHEDULE), ("pp_microbatches", 1))
                if recipe.get(knob, default) != default]
    problems = []
    stages = pp * SCHEDULES[schedule]
    if model is not None and model.n_layer % stages:
        per_rank = f" ({SCHEDULES[schedule]} per rank with {schedule})" if SCHEDULES[schedule] > 1 else ""
        problems.append(f"pp={pp} gives {stages} pipeline stages{per_rank}, which do not divide the model's "
                        f"n_layer={model.n_layer} (model {recipe.get('model')!r}): stages hold whole, equal "
                        f"shares of the blocks")
    if n_micro < pp or mbs % n_micro:
        problems.append(f"pp_microbatches={n_micro} must be at least pp={pp} and divide micro_batch_size={mbs}: "
                        f"each micro-batch is split into pp_microbatches pipeline micro-batches "
                        f"(relation: {MICROBATCH_RELATION})")
    elif SCHEDULES[schedule] == 2 and schedule not in V_SHAPED and n_micro % max(1, n_micro // pp):
        problems.append(f"pp_microbatches={n_micro} with {schedule}: torch needs a multiple of the rounds "
                        f"max(1, pp_microbatches // pp) = {n_micro // pp}")
    if recipe.get("dtype", "fp32") != "fp32":
        problems.append(f"dtype={recipe['dtype']!r} with pp={pp}: the schedule runs backward inside its step, "
                        "where autocast does not belong; compute in bf16 with dp_shard > 1 and "
                        "fsdp_param_dtype='bf16' instead")
    missing = _missing_schedule(schedule)
    if missing:
        problems.append(missing)
    return problems


def _missing_schedule(schedule: str) -> str:
    """The installed torch must have the schedule (imported only for a pipelined recipe)."""
    try:
        import torch.distributed.pipelining as pipelining
    except ImportError as e:
        return f"pp > 1 needs torch.distributed.pipelining, which this torch cannot import: {e}"
    if not hasattr(pipelining, f"Schedule{schedule}"):
        have = [s for s in SCHEDULES if hasattr(pipelining, f"Schedule{s}")]
        return f"pp_schedule={schedule!r} is not in this torch's pipelining; it has {', '.join(have)}"
    return ""


def _check_context(recipe: dict[str, Any], moe: bool, cp: int) -> list[str]:
    if cp == 1:
        return []
    problems = []
    if moe:
        problems.append(f"cp={cp}: context parallelism is for the dense models here; an MoE's capacity is counted "
                        "per whole sequence")
    if recipe.get("attention", "sdpa") != "sdpa":
        problems.append(f"cp={cp} needs attention='sdpa': ring attention replaces the SDPA kernels")
    seq = int(recipe.get("seq_len", 0))
    if seq % (2 * cp):
        problems.append(f"cp={cp} needs seq_len divisible by 2 * cp = {2 * cp} (load-balanced causal sharding "
                        f"gives each rank two chunks); seq_len={seq}")
    device = recipe.get("device", "auto")
    if device == "cpu" or (device == "auto" and not _cuda_available()):
        problems.append(f"cp={cp} needs CUDA: torch's context_parallel runs ring attention only for the CUDA SDPA "
                        "kernels (flash, efficient, cudnn); the CPU kernel "
                        "(aten._scaled_dot_product_flash_attention_for_cpu) has no context-parallel rule "
                        f"in this torch, so on device={device!r} it is refused rather than faked")
    return problems


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def check_float8(recipe: dict[str, Any]) -> list[str]:
    """float8 linear layers need a GPU with float8 tensor cores (compute capability >= 8.9) and torchao.

    The device first: on a CPU or an older GPU, installing torchao would not help."""
    mode = recipe.get("float8", "none")
    if mode == "none":
        return []
    import importlib.util

    import torch

    knob, need = f"float8={mode!r}", "a CUDA GPU of compute capability >= 8.9 (H100, H200, L4, RTX 4090...)"
    if recipe.get("device") == "cpu" or not torch.cuda.is_available():
        where = "device='cpu'" if recipe.get("device") == "cpu" else "this machine, which has no CUDA device"
        return [f"{knob} needs {need}; the recipe runs on {where} (compute capability: none)"]
    cc = torch.cuda.get_device_capability()
    if cc < (8, 9):
        return [f"{knob} needs {need}; {torch.cuda.get_device_name()} has compute capability {cc[0]}.{cc[1]}"]
    if importlib.util.find_spec("torchao") is None:
        return [f"{knob} needs the torchao package, which is not installed: pip install 'recipetune[float8]'"]
    if int(recipe.get("tp", 1)) > 1:
        return [f"{knob} is not combined with tp > 1 here; use dp_shard for parallelism"]
    return []
