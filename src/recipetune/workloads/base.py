"""The Workload contract: how to run one recipe of some trainer and read what it measured."""

from __future__ import annotations

import hashlib
import json
import math
import platform
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recipetune.core import clock
from recipetune.core.filenames import RESULT
from recipetune.core.measure import (
    EXIT_CODES,
    EvalRecord,
    RunResult,
    StepRecord,
    default_warmup_steps,
    environment_fingerprint,
    first_nonfinite_step,
    read_metrics_stream,
)
from recipetune.core.process import ProcessOutcome
from recipetune.core.recipe import KnobSet, Recipe
from recipetune.core.relations import Relation, Relations

ProgressFn = Callable[[int], None]  # called with the number of steps finished so far


@dataclass(frozen=True)
class Invariant:
    """A rule every candidate must keep relative to the baseline.

    ``unchanged``: the expression must evaluate to the same value as for the baseline
    (e.g. ``global_batch_size * seq_len``: the global batch in tokens).
    ``holds``: the expression is a relation that must be true for the candidate itself
    (e.g. ``micro_batch * grad_accum * nproc == 480``).
    """

    name: str
    expr: str
    kind: str = "unchanged"


class Workload(ABC):
    """One trainer, seen from recipetune. Every run is a fresh subprocess."""

    kind: str
    # True when the trainer draws the same batches whatever its speed knobs: a candidate must then
    # replay them (checked by the metrics stream's batch_fp). Outside trainers declare it, or report
    # batch_fp; otherwise the guard assumes nothing (docs/guard.md, "Which batches").
    sample_order_fixed: bool = False

    @abstractmethod
    def knobs(self) -> KnobSet: ...

    def invariants(self) -> list[Invariant]:
        return []

    def check(self, recipe: Recipe) -> list[str]:
        """Problems with a recipe on its own (e.g. a micro-batch that does not divide the batch)."""
        return []

    def flops_per_token(self, recipe: Recipe) -> float | None:
        return None

    def n_devices(self, recipe: Recipe) -> int:
        return 1

    def cpu_threads(self, recipe: Recipe) -> int | None:
        """CPU threads one run of ``recipe`` uses, where the workload knows (None: as many as it
        finds). How many loss-only runs share a CPU machine (execute/executor.py: local_share)."""
        return None

    def code_fingerprint(self) -> str:
        """What the runs' results depend on besides the recipe and the step count: the trainer's code
        and how it is launched. Two runs with equal (fingerprint, recipe, steps) are the same
        experiment, so the guard may reuse one for the other (guard/runs.py)."""
        return self.kind

    def code_manifest(self) -> dict[str, str]:
        """The fingerprint's parts, ``name -> digest`` (a command workload: one per file, package,
        variable; workloads/fingerprint.py), stored with the runs so that a verdict can say what
        changed since they were made. By default one part: the fingerprint itself."""
        return {"code": self.code_fingerprint()}

    def code_identity(self) -> tuple[str, dict[str, str]]:
        """(fingerprint, manifest), for a caller that needs both (guard/runs.py keys runs by the one and
        stores the other); a workload whose fingerprint is made from its manifest reads its files once."""
        return self.code_fingerprint(), self.code_manifest()

    def identity(self) -> dict[str, str]:
        """Which trainer this is, whatever its code now: a runs folder holds the runs of one."""
        return {"kind": self.kind}

    def prepare(self, recipe: Recipe) -> None:
        """Called once when a campaign starts, before its planning: start, in the background, what
        its runs will need (nothing by default), so that it overlaps the driver's own work."""
        return None

    @abstractmethod
    def command(self, recipe: Recipe, steps: int, out_dir: Path) -> list[str]:
        """The argv that launches this recipe: also what a user runs to reproduce it."""

    @abstractmethod
    def run(
        self,
        recipe: Recipe,
        steps: int,
        out_dir: Path,
        timeout_s: float | None = None,
        progress: ProgressFn | None = None,
    ) -> RunResult: ...

    live_records = True  # records_so_far reads a run as it goes (not only once it has ended)

    def steps_so_far(self, recipe: Recipe, steps: int, out_dir: Path) -> list[StepRecord]:
        """The step records of a run still going: what a search's pruner reads."""
        return self.records_so_far(recipe, steps, out_dir)[0]

    def records_so_far(self, recipe: Recipe, steps: int, out_dir: Path) -> tuple[list[StepRecord], list[EvalRecord]]:
        """The step and validation records of a run still going (its metrics stream as far as it is
        written): what a search's pruner and the guard's middle look read. The reference trainer's
        ``metrics.jsonl`` by default; nothing where it cannot be read yet."""
        try:
            return read_metrics_stream(out_dir / "metrics.jsonl")
        except (OSError, ValueError):
            return [], []

    def relations(self) -> Relations:
        """Derived knobs and relations that must hold (recipetune.core.relations): the knobs' own
        derivations, and the invariants of kind ``holds``."""
        holds = [Relation(inv.name, inv.expr) for inv in self.invariants() if inv.kind == "holds"]
        return Relations(self.knobs(), holds)

    def resolve(self, values: dict) -> Recipe:
        """Defaults overlaid with ``values``, each in its domain, derived knobs computed."""
        return self.relations().derive(self.knobs().resolve(values), given=values)


