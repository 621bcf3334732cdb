"""From a CSV of (batch_size, steps[, model_size, data_size]) measurements to a CBS summary.

Everything that can fail on bad input (reading, parsing, fitting) happens in `load_table` and
`summarize`, which raise TableError; writing comes after, so bad input leaves nothing behind.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from recipetune.cbs.fit import (
    PAPER_CHINCHILLA_COEF,
    PAPER_CHINCHILLA_EXPONENT,
    PAPER_DATA_EXPONENT,
    PAPER_MODEL_EXPONENT,
    PowerLawFit,
    StepsFit,
    critical_batch_size,
    critical_batch_size_ci,
    default_b_opt,
    fit_power_law,
    fit_steps_vs_batch,
)

REQUIRED = ("batch_size", "steps")
GROUP_COLUMNS = ("model_size", "data_size")
PAPER_EXPONENTS = {"data_size": PAPER_DATA_EXPONENT, "model_size": PAPER_MODEL_EXPONENT}
SHORT = {"data_size": "D", "model_size": "N"}
# Spellings of "this run never reached the target loss" in the steps column.
MISSING = {"", "na", "n/a", "nan", "none", "null", "inf", "-"}


class TableError(ValueError):
    """Bad measurement table; the message names the file and, where it can, the row and column."""


@dataclass
class Row:
    line: int  # line number in the file, header = 1
    batch_size: float
    steps: float | None  # None: target loss never reached
    groups: dict[str, float]


@dataclass
class Table:
    path: Path
    group_columns: list[str]
    rows: list[Row]

    @property
    def measured(self) -> list[Row]:
        return [r for r in self.rows if r.steps is not None]

    @property
    def excluded(self) -> list[Row]:
        return [r for r in self.rows if r.steps is None]


def _number(path: Path, line: int, column: str, text: str) -> float:
    if not text:
        raise TableError(f"{path}: line {line}, column '{column}': empty")
    try:
        value = float(text)
    except ValueError:
        raise TableError(f"{path}: line {line}, column '{column}': not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise TableError(f"{path}: line {line}, column '{column}': must be a positive number, got {text!r}")
    return value


def load_table(path: Path) -> Table:
    if not path.is_file():
        raise TableError(f"{path}: no such file")
    with path.open(newline="", encoding="utf-8-sig") as fh:  # utf-8-sig: spreadsheets prepend a BOM
        reader = csv.DictReader(fh)
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise TableError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header)})")
        group_columns = [c for c in GROUP_COLUMNS if c in header]
        rows = []
        for raw in reader:
            # Cells beyond the header land under the key None as a list; they carry nothing we read.
            cells = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
            line = reader.line_num
            if not any(cells.values()):
                continue  # blank line
            batch = _number(path, line, "batch_size", cells["batch_size"])
            steps_text = cells["steps"]
            steps = None if steps_text.lower() in MISSING else _number(path, line, "steps", steps_text)
            groups = {c: _number(path, line, c, cells[c]) for c in group_columns}
            rows.append(Row(line, batch, steps, groups))
    if not rows:
        raise TableError(f"{path}: no data rows")
    return Table(path, group_columns, rows)


def _label(key: dict[str, float]) -> str:
    return ", ".join(f"{SHORT[k]}={v:g}" for k, v in key.items())


@dataclass
class GroupResult:
    key: dict[str, float]
    fit: StepsFit
    b_opt: float
    b_star: float | None  # None: a <= 0, no saturation in range, B* unbounded by the data
    b_star_ci: tuple[float, float]
    note: str = ""

    @property
    def label(self) -> str:
        return _label(self.key) or "all"

    @property
    def unbounded(self) -> bool:
        return self.fit.a <= 0

    @property
    def b_star_text(self) -> str:
        return "unbounded" if self.unbounded else fmt(self.b_star, 3)


@dataclass
class ScalingResult:
    variable: str  # data_size or model_size
    fixed: dict[str, float]  # the other group column, held at this value
    fit: PowerLawFit
    x: list[float]
    b_star: list[float]
    b_star_ci: list[tuple[float, float]]

    @property
    def paper_exponent(self) -> float:
        return PAPER_EXPONENTS[self.variable]

    @property
    def label(self) -> str:
        return self.variable + (f" at {_label(self.fixed)}" if self.fixed else "")


@dataclass
class Summary:
    source: Path
    b_opt_rule: str
    groups: list[GroupResult]
    scaling: list[ScalingResult]
    excluded: list[Row]
    notes: list[str] = field(default_factory=list)


def _fit_group(path: Path, key: dict[str, float], rows: list[Row], b_opt: float | None, seed: int) -> GroupResult:
    label = _label(key) or "all rows"
    batch = [r.batch_size for r in rows]
    if len(set(batch)) < 3:
        raise TableError(
            f"{path}: group {label} has {len(set(batch))} distinct batch size(s) with steps "
            f"({sorted(set(batch))}); need at least 3 (lines {', '.join(str(r.line) for r in rows)})"
        )
    fit = fit_steps_vs_batch(batch, [r.steps for r in rows])
    ref = default_b_opt(batch) if b_opt is None else b_opt
    b_star, note = None, ""
    try:
        b_star = critical_batch_size(fit.a, fit.b, ref)
    except ValueError as exc:
        note = str(exc)
    ci = critical_batch_size_ci(fit, ref, seed=seed)
    if b_star is not None and b_star > max(batch):
        note = f"B* = {b_star:.4g} lies beyond the largest measured batch size {max(batch):g}: extrapolated"
    return GroupResult(key, fit, ref, b_star, ci, note)


def _scaling_fits(groups: list[GroupResult], columns: list[str], notes: list[str]) -> list[ScalingResult]:
    """Exponent of B* in each group column, holding the other column (if any) fixed."""
    usable = [g for g in groups if g.b_star is not None]
    results = []
    for var in sorted(columns, key=lambda c: c != "data_size"):  # the paper's main finding first
        others = [c for c in columns if c != var]
        slices: dict[tuple[float, ...], list[GroupResult]] = {}
        for g in usable:
            slices.setdefault(tuple(g.key[c] for c in others), []).append(g)
        for fixed_values, members in sorted(slices.items()):
            members.sort(key=lambda g: g.key[var])
            x = [g.key[var] for g in members]
            fixed = dict(zip(others, fixed_values, strict=True))
            if len(set(x)) < 2:
                continue
            fit = fit_power_law(x, [g.b_star for g in members])
            if fit.note:
                notes.append(f"{var} exponent at {_label(fixed) or 'all'}: {fit.note}")
            results.append(
                ScalingResult(var, fixed, fit, x, [g.b_star for g in members], [g.b_star_ci for g in members])
            )
        if not any(r.variable == var for r in results):
            notes.append(f"no {var} exponent: fewer than 2 {var} values with a finite B* at a fixed setting")
    return results


def summarize(table: Table, b_opt: float | None = None, seed: int = 0) -> Summary:
    """Fit every group, compute B* with its bootstrap CI, then the power laws across groups."""
    if b_opt is not None and not (math.isfinite(b_opt) and b_opt > 0):
        raise TableError(f"--b-opt must be a positive number, got {b_opt}")
    grouped: dict[tuple[float, ...], list[Row]] = {}
    for r in table.measured:
        grouped.setdefault(tuple(r.groups[c] for c in table.group_columns), []).append(r)
    if not grouped:
        raise TableError(f"{table.path}: no row has a step count (all targets missed)")
    groups = [
        _fit_group(table.path, dict(zip(table.group_columns, key, strict=True)), rows, b_opt, seed)
        for key, rows in sorted(grouped.items())
    ]
    notes = [f"group {g.label}: {g.note}" for g in groups if g.note]
    scaling = _scaling_fits(groups, table.group_columns, notes) if table.group_columns else []
    rule = "smallest measured batch size per group" if b_opt is None else f"given: {b_opt:g}"
    return Summary(table.path, rule, groups, scaling, table.excluded, notes)


def _finite(x: float | None) -> float | None:
    # JSON has no inf/NaN; null marks an unbounded or undefined value.
    return x if x is not None and math.isfinite(x) else None


def _group_dict(g: GroupResult) -> dict:
    """One group's fit as JSON: its points, a and b with their errors, B* with its interval."""
    return {
        "key": g.key,
        "label": g.label,
        "n": g.fit.n,
        "batch_sizes": g.fit.batch_sizes.tolist(),
        "steps": g.fit.steps.tolist(),
        "a": g.fit.a,
        "b": g.fit.b,
        "a_se": _finite(g.fit.a_se),
        "b_se": _finite(g.fit.b_se),
        "cov": [[_finite(float(v)) for v in row] for row in g.fit.cov],
        "r2": g.fit.r2,
        "b_opt": g.b_opt,
        "b_star": _finite(g.b_star),
        "b_star_unbounded": g.unbounded,
        "b_star_ci95": [_finite(v) for v in g.b_star_ci],
        "note": g.note,
    }


