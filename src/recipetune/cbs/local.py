"""`recipetune cbs local`: the local critical batch size by branched training (arXiv 2505.23971).

A trunk trains at batch B and saves a checkpoint at each `branch_at` step. From each checkpoint, one
branch per multiplier k continues at batch k*B with the learning rate scaled by sqrt(k) (Adam's
square-root rule; `lr_scaling` can say linear or none) for the same number of tokens: window_steps
steps at B, window_steps / k steps at k*B. The branch with k = 1 is the trunk continued at B. The local
CBS at that checkpoint is k*B for the largest k such that every k' <= k ends within epsilon (absolute,
in nats of validation loss) of the k = 1 branch.

At constant LR the last iterate is noisy. With `branch_ewa`, the trunk trains without an average and
each branch validates an EWA of its own steps only, its decay scaled so every k averages the same tokens.

Branches load the trunk's optimizer state (Adam moments, step counts) and take its learning rate from
their own recipe: the trainer sets the LR of every step from the schedule, overwriting the saved one.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator
from rich.progress import Progress

from recipetune.cbs.run import TrialRecord, run_trial
from recipetune.cbs.sweep import (
    PositiveFloat,
    PositiveInt,
    Scalar,
    Strict,
    Trial,
    check_base,
    micro_batch,
    validate_model,
)
from recipetune.config import check_recipe
from recipetune.core.batch import scale_lr
from recipetune.core.errors import ConfigError
from recipetune.core.files import apply_overrides, read_yaml
from recipetune.core.recipe import Recipe
from recipetune.workloads.reference import ReferenceWorkload

LOCAL_KNOBS = {
    "global_batch_size": "batch_size times each multiplier",
    "micro_batch_size": "from micro_batch_cap",
    "lr": "lr, scaled per branch",
    "beta2": "from beta2",
}


class LocalConfig(Strict):
    base: dict[str, Scalar] = Field(default_factory=dict, description="reference-trainer knobs of every run")
    batch_size: PositiveInt = Field(description="the trunk's batch size B (sequences)")
    lr: PositiveFloat = Field(description="the trunk's learning rate")
    beta2: Annotated[float, Field(gt=0, lt=1)] = 0.95
    branch_at: list[PositiveInt] = Field(min_length=1, description="trunk steps at which branches start")
    multipliers: list[PositiveInt] = Field([1, 2, 4, 8], min_length=1)
    window_steps: PositiveInt = Field(description="branch length in steps at B; k*B runs window_steps/k")
    lr_scaling: Literal["none", "sqrt", "linear"] = "sqrt"
    epsilon: float = Field(0.01, ge=0, description="allowed excess validation loss over k = 1, in nats")
    branch_ewa: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        None, description="EWA of each branch's own steps: decay at k = 1; 1 - t_k = (1 - t) k, at least 0.5"
    )
    micro_batch_cap: PositiveInt = 16
    timeout_s: PositiveFloat = 3600.0

    @field_validator("branch_at")
    @classmethod
    def _ascending(cls, v: list[int]) -> list[int]:
        if sorted(set(v)) != v:
            raise ValueError(f"branch steps must be strictly increasing, got {v}")
        return v

    @field_validator("multipliers")
    @classmethod
    def _with_one(cls, v: list[int]) -> list[int]:
        return sorted({1, *v})  # k = 1 is the reference every branch is judged against

    @field_validator("window_steps")
    @classmethod
    def _whole_windows(cls, v: int, info: ValidationInfo) -> int:
        bad = [k for k in info.data.get("multipliers", []) if v % k]
        if bad:
            raise ValueError(
                f"{v} is not divisible by multiplier(s) {bad}: every branch must see the same tokens in whole steps"
            )
        return v


@dataclass
class LocalSpec:
    path: Path
    config: LocalConfig
    base: Recipe
    workload: ReferenceWorkload

    def recipe(self, batch: int, lr: float, where: str, ewa_decay: float | None = None) -> Recipe:
        c = self.config
        micro = micro_batch(batch // int(self.base["nproc"]) or 1, c.micro_batch_cap)
        values = {**self.base, "global_batch_size": batch, "micro_batch_size": micro, "lr": lr, "beta2": c.beta2}
        if ewa_decay is not None:
            values["ewa_decay"] = ewa_decay
        return check_recipe(self.workload, values, self.path, where)

    def branch_ewa(self, k: int) -> float:
        """The branch's EWA decay: its horizon spans the same tokens at every k (1 - t_k = (1 - t) k)."""
        t = self.config.branch_ewa
        if t is None:
            return float(self.base["ewa_decay"])
        return float(f"{max(0.5, 1.0 - (1.0 - t) * k):.6g}")

    def trunk(self, out_dir: Path) -> list[Trial]:
        c, trials, prev = self.config, [], 0
        for step in c.branch_at:
            args = ["--save-checkpoint", str(self.checkpoint(out_dir, step))]
            if prev:
                args += ["--init-from", str(self.checkpoint(out_dir, prev))]
            trials.append(Trial(
                "trunk", c.batch_size, c.lr, c.beta2, float(self.base["ewa_decay"]),
                self.recipe(c.batch_size, c.lr, "batch_size"), step - prev,
                Path("trunk") / f"to{step:07d}", tuple(args),
            ))
            prev = step
        return trials

    def branches(self, out_dir: Path, step: int) -> list[Trial]:
        c = self.config
        trials = []
        for k in c.multipliers:
            lr = scale_lr(c.lr, k, c.lr_scaling)
            decay = self.branch_ewa(k)
            trials.append(Trial(
                "branch", k * c.batch_size, lr, c.beta2, decay,
                self.recipe(k * c.batch_size, lr, f"multipliers[{k}]", decay), c.window_steps // k,
                Path("branches") / f"at{step:07d}" / f"k{k:04d}",
                ("--init-from", str(self.checkpoint(out_dir, step))),
            ))
        return trials

    @staticmethod
    def checkpoint(out_dir: Path, step: int) -> Path:
        return (out_dir / "trunk" / f"step{step:07d}.pt").resolve()


