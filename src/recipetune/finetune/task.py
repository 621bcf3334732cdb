"""A fine-tuning task: three local files, the shape of their rows, the answer and a metric.

Shapes (``task.format``):
- ``template`` (the default): ``prompt`` is a template over the row's columns, ``target`` the answer column;
- ``instruction``: Alpaca-style ``instruction``, optional ``input`` and ``output`` (the answer) columns,
  rendered as ``INSTRUCTION`` (``INSTRUCTION_NO_INPUT`` when the input is empty);
- ``chat``: a ``messages`` column of ``{role, content}`` (system, user, assistant); the answer is the
  final assistant message, the prompt every message before it (plain text: ``formats.chat_text``;
  the HF route renders it with the tokenizer's own chat template instead);
- ``completion``: TRL's ``prompt`` and ``completion`` columns, as strings or as lists of messages.

Every row is checked when its file is read: a missing or empty answer, a missing prompt column or a
malformed conversation is an error naming the file, the line and the field, unless
``incomplete_rows: drop`` drops such rows (counted in ``Splits.dropped``).

The test split is closed. ``Splits`` hands out ``train`` and ``validation``; ``splits.test`` raises,
and only ``finetune.final.final_evaluation`` opens it (through ``open_test`` with the key that
module holds). Decontamination still has to compare the training data with the test text: it gets a
``ContaminationIndex`` built here, which answers "does this text overlap validation or test?" and
never hands out test text or test metrics.
"""

from __future__ import annotations

import string
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from recipetune.data.decontam import ContaminationIndex
from recipetune.data.files import file_fingerprint, read_rows, row_position, split_path
from recipetune.data.text import normalize, template_fields
from recipetune.finetune.formats import (
    Message,
    RowProblem,
    TaskError,
    answer_of,
    as_messages,
    before_answer,
    chat_text,
    parse_messages,
)

SplitName = Literal["train", "validation", "test"]
MetricName = Literal["exact_match", "accuracy", "macro_f1", "rouge_l", "numeric", "exec_output"]
TaskFormat = Literal["template", "instruction", "chat", "completion"]
DEFAULT_TARGET = {"instruction": "output", "chat": "messages", "completion": "completion"}
# Alpaca's layout without its preamble sentence, which would cost every row ~30 tokens of a short sequence
INSTRUCTION = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
INSTRUCTION_NO_INPUT = "### Instruction:\n{instruction}\n\n### Response:\n"
BUILTINS = ("arith", "stdlib-module", "funcname", "argcount", "default-value", "product", "exception",
            "chat-rename", "chat-recall", "exec-expr")


class TestSplitClosed(PermissionError):
    """Raised whenever anything but the final evaluation asks for the test split."""

    __test__ = False  # not a pytest test class, despite the name


class GenerationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(16, ge=1, le=4096, description="tokens generated per answer")
    stop: str = Field("\n", description="the answer ends at this string (and at the model's end token)")


