"""A Hugging Face ``TrainerCallback`` that writes recipetune's metrics stream.

Add one callback and a ``Trainer`` script becomes a ``command`` workload::

    from recipetune.integrations.hf import RecipetuneCallback
    trainer = Trainer(..., callbacks=[RecipetuneCallback()])

It writes one JSON line per optimizer step (``step, loss, tokens, step_time_s, lr, grad_norm``) and
one per evaluation (``step, val_loss``) to the path in ``$RECIPETUNE_METRICS`` (or ``path``), on the
main process only. Set ``logging_steps=1`` so every step is logged (HF averages the loss over the
logging interval). A step's time runs from the end of the previous step to the end of this one, so
it includes fetching the batch, as nanoGPT's ``dt`` does; evaluation and checkpointing are not
counted. Tokens come from ``state.num_input_tokens_seen`` when the script enables
``include_num_input_tokens_seen``, else from ``tokens_per_step`` when given, else they are left to
the campaign's ``workload.tokens_per_step``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, TextIO

from transformers import TrainerCallback


class RecipetuneCallback(TrainerCallback):
    def __init__(self, path: str | Path | None = None, tokens_per_step: int | None = None):
        target = path if path is not None else os.environ.get("RECIPETUNE_METRICS")
        self.path = Path(target) if target else None
        self.tokens_per_step = tokens_per_step
        self.file: TextIO | None = None
        self.clock = time.perf_counter()
        self.step_time: dict[int, float] = {}
        self.tokens: dict[int, int] = {}
        self.seen = 0

    def _write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()  # a killed run keeps every finished step

    def on_train_begin(self, args, state, control, **kwargs):
        if self.path is not None and state.is_world_process_zero:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file = self.path.open("w")
        self.seen = state.num_input_tokens_seen or 0
        self.clock = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.step_time[state.global_step] = now - self.clock
        self.clock = now
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
            for key in ("learning_rate", "grad_norm"):
                if logs.get(key) is not None:
                    record["lr" if key == "learning_rate" else key] = float(logs[key])
            self._write(record)
        if "eval_loss" in logs:
            self._write({"step": step, "val_loss": float(logs["eval_loss"])})
        self.clock = time.perf_counter()  # writing the line is not the next step's work

    def on_evaluate(self, args, state, control, **kwargs):
        self.clock = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        self.clock = time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs):
        if self.file is not None:
            self.file.close()
            self.file = None