def load_local(path: str | Path, overrides: list[str] | None = None) -> LocalSpec:
    """Read, check and plan a local-CBS file; ConfigError naming file and field on bad input."""
    path = Path(path)
    raw = apply_overrides(read_yaml(path), overrides or [], set(LocalConfig.model_fields), "base")
    cfg = validate_model(LocalConfig, raw, path)
    owned = {**LOCAL_KNOBS, "ewa_decay": "by branch_ewa"} if cfg.branch_ewa is not None else LOCAL_KNOBS
    base = check_base(path, cfg.base, ReferenceWorkload(), owned)
    if "lr_schedule" not in cfg.base:
        base = base.with_(lr_schedule="constant")  # the knob table defaults to cosine
    spec = LocalSpec(path, cfg, base, ReferenceWorkload())
    spec.trunk(Path("."))  # builds and checks every recipe before anything runs
    for step in cfg.branch_at:
        spec.branches(Path("."), step)
    if int(base["warmup_steps"]) > cfg.branch_at[0]:
        raise ConfigError(path, "branch_at", f"the first branch ({cfg.branch_at[0]}) is inside the LR warm-up "
                          f"(base.warmup_steps={base['warmup_steps']}): branches would warm up at k-scaled rates")
    return spec


def epsilon_rule(losses: dict[int, float | None], epsilon: float) -> tuple[int | None, dict[int, bool]]:
    """The largest k such that every k' <= k ends within epsilon of k = 1 (None when k = 1 has no loss)."""
    ref = losses.get(1)
    if ref is None:
        return None, {k: False for k in losses}
    within = {k: v is not None and v <= ref + epsilon for k, v in sorted(losses.items())}
    best = 1
    for k, ok in within.items():
        if not ok:
            break
        best = k
    return best, within


@dataclass
class BranchPoint:
    step: int  # trunk step of the checkpoint
    tokens: int  # tokens of every branch's window
    records: dict[int, TrialRecord]  # by multiplier k
    k_max: int | None
    within: dict[int, bool]
    batch_size: int

    @property
    def local_cbs(self) -> int | None:
        return None if self.k_max is None else self.k_max * self.batch_size


