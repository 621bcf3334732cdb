"""The Hugging Face route: any local causal-LM folder, fine-tuned with TRL's ``SFTTrainer``.

The dataset is in TRL's prompt-completion form, so ``completion_only_loss`` and ``packing`` are
TRL's own; LoRA is ``peft``'s through ``peft_config``. A conversation goes to TRL as messages (its
conversational prompt-completion form), so TRL renders it with the tokenizer's chat template, and
generation renders the same prompt with ``apply_chat_template(add_generation_prompt=True)``. TRL
keeps the start of an over-long sequence, which would cut the answer: prompts are cut on the left
here first, as on the reference route (a conversation's earliest contents first). Nothing is
downloaded (``local_files_only``). Precision and activation checkpointing are the recipe's
(``precision``, ``gradient_checkpointing``): TRL would turn both on, and on a CPU bf16 autocast is
far slower than fp32.

``build_tiny_llama`` makes a small Llama from a config, with a BPE tokenizer trained locally by
``tokenizers`` and a small chat template: what the tests and the benchmark's HF route use.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

from recipetune.engine.job import checkpoint_steps
from recipetune.finetune.formats import Message
from recipetune.finetune.recipe import LORA_PRESETS, ModelSpec, TrainRecipe, lora_modules
from recipetune.finetune.route import (
    Checkpoint,
    Generation,
    ModelError,
    Prompt,
    TrainLog,
    resolve_path,
)
from recipetune.finetune.task import GenerationSettings, TaskConfig
from recipetune.trainer.data import ByteTokenizer

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
GEN_BATCH = 32
# role markers as plain text and the end token after each turn: no new tokens, so a model built with it is
# the same model as one built without (ChatML's layout)
TINY_CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
                      "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def hf_path(spec: ModelSpec, base_dir: Path) -> Path:
    """``tiny``: a tiny Llama (random weights, BPE tokenizer trained on stdlib text), built once and cached."""
    if spec.path != "tiny":
        return resolve_path(spec.path, base_dir)
    from recipetune.core.measure import cache_dir
    from recipetune.trainer.data import load_corpus

    folder = cache_dir() / "base" / "hf-tiny-llama-v2"  # v2: with TINY_CHAT_TEMPLATE
    if not (folder / "config.json").is_file():
        text = ByteTokenizer().decode(load_corpus("stdlib").train[:2_000_000])
        tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
        build_tiny_llama(tmp, text.splitlines(), vocab_size=2048, hidden=128, layers=4)
        if folder.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # another process built it first
        else:
            os.replace(tmp, folder)
    return folder


def check_hf(spec: ModelSpec, base_dir: Path) -> None:
    if spec.path == "tiny":
        return
    path = resolve_path(spec.path, base_dir)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise ModelError("model.path", f"{path} is not a Hugging Face model folder (needs config.json, "
                                       "weights and a tokenizer; save one with save_pretrained)")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ModelError("model.path", f"{path} holds no weights (one of {', '.join(WEIGHT_FILES)})")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise ModelError("model.path", f"{path} holds no tokenizer (tokenizer.json)")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception as e:
        raise ModelError("model.path", f"{path}: config.json is not a transformers config: {str(e)[:200]}") from None


class HFRoute:
    name = "hf"

    def __init__(self, spec: ModelSpec, base_dir: Path, recipe: TrainRecipe):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.path = hf_path(spec, base_dir)
        self.checkpoint = str(self.path)
        self.tok = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        torch.manual_seed(recipe.seed)
        self.model = AutoModelForCausalLM.from_pretrained(self.path, local_files_only=True, dtype=torch.float32)
        self.peft_config = None
        if recipe.method == "lora":
            from peft import LoraConfig

            model_type = self.model.config.model_type
            try:
                targets = lora_modules(recipe.lora_targets, model_type)
            except ValueError as e:
                raise ModelError("recipe.lora_targets", str(e)) from None
            names = [n for n, _ in self.model.named_modules()]
            # peft matches a target against a module's whole name or its dotted tail (attn.c_proj)
            missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)] \
                if isinstance(targets, list) else []
            if missing:
                linear = sorted({n.rsplit(".", 1)[-1] for n, m in self.model.named_modules()
                                 if isinstance(m, torch.nn.Linear)} - {"lm_head"})
                raise ModelError("recipe.lora_targets", f"no module named {', '.join(missing)} in {self.path} "
                                                        f"({model_type}); its linear layers: {', '.join(linear)}; "
                                                        f"or a preset: {', '.join(LORA_PRESETS)}")
            self.peft_config = LoraConfig(r=recipe.lora_rank, lora_alpha=recipe.lora_alpha,
                                          lora_dropout=recipe.lora_dropout, target_modules=targets,
                                          task_type="CAUSAL_LM")

    def params(self) -> dict[str, int]:
        ps = list(self.model.parameters())
        trainable = sum(p.numel() for p in ps if p.requires_grad)
        if self.peft_config is not None and not any("lora_" in n for n, _ in self.model.named_parameters()):
            trainable = -1  # not wrapped yet: known after training
        return {"total": sum(p.numel() for p in ps), "trainable": trainable}

    def prompt(self, task: TaskConfig, row: dict) -> Prompt:
        """A conversation's messages (the chat template renders them), else the task's plain text."""
        messages = task.messages(row)
        if messages is None:
            return task.render(row)
        if not self.tok.chat_template:  # check_fit refuses this before anything runs; a last guard
            raise ModelError("model.path", f"the tokenizer of {self.path} has no chat template, which conversations "
                                           "(task.format: chat) need on the hf route")
        return messages

    def _chat_text(self, messages: list[Message], answer: str | None = None) -> str:
        if answer is None:
            return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tok.apply_chat_template([*messages, {"role": "assistant", "content": answer}], tokenize=False)

    def _n_tokens(self, text: str, special: bool = True) -> int:
        return len(self.tok(text, add_special_tokens=special)["input_ids"])

    def _cut_messages(self, messages: list[Message], completion: str, max_len: int) -> tuple[list[Message], bool]:
        """The conversation cut to fit with its answer: the earliest contents go first, as a text prompt is
        cut on the left."""
        out, cut = [dict(m) for m in messages], False
        while (excess := self._n_tokens(self._chat_text(out, completion), special=False) - max_len) > 0:
            first = next((m for m in out if m["content"]), None)
            if first is None:
                break  # the template and the answer alone are too long: TRL cuts the rest
            ids = self.tok(first["content"], add_special_tokens=False)["input_ids"]
            first["content"], cut = self.tok.decode(ids[min(len(ids), excess):]), True
        return out, cut

    def _cut_prompt(self, prompt: str, completion: str, max_len: int) -> tuple[str, bool]:
        room = max_len - len(self.tok(completion, add_special_tokens=False)["input_ids"]) - 2  # bos/eos
        ids = self.tok(prompt, add_special_tokens=False)["input_ids"]
        if len(ids) <= room:
            return prompt, False
        return self.tok.decode(ids[len(ids) - max(1, room):]), True

    def train(self, pairs: list[tuple[Prompt, str]], recipe: TrainRecipe, out_dir: Path, checkpoints: int = 0,
              on_checkpoint: Checkpoint | None = None, on_step: Checkpoint | None = None) -> TrainLog:
        import datasets
        from trl import SFTTrainer

        log = TrainLog()
        rows: list[dict] = []
        for prompt, completion in pairs:
            if isinstance(prompt, list):  # TRL's conversational form: TRL applies the chat template
                messages, cut = self._cut_messages(prompt, completion, recipe.max_seq_len)
                rows.append({"prompt": messages, "completion": [{"role": "assistant", "content": completion}]})
            else:
                # BPE merges a prompt's trailing space into the answer's first token ("Ġos"), and TRL then
                # drops it from the prompt: move it into the completion so training matches generation
                stripped = prompt.rstrip()
                prompt, completion = stripped, prompt[len(stripped):] + completion
                prompt, cut = self._cut_prompt(prompt, completion, recipe.max_seq_len)
                rows.append({"prompt": prompt, "completion": completion})
            log.truncated += cut
        datasets.disable_progress_bars()
        trainer = SFTTrainer(model=self.model, args=sft_args(recipe, out_dir),
                             train_dataset=datasets.Dataset.from_list(rows), processing_class=self.tok,
                             peft_config=self.peft_config)
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)  # the loss goes to the report, not to the console
        if (on_checkpoint is not None and checkpoints) or on_step is not None:
            trainer.add_callback(_checkpoints(self, checkpoints if on_checkpoint else 0, on_checkpoint, on_step))
        trainer.train()
        self.model = trainer.model
        for entry in trainer.state.log_history:
            if "loss" in entry and "step" in entry:
                if not torch.isfinite(torch.tensor(float(entry["loss"]))):
                    raise FloatingPointError(f"non-finite training loss at step {entry['step']}")
                log.losses.append((int(entry["step"]), float(entry["loss"])))
        log.tokens = int(trainer.state.num_input_tokens_seen or 0)
        self.model.eval()
        return log

    @torch.no_grad()
    def generate(self, prompts: list[Prompt], settings: GenerationSettings) -> list[Generation]:
        """Greedy decoding, left-padded batches; the answer ends at an end token or the stop string."""
        self.model.eval()
        self.tok.padding_side = "left"
        device = next(self.model.parameters()).device
        # the end of an answer: the tokenizer's end token, and the model's own (a chat model's end of turn)
        eos = self.model.generation_config.eos_token_id
        eos_ids = sorted({self.tok.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None})
        out: list[Generation] = []
        for i in range(0, len(prompts), GEN_BATCH):
            chunk = prompts[i : i + GEN_BATCH]
            if isinstance(chunk[0], list):  # a conversation: its template carries the special tokens it needs
                texts, moved = [self._chat_text(p) for p in chunk], [""] * len(chunk)  # type: ignore[arg-type]
                batch = self.tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            else:  # the prompt's trailing whitespace was trained as the answer's start (see train)
                texts = [p.rstrip() for p in chunk]  # type: ignore[union-attr]
                moved = [p[len(t):] for p, t in zip(chunk, texts, strict=True)]  # type: ignore[arg-type]
                batch = self.tok(texts, return_tensors="pt", padding=True)
            batch = batch.to(device)
            ids = self.model.generate(**batch, max_new_tokens=settings.max_new_tokens, do_sample=False,
                                      pad_token_id=self.tok.pad_token_id, eos_token_id=eos_ids)
            for row, lead in zip(ids[:, batch["input_ids"].shape[1]:].tolist(), moved, strict=True):
                ended = any(e in row for e in eos_ids)
                text = self.tok.decode(row, skip_special_tokens=True)
                # the whitespace moved out of the prompt is not the answer: with a prompt ending in "\n" and
                # the stop "\n", the answer would otherwise end before it starts
                text = text[len(lead):] if lead and text.startswith(lead) else text
                stopped = bool(settings.stop) and settings.stop in text
                if stopped:
                    text = text[: text.index(settings.stop)]
                out.append(Generation(text, truncated=not (ended or stopped)))
        return out


def sft_args(recipe: TrainRecipe, out_dir: Path):
    """TRL's config from the recipe; every default TRL would choose for us is set here."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(out_dir / "hf"), learning_rate=recipe.lr, num_train_epochs=recipe.epochs,
        max_steps=recipe.max_steps or -1, per_device_train_batch_size=recipe.batch_size,
        gradient_accumulation_steps=recipe.grad_accum, warmup_steps=recipe.warmup_ratio,
        lr_scheduler_type=recipe.scheduler, weight_decay=recipe.weight_decay, max_length=recipe.max_seq_len,
        packing=recipe.packing, packing_strategy="wrapped" if recipe.packing else "bfd",
        completion_only_loss=recipe.completion_only, seed=recipe.seed, data_seed=recipe.seed,
        logging_steps=1, report_to="none", save_strategy="no", use_cpu=not torch.cuda.is_available(),
        bf16=recipe.precision == "bf16", fp16=recipe.precision == "fp16",  # autocast over fp32 weights
        activation_checkpointing=recipe.gradient_checkpointing,  # transformers' name; TRL's alias defaults to on
        dataloader_pin_memory=False, disable_tqdm=True, max_grad_norm=1.0,
    )


