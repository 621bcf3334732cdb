"""The quality job's knobs: every field of the training recipe, plus the campaign's optional data steps.

A node of the quality tree is one experiment: (data chain, training recipe). Both map onto the
search's flat ``Recipe``, so the engine, the proposers and Optuna's samplers need nothing new:

- a training-recipe field is a knob of the same name (``lr``, ``epochs``, ``method``, ``lora_rank``,
  ``precision``, ``lora_targets`` ...), its domain read from ``TrainRecipe``; ``seed`` is invariant (the
  final evaluation varies it), ``threads`` and ``gradient_checkpointing`` are speed knobs (the same maths);
  a value the route or the machine cannot honour (fp16 without CUDA, a LoRA preset unknown for the
  architecture) is refused by ``Experiment`` like any bad value (routes.check_fit);
- a data step the campaign offers (``search.data: {near_dedup: {op: dedup_near, ...}}``) is a boolean
  knob ``data_near_dedup``: on, the step joins the baseline chain, before its decontamination, so
  whatever it adds is decontaminated too.

The task, the metric, the model and the evaluation data are not knobs at all: a proposal cannot
name them, and ``experiment_of`` checks again that a child changes none of them.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from recipetune.core.errors import ConfigError, validation_error
from recipetune.core.recipe import INVARIANT, SEMANTIC, SPEED, Knob, KnobSet, Recipe, Scalar
from recipetune.core.relations import Relations
from recipetune.data.ops import Operator
from recipetune.finetune.experiment import Experiment
from recipetune.finetune.recipe import DATA_PREFIX, TrainRecipe, describe_change

_OPERATOR: TypeAdapter = TypeAdapter(Operator)
SPEED_FIELDS = ("threads", "gradient_checkpointing")  # change how fast, not what is learned


def _field_knob(name: str) -> Knob:
    """A knob with the domain pydantic declares for ``TrainRecipe.<name>``."""
    info = TrainRecipe.model_fields[name]
    kind, default = info.annotation, info.default
    role = INVARIANT if name == "seed" else SPEED if name in SPEED_FIELDS else SEMANTIC
    text = info.description or ""
    if typing.get_origin(kind) is Literal:
        return Knob(name, default, role, choices=typing.get_args(kind), help=text)
    if kind is bool:
        return Knob(name, default, role, choices=(False, True), help=text)
    if kind in (int, float):
        low = high = None
        for m in info.metadata:  # annotated_types Ge/Gt/Le/Lt
            low = getattr(m, "ge", getattr(m, "gt", low))
            high = getattr(m, "le", getattr(m, "lt", high))
        return Knob(name, default, role, low=low, high=high, integer=kind is int, help=text)
    return Knob(name, default, role, help=text)  # a string (lora_targets): TrainRecipe checks it


def check_data_steps(steps: dict[str, Any], file: str) -> dict[str, dict[str, Any]]:
    """The campaign's optional data steps, each a valid operator; ConfigError names the bad one."""
    out = {}
    for name, raw in steps.items():
        if not name.isidentifier():
            raise ConfigError(file, f"search.data.{name}", "a data step's name must be an identifier (it becomes "
                                                          f"the knob {DATA_PREFIX}<name>)")
        try:
            op = _OPERATOR.validate_python(raw)
        except ValidationError as e:
            # the first location part is the operator's tag, not a field of the step
            raise validation_error(e, file, prefix=f"search.data.{name}", skip=1) from None
        if op.op == "export":
            raise ConfigError(file, f"search.data.{name}", "an export step changes nothing the model trains on; "
                                                          "offer steps that change the data")
        out[name] = op.model_dump(mode="json", exclude_none=True)
    return out


class ExperimentSpace:
    """The knobs of one fine-tuning campaign (the search's ``Subject``) and the recipe <-> experiment map."""

    def __init__(self, experiment: Experiment, data_steps: dict[str, dict[str, Any]]):
        self.experiment, self.data_steps = experiment, data_steps
        knobs = [_field_knob(n) for n in TrainRecipe.model_fields]
        knobs += [Knob(DATA_PREFIX + n, False, SEMANTIC, choices=(False, True), help=f"add the data step {step}")
                  for n, step in data_steps.items()]
        self._knobs = KnobSet(knobs)

    def knobs(self) -> KnobSet:
        return self._knobs

    def relations(self) -> Relations:
        return Relations(self._knobs)  # none between the recipe's fields

    def baseline(self) -> Recipe:
        values: dict[str, Scalar] = dict(self.experiment.spec.recipe.model_dump(mode="json"))
        values.update({DATA_PREFIX + n: False for n in self.data_steps})
        return Recipe(values)

    def chain(self, recipe: Recipe) -> list[dict[str, Any]]:
        """The baseline chain with the recipe's data steps, inserted before its first decontamination."""
        chain = [op.model_dump(mode="json", exclude_none=True) for op in self.experiment.spec.data]
        extra = [step for n, step in self.data_steps.items() if recipe.get(DATA_PREFIX + n)]
        at = next((i for i, op in enumerate(chain) if op["op"] in ("decontaminate", "export")), len(chain))
        return chain[:at] + extra + chain[at:]

    def train_recipe(self, recipe: Recipe) -> dict[str, Scalar]:
        return {n: v for n, v in recipe.items() if not n.startswith(DATA_PREFIX)}

    def experiment_of(self, recipe: Recipe) -> Experiment:
        """The child experiment a recipe stands for; ConfigError when it is not a valid one, or when it
        would change the task, the model or the evaluation data (Experiment.derive checks)."""
        return self.experiment.derive(recipe=self.train_recipe(recipe), data=self.chain(recipe))

    def child_file(self, recipe: Recipe) -> dict[str, Any]:
        """What ``python -m recipetune.finetune --child`` reads: the recipe and the chain."""
        return {"recipe": self.train_recipe(recipe), "data": self.chain(recipe)}

    def describe(self, recipe: Recipe, base: Recipe) -> str:
        """``lr=0.01, +near_dedup``: a data step shows by name, not as true/false."""
        return describe_change((name, new) for name, (_, new) in recipe.diff(base).items())