def _scaling_dict(s: ScalingResult) -> dict:
    """One scaling fit as JSON: B* against the varied quantity, beside the paper's exponent."""
    return {
        "variable": s.variable,
        "fixed": s.fixed,
        "x": s.x,
        "b_star": s.b_star,
        "exponent": s.fit.exponent,
        "exponent_ci95": [_finite(v) for v in s.fit.exponent_ci],
        "coef": s.fit.coef,
        "coef_ci95": [_finite(v) for v in s.fit.coef_ci],
        "r2": s.fit.r2,
        "n": s.fit.n,
        "paper_exponent": s.paper_exponent,
        "note": s.fit.note,
    }


def to_dict(summary: Summary) -> dict:
    return {
        "source": str(summary.source),
        "model": "S(B) = a + b/B; B* = b/(5a) + 1.2 B_opt (arXiv 2410.21676)",
        "b_opt_rule": summary.b_opt_rule,
        "groups": [_group_dict(g) for g in summary.groups],
        "scaling": [_scaling_dict(s) for s in summary.scaling],
        "excluded_rows": [
            {"line": r.line, "batch_size": r.batch_size, **r.groups, "reason": "target loss not reached"}
            for r in summary.excluded
        ],
        "notes": summary.notes,
        "paper": {
            "data_exponent": PAPER_DATA_EXPONENT,
            "model_exponent": PAPER_MODEL_EXPONENT,
            "chinchilla_law": f"B* = {PAPER_CHINCHILLA_COEF} N^{PAPER_CHINCHILLA_EXPONENT} "
            "(N in millions of params, B in 512-token sequences)",
        },
    }


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if 1e-3 <= abs(x) < 1e6:  # plain digits read easier than 3.46e+03
        return np.format_float_positional(x, precision=digits, unique=False, fractional=False, trim="-")
    return f"{x:.{digits}g}"


