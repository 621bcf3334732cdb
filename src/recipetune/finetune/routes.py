"""What an experiment needs from a base model, whichever library runs it.

A route loads a base model, fine-tunes it on (prompt, completion) pairs with a ``TrainRecipe`` and
generates answers greedily. Two exist: ``reference`` (the reference trainer's model, byte tokenizer,
a short loop in reference.py) and ``hf`` (transformers + TRL's SFTTrainer + peft, in hf.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from recipetune.finetune.recipe import ModelSpec, TrainRecipe
from recipetune.finetune.task import GenerationSettings


class ModelError(ValueError):
    """A base model that cannot be used; ``field`` names the experiment file's field."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


@dataclass
class TrainLog:
    losses: list[tuple[int, float]] = field(default_factory=list)  # (optimizer step, mean loss)
    tokens: int = 0  # supervised tokens seen
    truncated: int = 0  # training examples cut to fit max_seq_len


@dataclass
class Generation:
    text: str
    truncated: bool  # hit max_new_tokens before the stop string / end token


class Route(Protocol):
    name: str

    def params(self) -> dict[str, int]: ...

    def train(self, pairs: list[tuple[str, str]], recipe: TrainRecipe, out_dir: Path) -> TrainLog: ...

    def generate(self, prompts: list[str], settings: GenerationSettings) -> list[Generation]: ...


def check_model(spec: ModelSpec, base_dir: Path) -> None:
    """Refuse a base model that is not one before anything is written (raises ModelError)."""
    if spec.kind == "reference":
        from recipetune.finetune.reference import check_reference

        check_reference(spec, base_dir)
    else:
        from recipetune.finetune.hf import check_hf

        check_hf(spec, base_dir)


def load_route(spec: ModelSpec, base_dir: Path, recipe: TrainRecipe) -> Route:
    if spec.kind == "reference":
        from recipetune.finetune.reference import ReferenceRoute

        return ReferenceRoute(spec, base_dir, recipe)
    from recipetune.finetune.hf import HFRoute

    return HFRoute(spec, base_dir, recipe)


def resolve_path(path: str, base_dir: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base_dir / p).resolve()
