"""Recipes and the knobs they set.

A recipe is the flat set of settings a training run is launched with. Its canonical JSON is its
identity: two recipes with the same settings are the same recipe, so nothing is measured twice by
accident. A knob declares its domain and whether changing it may change what the model learns.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Scalar = bool | int | float | str

# Why a knob exists decides how the control system treats a change to it.
SPEED = "speed"  # only how fast the same maths runs: freely searchable
SEMANTIC = "semantic"  # may change what is learned (e.g. global batch): only when a campaign opts in
INVARIANT = "invariant"  # defines the experiment (model, data, seed): never changes within a campaign
KNOB_ROLES = (SPEED, SEMANTIC, INVARIANT)


class KnobError(ValueError):
    """A recipe names an unknown knob or a value outside a knob's domain."""

    def __init__(self, knob: str, message: str):
        super().__init__(f"knob '{knob}': {message}")
        self.knob = knob


@dataclass(frozen=True)
class Knob:
    """One setting: its domain, default and role.

    The domain is either a tuple of allowed values (``choices``) or a numeric interval
    (``low``..``high``, ints when ``integer``). ``choices=None`` and no bounds means any string
    (paths, commands), which is only sensible for invariant knobs.
    """

    name: str
    default: Scalar
    role: str = SPEED
    choices: tuple[Scalar, ...] | None = None
    low: float | None = None
    high: float | None = None
    integer: bool = False
    help: str = ""
    means: str | None = None  # what the knob is, in the vocabulary of recipetune.core.meanings
    derive: str | None = None  # computed from other knobs (recipetune.core.relations), never searched
    # old spellings still accepted, as (old, new) pairs: a renamed value keeps old files working
    renamed: tuple[tuple[Scalar, Scalar], ...] = ()

    def __post_init__(self) -> None:
        if self.role not in KNOB_ROLES:
            raise ValueError(f"knob '{self.name}': role must be one of {KNOB_ROLES}, got {self.role!r}")

    def describe_domain(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(json.dumps(c) for c in self.choices)
        if self.low is not None or self.high is not None:
            kind = "an integer" if self.integer else "a number"
            lo = "-inf" if self.low is None else f"{self.low:g}"
            hi = "inf" if self.high is None else f"{self.high:g}"
            return f"{kind} in [{lo}, {hi}]"
        return "a string"

    def validate(self, value: Any) -> Scalar:
        """Return ``value`` coerced to the knob's type, or raise KnobError naming the domain."""
        for old, new in self.renamed:
            if value == old and type(value) is type(old):
                value = new
        if self.choices is not None:
            for choice in self.choices:
                # bool is an int subclass; compare type-strictly so True never matches 1.
                if value == choice and isinstance(value, bool) == isinstance(choice, bool):
                    return choice
            raise KnobError(self.name, f"{value!r} is not allowed; expected {self.describe_domain()}")
        if self.low is not None or self.high is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise KnobError(self.name, f"{value!r} is not a number; expected {self.describe_domain()}")
            if not math.isfinite(value):
                raise KnobError(self.name, f"{value!r} is not a finite number; expected {self.describe_domain()}")
            if self.integer:
                if float(value) != int(value):
                    raise KnobError(self.name, f"{value!r} is not an integer")
                value = int(value)
            else:
                value = float(value)
            if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
                raise KnobError(self.name, f"{value!r} is outside the domain: {self.describe_domain()}")
            return value
        if not isinstance(value, str):
            raise KnobError(self.name, f"{value!r} must be a string")
        return value


class KnobSet(Mapping[str, Knob]):
    """The knobs one workload understands, by name."""

    def __init__(self, knobs: Sequence[Knob]):
        self._knobs = {k.name: k for k in knobs}

    def __getitem__(self, name: str) -> Knob:
        if name not in self._knobs:
            raise KnobError(name, f"unknown knob; valid knobs are: {', '.join(sorted(self._knobs))}")
        return self._knobs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._knobs)

    def __contains__(self, name: object) -> bool:
        # Mapping's default catches KeyError only; __getitem__ raises KnobError for a friendly message.
        return name in self._knobs

    def __len__(self) -> int:
        return len(self._knobs)

    def defaults(self) -> dict[str, Scalar]:
        return {k.name: k.default for k in self._knobs.values()}

    def resolve(self, values: Mapping[str, Any]) -> Recipe:
        """Defaults overlaid with ``values``, every value checked against its knob's domain."""
        settings = self.defaults()
        for name, value in values.items():
            settings[name] = self[name].validate(value)
        return Recipe(settings)


@dataclass(frozen=True)
class Recipe(Mapping[str, Scalar]):
    """An immutable knob -> scalar mapping whose canonical JSON is its identity."""

    settings: Mapping[str, Scalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", dict(sorted(self.settings.items())))

    def __getitem__(self, name: str) -> Scalar:
        return self.settings[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.settings)

    def __len__(self) -> int:
        return len(self.settings)

    def __hash__(self) -> int:
        return hash(self.canonical_json())

    def canonical_json(self) -> str:
        return json.dumps(self.settings, sort_keys=True, separators=(",", ":"))

    @property
    def id(self) -> str:
        """Short content hash, stable across processes and machines."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:12]

    def with_(self, **edits: Scalar) -> Recipe:
        return Recipe({**self.settings, **edits})

    def diff(self, base: Recipe) -> dict[str, tuple[Scalar | None, Scalar | None]]:
        """Knobs whose value differs from ``base``: name -> (base value, this value)."""
        names = sorted(set(self) | set(base))
        return {
            n: (base.get(n), self.get(n)) for n in names if base.get(n) != self.get(n)
        }

    def edits_from(self, base: Recipe) -> dict[str, Scalar | None]:
        """The edits that make this recipe from ``base``: name -> this value, for the knobs that differ."""
        return {n: new for n, (_, new) in self.diff(base).items()}

    def describe_diff(self, base: Recipe) -> str:
        changes = self.edits_from(base)
        if not changes:
            return "(baseline)"
        return ", ".join(f"{n}={json.dumps(new)}" for n, new in changes.items())


@dataclass(frozen=True)
class SearchSpace:
    """The values a campaign may try for each searchable knob (a subset of each knob's domain)."""

    values: Mapping[str, tuple[Scalar, ...]]

    @classmethod
    def from_lists(cls, knobs: KnobSet, lists: Mapping[str, Sequence[Any]]) -> SearchSpace:
        checked = {}
        for name, vals in lists.items():
            knob = knobs[name]
            if not vals:
                raise KnobError(name, "the search space lists no values")
            checked[name] = tuple(dict.fromkeys(knob.validate(v) for v in vals))
        return cls(checked)

    def size(self) -> int:
        n = 1
        for vals in self.values.values():
            n *= len(vals)
        return n
