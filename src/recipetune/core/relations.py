"""Relations between knobs: derived knobs, relations that must hold, and how to repair a recipe.

One place for what couples knobs, used three ways:

- the search **repairs** a proposal that breaks a relation: the fewest other searched knobs of the
  broken relations move to values their search space lists, the nearest ones first;
- the Optuna strategies **sample only feasible points** (``feasible``, ``feasible_points``);
- the guard's static check **refuses** a recipe that breaks one (``problems``): repairing is the
  search's job, checking is the guard's.

A knob may be **derived** (``grad_accum: {derive: "32 // batch_size"}``): computed from the other
knobs with the safe evaluator (``recipetune.core.expr``), rendered into argv like any knob, never
searched, and held to its own domain. A **relation** is a ``holds`` invariant of the workload
(``batch_size * grad_accum == 32``; the reference trainer's ``global_batch_size % (nproc *
micro_batch_size) == 0``, i.e. nproc x micro-batch x accumulation = global batch).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from recipetune.core import expr
from recipetune.core.recipe import SPEED, KnobError, KnobSet, Recipe, Scalar

MAX_CHECKS = 50_000  # recipes a repair (or a feasible-set enumeration) evaluates at most


@dataclass(frozen=True)
class Relation:
    name: str  # what a user reads
    expr: str  # a boolean expression over knob names

    @property
    def knobs(self) -> set[str]:
        return expr.names(self.expr)


@dataclass(frozen=True)
class Problem:
    """A derived knob with a wrong or out-of-domain value, or a relation that does not hold."""

    knob: str  # the derived knob, or the relation's name
    rule: str  # "derived" | "relation"
    message: str
    knobs: frozenset[str]  # the knobs involved


@dataclass(frozen=True)
class Repair:
    recipe: Recipe
    moved: dict[str, tuple[Scalar, Scalar]]  # knob -> (proposed value, repaired value)
    note: str  # what was repaired and why ('' when nothing was broken); why not, when failed
    ok: bool = True


def _show(values: Mapping[str, Scalar], names: Collection[str]) -> str:
    return ", ".join(f"{n}={json.dumps(values[n])}" for n in sorted(names) if n in values)


class Relations:
    """The derived knobs and the relations of one workload."""

    def __init__(self, knobs: KnobSet, relations: Sequence[Relation] = ()):
        self.knobs = knobs
        self.derived = {k.name: k.derive for k in knobs.values() if k.derive}
        self.relations = list(relations)

    def __bool__(self) -> bool:
        return bool(self.derived or self.relations)

    # -- derived knobs ---------------------------------------------------------------------------

    def derive(self, recipe: Mapping[str, Scalar], given: Mapping[str, Scalar] | None = None) -> Recipe:
        """``recipe`` with every derived knob computed; KnobError when one falls outside its domain,
        or when ``given`` (values a user wrote) sets one to anything else."""
        values = dict(recipe)
        for name, text in self.derived.items():
            try:
                raw = expr.evaluate(text, values)
            except (expr.ExprError, TypeError, ValueError) as e:
                raise KnobError(name, f"derived from '{text}', which cannot be evaluated: {e}") from None
            try:
                value = self.knobs[name].validate(raw)
            except KnobError as e:
                used = _show(values, expr.names(text))
                raise KnobError(name, f"derived from '{text}' = {raw!r} ({used}), outside its domain: "
                                      f"{self.knobs[name].describe_domain()}") from e
            if given is not None and name in given and given[name] != value:
                raise KnobError(name, f"is derived from '{text}' (= {value!r} here); leave it out or set "
                                      f"{json.dumps(given[name])} through the knobs it is derived from")
            values[name] = value
        return Recipe(values)

    # -- checking ------------------------------------------------------------------------------

    def problems(self, recipe: Mapping[str, Scalar]) -> list[Problem]:
        """Derived knobs whose value is not the derived one, and relations that do not hold."""
        out: list[Problem] = []
        values = dict(recipe)
        for name, text in self.derived.items():
            involved = frozenset({name, *expr.names(text)})
            try:
                want = self.derive(values)[name]
            except KnobError as e:
                out.append(Problem(name, "derived", str(e).removeprefix(f"knob '{name}': "), involved))
                continue
            if values.get(name) != want:
                used = _show(values, expr.names(text))
                message = f"is derived from '{text}' = {json.dumps(want)} ({used}), not {json.dumps(values.get(name))}"
                out.append(Problem(name, "derived", message, involved))
        for rel in self.relations:
            involved = frozenset(rel.knobs)
            try:
                ok = bool(expr.evaluate(rel.expr, values))
            except (expr.ExprError, TypeError, ValueError) as e:
                out.append(Problem(rel.name, "relation", f"'{rel.expr}' cannot be evaluated: {e}", involved))
                continue
            if not ok:
                out.append(Problem(rel.name, "relation", f"'{rel.expr}' does not hold ({_show(values, involved)})",
                                   involved))
        return out

    def feasible(self, recipe: Mapping[str, Scalar]) -> bool:
        """Whether ``recipe``, its derived knobs computed, keeps every relation and domain."""
        try:
            return not self.problems(self.derive(recipe))
        except KnobError:
            return False

    # -- repairing ---------------------------------------------------------------------------

    def repair(self, recipe: Recipe, keep: Collection[str], space: Mapping[str, Sequence[Scalar]]) -> Repair:
        """The nearest feasible recipe that moves the fewest searched knobs of the broken relations (and,
        where those alone cannot, of the relations that share knobs with them).

        ``keep``: knobs that must keep their value (what a proposal asked for). Only knobs listed in
        ``space`` move, to values it lists; a speed knob moves before one that may change learning,
        then the smallest move wins (log-ratio for positive numbers, list positions otherwise).
        """
        try:
            start = self.derive(recipe)
            broken = self.problems(start)
        except KnobError as e:
            start, broken = recipe, [Problem(e.knob, "derived", str(e), frozenset({e.knob, *self._inputs(e.knob)}))]
        if not broken:
            return Repair(start, {}, "")
        involved: set[str] = set()
        for p in broken:
            for name in p.knobs:
                involved |= {name, *self._inputs(name)}
        what = "; ".join(p.message for p in broken)
        movable = self._movable(involved, keep, space)
        if not movable:
            return Repair(start, {}, f"{what}; no other searched knob of it may move", ok=False)
        found = self._nearest(recipe, movable, space)
        coupled = self._movable(self._coupled(involved), keep, space)
        if found is None and len(coupled) > len(movable):
            # moving these knobs breaks a relation they share knobs with (ep needs dp_shard, which
            # leaves no room for pp, whose micro-batches must then go): that relation's knobs may move too
            movable, found = coupled, self._nearest(recipe, coupled, space)
        if found is None:
            return Repair(start, {}, f"{what}; no values of {', '.join(movable)} in the search space repair it",
                          ok=False)
        repaired, moved = found
        changes = ", ".join(f"{n} {json.dumps(old)} -> {json.dumps(new)}" for n, (old, new) in moved.items())
        derived = [n for n in self.derived if repaired.get(n) != start.get(n)]
        also = f" ({', '.join(f'{n}={json.dumps(repaired[n])}' for n in derived)} derived)" if derived else ""
        return Repair(repaired, moved, f"repaired: {changes}{also}, because {what}")

    def _movable(self, involved: set[str], keep: Collection[str], space: Mapping[str, Sequence[Scalar]]) -> list[str]:
        return [n for n in space if n in involved and n not in keep and n not in self.derived]

    def _coupled(self, involved: set[str]) -> set[str]:
        """``involved`` and the knobs of every relation linked to it through shared knobs."""
        out = set(involved)
        grown = True
        while grown:
            grown = False
            for rel in self.relations:
                if rel.knobs & out and not rel.knobs <= out:
                    out |= rel.knobs
                    grown = True
        return out

    def _nearest(self, recipe: Recipe, movable: list[str],
                 space: Mapping[str, Sequence[Scalar]]) -> tuple[Recipe, dict] | None:
        """The feasible recipe moving the fewest of ``movable``, speed knobs first, then the smallest move."""
        best: tuple[tuple, Recipe, dict] | None = None
        checks = 0
        for r in range(1, len(movable) + 1):
            for combo in itertools.combinations(movable, r):
                choices = [[v for v in space[n] if v != recipe.get(n)] for n in combo]
                for values in itertools.product(*choices):
                    checks += 1
                    if checks > MAX_CHECKS:
                        break
                    candidate = recipe.with_(**dict(zip(combo, values, strict=True)))
                    try:
                        candidate = self.derive(candidate)
                    except KnobError:
                        continue
                    if self.problems(candidate):
                        continue
                    semantic = sum(self.knobs[n].role != SPEED for n in combo)
                    cost = sum(_distance(space[n], recipe.get(n), v) for n, v in zip(combo, values, strict=True))
                    key = (semantic, cost)
                    if best is None or key < best[0]:
                        best = (key, candidate, {n: (recipe.get(n), v) for n, v in zip(combo, values, strict=True)})
            if best is not None:
                break
        return None if best is None else (best[1], best[2])

    def _inputs(self, name: str) -> set[str]:
        text = self.derived.get(name)
        return expr.names(text) if text else set()

    # -- the feasible set, for samplers --------------------------------------------------------

    def feasible_points(self, base: Recipe, space: Mapping[str, Sequence[Scalar]]) -> list[dict[str, Scalar]] | None:
        """Every feasible assignment of the searched knobs (the rest as in ``base``), in product
        order; None when the space is too large to enumerate."""
        names = list(space)
        if math.prod(len(v) for v in space.values()) > MAX_CHECKS:
            return None
        out = []
        for values in itertools.product(*(space[n] for n in names)):
            point = dict(zip(names, values, strict=True))
            if self.feasible(base.with_(**point)):
                out.append(point)
        return out


def _distance(values: Sequence[Scalar], old: Scalar | None, new: Scalar) -> float:
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (old, new))
    if numbers and old > 0 and new > 0:  # type: ignore[operator]
        return abs(math.log(float(new) / float(old)))  # type: ignore[arg-type]
    if old in values:
        return float(abs(list(values).index(new) - list(values).index(old)))
    return 1.0