def build_tiny_llama(folder: Path, texts: list[str], vocab_size: int = 512, hidden: int = 64, layers: int = 2,
                     seed: int = 0, chat_template: str | None = TINY_CHAT_TEMPLATE) -> Path:
    """A small Llama (random weights) with a byte-level BPE tokenizer trained on ``texts`` and (unless None)
    a chat template; saved."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|pad|>", "<|bos|>", "<|eos|>"]
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|pad|>", bos_token="<|bos|>",
                                   eos_token="<|eos|>")
    fast.chat_template = chat_template
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=hidden, intermediate_size=hidden * 4 // 1, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        pad_token_id=fast.pad_token_id, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
    )
    folder.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def _checkpoints(route: HFRoute, n: int, on_checkpoint: Checkpoint | None, on_step: Checkpoint | None) -> Any:
    """A TrainerCallback calling ``on_checkpoint`` at the run's checkpoints (engine/job.py: checkpoint_steps of
    the trainer's max_steps), generating with the model being trained (the PEFT-wrapped one), and
    ``on_step`` after every step."""
    from transformers import TrainerCallback

    class Checkpoints(TrainerCallback):
        at: dict[int, int] = {}

        def on_train_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            self.at = checkpoint_steps(state.max_steps, n)

        def on_step_end(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
            if on_step is not None:
                on_step(state.global_step, state.max_steps)
            k = self.at.get(state.global_step)
            if k is None or model is None or on_checkpoint is None:
                return
            trained, route.model = route.model, model
            try:
                on_checkpoint(k, state.global_step)
            finally:
                route.model = trained
                model.train()

    return Checkpoints()
