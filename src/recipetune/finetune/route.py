"""What an experiment needs from a base model, whichever library runs it: the route contract.

A route loads a base model, fine-tunes it on (prompt, completion) pairs with a ``TrainRecipe`` and
generates answers greedily. Two exist: ``reference`` (the reference trainer's model, byte tokenizer,
a short loop in reference.py) and ``hf`` (transformers + TRL's SFTTrainer + peft, in hf.py). A
route says what its prompt is (``Route.prompt``): the task's plain text, or on the HF route a
conversation's messages, which the tokenizer's chat template renders. routing.py picks one by the
model's kind; both import this module, never that one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from recipetune.finetune.formats import Message
from recipetune.finetune.recipe import TrainRecipe
from recipetune.finetune.task import GenerationSettings, TaskConfig

Prompt = str | list[Message]  # plain text, or the messages before the answer (a chat template renders them)


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

    def prompt(self, task: TaskConfig, row: dict) -> Prompt: ...

    def train(self, pairs: list[tuple[Prompt, str]], recipe: TrainRecipe, out_dir: Path, checkpoints: int = 0,
              on_checkpoint: Checkpoint | None = None, on_step: Checkpoint | None = None) -> TrainLog:
        """Fine-tune; with ``checkpoints``, call ``on_checkpoint(k, step)`` at each of that many points
        evenly spaced inside the training (``checkpoint_steps``), the model in eval mode meanwhile;
        ``on_step(step, total)`` after every optimizer step (the live view's progress)."""

    def generate(self, prompts: list[Prompt], settings: GenerationSettings) -> list[Generation]: ...


Checkpoint = Callable[[int, int], None]  # (k: the k-th checkpoint, from 1; the training step it follows)


def resolve_path(path: str, base_dir: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base_dir / p).resolve()
