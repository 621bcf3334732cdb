"""The reference route: fine-tune a checkpoint of the reference trainer (byte tokenizer).

A short loop rather than transformers' Trainer: wrapping the reference ``Transformer`` as a
``PreTrainedModel`` would need a config class, a forward with HF's signature and a generation
mixin, all for a model that has none of HF's conventions; the loop below is ~80 lines a reader
checks top to bottom. LoRA still comes from ``peft`` (``inject_adapter_in_model`` works on any
``nn.Module``). Completions end with the task's stop string (a byte model has no end token). A
conversation is trained and prompted in its plain rendering (``formats.chat_text``); ``precision:
bf16`` is autocast over fp32 weights, ``gradient_checkpointing`` the reference trainer's own
(trainer/parallel.py), and fp16 is refused (routes.check_precision): it would need loss scaling.

``path: base`` is the stdlib-pretrained model of base_model.py (shipped with the package where it
matches, else built once and cached).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from recipetune.engine.job import checkpoint_steps
from recipetune.finetune.base_model import base_checkpoint
from recipetune.finetune.recipe import ModelSpec, TrainRecipe, lora_modules
from recipetune.finetune.route import Checkpoint, Generation, ModelError, TrainLog, resolve_path
from recipetune.finetune.task import GenerationSettings, TaskConfig
from recipetune.trainer.data import ByteTokenizer
from recipetune.trainer.model import PRESETS, Transformer, get_model_config

IGNORE = -100
GEN_BATCH = 64


def check_reference(spec: ModelSpec, base_dir: Path) -> None:
    if spec.path == "base":
        if spec.preset not in PRESETS:
            raise ModelError("model.preset", f"unknown preset {spec.preset!r}; valid: {', '.join(PRESETS)}")
        return
    path = resolve_path(spec.path, base_dir)
    if not path.is_file():
        raise ModelError("model.path", f"{path} is not a reference-trainer checkpoint file (.pt); "
                                       "use 'base' or a file saved by the reference trainer")
    _load_checkpoint(path)


def _load_checkpoint(path: Path) -> dict:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ModelError("model.path", f"{path} is not a checkpoint torch can read: {str(e)[:200]}") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "recipe" not in ckpt:
        raise ModelError("model.path", f"{path} is not a reference-trainer checkpoint (needs 'model' and 'recipe')")
    return ckpt


class ReferenceRoute:
    name = "reference"

    def __init__(self, spec: ModelSpec, base_dir: Path, recipe: TrainRecipe):
        path = base_checkpoint(spec) if spec.path == "base" else resolve_path(spec.path, base_dir)
        ckpt = _load_checkpoint(path)
        r = ckpt["recipe"]
        # RoPE tables are derived from max_seq_len, not learned: any length works after pretraining
        cfg = dataclasses.replace(get_model_config(r["model"], vocab_size=256), max_seq_len=4096)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model = Transformer(cfg).to(self.device)
        self.model.load_state_dict(ckpt["model"])
        self.checkpoint = str(path)
        self.tok = ByteTokenizer()
        if recipe.method == "lora":
            from peft import LoraConfig, inject_adapter_in_model

            config = LoraConfig(r=recipe.lora_rank, lora_alpha=recipe.lora_alpha, lora_dropout=recipe.lora_dropout,
                                target_modules=lora_modules(recipe.lora_targets, "reference"))
            try:
                self.model = inject_adapter_in_model(config, self.model)
            except ValueError as e:
                raise ModelError("recipe.lora_targets", str(e).splitlines()[0]) from None
            for n, p in self.model.named_parameters():
                p.requires_grad = "lora_" in n

    def params(self) -> dict[str, int]:
        ps = list(self.model.parameters())
        return {"total": sum(p.numel() for p in ps), "trainable": sum(p.numel() for p in ps if p.requires_grad)}

    def prompt(self, task: TaskConfig, row: dict) -> str:
        return task.render(row)

    def encode(self, prompt: str, completion: str, max_len: int, completion_only: bool):
        p = self.tok.encode(prompt).tolist()
        c = self.tok.encode(completion).tolist()  # the experiment appends the task's stop string
        ids = p + c
        labels = ([IGNORE] * len(p) if completion_only else p) + c
        cut = max(0, len(ids) - (max_len + 1))  # cut the prompt on the left: the answer must stay
        return ids[cut:], labels[cut:], cut > 0

    def train(self, pairs: list[tuple[str, str]], recipe: TrainRecipe, out_dir: Path, checkpoints: int = 0,
              on_checkpoint: Checkpoint | None = None, on_step: Checkpoint | None = None) -> TrainLog:
        log = TrainLog()
        seqs = self._sequences(pairs, recipe, log)
        total = recipe.total_steps(math.ceil(len(seqs) / recipe.batch_size))
        warmup = round(recipe.warmup_ratio * total)
        at = checkpoint_steps(total, checkpoints) if on_checkpoint is not None else {}

        torch.manual_seed(recipe.seed)
        self._checkpointing(recipe, "full")
        params, opt = self._optimizer(recipe)
        self.model.train()
        stream = micro_batches(seqs, recipe)
        for step in range(total):
            batch = [self._pad(next(stream)) for _ in range(recipe.grad_accum)]
            n_tok = sum(int((y != IGNORE).sum()) for _, y in batch)
            loss_sum = self._step(batch, n_tok, recipe)
            for g in opt.param_groups:
                g["lr"] = lr_at(recipe, step, warmup, total)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if not math.isfinite(loss_sum):
                raise FloatingPointError(f"non-finite training loss at step {step + 1}")
            log.losses.append((step + 1, loss_sum))
            log.tokens += n_tok
            if on_step is not None:
                on_step(step + 1, total)
            if step + 1 in at:  # greedy generation draws no random numbers: the training goes on unchanged
                self.model.eval()
                on_checkpoint(at[step + 1], step + 1)  # type: ignore[misc]
                self.model.train()
        self._checkpointing(recipe, "none")  # generation keeps no activations anyway
        self.model.eval()
        return log

    def _sequences(self, pairs: list[tuple[str, str]], recipe: TrainRecipe,
                   log: TrainLog) -> list[tuple[list[int], list[int]]]:
        """The training sequences (ids, labels): one per pair, or with ``packing`` one stream cut into full
        windows (no padding, examples may span windows). Truncated examples are counted in ``log``."""
        seqs = []
        for prompt, completion in pairs:
            ids, labels, cut = self.encode(prompt, completion, recipe.max_seq_len, recipe.completion_only)
            seqs.append((ids, labels))
            log.truncated += cut
        if recipe.packing:
            ids = [t for s in seqs for t in s[0]]
            labels = [t for s in seqs for t in s[1]]
            w = recipe.max_seq_len + 1
            seqs = [(ids[i : i + w], labels[i : i + w]) for i in range(0, len(ids) - 1, w)]
        return seqs

    def _checkpointing(self, recipe: TrainRecipe, mode: str) -> None:
        """Activation checkpointing on ("full") for training, off ("none") after, where the recipe asks."""
        if recipe.gradient_checkpointing:
            from recipetune.trainer.parallel import apply_activation_checkpointing

            apply_activation_checkpointing(self.model, mode)

    def _optimizer(self, recipe: TrainRecipe) -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer]:
        """AdamW over the trainable parameters; no weight decay on norms, as in the reference trainer."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": recipe.weight_decay},
                                 {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                lr=recipe.lr, betas=(0.9, 0.999))
        return params, opt

    def _step(self, batch: list[tuple[torch.Tensor, torch.Tensor]], n_tok: int, recipe: TrainRecipe) -> float:
        """Forward and backward over one step's micro-batches; the loss is normalised over the whole step's
        answer tokens (exact accumulation). The step's loss."""
        loss_sum = 0.0
        for x, y in batch:
            with torch.autocast(self.device.type, torch.bfloat16, enabled=recipe.precision == "bf16"):
                logits, _ = self.model(x)
            loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE,
                                   reduction="sum") / max(1, n_tok)
            loss.backward()
            loss_sum += loss.item()
        return loss_sum

    def _pad(self, rows: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
        T = max(len(ids) for ids, _ in rows) - 1
        x = torch.zeros(len(rows), T, dtype=torch.long)
        y = torch.full((len(rows), T), IGNORE, dtype=torch.long)
        for i, (ids, labels) in enumerate(rows):
            x[i, : len(ids) - 1] = torch.tensor(ids[:-1])
            y[i, : len(labels) - 1] = torch.tensor(labels[1:])
        return x.to(self.device), y.to(self.device)

    @torch.no_grad()
    def generate(self, prompts: list[str], settings: GenerationSettings) -> list[Generation]:
        """Greedy decoding; prompts of equal length run as one batch (no padding to get wrong)."""
        self.model.eval()
        stop = self.tok.encode(settings.stop).tolist() if settings.stop else []
        out: list[Generation | None] = [None] * len(prompts)
        by_len: dict[int, list[int]] = {}
        encoded = [self.tok.encode(p).tolist()[-(4096 - settings.max_new_tokens):] for p in prompts]
        for i, ids in enumerate(encoded):
            by_len.setdefault(len(ids), []).append(i)
        for group in by_len.values():
            for k in range(0, len(group), GEN_BATCH):
                idx = group[k : k + GEN_BATCH]
                x = torch.tensor([encoded[i] for i in idx], dtype=torch.long, device=self.device)
                new = torch.empty(len(idx), 0, dtype=torch.long, device=self.device)
                for _ in range(settings.max_new_tokens):
                    logits, _ = self.model(torch.cat([x, new], dim=1))
                    new = torch.cat([new, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
                    if stop and all(_find(row, stop) >= 0 for row in new.tolist()):
                        break
                for i, row in zip(idx, new.tolist(), strict=True):
                    at = _find(row, stop) if stop else -1
                    out[i] = Generation(self.tok.decode(row[:at] if at >= 0 else row), truncated=bool(stop) and at < 0)
        return out  # type: ignore[return-value]


def lr_at(recipe: TrainRecipe, step: int, warmup: int, total: int) -> float:
    """The learning rate at ``step``: linear warm-up, then the recipe's scheduler (linear, cosine or constant)."""
    if step < warmup:
        return recipe.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    if recipe.scheduler == "linear":
        return recipe.lr * (1 - progress)
    if recipe.scheduler == "cosine":
        return recipe.lr * 0.5 * (1 + math.cos(math.pi * progress))
    return recipe.lr


def micro_batches(seqs: list, recipe: TrainRecipe) -> Iterator[list]:
    """An endless stream of micro-batches, reshuffled every epoch by the recipe's seed."""
    epoch = 0
    while True:
        order = list(range(len(seqs)))
        random.Random(recipe.seed * 100_003 + epoch).shuffle(order)
        for i in range(0, len(order), recipe.batch_size):
            yield [seqs[j] for j in order[i : i + recipe.batch_size]]
        epoch += 1


def _find(row: list[int], stop: list[int]) -> int:
    for i in range(len(row) - len(stop) + 1):
        if row[i : i + len(stop)] == stop:
            return i
    return -1
