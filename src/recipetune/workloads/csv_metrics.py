"""Step metrics from the CSV file a trainer's logger writes (Lightning's CSVLogger: litgpt's metrics.csv).

A column map says which column holds each field; without one, the file's columns that carry these names:

    step          the optimizer step; or
    tokens_seen   tokens trained so far, all devices together: the step is tokens_seen / tokens_per_step,
                  which must come out whole (a check of workload.tokens_per_step)
    loss          a row with a loss is a training step
    step_time_s   the step's time; or
    elapsed_s     seconds since training started: a step's time is the difference to the row before,
                  over the steps between them
    tokens, lr, grad_norm
    val_loss      a row with a validation loss is a validation
    row           the logger's own row number: a validation row without a step belongs to the training
                  row before it, logged at the same number or the one before (litgpt logs its final
                  validation one past the last step)

A column a map names must be in the file, except ``val_loss``'s: a logger adds that column at the first
validation. The path may hold ``*`` (Lightning numbers its folders ``version_0``, ``version_1``, ...):
the newest match is read.
"""

from __future__ import annotations

import csv
import glob
from collections.abc import Callable, Mapping
from pathlib import Path

from recipetune.core.measure import EvalRecord, StepRecord
from recipetune.workloads.log_formats import MetricsError, Records, number, ordered, to_step_record

FIELDS = ("step", "tokens_seen", "loss", "step_time_s", "elapsed_s", "tokens", "lr", "grad_norm", "val_loss", "row")

# litgpt's pretrain.py (v0.5.13, commit 2685705) with --logger_name csv: fabric.log_dict(metrics,
# step=iter_num - 1) into {out_dir}/logs/csv/version_N/metrics.csv. Lightning's writer (lightning 2.6.6,
# fabric/loggers/csv_logs.py) overwrites litgpt's own "step" (the optimizer step) with that iteration
# index, so the step comes from total_tokens; "time" is ThroughputMonitor's seconds since training began,
# the whole step's wall time (litgpt's iter_time covers the last micro-batch and the optimizer step only).
PRESETS: dict[str, dict[str, str]] = {
    "litgpt": {
        "tokens_seen": "total_tokens",
        "loss": "loss",
        "elapsed_s": "time",
        "lr": "learning_rate",
        "val_loss": "val_loss",
        "row": "step",
    },
}


Value = Callable[[Mapping[str, str], str], "str | None"]  # a row's text in a field's column, None where empty


def columns_of(spec: str | Mapping[str, str]) -> dict[str, str]:
    """The column map a campaign gives (a preset's name, or {field: column}), vetted."""
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise ValueError(f"unknown CSV column preset {spec!r}; valid presets are: {', '.join(sorted(PRESETS))}")
        return dict(PRESETS[spec])
    if unknown := sorted(set(spec) - set(FIELDS)):
        raise ValueError(f"unknown field(s) {unknown}; allowed: {list(FIELDS)}")
    for one_of in (("step", "tokens_seen"), ("step_time_s", "elapsed_s")):
        if sum(f in spec for f in one_of) != 1:
            raise ValueError(f"map exactly one of {' or '.join(one_of)} to a column")
    if "loss" not in spec:
        raise ValueError("map loss to a column")
    return dict(spec)


def matches(path: Path) -> list[Path]:
    """The files ``path`` names, newest first (a path with ``*`` may name several)."""
    if "*" not in str(path):
        return [path] if path.is_file() else []
    found = [Path(p) for p in glob.glob(str(path)) if Path(p).is_file()]
    return sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)


