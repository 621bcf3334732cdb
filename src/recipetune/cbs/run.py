"""Running a planned CBS sweep (cbs/sweep.py) and writing what it measured: points.csv, runs.csv, sweep.json.

Every run has its own folder and, once finished, a `point.json`; a restarted sweep reuses each finished
run whose recipe, step cap and target are unchanged, so a long sweep can be stopped and resumed.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field
from rich.progress import Progress

from recipetune.cbs.sweep import SweepError, SweepSpec, Trial
from recipetune.core.filenames import RESULT
from recipetune.core.files import write_atomic
from recipetune.core.measure import RunResult
from recipetune.workloads.reference import ReferenceWorkload

FINISHED = frozenset({"ok", "nan", "oom", "invalid"})


def _num(x: float) -> str:
    return f"{x:.4g}"


# ---------------------------------------------------------------------------------------------- run


class TrialRecord(BaseModel):
    """What one run gave, saved as point.json in its folder."""

    key: str
    kind: str
    batch_size: int
    lr: float
    beta2: float
    ewa_decay: float
    seq_len: int
    max_steps: int
    target: float | None
    status: str
    cause: str = ""
    steps_run: int = 0
    steps_to_target: int | None = None  # first validation at or below the target; None: never
    tokens_to_target: int | None = None
    final_val_loss: float | None = None
    best_val_loss: float | None = None
    wall_s: float = 0.0
    params: int | None = None
    folder: str = ""
    resumed: bool = Field(False, exclude=True)

    @property
    def reached(self) -> bool:
        return self.steps_to_target is not None


def trial_key(trial: Trial, target: float | None) -> str:
    blob = json.dumps([trial.recipe.canonical_json(), trial.max_steps, target, list(trial.extra_args)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _reusable(point: Path, key: str) -> TrialRecord | None:
    """The finished record in point.json, when it was measured for this very trial (same key)."""
    if point.is_file():
        try:
            old = TrialRecord.model_validate_json(point.read_text())
        except ValueError:
            old = None
        if old is not None and old.key == key and old.status in FINISHED:
            old.resumed = True
            return old
    return None


def _run(workload: ReferenceWorkload, trial: Trial, folder: Path, target: float | None, timeout_s: float,
         progress: Progress | None, label: str) -> RunResult:
    """Run the trial's recipe, stopping at the target loss, with a progress bar for as long as it runs."""
    args = list(trial.extra_args)
    if target is not None:
        args += ["--stop-at-val-loss", repr(target)]
    task = progress.add_task(label or str(trial.rel), total=trial.max_steps) if progress else None

    def on_steps(done: int) -> None:
        if progress is not None and task is not None:
            progress.update(task, completed=min(done, trial.max_steps))

    try:
        return workload.run(trial.recipe, trial.max_steps, folder, timeout_s=timeout_s,
                            progress=on_steps, extra_args=args)
    finally:
        if progress is not None and task is not None:
            progress.remove_task(task)


def _record(trial: Trial, key: str, target: float | None, result: RunResult, folder: Path) -> TrialRecord:
    """What the sweep keeps of a run: steps and tokens to the target (a branch counts from its checkpoint)."""
    vals = [e for e in result.evals if math.isfinite(e.val_loss)]
    reached = next((e.step for e in result.evals if target is not None and e.val_loss <= target), None)
    start = result.steps[0].step - 1 if result.steps else 0  # a branch counts from its checkpoint
    steps_to_target = None if reached is None else reached - start
    try:
        params = json.loads((folder / "run.json").read_text()).get("params")
    except (OSError, ValueError):
        params = None
    return TrialRecord(
        key=key, kind=trial.kind, batch_size=trial.batch_size, lr=trial.lr, beta2=trial.beta2,
        ewa_decay=trial.ewa_decay, seq_len=int(trial.recipe["seq_len"]), max_steps=trial.max_steps,
        target=target, status=result.status, cause=result.cause, steps_run=len(result.steps),
        steps_to_target=steps_to_target,
        tokens_to_target=None if steps_to_target is None else steps_to_target * trial.batch_size * int(
            trial.recipe["seq_len"]),
        final_val_loss=result.evals[-1].val_loss if result.evals else None,
        best_val_loss=min(e.val_loss for e in vals) if vals else None,
        wall_s=result.wall_s, params=params, folder=str(folder),
    )


def run_trial(
    workload: ReferenceWorkload,
    trial: Trial,
    out_dir: Path,
    target: float | None,
    timeout_s: float,
    progress: Progress | None = None,
    label: str = "",
) -> TrialRecord:
    """Run one trial, or reuse its finished point.json when recipe, step cap and target are unchanged."""
    folder = out_dir / trial.rel
    key = trial_key(trial, target)
    point = folder / "point.json"
    old = _reusable(point, key)
    if old is not None:
        return old
    result = _run(workload, trial, folder, target, timeout_s, progress, label)
    record = _record(trial, key, target, result, folder)
    write_atomic(point, record.model_dump_json(indent=2))
    return record


