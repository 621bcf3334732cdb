"""The analyst's playbook language: rules (``when`` a condition over a node's facts holds, ``do`` an
action on a knob) read from YAML, checked field by field (``PlaybookError`` names the file and the
rule). The analyst (engine/proposers.py) applies them; each job ships its own playbook
(speed/playbook.yaml, finetune/playbook.yaml)."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from recipetune.core.errors import validation_error
from recipetune.core.expr import ExprError, evaluate, parse
from recipetune.core.meanings import Glossary
from recipetune.core.recipe import Recipe, Scalar, SearchSpace
from recipetune.engine.researcher import member


class Action(BaseModel):
    model_config = ConfigDict(extra="forbid")

    knob: str = Field(description="a knob of the search space; '*' for every searchable knob, 'data_*' for every "
                                  "knob whose name starts with data_")
    set: Scalar | None = None
    move: Literal["up", "down"] | None = None
    each: bool = False
    to: str | None = Field(None, description="an expression over the facts, e.g. 'global_batch_size // nproc'")
    helped: bool = Field(False, description="each move (of these knobs) that raised its parent's score elsewhere "
                                            "in the tree, made on this node; the largest gain first")

    @model_validator(mode="after")
    def _one_kind(self) -> Action:
        kinds = (self.set is not None) + (self.move is not None) + self.each + (self.to is not None) + self.helped
        if kinds != 1:
            raise ValueError("an action needs exactly one of: set: VALUE, move: up|down, each: true, to: EXPR, "
                             "helped: true")
        if self.knob == "*" and not (self.each or self.helped):
            raise ValueError("knob '*' only works with each: true or helped: true")
        if self.knob.endswith("*") and self.move is not None:
            raise ValueError("a knob pattern ending in '*' works with set or each, not move")
        if self.to is not None:
            parse(self.to)
        return self

    def knobs(self, space: SearchSpace, glossary: Glossary | None = None) -> list[str]:
        """The knobs the action may change: a playbook name maps to the knob that means it."""
        if self.knob.endswith("*"):  # "*": every searchable knob; "data_*": those named data_...
            return [k for k in space.values if k.startswith(self.knob[:-1])]
        return [glossary.knob(self.knob) if glossary else self.knob]

    def edits(self, recipe: Recipe, space: SearchSpace, facts: dict[str, Any],
              glossary: Glossary | None = None) -> Iterator[dict[str, Scalar]]:
        """Edits of the workload's own knobs (``helped`` reads the tree: ``helped_moves``)."""
        if self.helped:
            return
        for knob in self.knobs(space, glossary):
            values = space.values.get(knob)
            if not values:
                continue  # not searchable in this campaign
            current = recipe.get(knob)
            target = self.set
            if self.to is not None:
                try:
                    target = evaluate(self.to, facts)
                except (ExprError, TypeError):
                    continue  # a fact it needs is unknown here
            if target is not None:
                # Only a value the space lists, in the trainer's own spelling (bf16 may be 'bfloat16').
                hit = glossary.value(knob, target, values) if glossary else next(
                    (v for v in values if member(v, (target,))), None)
                if hit is not None:
                    yield {knob: hit}
            elif self.move is not None:
                nxt = _neighbour(values, current, self.move)
                if nxt is not None:
                    yield {knob: nxt}
            else:
                for v in values:
                    if v != current:
                        yield {knob: v}


def _neighbour(values: tuple[Scalar, ...], current: Scalar | None, move: str) -> Scalar | None:
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if numeric and isinstance(current, int | float) and not isinstance(current, bool):
        bigger, smaller = [v for v in values if v > current], [v for v in values if v < current]
        if move == "up":
            return min(bigger) if bigger else None
        return max(smaller) if smaller else None
    if current not in values:
        return None
    i = values.index(current) + (1 if move == "up" else -1)
    return values[i] if 0 <= i < len(values) else None


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    when: str = "True"
    action: Action
    why: str

    @field_validator("when")
    @classmethod
    def _parses(cls, text: str) -> str:
        parse(text)  # ExprError is a ValueError: pydantic reports it with the field
        return text


class Playbook(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[Rule]


class PlaybookError(ValueError):
    def __init__(self, file: str, field: str, message: str):
        super().__init__(f"{file}: {field}: {message}" if field else f"{file}: {message}")
        self.file, self.field, self.message = file, field, message


def load_playbook(path: str | Path | None = None, builtin: str | None = None) -> list[Rule]:
    """The rules of a playbook file; a job's built-in one (``package:file``) when ``path`` is None."""
    if path is None:
        if builtin is None:
            raise PlaybookError("playbook", "", "no playbook: give a file or the job's built-in one")
        package, _, name = builtin.partition(":")
        text, where = resources.files(package).joinpath(name).read_text(), name
    else:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise PlaybookError(where, "", f"cannot read: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise PlaybookError(where, "", f"not a text file: byte {e.start} is not UTF-8") from None
    try:
        raw = yaml.safe_load(text)
        return Playbook.model_validate(raw).rules
    except yaml.YAMLError as e:
        raise PlaybookError(where, "", f"malformed YAML: {getattr(e, 'problem', e)}") from None
    except RecursionError:
        raise PlaybookError(where, "", "nested too deeply to be a playbook") from None
    except ValidationError as e:
        raise validation_error(e, where, error=PlaybookError) from None