def fmt_ci(ci: tuple[float, float], digits: int = 4) -> str:
    return f"[{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"


def to_markdown(summary: Summary) -> str:
    lines = [
        "# Critical batch size",
        "",
        f"Source: `{summary.source}`. Fit: S(B) = a + b/B; B* = b/(5a) + 1.2 B_opt, where steps exceed "
        f"linear scaling from B_opt by 20% (arXiv 2410.21676). B_opt: {summary.b_opt_rule}.",
        "",
        "Groups: D = data_size, N = model_size.",
        "",
        "| group | n | a | b | r2 | B_opt | B* | B* 95% CI |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in summary.groups:
        lines.append(
            f"| {g.label} | {g.fit.n} | {fmt(g.fit.a)} ± {fmt(g.fit.a_se, 2)} | {fmt(g.fit.b)} ± "
            f"{fmt(g.fit.b_se, 2)} | {g.fit.r2:.4f} | {fmt(g.b_opt)} | {g.b_star_text} "
            f"| {fmt_ci(g.b_star_ci)} |"
        )
    if summary.scaling:
        lines += [
            "",
            "## Scaling of B*",
            "",
            "| variable | n | exponent | 95% CI | r2 | paper |",
            "|---|---|---|---|---|---|",
        ]
        for s in summary.scaling:
            lines.append(
                f"| {s.label} | {s.fit.n} | {s.fit.exponent:.3f} | {fmt_ci(s.fit.exponent_ci)} | "
                f"{s.fit.r2:.3f} | {s.paper_exponent} |"
            )
    if summary.excluded:
        lines += ["", "## Excluded rows (target loss not reached)", ""]
        lines += [
            f"- line {r.line}: batch_size={r.batch_size:g}"
            + "".join(f", {SHORT[k]}={v:g}" for k, v in r.groups.items())
            for r in summary.excluded
        ]
    if summary.notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in summary.notes]
    return "\n".join(lines) + "\n"


def write_summary(summary: Summary, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / "summary.json", out_dir / "summary.md"
    json_path.write_text(json.dumps(to_dict(summary), indent=2, allow_nan=False) + "\n")
    md_path.write_text(to_markdown(summary))
    return [json_path, md_path]
