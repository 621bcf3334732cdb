"""The two routes (route.py), picked by the model's kind, and what is refused before anything runs.

``check_model`` refuses a base model that is not one; ``check_fit`` what a route or this machine
cannot honour: a precision, a LoRA preset unknown for the architecture, a conversation for a
tokenizer without a chat template. ``load_route`` builds the route.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from recipetune.finetune.recipe import ModelSpec, TrainRecipe, lora_modules
from recipetune.finetune.route import ModelError, Route, resolve_path


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
