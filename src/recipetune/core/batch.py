"""The batch-size rules the trainer, the CBS measurements and the speed job share.

``split_batch``: the one divisibility rule (data-parallel ranks x micro-batch x accumulation = global
batch), which the recipe check, the workload's invariant, the sampler and the trainer all apply.
``scale_lr``: the learning rate for a batch k times larger; ``cbs_bound``: the largest global batch a
measured critical batch size allows, read from a ``summary.json`` of `recipetune cbs fit|sweep|scale`.
Here, below both jobs, because the speed job may not import the cbs job (they are peers).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

LR_EXPONENT = {"none": 0.0, "sqrt": 0.5, "linear": 1.0}

# The rule as a relation over recipe knobs, for the workload's invariants (core/expr.py evaluates it). The
# data-parallel degree is nproc over the ranks that share a batch (pp * cp * tp), rounded up so a layout that
# does not divide nproc still reads as a number here (the layout check names that problem on its own).
DP_OF_RECIPE = "(nproc + pp * cp * tp - 1) // (pp * cp * tp)"
BATCH_SPLITS = f"global_batch_size % ({DP_OF_RECIPE} * micro_batch_size) == 0"


def batch_problem(global_batch_size: int, dp: int, micro_batch_size: int, dp_name: str | None = None) -> str | None:
    """What stops ``global_batch_size`` from splitting over ``dp`` ranks into micro-batches; None when it splits.

    dp_name says what the data-parallel degree is in the user's words (e.g. "nproc=4"); the message
    names the knobs so a user can fix the recipe.
    """
    by = dp_name or f"{dp} data-parallel ranks"
    if dp < 1 or global_batch_size % dp:
        return f"global_batch_size={global_batch_size} is not divisible by {by}"
    per_rank = global_batch_size // dp
    if micro_batch_size < 1 or per_rank % micro_batch_size:
        return (f"micro_batch_size={micro_batch_size} does not divide the per-process batch {per_rank} "
                f"(global_batch_size={global_batch_size} / {by})")
    return None


def split_batch(global_batch_size: int, dp: int, micro_batch_size: int, dp_name: str | None = None) -> tuple[int, int]:
    """(rows per data-parallel rank, micro-batches per step); ValueError naming the knobs when it does not split."""
    problem = batch_problem(global_batch_size, dp, micro_batch_size, dp_name)
    if problem:
        raise ValueError(problem)
    per_rank = global_batch_size // dp
    return per_rank, per_rank // micro_batch_size


def scale_lr(lr: float, k: float, rule: str) -> float:
    """The learning rate for a batch k times larger: unchanged, times sqrt(k) (Adam), or times k (SGD)."""
    return lr * k ** LR_EXPONENT[rule]


def cbs_bound(summary_json: str | Path, group: str | None = None, conservative: bool = True) -> int:
    """The largest global batch (in the summary's unit, sequences for our sweeps) a speed campaign may allow.

    Reads a `summary.json` written by `recipetune cbs fit|sweep|scale`. conservative: the lower end of
    the 95% interval of B*, else the estimate itself. `group` picks a group by its label (e.g. "D=1e+06,
    N=7.7e+05") when the summary has several. Raises ValueError when there is no finite B* to bound by.
    """
    path = Path(summary_json)
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable CBS summary ({e})") from None
    groups = summary.get("groups") or []
    if group is not None:
        groups = [g for g in groups if g.get("label") == group]
    if len(groups) != 1:
        labels = ", ".join(str(g.get("label")) for g in summary.get("groups") or [])
        raise ValueError(f"{path}: pick one group with group=...; groups: {labels or 'none'}")
    g = groups[0]
    value = (g.get("b_star_ci95") or [None])[0] if conservative else g.get("b_star")
    if value is None or g.get("b_star_unbounded") or not math.isfinite(value) or value < 1:
        what = "the lower end of the B* interval" if conservative else "B*"
        raise ValueError(f"{path}: group {g.get('label')}: {what} is not finite and >= 1, nothing to bound by")
    return int(math.floor(value))