@dataclass
class LocalResult:
    trunk: list[TrialRecord]
    points: list[BranchPoint]

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.trunk) + sum(r.wall_s for p in self.points for r in p.records.values())


class LocalError(RuntimeError):
    """A trunk segment failed, so the branches after it have no checkpoint."""


def run_local(spec: LocalSpec, out_dir: Path, progress: Progress | None = None) -> LocalResult:
    """Train (or resume) the trunk, run every branch, apply the epsilon rule; write local.csv and local.json."""
    c = spec.config
    out_dir.mkdir(parents=True, exist_ok=True)
    total = len(c.branch_at) * (1 + len(c.multipliers))
    overall = progress.add_task("local CBS (runs)", total=total) if progress else None
    trunk_records, points = [], []
    seq_len = int(spec.base["seq_len"])
    for trunk, step in zip(spec.trunk(out_dir), c.branch_at, strict=True):
        if not spec.checkpoint(out_dir, step).is_file():
            (out_dir / trunk.rel / "point.json").unlink(missing_ok=True)  # reusable only with its checkpoint
        rec = run_trial(spec.workload, trunk, out_dir, None, c.timeout_s, progress, f"trunk to step {step}")
        trunk_records.append(rec)
        _advance(progress, overall, f"trunk to step {step}: {rec.status}, val loss {rec.final_val_loss}")
        if rec.status != "ok":
            raise LocalError(f"trunk segment {rec.folder} ended {rec.status}: {rec.cause}")
        records = {}
        for trial in spec.branches(out_dir, step):
            k = trial.batch_size // c.batch_size
            r = run_trial(spec.workload, trial, out_dir, None, c.timeout_s, progress, f"step {step}: k={k}")
            records[k] = r
            _advance(progress, overall, f"step {step}, k={k} (B={trial.batch_size}, lr={trial.lr:.4g}): "
                     f"{r.status}, val loss {r.final_val_loss}" + (" (resumed)" if r.resumed else ""))
        losses = {k: (r.final_val_loss if r.status == "ok" else None) for k, r in records.items()}
        k_max, within = epsilon_rule(losses, c.epsilon)
        points.append(BranchPoint(step, c.window_steps * c.batch_size * seq_len, records, k_max, within,
                                  c.batch_size))
    if progress is not None and overall is not None:
        progress.remove_task(overall)
    result = LocalResult(trunk_records, points)
    write_local(spec, result, out_dir)
    return result


def _advance(progress: Progress | None, task: object, text: str) -> None:
    if progress is not None and task is not None:
        progress.console.print(text, highlight=False)
        progress.advance(task)  # type: ignore[arg-type]


def write_local(spec: LocalSpec, result: LocalResult, out_dir: Path) -> list[Path]:
    columns = ["branch_step", "k", "batch_size", "lr", "steps", "tokens", "val_loss", "within_epsilon", "status"]
    csv_path, json_path = out_dir / "local.csv", out_dir / "local.json"
    with csv_path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(columns)
        for p in result.points:
            for k, r in sorted(p.records.items()):
                w.writerow([p.step, k, r.batch_size, r.lr, r.steps_run, r.steps_run * r.batch_size * r.seq_len,
                            "" if r.final_val_loss is None else r.final_val_loss, p.within[k], r.status])
    c = spec.config
    json_path.write_text(json.dumps({
        "config": str(spec.path),
        "rule": f"local CBS = k*B for the largest k with every k' <= k within epsilon={c.epsilon} nats of the "
                f"k=1 branch after the same tokens; branch lr = lr * k^p ({c.lr_scaling})",
        "batch_size": c.batch_size,
        "lr": c.lr,
        "window_tokens": c.window_steps * c.batch_size * int(spec.base["seq_len"]),
        "points": [
            {"step": p.step, "local_cbs": p.local_cbs, "k_max": p.k_max,
             "branches": [{"k": k, **r.model_dump(), "within_epsilon": p.within[k]}
                          for k, r in sorted(p.records.items())]}
            for p in result.points
        ],
        "trunk": [r.model_dump() for r in result.trunk],
        "runs_wall_s": result.wall_s,
    }, indent=2))
    return [csv_path, json_path]