def read_csv(path: Path, columns: Mapping[str, str] | None, tokens_per_step: int | None, n_devices: int) -> Records:
    """Step and validation records from the CSV file at ``path`` (the newest match of a ``*``); ``columns``:
    a vetted column map, or None for the columns named as recipetune's fields."""
    found = matches(path)
    if not found:
        raise MetricsError(f"{path}: no such file (workload.metrics.csv: where the trainer's CSV logger writes)")
    with found[0].open(newline="", errors="replace") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        header = set(reader.fieldnames or ())
    if rows and None in rows[-1].values():
        rows.pop()  # a last row still being written (a full row has every field, empty or not)
    name = found[0].name
    if columns is None and rows:
        try:
            columns = columns_of({f: f for f in FIELDS if f in header})
        except ValueError as e:
            raise MetricsError(
                f"{name}: {e} (workload.metrics.columns); its columns are: {', '.join(sorted(header))}"
            ) from None
    columns = columns or {}
    if rows and (missing := [(k, c) for k, c in columns.items() if c not in header and k != "val_loss"]):
        field, col = missing[0]
        raise MetricsError(
            f"{name} has no column {col!r} (workload.metrics.columns: {field}); its columns are: "
            f"{', '.join(sorted(header))}"
        )

    def value(row: Mapping[str, str], field: str) -> str | None:
        text = row.get(columns.get(field, ""))
        return text if text not in (None, "") else None

    steps: list[StepRecord] = []
    evals: list[EvalRecord] = []
    rows_of: dict[int, int] = {}  # a training row's logger row number -> its step
    last = (0, 0.0)  # (step, elapsed_s) of the training row before
    for i, row in enumerate(rows, 2):  # line 1 is the header
        try:
            if value(row, "loss") is not None:
                fields = _step_fields(row, value, tokens_per_step, last)
                steps.append(to_step_record(fields, tokens_per_step, n_devices))
                if "elapsed_s" in columns:
                    last = (steps[-1].step, number(value(row, "elapsed_s")))
                if (r := value(row, "row")) is not None:
                    rows_of[int(number(r))] = steps[-1].step
            elif (val := value(row, "val_loss")) is not None:
                step = _val_step(row, value, rows_of, steps)
                if step is not None:
                    evals.append(EvalRecord(step=step, val_loss=number(val)))
        except (TypeError, ValueError) as e:
            raise MetricsError(f"{name} line {i}: {e}") from None
    return ordered(steps, evals)


def _step_fields(
    row: Mapping[str, str], value: Value, tokens_per_step: int | None, last: tuple[int, float]
) -> dict[str, str | int | float]:
    own = ("loss", "tokens", "lr", "grad_norm", "step_time_s")
    fields: dict[str, str | int | float] = {k: v for k in own if (v := value(row, k)) is not None}
    if (seen := value(row, "tokens_seen")) is not None:
        if tokens_per_step is None:
            raise MetricsError("steps counted in tokens (tokens_seen) need workload.tokens_per_step")
        steps = number(seen) / tokens_per_step
        if abs(steps - round(steps)) > 1e-6 or round(steps) < 1:
            raise MetricsError(
                f"{number(seen):g} tokens trained is not a whole number of steps of {tokens_per_step} "
                "tokens: workload.tokens_per_step is not this run's global batch in tokens"
            )
        fields["step"] = round(steps)
    elif (step := value(row, "step")) is not None:
        fields["step"] = step
    else:
        raise MetricsError("a training row without its step")
    if (elapsed := value(row, "elapsed_s")) is not None:
        span = int(number(fields["step"])) - last[0]
        time = number(elapsed) - last[1]
        if span < 1 or not time > 0:
            raise MetricsError(
                f"step {fields['step']} at {number(elapsed):g} s does not follow step {last[0]} at {last[1]:g} s"
            )
        fields["step_time_s"] = time / span
    return fields


def _val_step(row: Mapping[str, str], value: Value, rows_of: Mapping[int, int], steps: list[StepRecord]) -> int | None:
    if (step := value(row, "step")) is not None:
        return int(number(step))
    if not steps:
        return None  # a validation before training (litgpt's initial_validation): no step to compare it at
    if (r := value(row, "row")) is not None:
        r = int(number(r))
        if r in rows_of or r - 1 in rows_of:
            return rows_of.get(r, rows_of.get(r - 1))
        raise MetricsError(f"a validation at row {r}, where no training row was logged: log every step")
    return steps[-1].step