def code_digest(code: Path | list[Path], *parts: str) -> str:
    """A short hash of the code a trainer runs (a file, or a folder's Python files), ``parts`` (how it
    is launched) and the versions it runs on (Python, torch, recipetune)."""
    from importlib import metadata

    from recipetune import __version__

    h = hashlib.sha256()
    paths = code if isinstance(code, list) else [code]
    for path in paths:
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.name).encode())
            h.update(f.read_bytes())
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    for part in (*parts, platform.python_version(), torch_version, __version__):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:16]


def classify(outcome: ProcessOutcome, out_dir: Path) -> tuple[str, str]:
    """Status and cause of a finished process: its status file first, then its exit code."""
    status_file = out_dir / "status.json"
    if outcome.stopped:
        return "pruned", "stopped by the search's pruner"
    if outcome.timed_out:
        return "timeout", f"killed after exceeding the timeout ({outcome.wall_s:.0f}s)"
    if status_file.exists():
        try:
            info = json.loads(status_file.read_text())
            return info["status"], info.get("cause", "")
        except (json.JSONDecodeError, KeyError):
            pass
    status = EXIT_CODES.get(outcome.returncode or 0, "crash")
    if status == "ok":
        return "ok", ""
    lines = [ln for ln in outcome.stderr_tail.strip().splitlines() if ln.strip()]
    return status, f"exit code {outcome.returncode}: {lines[-1] if lines else 'no output'}"


def build_result(
    recipe: Recipe,
    outcome: ProcessOutcome,
    out_dir: Path,
    steps_expected: int,
    metrics_path: Path | None,
    run_info: dict,
    parsed: tuple[list[StepRecord], list[EvalRecord]] | None = None,
    steps_done: int | None = None,
    kind: clock.Kind = clock.jsonl_kind,
) -> RunResult:
    """Turn a finished process and its metrics stream into a RunResult (saved as result.json).

    ``run_info`` is what the trainer said about where it ran: ``n_devices``, ``flops_per_token``,
    ``peak_flops_per_device``, ``environment`` (all optional). ``parsed`` replaces reading
    ``metrics_path`` when the caller parsed them itself (e.g. from log lines); ``steps_done``
    replaces their count when they sample the run (a trainer logging every 10th step). ``kind`` tells
    a step line from a validation line among the lines the runner timed (``outcome.arrivals``): each
    step is stamped with the guard's own time for it and the run's clock reading is made
    (core/clock.py).
    """
    status, cause = classify(outcome, out_dir)
    records, evals = parsed if parsed is not None else read_metrics_stream(metrics_path)
    records = clock.stamp(records, outcome.arrivals, kind) if outcome.arrivals else records
    done = len(records) if steps_done is None else steps_done
    bad_step = first_nonfinite_step(records)
    if status == "ok" and bad_step is not None:
        status, cause = "nan", f"non-finite loss at step {bad_step}"
    # A trainer that stopped early on purpose (a target loss reached) says so in its status file.
    if status == "ok" and done < steps_expected and not (out_dir / "status.json").exists():
        status, cause = "crash", f"exited cleanly after {done} of {steps_expected} steps"
    if status == "ok" and any(not math.isfinite(e.val_loss) for e in evals):
        status, cause = "nan", "non-finite validation loss"
    result = RunResult(
        recipe=dict(recipe),
        recipe_id=recipe.id,
        status=status,  # type: ignore[arg-type]
        cause=cause,
        steps=records,
        evals=evals,
        warmup_steps=default_warmup_steps(len(records)),
        n_devices=run_info.get("n_devices", 1),
        flops_per_token=run_info.get("flops_per_token"),
        peak_flops_per_device=run_info.get("peak_flops_per_device"),
        wall_s=outcome.wall_s,
        stderr_tail=outcome.stderr_tail if status != "ok" else "",
        out_dir=str(out_dir),
        environment=run_info.get("environment") or environment_fingerprint(),
    )
    if outcome.arrivals:
        last = records[-1].step if records else done
        reading = clock.read(result.measured(), outcome.arrivals, outcome.wall_s, max(done, last),
                             outcome.poll_cpu_s, kind)
        result = result.model_copy(update={"clock": reading})
    result.save(out_dir / RESULT)
    return result


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for line in f if b'"val_loss"' not in line)
    except OSError:
        return 0


def tokens_per_step(workload: Workload, recipe: Recipe) -> int | None:
    """Tokens one optimizer step consumes, where the workload can tell before running."""
    counter = getattr(workload, "tokens_per_step", None)
    if callable(counter):
        return counter(recipe)
    if {"global_batch_size", "seq_len"} <= set(recipe):
        return int(recipe["global_batch_size"]) * int(recipe["seq_len"])
    return None
