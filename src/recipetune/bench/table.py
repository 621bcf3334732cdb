"""Measured tables: every recipe of a campaign's search space, run for real with repeats.

A table is the ground truth a search strategy is replayed against (``bench/replay.py``): for each
recipe of the space, each repeat's status, wall time and the figures a proposer reads from a run
(throughput, step-time breakdown, peak memory, MFU, accumulation). Recipes the guard's static check
refuses (a broken relation between knobs) are listed as infeasible and never run.

Repeats are interleaved: repeat r runs every recipe once, in an order shuffled per repeat, so a
neighbour's burst of load on a shared machine spreads over many recipes instead of wrecking one.
The table is rewritten after every run, so an interrupted build resumes where it stopped.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from recipetune.config import Campaign
from recipetune.core.errors import ConfigError, validation_error
from recipetune.core.measure import RunResult, environment_fingerprint
from recipetune.core.recipe import KnobError, Recipe, Scalar
from recipetune.engine.samplers import distributions
from recipetune.workloads.base import Workload

FORMAT = "recipetune-bench-table/1"


class Measurement(BaseModel):
    """One run of one recipe: what a proposer reads from a RunResult, and what it cost."""

    repeat: int
    status: str
    cause: str = ""
    wall_s: float  # the whole subprocess: start, imports, data, warm-up, steps
    tokens_per_s: float | None = None  # per device, warm-up excluded
    step_s: float | None = None
    data_s: float | None = None
    compute_s: float | None = None
    optim_s: float | None = None
    peak_mem_bytes: int | None = None
    mfu: float | None = None
    tokens_per_step: int | None = None
    measured_steps: int = 0
    warmup_s: float | None = None
    loss_last: float | None = None
    n_devices: int = 1
    flops_per_token: float | None = None
    peak_flops: float | None = None
    accumulation_steps: int | None = None  # from the trainer's run.json where it says
    device: str | None = None


class Entry(BaseModel):
    """One recipe of the space: its searched values, and its runs (none when infeasible)."""

    id: str
    values: dict[str, Scalar]  # the searched knobs; the rest are the table's baseline
    feasible: bool = True
    cause: str = ""  # why the static check refuses it
    runs: list[Measurement] = Field(default_factory=list)

    def ok_runs(self) -> list[Measurement]:
        return [m for m in self.runs if m.status == "ok" and m.tokens_per_s]

    def tokens_per_s(self) -> float | None:
        """The recipe's speed: the median of its successful repeats (a neighbour's burst of load
        moves one repeat, not the median)."""
        ok = self.ok_runs()
        return statistics.median(m.tokens_per_s for m in ok) if ok else None  # type: ignore[type-var]


class Table(BaseModel):
    format: str = FORMAT
    name: str
    workload: str
    workload_spec: dict[str, Any] = Field(default_factory=dict)  # the campaign's workload section
    campaign: str  # the file it was built from, as given
    baseline: dict[str, Scalar]
    baseline_id: str
    space: dict[str, list[Scalar]]
    steps: int
    repeats: int
    environment: dict[str, str]
    conditions: dict[str, Any] = Field(default_factory=dict)  # load averages, threads, dates
    entries: list[Entry]

    def recipe(self, entry: Entry) -> Recipe:
        return Recipe(self.baseline).with_(**entry.values)

    def by_id(self) -> dict[str, Entry]:
        return {e.id: e for e in self.entries}

    def baseline_entry(self) -> Entry:
        return self.by_id()[self.baseline_id]

    def best(self) -> Entry:
        scored = [e for e in self.entries if e.tokens_per_s() is not None]
        return max(scored, key=lambda e: e.tokens_per_s())  # type: ignore[arg-type,return-value]

    def make_workload(self) -> Workload:
        """The workload the table was measured on (its knobs, relations and meanings; never run here)."""
        from pydantic import TypeAdapter

        from recipetune.config import CampaignConfig, build_workload

        spec = TypeAdapter(CampaignConfig.model_fields["workload"].annotation).validate_python(
            self.workload_spec or {"kind": self.workload})
        if getattr(spec, "cwd", None):
            spec = spec.model_copy(update={"cwd": None})  # a folder of the machine that measured it
        return build_workload(spec, Path.cwd())

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.model_dump_json(exclude_none=True) + "\n")  # one line: small in the repository
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Table:
        """A table file; ConfigError naming the file and every field that is wrong when it is not one."""
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(path, "", f"cannot read: {e.strerror}") from None
        try:
            table = cls.model_validate_json(text)
        except ValidationError as e:
            raise validation_error(e, path) from None
        if table.format != FORMAT:
            raise ConfigError(path, "format", f"{table.format!r}, expected {FORMAT!r}")
        return table

    def planted(self, speed: Callable[[dict[str, Scalar]], float], spread: float = 0.02) -> Table:
        """This table's space with a planted truth: each recipe's repeats at ``speed(values)`` times the
        baseline's tokens/s, within +-``spread`` (log), its step and wall times to match. What a search rule
        is tested against where the true speed of every recipe must be known (a value far slower everywhere,
        an interaction)."""
        base = self.baseline_entry().runs[0].tokens_per_s
        entries = []
        for e in self.entries:
            runs = []
            for i, wiggle in enumerate((-spread, 0.0, spread)):
                tps = base * speed(e.values) * math.exp(wiggle)
                tokens = e.runs[0].tokens_per_step
                runs.append(e.runs[0].model_copy(update={"repeat": i, "status": "ok", "tokens_per_s": tps,
                                                         "step_s": tokens / tps, "wall_s": 20 * tokens / tps}))
            entries.append(e.model_copy(update={"runs": runs}))
        return self.model_copy(update={"entries": entries})

    def up_to_date(self, workload: Workload, path: Path | str = "table") -> tuple[Table, list[str]]:
        """This table under ``workload``'s knobs as they are now, and a note of what was brought up to date.

        A table measured before a knob existed ran with that knob's behaviour of then: the knob's
        current default (tensor parallelism 1, no float8, ...). Its recipes gain the default, so the
        relations over the new knobs hold, and their ids are computed again. A knob the workload no
        longer has, or a value outside a knob's domain now, cannot be mapped: ConfigError."""
        knobs = workload.knobs()
        gone = sorted(set(self.baseline) - set(knobs))
        if gone:
            raise ConfigError(path, "baseline", f"knob(s) {', '.join(gone)} of this table are not knobs of the "
                              f"{self.workload} workload now; rebuild it with `recipetune bench table`")
        new = {n: knobs[n].default for n in knobs if n not in self.baseline}
        if not new:
            return self, []
        baseline = Recipe({**self.baseline, **new})
        entries = []
        for e in self.entries:
            recipe = baseline.with_(**e.values)
            try:
                knobs.resolve(recipe)  # every value still in its knob's domain
            except KnobError as err:
                raise ConfigError(path, f"entries.{e.id}", str(err)) from None
            entries.append(e.model_copy(update={"id": recipe.id}))
        shown = ", ".join(f"{n}={v}" for n, v in new.items())
        note = (f"{self.name}: measured before the knobs {', '.join(new)} existed; their current defaults are "
                f"assumed ({shown}), so its recipes have new ids")
        return self.model_copy(update={"baseline": dict(baseline), "baseline_id": baseline.id,
                                       "entries": entries}), [note]


