"""What an experiment needs from a base model, whichever library runs it.

A route loads a base model, fine-tunes it on (prompt, completion) pairs with a ``TrainRecipe`` and
generates answers greedily. Two exist: ``reference`` (the reference trainer's model, byte tokenizer,
a short loop in reference.py) and ``hf`` (transformers + TRL's SFTTrainer + peft, in hf.py). A
route says what its prompt is (``Route.prompt``): the task's plain text, or on the HF route a
conversation's messages, which the tokenizer's chat template renders.

``check_fit`` refuses, before anything runs, what a route or this machine cannot honour: a precision,
a LoRA preset unknown for the architecture, a conversation for a tokenizer without a chat template.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from recipetune.finetune.formats import Message
from recipetune.finetune.recipe import ModelSpec, TrainRecipe, lora_modules
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

    def train(self, pairs: list[tuple[Prompt, str]], recipe: TrainRecipe, out_dir: Path) -> TrainLog: ...

    def generate(self, prompts: list[Prompt], settings: GenerationSettings) -> list[Generation]: ...


def check_model(spec: ModelSpec, base_dir: Path) -> None:
    """Refuse a base model that is not one before anything is written (raises ModelError)."""
    if spec.kind == "reference":
        from recipetune.finetune.reference import check_reference

        check_reference(spec, base_dir)
    else:
        from recipetune.finetune.hf import check_hf

        check_hf(spec, base_dir)


def check_fit(model: ModelSpec, recipe: TrainRecipe, conversational: bool, base_dir: Path) -> None:
    """Refuse a recipe the route or this machine cannot honour (raises ModelError naming the field)."""
    check_precision(model.kind, recipe.precision)
    model_type = "reference" if model.kind == "reference" else hf_model_type(model, base_dir)
    if recipe.method == "lora" and model_type is not None:
        try:
            lora_modules(recipe.lora_targets, model_type)
        except ValueError as e:
            raise ModelError("recipe.lora_targets", str(e)) from None
    if conversational and model.kind == "hf" and model.path != "tiny":  # tiny is built with one
        path = resolve_path(model.path, base_dir)
        if (path / "config.json").is_file() and not has_chat_template(str(path)):
            raise ModelError("model.path", f"the rows are conversations (task.format: chat, or conversational "
                                           f"prompt/completion rows), which the hf route renders with the tokenizer's "
                                           f"chat template, and {path} has none (chat_template in "
                                           "tokenizer_config.json, or chat_template.jinja); give the tokenizer one, "
                                           "or use the reference route (plain rendering)")


def check_precision(route: str, precision: str) -> None:
    if precision == "fp32":
        return
    import torch

    if route == "reference" and precision == "fp16":
        raise ModelError("recipe.precision", "the reference route trains in fp32 or bf16 (autocast); fp16 would "
                                             "need loss scaling, which its loop does not do")
    cuda = torch.cuda.is_available()
    if precision == "fp16" and not cuda:
        raise ModelError("recipe.precision", "fp16 needs a CUDA GPU and none is visible; use fp32, or bf16 "
                                             "(on a CPU, bf16 is correct but much slower than fp32)")
    if precision == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        raise ModelError("recipe.precision", f"{torch.cuda.get_device_name()} has no bf16; use fp16 or fp32")


def hf_model_type(model: ModelSpec, base_dir: Path) -> str | None:
    """``config.model_type`` of an HF model folder, read without transformers; None when it has no config."""
    if model.path == "tiny":
        return "llama"
    try:
        return json.loads((resolve_path(model.path, base_dir) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None  # check_model says what is wrong with the folder


@functools.cache
def has_chat_template(path: str) -> bool:
    folder = Path(path)
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def load_route(spec: ModelSpec, base_dir: Path, recipe: TrainRecipe) -> Route:
    if spec.kind == "reference":
        from recipetune.finetune.reference import ReferenceRoute

        return ReferenceRoute(spec, base_dir, recipe)
    from recipetune.finetune.hf import HFRoute

    return HFRoute(spec, base_dir, recipe)


def resolve_path(path: str, base_dir: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base_dir / p).resolve()
