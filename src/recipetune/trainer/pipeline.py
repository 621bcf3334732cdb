"""Pipeline parallelism with torch.distributed.pipelining, composed with FSDP2, TP and EP as torchtitan does.

The model is built whole on every rank (the same seed gives one process's weights), then cut into
``pp * stages_per_rank`` stages with equal shares of the blocks (layout.py checks that they divide):
the first stage keeps the embedding, the last the final norm and the head. A tied embedding becomes two
copies, on the first and the last stage, whose gradients are summed after backward (``sum_tied_grads``),
so both take the same step and stay equal (Megatron's embedding group). Each stage is then parallelized
like a whole model (parallel.py: TP, EP, checkpointing, FSDP over the data-parallel ranks of its pp
rank) and wrapped in a ``PipelineStage``; the schedule runs each micro-batch as ``pp_microbatches``
pipeline micro-batches.

Measured for the metrics stream: the seconds each rank's stages compute (forward, backward, weight
gradients, the loss) against the seconds the schedule's step takes; the rest is the bubble.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.tensor import DTensor

from recipetune.trainer.layout import SCHEDULES, V_SHAPED, Layout
from recipetune.trainer.model import Transformer

WIRE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def stage_ids(schedule: str, pp: int, pp_rank: int) -> list[int]:
    """The stages a pp rank holds: its own; r and r + pp (interleaved); r and 2 pp - 1 - r (V-shaped)."""
    if SCHEDULES[schedule] == 1:
        return [pp_rank]
    return [pp_rank, 2 * pp - 1 - pp_rank] if schedule in V_SHAPED else [pp_rank, pp_rank + pp]


def stage_owner(schedule: str, pp: int, stage: int) -> int:
    return next(r for r in range(pp) if stage in stage_ids(schedule, pp, r))


def split(model: Transformer, ids: list[int], n_stages: int, stage_batch: int) -> list[Transformer]:
    """Copies of ``model`` holding only the blocks (and embedding, head) of stages ``ids``."""
    per = model.cfg.n_layer // n_stages
    stages = []
    for s in ids:
        m = copy.deepcopy(model)
        for key in [k for k in m.layers if not s * per <= int(k) < (s + 1) * per]:
            del m.layers[key]
        if s > 0:
            m.tok_emb = None
        if s < n_stages - 1:
            m.norm, m.lm_head = None, None
        m.stage_batch = stage_batch
        stages.append(m)
    return stages


class TimedStage(PipelineStage):
    """A PipelineStage that adds up the seconds its compute takes (synchronised on a GPU)."""

    busy_s = 0.0

    def _timed(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.busy_s += time.perf_counter() - t0
        return out

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super().forward_one_chunk, *args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super().backward_one_chunk, *args, **kwargs)

    def backward_weight_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed(super().backward_weight_one_chunk, *args, **kwargs)


class Pipeline:
    """This rank's stages and the schedule that runs them; ``step`` trains on one micro-batch."""

    def __init__(self, models: list[Transformer], r: dict[str, Any], layout: Layout, mesh: DeviceMesh,
                 device: torch.device, rank: int, tokens_per_rank: int) -> None:
        from torch.distributed import pipelining

        schedule, pp = r["pp_schedule"], layout.pp
        self.schedule_name, self.pp, self.device = schedule, pp, device
        self.pp_rank = layout.pp_rank(rank)
        self.ids = stage_ids(schedule, pp, self.pp_rank)
        self.n_stages = pp * SCHEDULES[schedule]
        self.models = models
        self.group = mesh["pp"].get_group()
        self.tokens_per_rank = tokens_per_rank
        self.stages = [TimedStage(m, i, self.n_stages, device, group=self.group) for m, i in zip(models, self.ids,
                                                                                                    strict=True)]
        self._ce: list[torch.Tensor] = []
        self.n_micro = r["pp_microbatches"]
        self.loss_s, self.wall_s = 0.0, 0.0
        cls = getattr(pipelining, f"Schedule{schedule}")
        # the loss of each pipeline micro-batch is normalised over the rank's whole batch, so the summed
        # gradients are the update of one process: no scaling by the number of micro-batches
        try:
            self.schedule = cls(self.stages if SCHEDULES[schedule] > 1 else self.stages[0],
                                n_microbatches=r["pp_microbatches"], loss_fn=self._loss, scale_grads=False)
        except ValueError as e:  # torch's own condition on the schedule; layout.py checks the known ones
            from recipetune.core.recipe import KnobError

            raise KnobError("pp_microbatches", f"{schedule} refuses it: {e}") from None
        self.first = self._model(0)
        self.last = self._model(self.n_stages - 1)
        self.tied = bool(models[0].cfg.tie_embeddings)
        self.embed_group = self._embed_group(layout, rank) if self.tied else None

    def _model(self, stage: int) -> Transformer | None:
        return self.models[self.ids.index(stage)] if stage in self.ids else None

    def _embed_group(self, layout: Layout, rank: int) -> dist.ProcessGroup | None:
        """The ranks holding the first and the last stage at this rank's data/tensor coordinate."""
        last = stage_owner(self.schedule_name, self.pp, self.n_stages - 1)
        if last == 0:
            return None  # both on pp rank 0: summed locally
        per_pp = layout.world // self.pp
        mine = None
        for c in range(per_pp):  # every rank creates every group, in the same order
            group = dist.new_group([c, last * per_pp + c])
            if rank % per_pp == c:
                mine = group
        return mine

    def _loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")
        self._ce.append(ce.detach())
        self.loss_s += time.perf_counter() - t0
        return ce / self.tokens_per_rank

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Forward and backward of one micro-batch; the summed cross-entropy on the last stage's rank, else 0."""
        t0 = time.perf_counter()
        self.schedule.step(*((x,) if self.first is not None else ()),
                           target=y if self.last is not None else None, return_outputs=False)
        self.wall_s += time.perf_counter() - t0
        # the last pipeline micro-batches' losses: the schedule's first step also calls the loss to infer
        # shapes, before them
        ce = torch.stack(self._ce[-self.n_micro:]).sum() if self._ce else torch.zeros((), device=self.device)
        self._ce.clear()
        return ce

    def take_times(self) -> tuple[float, float]:
        """(seconds this rank's stages computed, seconds the schedule ran) since the last call."""
        busy = sum(s.busy_s for s in self.stages) + self.loss_s
        wall = self.wall_s
        for s in self.stages:
            s.busy_s = 0.0
        self.loss_s, self.wall_s = 0.0, 0.0
        return busy, wall

    def tied_copy(self) -> frozenset[int]:
        """The last stage's copy of a tied embedding: its gradient is the first's, counted once in the norm."""
        if self.tied and self.last is not None:
            return frozenset({id(self.last.lm_head.weight)})
        return frozenset()

    def sum_tied_grads(self) -> None:
        """Both copies of a tied embedding get the sum of their gradients, as the one tied weight would."""
        if not self.tied:
            return
        grads = []
        for module in (self.first and self.first.tok_emb, self.last and self.last.lm_head):
            if module is None or module.weight.grad is None:
                continue
            w = module.weight
            if isinstance(w.grad, DTensor) and w.grad.placements != w.placements:
                # an embedding's gradient comes back replicated under tensor parallelism: shard it like
                # its weight (a local slice), so that both copies hold the same rows
                w.grad = w.grad.redistribute(w.device_mesh, w.placements)
            grads.append(_local(w.grad))
        if self.embed_group is None:
            if len(grads) == 2:
                total = grads[0] + grads[1]
                grads[0].copy_(total)
                grads[1].copy_(total)
        elif grads:
            dist.all_reduce(grads[0], group=self.embed_group)

    @torch.no_grad()
    def evaluate(self, batches: list, autocast: Any) -> float:
        """Mean cross-entropy over ``batches``, the stages run in order by plain sends; on every rank."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        count = 0
        for x, y in batches:
            x, y = x.to(self.device), y.to(self.device)
            h: torch.Tensor | None = None
            for s in range(self.n_stages):
                if s not in self.ids:
                    continue
                prev = stage_owner(self.schedule_name, self.pp, s - 1) if s else self.pp_rank
                if s == 0:
                    h = x
                elif prev != self.pp_rank:
                    h = self._recv(prev)
                with autocast:
                    h = self._model(s)(h)
                if s == self.n_stages - 1:
                    total += F.cross_entropy(h.float().flatten(0, 1), y.flatten(), reduction="sum").double()
                    count += y.numel()
                elif (nxt := stage_owner(self.schedule_name, self.pp, s + 1)) != self.pp_rank:
                    self._send(h, nxt)
        # every holder of the last stage computed the same sum over the same tokens: sum both over the world
        counted = torch.tensor(float(count), dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        dist.all_reduce(counted)
        return float(total / counted)

    def _send(self, h: torch.Tensor, pp_rank: int) -> None:
        h = _local(h).contiguous()
        header = torch.tensor([*h.shape, WIRE_DTYPES.index(h.dtype)], dtype=torch.long, device=self.device)
        dist.send(header, group=self.group, group_dst=pp_rank)
        dist.send(h, group=self.group, group_dst=pp_rank)

    def _recv(self, pp_rank: int) -> torch.Tensor:
        header = torch.empty(4, dtype=torch.long, device=self.device)
        dist.recv(header, group=self.group, group_src=pp_rank)
        *shape, dtype = header.tolist()
        h = torch.empty(shape, dtype=WIRE_DTYPES[dtype], device=self.device)
        dist.recv(h, group=self.group, group_src=pp_rank)
        return h


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t