def space_points(campaign: Campaign) -> list[dict[str, Scalar]]:
    """Every combination of the searched knobs' values (the baseline's value included, as Optuna sees it)."""
    from recipetune.speed.plan import check_space

    dists = distributions(check_space(campaign), campaign.baseline)
    names = list(dists)
    return [dict(zip(names, combo, strict=True)) for combo in
            itertools.product(*(dists[n].choices for n in names))]  # type: ignore[attr-defined]


def measurement(result: RunResult, repeat: int) -> Measurement:
    m = Measurement(repeat=repeat, status=result.status, cause=result.cause[:300], wall_s=round(result.wall_s, 3),
                    n_devices=result.n_devices, flops_per_token=result.flops_per_token,
                    peak_flops=result.peak_flops_per_device)
    info = _run_info(Path(result.out_dir)) if result.out_dir else {}
    m.accumulation_steps = info.get("accumulation_steps")
    m.device = info.get("device")
    if not result.steps:
        return m
    s = result.summary()
    measured = result.measured()
    m.tokens_per_s = s.tokens_per_s_per_device
    m.step_s, m.mfu, m.peak_mem_bytes = s.mean_step_time_s, s.mfu, s.peak_mem_bytes
    m.data_s, m.compute_s, m.optim_s = (s.breakdown_s.get(k) for k in ("data_s", "compute_s", "optim_s"))
    m.tokens_per_step = measured[0].tokens if measured else None
    m.measured_steps, m.warmup_s, m.loss_last = s.measured_steps, s.warmup_time_s, s.loss_last
    return m