@dataclass
class SweepResult:
    target: float
    target_rule: str
    trials: list[TrialRecord]
    reference: list[TrialRecord]
    best: list[TrialRecord]  # one per batch size: fewest steps, or (never reached) lowest loss
    params: int | None
    data_tokens: int | None
    wall_s: float  # the runs' own wall time, resumed runs included

    @property
    def missed(self) -> list[int]:
        return [r.batch_size for r in self.best if not r.reached]


def best_per_batch(records: list[TrialRecord]) -> list[TrialRecord]:
    """Per batch size: the run that reached the target in the fewest steps (ties: the lower loss); when none
    reached it, the run that came closest, which then stands for a batch size that missed the target."""
    by_batch: dict[int, list[TrialRecord]] = {}
    for r in records:
        by_batch.setdefault(r.batch_size, []).append(r)
    best = []
    for batch in sorted(by_batch):
        runs = by_batch[batch]
        reached = [r for r in runs if r.reached]
        if reached:
            best.append(min(reached, key=lambda r: (r.steps_to_target, r.best_val_loss or 0.0, r.lr)))
        else:
            best.append(min(runs, key=lambda r: (r.best_val_loss is None, r.best_val_loss or 0.0, r.lr)))
    return best


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress.console.print(text, highlight=False)


def _describe(r: TrialRecord) -> str:
    derived = r.cause.startswith("read from reference")
    tag = " (read from the reference run)" if derived else " (resumed)" if r.resumed else f" in {r.wall_s:.0f}s"
    if r.status != "ok":
        outcome = f"{r.status}: {r.cause}"
    elif r.kind == "reference":
        outcome = f"val loss {r.final_val_loss:.4f} after {r.steps_run} steps"
    elif r.reached:
        outcome = f"target after {r.steps_to_target} steps"
    else:
        best = "n/a" if r.best_val_loss is None else f"{r.best_val_loss:.4f}"
        outcome = f"target missed in {r.steps_run} steps (best val {best})"
    return f"B={r.batch_size} lr={_num(r.lr)} beta2={r.beta2:g}: {outcome}{tag}"


def from_reference(trial: Trial, ref: TrialRecord | None, target: float) -> TrialRecord | None:
    """A sweep run with the recipe of a finished reference run is that run stopped at the target (same seed,
    same data order): read its steps from the reference's validations instead of training it again."""
    if ref is None or ref.status != "ok":
        return None
    try:
        evals = RunResult.load(Path(ref.folder) / RESULT).evals
    except (OSError, ValueError):
        return None
    reached = next((e for e in evals if e.val_loss <= target), None)
    if reached is None or reached.step > trial.max_steps:
        return None  # the reference never got there: the sweep run must go on past D tokens
    loss = [e.val_loss for e in evals if e.step <= reached.step]
    return ref.model_copy(update={
        "key": trial_key(trial, target), "kind": trial.kind, "max_steps": trial.max_steps, "target": target,
        "cause": f"read from reference run {ref.folder}", "steps_run": reached.step,
        "steps_to_target": reached.step, "tokens_to_target": reached.step * trial.batch_size * ref.seq_len,
        "final_val_loss": reached.val_loss, "best_val_loss": min(loss), "wall_s": 0.0, "resumed": ref.resumed,
    })


def resolve_target(spec: SweepSpec, out_dir: Path, progress: Progress | None = None,
                   overall: Any = None) -> tuple[float, str, list[TrialRecord]]:
    """The target loss, and how it was chosen (running the reference trials when the rule asks)."""
    t = spec.config.target
    if t.loss is not None:
        return t.loss, f"fixed: {t.loss:g}", []
    records = []
    for trial in spec.reference_trials:
        rec = run_trial(spec.workload, trial, out_dir, None, spec.config.timeout_s, progress,
                        f"{spec.label}reference B={trial.batch_size} lr={_num(trial.lr)}")
        records.append(rec)
        _say(progress, f"{spec.label}reference {_describe(rec)}")
        if progress is not None and overall is not None:
            progress.advance(overall)
    losses = [r.final_val_loss for r in records if r.status == "ok" and r.final_val_loss is not None]
    if not losses:
        raise SweepError(
            f"{spec.path}: no reference run finished, so there is no target loss; see "
            + ", ".join(f"{r.folder} ({r.status}: {r.cause})" for r in records)
        )
    best = min(losses)
    rule = (
        f"best validation loss after D={spec.data_tokens} tokens at B={spec.reference_batch_size} over the "
        f"lr/beta2 sweep ({best:.4f}) x (1 + {t.epsilon:g})"
    )
    return best * (1.0 + t.epsilon), rule, records


