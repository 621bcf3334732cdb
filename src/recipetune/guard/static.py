"""Static checks: what a candidate recipe may change, decided before anything runs.

A candidate passes when every knob is known and inside its domain, the workload finds the recipe
consistent, every knob that may change learning (role semantic or invariant) equals the baseline's
unless the campaign allows it, and every invariant of the workload holds. Nothing proposed is ever
executed: relations are evaluated with ``recipetune.core.expr``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field

from recipetune.core import expr
from recipetune.core.recipe import INVARIANT, SPEED, KnobError, KnobSet, Recipe
from recipetune.workloads.base import Workload


@dataclass(frozen=True)
class Violation:
    knob: str  # the knob (or invariant name) at fault
    # "unknown-knob", "out-of-domain", "invariant", "semantic-not-allowed", "recipe-check", "relation",
    # "derived";
    # a campaign adds "above-critical-batch-size" (recipetune.speed.semantic)
    rule: str
    message: str  # a sentence a user understands

    def __str__(self) -> str:
        return f"{self.knob}: {self.message} [{self.rule}]"


@dataclass
class StaticReport:
    violations: list[Violation] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # what was checked, one line each
    allowed_semantic: list[str] = field(default_factory=list)  # semantic knobs changed with permission

    @property
    def passed(self) -> bool:
        return not self.violations


def _show(value: object) -> str:
    return json.dumps(value)


def _knob_in(message: str, names: Collection[str]) -> str:
    """The first knob a workload's message names, so a recipe-check violation points at a knob."""
    for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message):
        if word in names:
            return word
    return "recipe"


def _check_roles(report: StaticReport, knobs: KnobSet, base: Recipe, resolved: Recipe, allow: set[str]) -> None:
    """Roles: a knob that may change learning keeps the baseline's value unless the campaign opts in."""
    fixed = [k for k in knobs.values() if k.role != SPEED]
    for knob in fixed:
        old, new = base.get(knob.name), resolved.get(knob.name)
        if old == new:
            continue
        if knob.role == INVARIANT:
            report.violations.append(Violation(
                knob.name, "invariant", f"defines the experiment and must not change "
                f"(baseline {_show(old)}, candidate {_show(new)})"))
        elif knob.name in allow:
            report.allowed_semantic.append(knob.name)
        else:
            report.violations.append(Violation(
                knob.name, "semantic-not-allowed", f"may change what the model learns "
                f"(baseline {_show(old)}, candidate {_show(new)}); the campaign must list it in "
                "search.allow_semantic to try it"))
    allowed = f" except allowed {', '.join(report.allowed_semantic)}" if report.allowed_semantic else ""
    report.checked.append(f"roles: {len(fixed)} semantic/invariant knobs equal to the baseline{allowed}")


def _check_invariants(report: StaticReport, workload: Workload, base: Recipe, resolved: Recipe) -> None:
    """'Unchanged' invariants. One that depends on a semantic knob the campaign allowed to change is
    waived: that change is judged on loss at equal tokens instead."""
    reported = {v.knob for v in report.violations}
    for inv in workload.invariants():
        if inv.kind == "holds":
            continue  # a relation, checked above
        try:
            new = expr.evaluate(inv.expr, resolved)
            old = expr.evaluate(inv.expr, base)
        except (expr.ExprError, TypeError, ValueError) as e:
            report.violations.append(Violation(inv.name, "invariant", f"cannot be evaluated: {e}"))
            continue
        waived = expr.names(inv.expr) & set(report.allowed_semantic)
        if waived:
            report.checked.append(f"{inv.name}: {_show(old)} -> {_show(new)}, waived (allowed {', '.join(waived)})")
        elif new != old and not expr.names(inv.expr) <= reported:  # else said above, knob by knob
            report.violations.append(Violation(
                inv.name, "invariant", f"'{inv.expr}' must stay {_show(old)}, the candidate gives {_show(new)}"))
        elif new == old:
            report.checked.append(f"{inv.name}: {inv.expr} = {_show(new)}, unchanged")


def static_report(
    workload: Workload, baseline: Recipe, candidate: Recipe, allow_semantic: Collection[str] = ()
) -> StaticReport:
    """Every static check of ``candidate`` against ``baseline``, with what was checked."""
    report = StaticReport()
    knobs = workload.knobs()

    values = dict(knobs.defaults())
    for name, value in candidate.items():
        if name not in knobs:
            report.violations.append(Violation(
                name, "unknown-knob", f"the {workload.kind} workload has no knob '{name}'; "
                f"valid knobs are: {', '.join(sorted(knobs))}"))
            continue
        try:
            values[name] = knobs[name].validate(value)
        except KnobError as e:
            report.violations.append(Violation(name, "out-of-domain", str(e)))
    report.checked.append(f"domains: {len(candidate)} knob values known and in range")
    if report.violations:
        return report  # nothing else can be evaluated meaningfully on unknown or invalid values
    resolved = Recipe(values)
    base = Recipe({**knobs.defaults(), **baseline})

    _check_roles(report, knobs, base, resolved, set(allow_semantic))

    # Derived knobs and relations that must hold (recipetune.core.relations: the search repairs a
    # proposal that breaks one; here a recipe that still breaks one is refused).
    broken_knobs: set[str] = set()
    for problem in workload.relations().problems(resolved):
        report.violations.append(Violation(problem.knob, problem.rule, problem.message))
        broken_knobs |= problem.knobs
    n_rel = len(workload.relations().relations) + len(workload.relations().derived)
    if n_rel and not broken_knobs:
        report.checked.append(f"relations: {n_rel} derived knobs and relations hold")

    _check_invariants(report, workload, base, resolved)

    # The workload's own consistency checks (e.g. a micro-batch that does not divide the batch).
    for problem in workload.check(resolved):
        if set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", problem)) & broken_knobs:
            continue  # already reported as a broken relation
        report.violations.append(Violation(_knob_in(problem, knobs), "recipe-check", problem))
    report.checked.append(f"{workload.kind} workload consistency checks")
    return report


def static_check(
    workload: Workload, baseline: Recipe, candidate: Recipe, allow_semantic: Collection[str] = ()
) -> list[Violation]:
    """The violations of ``candidate`` against ``baseline``; empty when it may run."""
    return static_report(workload, baseline, candidate, allow_semantic).violations
