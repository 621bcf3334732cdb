"""A Hugging Face ``TrainerCallback`` that writes recipetune's metrics stream.

Add one callback and a ``Trainer`` script becomes a ``command`` workload::

    from recipetune.integrations.hf import RecipetuneCallback
    trainer = Trainer(..., callbacks=[RecipetuneCallback()])

It writes one JSON line per optimizer step (``step, loss, tokens, step_time_s, lr, grad_norm,
batch_fp``) and
one per evaluation (``step, val_loss``) to the path in ``$RECIPETUNE_METRICS`` (or ``path``), on the
main process only. Set ``logging_steps=1`` so every step is logged (HF averages the loss over the
logging interval). A step's time runs from the end of the previous step to the end of this one, so
it includes fetching the batch, as nanoGPT's ``dt`` does; evaluation and checkpointing are not
counted. Tokens come from ``state.num_input_tokens_seen`` when the script enables
``include_num_input_tokens_seen``, else from ``tokens_per_step`` when given, else they are left to
the campaign's ``workload.tokens_per_step``. ``batch_fp`` is a hash of the sorted sample indices
the step drew from the Trainer's sampler, so another micro-batch split of the same global batch
shows the guard that it replayed the baseline's batches (one process, a fresh run, a map-style
dataset; otherwise no ``batch_fp`` and the campaign declares ``guard.parity.data_order``).

What such a script's stored runs depend on is the command workload's fingerprint
(workloads/fingerprint.py): the script's folder, and the versions installed in the interpreter it
runs with, transformers, accelerate and torch among them. After an upgrade the guard trains again,
and says which version moved.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from transformers import TrainerCallback


class _Drawn:
    """Stands in for the Trainer's sampler: yields what it yields and keeps the indices, in the
    order the data loader draws them, for the epoch being drawn."""

    def __init__(self, sampler: Any):
        self.sampler, self.indices = sampler, []  # type: ignore[var-annotated]

    def __iter__(self) -> Iterator[Any]:
        self.indices = []
        for i in self.sampler:
            self.indices.append(int(i))
            yield i

    def __len__(self) -> int:
        return len(self.sampler)

    def __getattr__(self, name: str) -> Any:  # set_epoch, generator, ...: the sampler's own
        return getattr(self.__dict__["sampler"], name)


def _draw_recorder(dataloader: Any) -> _Drawn | None:
    """Put a ``_Drawn`` between the training data loader's batch sampler and its index sampler (a
    plain BatchSampler, or one inside accelerate's BatchSamplerShard); None where there is none (an
    iterable dataset, a batch sampler of the script's own)."""
    holder = getattr(dataloader, "batch_sampler", None)
    holder = getattr(holder, "batch_sampler", holder)  # accelerate's BatchSamplerShard wraps one
    if holder is None or not hasattr(holder, "sampler") or not hasattr(holder.sampler, "__len__"):
        return None
    if not isinstance(holder.sampler, _Drawn):
        holder.sampler = _Drawn(holder.sampler)
    return holder.sampler


class RecipetuneCallback(TrainerCallback):
    def __init__(self, path: str | Path | None = None, tokens_per_step: int | None = None):
        target = path if path is not None else os.environ.get("RECIPETUNE_METRICS")
        self.path = Path(target) if target else None
        self.tokens_per_step = tokens_per_step
        self.file: TextIO | None = None
        self.clock = time.perf_counter()
        self.step_time: dict[int, float] = {}
        self.tokens: dict[int, int] = {}
        self.batch_fp: dict[int, str] = {}
        self.seen = 0
        self.drawn: _Drawn | None = None  # the sampler's indices, where batch_fp can be told
        self.used = 0  # indices of this epoch's draw the logged steps consumed
        self.global_batch = 0

    def _write(self, record: dict[str, Any], state: Any) -> None:
        if self.path is None or not state.is_world_process_zero:
            return
        if self.file is None:  # an evaluation after training (``--do_eval``) appends its line
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = self.path.open("a")
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()  # a killed run keeps every finished step

    def on_train_begin(self, args, state, control, **kwargs):
        if self.path is not None and state.is_world_process_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = self.path.open("w")  # a fresh stream per run
        self.seen = state.num_input_tokens_seen or 0
        # One process, a fresh run: step s consumes the next train_batch_size x accumulation indices
        # of the epoch's draw, whatever the split. (Several processes shard the draw, and a resumed
        # run skips part of it without steps: no fingerprint then.)
        if args.world_size == 1 and not state.global_step:
            self.drawn = _draw_recorder(kwargs.get("train_dataloader"))
            self.global_batch = args.train_batch_size * args.gradient_accumulation_steps
        self.clock = time.perf_counter()

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.used = 0

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.step_time[state.global_step] = now - self.clock
        self.clock = now
        if self.drawn is not None:
            batch = sorted(self.drawn.indices[self.used:self.used + self.global_batch])
            self.used += self.global_batch
            if batch:  # the same samples in any order and any micro-batch split: the same global batch
                self.batch_fp[state.global_step] = hashlib.blake2b(json.dumps(batch).encode(),
                                                                   digest_size=8).hexdigest()
        seen = state.num_input_tokens_seen or 0
        if seen > self.seen:
            self.tokens[state.global_step] = seen - self.seen
        self.seen = seen

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs, step = logs or {}, state.global_step
        if "loss" in logs and step in self.step_time:
            record = {"step": step, "loss": float(logs["loss"]), "step_time_s": self.step_time.pop(step)}
            tokens = self.tokens.pop(step, self.tokens_per_step)
            if tokens is not None:
                record["tokens"] = int(tokens)
            if step in self.batch_fp:
                record["batch_fp"] = self.batch_fp.pop(step)
            for key in ("learning_rate", "grad_norm"):
                if logs.get(key) is not None:
                    record["lr" if key == "learning_rate" else key] = float(logs[key])
            self._write(record, state)
        if "eval_loss" in logs:
            self._write({"step": step, "val_loss": float(logs["eval_loss"])}, state)
        self.clock = time.perf_counter()  # writing the line is not the next step's work

    def on_evaluate(self, args, state, control, **kwargs):
        self.clock = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        self.clock = time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs):
        if self.file is not None:
            self.file.close()
            self.file = None