def _run_info(out_dir: Path) -> dict[str, Any]:
    import json

    try:
        return json.loads((out_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def _load_avg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _new_table(campaign: Campaign, name: str, points: list[dict[str, Scalar]], steps: int, repeats: int,
               timeout_s: float) -> Table:
    """A table with no runs yet: every point of the space as an entry, the static check's refusal with it."""
    from recipetune.guard.static import static_check

    workload, baseline = campaign.workload, campaign.baseline
    entries = []
    for values in points:
        recipe = baseline.with_(**values)
        violations = static_check(workload, baseline, recipe)
        cause = "; ".join(f"{v.knob}: {v.message}" for v in violations)
        entries.append(Entry(id=recipe.id, values=values, feasible=not violations, cause=cause))
    return Table(name=name, workload=workload.kind, campaign=str(campaign.path), baseline=dict(baseline),
                 workload_spec=campaign.config.workload.model_dump(mode="json", exclude_none=True),
                 baseline_id=baseline.id, space={n: list(v) for n, v in campaign.config.search.knobs.items()},
                 steps=steps, repeats=repeats, environment=environment_fingerprint(),
                 conditions={"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "load_avg_start": _load_avg(),
                             "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", ""), "timeout_s": timeout_s},
                 entries=entries)


def build_table(campaign: Campaign, out: Path, name: str, repeats: int, steps: int, timeout_s: float,
                seed: int = 0, log: Callable[[str], None] = print) -> Table:
    """Measure every feasible recipe ``repeats`` times, interleaved; resume from ``out`` if it holds this table."""
    workload, baseline = campaign.workload, campaign.baseline
    points = space_points(campaign)
    previous: Table | None = None
    if out.exists():
        previous = Table.load(out)
        if previous.baseline_id != baseline.id or previous.steps != steps or len(previous.entries) != len(points):
            raise ValueError(f"{out} holds another table (baseline, steps or space differ); choose another --out")
    if previous is not None:
        table = previous
        table.repeats = max(table.repeats, repeats)
    else:
        table = _new_table(campaign, name, points, steps, repeats, timeout_s)
    feasible = [e for e in table.entries if e.feasible]
    todo = [(r, e) for r in range(repeats) for e in feasible if all(m.repeat != r for m in e.runs)]
    log(f"{len(table.entries)} recipes, {len(feasible)} feasible; {len(todo)} runs to go ({repeats} repeats, "
        f"{steps} steps each)")
    scratch = Path(tempfile.mkdtemp(prefix="recipetune-bench-"))
    started = time.monotonic()
    try:
        for r in range(repeats):
            batch = [e for rr, e in todo if rr == r]
            random.Random(f"{seed}-{r}").shuffle(batch)  # interleaved: a burst of load hits many recipes once
            for i, entry in enumerate(batch):
                recipe = table.recipe(entry)
                run_dir = scratch / f"{r}-{entry.id}"
                try:
                    result = workload.run(recipe, steps, run_dir, timeout_s=timeout_s)
                    m = measurement(result, r)
                finally:
                    shutil.rmtree(run_dir, ignore_errors=True)
                entry.runs.append(m)
                table.conditions["elapsed_s"] = round(table.conditions.get("elapsed_s", 0.0) +
                                                      m.wall_s, 1)
                table.save(out)
                tps = f"{m.tokens_per_s:,.0f} tok/s" if m.tokens_per_s else m.cause[:80]
                log(f"repeat {r + 1}/{repeats} [{i + 1}/{len(batch)}] {entry.id} {m.status} {m.wall_s:.1f}s {tps}  "
                    + ", ".join(f"{k}={v}" for k, v in entry.values.items()))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table.conditions.update(finished=time.strftime("%Y-%m-%d %H:%M:%S %Z"), load_avg_end=_load_avg(),
                            session_s=round(time.monotonic() - started, 1))
    table.save(out)
    return table
