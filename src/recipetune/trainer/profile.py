"""What the metrics stream adds for the MoE and the parallel layouts, gathered to rank 0 outside the timed region.

``moe_figures``: the router's load over the global batch. ``rank_figures``: per-rank seconds in all-to-all,
the pipeline bubble and peak memory per stage. The analyst reads them (speed/facts.py); the fields are
listed in docs/parallel.md, "The metrics stream of these layouts".
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from recipetune.trainer.layout import Layout
from recipetune.trainer.model import MoE


def moe_figures(layers: dict[int, MoE], n_layer: int, n_experts: int, device: torch.device,
                world: int) -> dict[str, float]:
    """The router's load over the whole global batch: slots per expert, before and after capacity drops.

    ``expert_imbalance``: the busiest expert's routing slots over the mean, in the worst layer (1.0 =
    balanced); ``expert_drop``: the share of routing slots dropped by the capacity factor.
    """
    counts = torch.zeros(n_layer, 2, n_experts, dtype=torch.float64, device=device)
    for i, moe in layers.items():
        if moe.stats is not None:
            counts[i] = moe.stats
    if world > 1:  # each rank counted its own tokens (and each pipeline stage its own layers)
        dist.all_reduce(counts)
    routed, kept = counts[:, 0], counts[:, 1]
    used = routed.sum(-1) > 0
    imbalance = (routed.max(-1).values / routed.mean(-1))[used]
    return {"expert_imbalance": float(imbalance.max()) if len(imbalance) else 1.0,
            "expert_drop": float(1 - kept.sum() / routed.sum()) if routed.sum() > 0 else 0.0}


def rank_figures(layout: Layout, device: torch.device, a2a_s: float, pipe_times: tuple[float, float],
                 peak_mem_bytes: int) -> dict[str, Any]:
    """Per-rank figures gathered to rank 0: all-to-all seconds, pipeline bubble, peak memory per stage."""
    busy, wall = pipe_times
    mine = torch.tensor([a2a_s, busy, wall, float(peak_mem_bytes)], dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(layout.world)]
    dist.all_gather(every, mine)
    table = torch.stack(every)
    out: dict[str, Any] = {}
    if layout.ep > 1:
        out.update(a2a_s=float(table[:, 0].mean()), a2a_s_max=float(table[:, 0].max()))
    if layout.pp > 1:
        bubble = 1 - table[:, 1] / table[:, 2].clamp(min=1e-9)
        stage_of = torch.tensor([layout.pp_rank(r) for r in range(layout.world)], device=device)
        out.update(pp_bubble=float(bubble.mean()), pp_bubble_max=float(bubble.max()),
                   stage_mem_bytes=[int(table[stage_of == s, 3].max()) for s in range(layout.pp)])
    return out