def run_sweep(spec: SweepSpec, out_dir: Path, progress: Progress | None = None) -> SweepResult:
    """Run (or resume) every trial of the sweep and write runs.csv, points.csv and sweep.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.yaml").write_text(yaml.safe_dump(spec.config.model_dump(mode="json"), sort_keys=False))
    total = len(spec.trials) + len(spec.reference_trials)
    overall = progress.add_task(f"{spec.label}sweep (runs)", total=total) if progress else None
    target, rule, reference = resolve_target(spec, out_dir, progress, overall)
    _say(progress, f"{spec.label}target validation loss {target:.4f} ({rule})")
    references = {t.recipe.canonical_json(): r for t, r in zip(spec.reference_trials, reference, strict=False)}
    records = []
    for trial in spec.trials:
        rec = from_reference(trial, references.get(trial.recipe.canonical_json()), target)
        if rec is None:
            rec = run_trial(spec.workload, trial, out_dir, target, spec.config.timeout_s, progress,
                            f"{spec.label}B={trial.batch_size} lr={_num(trial.lr)} beta2={trial.beta2:g}")
        records.append(rec)
        _say(progress, f"{spec.label}{_describe(rec)}")
        if progress is not None and overall is not None:
            progress.advance(overall)
    if progress is not None and overall is not None:
        progress.remove_task(overall)
    params = next((r.params for r in records + reference if r.params), None)
    result = SweepResult(
        target, rule, records, reference, best_per_batch(records), params, spec.data_tokens,
        sum(r.wall_s for r in records + reference),
    )
    write_runs(out_dir / "runs.csv", reference + records)
    write_points(out_dir / "points.csv", result.best)
    write_atomic(out_dir / "sweep.json", json.dumps(sweep_dict(spec, result), indent=2))
    (out_dir / "sweep.md").write_text(sweep_markdown(spec, result))
    return result


# ---------------------------------------------------------------------------------------------- files

POINT_COLUMNS = ("batch_size", "steps", "tokens", "lr", "beta2", "ewa_decay", "best_val_loss", "status")


def _cell(x: Any) -> str:
    return "" if x is None else str(x)


def write_points(path: Path, best: list[TrialRecord], groups: list[dict[str, Any]] | None = None) -> Path:
    """One row per batch size, `recipetune cbs fit` format: steps is empty where the target was missed."""
    extra = list(groups[0]) if groups else []
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*extra, *POINT_COLUMNS])
        for i, r in enumerate(best):
            w.writerow([
                *(_cell(groups[i][c]) for c in extra if groups),
                r.batch_size, _cell(r.steps_to_target), _cell(r.tokens_to_target), r.lr, r.beta2, r.ewa_decay,
                _cell(r.best_val_loss), r.status if r.reached or r.status != "ok" else "missed",
            ])
    return path


def write_runs(path: Path, records: list[TrialRecord]) -> Path:
    columns = ["kind", "batch_size", "lr", "beta2", "ewa_decay", "status", "steps_to_target", "tokens_to_target",
               "steps_run", "max_steps", "final_val_loss", "best_val_loss", "target", "wall_s", "folder", "cause"]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow({k: _cell(v) for k, v in r.model_dump().items()})
    return path


def sweep_dict(spec: SweepSpec, result: SweepResult) -> dict[str, Any]:
    return {
        "config": str(spec.path),
        "base_recipe": dict(spec.base),
        "target": result.target,
        "target_rule": result.target_rule,
        "ewa_rule": "1 - t(B) = (1 - decay_at_reference) * B / B_min, clipped to [min, max]",
        "params": result.params,
        "data_tokens": result.data_tokens,
        "runs_wall_s": result.wall_s,
        "points": [r.model_dump() for r in result.best],
        "missed_batch_sizes": result.missed,
    }


def sweep_markdown(spec: SweepSpec, result: SweepResult) -> str:
    """The steps-to-target table, ready to paste into a report."""
    lines = [
        f"# CBS sweep: `{spec.path}`",
        "",
        f"Target validation loss (EWA weights): {result.target:.4f}, {result.target_rule}.",
        f"Model parameters: {result.params}. Sequence length: {spec.seq_len}. Step cap: {spec.config.max_steps}"
        + (f", token cap {spec.config.max_tokens}" if spec.config.max_tokens else "") + ".",
        f"Runs: {len(result.trials) + len(result.reference)}, their wall time {result.wall_s / 60:.1f} min.",
        "",
        "| B | steps to target | tokens | lr | beta2 | EWA decay | best val loss | runs in sweep |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result.best:
        n = sum(t.batch_size == r.batch_size for t in result.trials)
        steps = str(r.steps_to_target) if r.reached else f"not reached ({r.status}, {r.steps_run} steps)"
        loss = "n/a" if r.best_val_loss is None else f"{r.best_val_loss:.4f}"
        lines.append(f"| {r.batch_size} | {steps} | {_cell(r.tokens_to_target) or '-'} | {_num(r.lr)} | "
                     f"{r.beta2:g} | {r.ewa_decay:g} | {loss} | {n} |")
    return "\n".join(lines) + "\n"