class TaskConfig(BaseModel):
    """A few lines of YAML naming a user's files and fields; or ``builtin`` for a benchmark task."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("task", min_length=1)
    builtin: Literal["arith", "stdlib-module", "funcname", "argcount", "default-value", "product",
                     "exception", "chat-rename", "chat-recall", "exec-expr"] | None = Field(
        None, description="a benchmark task generated on this machine (finetune/bench_tasks.py)")
    files: dict[SplitName, str] = Field(default_factory=dict, description="split -> .jsonl/.csv/.parquet path, "
                                        "or a datasets save_to_disk folder")
    format: TaskFormat = Field("template", description="the rows' shape: template | instruction | chat | completion")
    prompt: str | None = Field(None, min_length=1, description="format template: a template over the row's "
                               "fields, e.g. 'Q: {question}\\nA: '")
    target: str | None = Field(None, min_length=1, description="the column holding the answer (chat: the "
                               "messages); default output / messages / completion for those formats")
    incomplete_rows: Literal["error", "drop"] = Field(
        "error", description="a row without an answer or a prompt column: an error, or dropped and counted")
    metric: MetricName = "exact_match"
    metrics: list[MetricName] = Field(default_factory=list, description="also reported, not optimised")
    answer_pattern: str | None = Field(None, description="regex a well-formed answer matches (error kind)")
    labels: list[str] | None = Field(None, description="classification: the allowed answers (default: seen)")
    # the numeric metric's tolerance (finetune/metrics.py):
    # an answer is right when |answer - target| <= max(rel_tol * |target|, abs_tol)
    rel_tol: float = Field(0.0, ge=0, description="metric numeric: tolerance relative to the target")
    abs_tol: float = Field(0.0, ge=0, description="metric numeric: absolute tolerance")
    generation: GenerationSettings = GenerationSettings()
    max_eval_examples: int = Field(200, ge=1, description="validation examples scored per experiment")

    @field_validator("prompt")
    @classmethod
    def _plain_fields(cls, v: str | None) -> str | None:
        for _, name, spec, conv in string.Formatter().parse(v or ""):
            if name is not None and (not name.isidentifier() or spec or conv):
                raise ValueError(f"template field {{{name}}} must be a plain field name (no attributes, "
                                 "indexes, conversions or format specs)")
        return v

    @model_validator(mode="after")
    def _source(self) -> TaskConfig:
        if self.builtin is None and set(self.files) != {"train", "validation", "test"}:
            missing = sorted({"train", "validation", "test"} - set(self.files))
            raise ValueError(f"files needs train, validation and test (missing: {', '.join(missing)}), "
                             "or set builtin to one of " + ", ".join(BUILTINS))
        if self.format == "template":
            if self.prompt is None or self.target is None:
                raise ValueError("format template needs prompt (a template over the row's fields) and target "
                                 "(the answer's field); or set format to instruction, chat or completion")
        elif self.prompt is not None:
            raise ValueError(f"prompt: format {self.format} renders its own prompt (docs/finetune.md, Data "
                             "formats); a template of your own is format: template")
        else:
            self.target = self.target or DEFAULT_TARGET[self.format]
        return self

    # -- what a row says, whatever its shape ------------------------------------------------------

    def fields(self) -> list[str]:
        """The columns the prompt reads."""
        if self.format == "instruction":
            return ["instruction", "input"]
        if self.format == "chat":
            return [self.target or "messages"]
        if self.format == "completion":
            return ["prompt"]
        return list(template_fields(self.prompt or ""))

    def required_columns(self) -> list[str]:
        """The columns every file must have (an instruction's input may be absent)."""
        return list(dict.fromkeys([c for c in self.fields() if c != "input" or self.format != "instruction"]
                                  + [str(self.target)]))

    def conversation(self, row: dict) -> list[Message] | None:
        """A chat row's messages (or a conversational prompt/completion row's, prompt then completion), the
        answer last; None for a row of text. RowProblem when they are malformed."""
        if self.format == "chat":
            return parse_messages(row.get(str(self.target)), str(self.target))
        prompt = as_messages(row.get("prompt")) if self.format == "completion" else None
        if prompt is None:
            return None
        completion = row.get(str(self.target))
        if isinstance(completion, str) and as_messages(completion) is None:  # a text answer to a conversation
            completion = [{"role": "assistant", "content": completion}]
        return parse_messages(prompt, "prompt") + parse_messages(completion, str(self.target))

    def messages(self, row: dict) -> list[Message] | None:
        """The messages before the answer (what the HF route's chat template renders); None for a row of text."""
        conversation = self.conversation(row)
        return None if conversation is None else before_answer(conversation)

    def render(self, row: dict) -> str:
        """The prompt as plain text: everything but the HF route's generation and training uses it."""
        messages = self.messages(row)
        if messages is not None:
            return chat_text(messages)
        if self.format == "instruction":
            has_input = str(row.get("input") or "").strip()
            return (INSTRUCTION if has_input else INSTRUCTION_NO_INPUT).format(
                instruction=row.get("instruction") or "", input=row.get("input") or "")
        if self.format == "completion":
            return str(row.get("prompt") or "")
        return str(self.prompt).format(**{k: "" if row.get(k) is None else row[k] for k in self.fields()})

    def input_parts(self, row: dict) -> list[str]:
        """What varies between rows: the values the prompt reads, without the template's fixed text (for
        a conversation, the contents of the messages before the answer, the system prompt included).
        Decontamination compares these, so a template (or an instruction) every row shares is no
        evidence of a copy."""
        messages = self.messages(row)
        if messages is not None:
            return [m["content"] for m in messages]
        return ["" if row.get(k) is None else str(row[k]) for k in self.fields()]

    def answer(self, row: dict) -> str:
        conversation = self.conversation(row)
        if conversation is not None:
            return conversation[-1]["content"].strip() if conversation[-1]["role"] == "assistant" else ""
        value = row.get(str(self.target))
        return "" if value is None else str(value).strip()

    def problem(self, row: dict) -> RowProblem | None:
        """Why a row cannot be trained or scored on, or None."""
        try:
            conversation = self.conversation(row)
            if conversation is not None:
                answer_of(conversation)
                return None
        except RowProblem as e:
            return e
        for name in self.fields():
            value = row.get(name)
            if name == "input" and self.format == "instruction":
                continue  # an instruction without an input is the common case
            if value is None or (self.format != "template" and not str(value).strip()):
                field = "task.prompt" if self.format == "template" else "task.format"
                return RowProblem("missing prompt field", field,
                                  f"the prompt's column '{name}' is {'missing' if value is None else 'empty'}")
        value = row.get(str(self.target))
        if value is None:
            return RowProblem("missing target", "task.target", f"the target column '{self.target}' is missing")
        if not str(value).strip():
            return RowProblem("empty target", "task.target", f"the target column '{self.target}' is empty")
        return None


def iter_rows(ds: Any, batch_size: int = 4096):
    """A dataset's rows as dicts, read a batch at a time (per-row indexing of Arrow costs ~20x more)."""
    for batch in ds.iter(batch_size=batch_size):
        columns = list(batch)
        for values in zip(*(batch[c] for c in columns), strict=True):
            yield dict(zip(columns, values, strict=True))


TEST_KEY = object()  # held by finetune/final.py, the one place that opens the test split


class Splits:
    """Train and validation open; test closed (see the module docstring)."""

    def __init__(self, task: TaskConfig, paths: dict[str, Path]):
        self.task = task
        self.paths = {s: split_path(p, s, f"task.files.{s}") for s, p in paths.items()}
        self.dropped: dict[str, dict[str, int]] = {}  # split -> reason -> rows dropped (incomplete_rows: drop)
        self._kept: dict[str, list[int]] = {}  # split -> the file's row indices kept, where some were dropped
        self.train = self._load("train")
        self.validation = self._load("validation")
        self._test = None
        self.fingerprints = {s: file_fingerprint(p) for s, p in self.paths.items()}  # hashes reveal nothing
        self._check_overlap()

    @property
    def conversational(self) -> bool:
        """Rows are conversations (chat, or TRL's conversational prompt/completion): the HF route needs a
        chat template."""
        return self.task.conversation(self.train[0]) is not None

    def _load(self, split: str):
        path = self.paths[split]
        ds = read_rows(path, f"task.files.{split}")
        for name in self.task.required_columns():
            if name not in ds.column_names:
                where = "task.target" if name == self.task.target else (
                    "task.prompt" if self.task.format == "template" else "task.format")
                raise TaskError(where, f"field '{name}' is not in {path} (columns: {', '.join(ds.column_names)})")
        return self._checked(split, ds)

    def _checked(self, split: str, ds: Any):
        """The rows the task can use: an unusable one is an error naming its line, or dropped and counted."""
        keep, dropped = [], Counter()
        for i, row in enumerate(iter_rows(ds)):
            problem = self.task.problem(row)
            if problem is None:
                keep.append(i)
            elif self.task.incomplete_rows == "error":
                raise TaskError(problem.field, f"{row_position(self.paths[split], i)}: {problem}; fix the row, or "
                                               "set task.incomplete_rows: drop to drop such rows (and count them)")
            else:
                dropped[problem.reason] += 1
        if not dropped:
            return ds
        self.dropped[split] = dict(dropped)
        self._kept[split] = keep
        if not keep:
            raise TaskError("task.incomplete_rows", f"{self.paths[split]}: every row was dropped ({dict(dropped)})")
        return ds.select(keep)

    def _check_overlap(self) -> None:
        same = [(a, b) for a in self.paths for b in self.paths
                if a < b and self.paths[a].resolve() == self.paths[b].resolve()]
        if same:
            a, b = same[0]
            raise TaskError(f"task.files.{b}", f"{a} and {b} are the same file {self.paths[a]}")
        # validation and test must not share an input: the search would be tuned on test examples.
        # (train overlaps are removed by decontamination instead, and reported.)
        test_rows: dict[str, int] = {}
        for i, row in enumerate(self._read_test()):
            test_rows.setdefault(normalize(self.task.render(row)), i)
        both = [(i, test_rows[key]) for i, row in enumerate(self.validation)
                if (key := normalize(self.task.render(row))) in test_rows]
        if both:
            i, j = both[0]
            raise TaskError("task.files.validation", f"{self.position('validation', i)} has the same prompt as "
                            f"{self.position('test', j)} (case and whitespace ignored; {len(both)} of "
                            f"{len(self.validation)} validation rows are in the test file): validation and test "
                            "splits overlap; remove each such row from one of the two files")

    def position(self, split: str, index: int) -> str:
        """Where row ``index`` of a split (after any rows dropped at load) is in its file: the 1-based
        line of a JSONL or CSV file, else the row index."""
        kept = self._kept.get(split)
        return row_position(self.paths[split], kept[index] if kept else index)

    def _read_test(self):
        return self._load("test")

    @property
    def test(self):
        raise TestSplitClosed("the test split is closed: only the final evaluation "
                              "(recipetune.finetune.final.final_evaluation) opens it")

    def open_test(self, key: object):
        if key is not TEST_KEY:
            raise TestSplitClosed("the test split opens only through recipetune.finetune.final.final_evaluation")
        if self._test is None:
            self._test = self._read_test()
        return self._test

    def contamination_index(self, settings) -> ContaminationIndex:
        """An index of validation and test inputs (their ``input_parts``) that answers overlap queries
        without showing test text; ``settings`` is the ``decontaminate`` step's config."""
        parts = self.task.input_parts
        return ContaminationIndex({"validation": [parts(r) for r in self.validation],
                                   "test": [parts(r) for r in self._read_test()]}, settings)


def resolve_files(task: TaskConfig, base_dir: Path, cache_dir: Path | None = None) -> dict[str, Path]:
    """Split -> file: the task's own files (relative to the experiment file) or a generated builtin."""
    if task.builtin is not None:
        from recipetune.finetune.bench_tasks import builtin_files

        return builtin_files(task.builtin, cache_dir)
    out = {}
    for split, p in task.files.items():
        path = Path(p).expanduser()
        out[split] = path if path.is_absolute() else (base_dir / path).resolve()
    return out


def load_splits(task: TaskConfig, base_dir: Path, cache_dir: Path | None = None) -> Splits:
    return Splits(task, resolve_files(task, base_dir, cache_dir))
