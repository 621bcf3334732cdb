"""A fine-tuning task: three local files, a prompt template, a target field and a metric.

The test split is closed. ``Splits`` hands out ``train`` and ``validation``; ``splits.test`` raises,
and only ``finetune.final.final_evaluation`` opens it (through ``open_test`` with the key that
module holds). Decontamination still has to compare the training data with the test text: it gets a
``ContaminationIndex`` built here, which answers "does this text overlap validation or test?" and
never hands out test text or test metrics.
"""

from __future__ import annotations

import hashlib
import string
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from recipetune.data.text import ContaminationIndex

SplitName = Literal["train", "validation", "test"]
MetricName = Literal["exact_match", "accuracy", "macro_f1", "rouge_l", "numeric"]
FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
BUILTINS = ("arith", "stdlib-module", "funcname", "argcount", "default-value", "product", "exception")


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
                     "exception"] | None = Field(
        None, description="a benchmark task generated on this machine (finetune/bench.py)")
    files: dict[SplitName, str] = Field(default_factory=dict, description="split -> .jsonl/.csv/.parquet path")
    prompt: str = Field(..., min_length=1, description="template over the row's fields, e.g. 'Q: {question}\\nA: '")
    target: str = Field(..., min_length=1, description="the field holding the expected answer")
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
    def _plain_fields(cls, v: str) -> str:
        for _, name, spec, conv in string.Formatter().parse(v):
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
        return self

    def fields(self) -> list[str]:
        return [name for _, name, _, _ in string.Formatter().parse(self.prompt) if name]

    def render(self, row: dict) -> str:
        return self.prompt.format(**{k: "" if row.get(k) is None else row[k] for k in self.fields()})

    def input_parts(self, row: dict) -> list[str]:
        """What varies between rows: the values the prompt reads, without the template's fixed text.
        Decontamination compares these, so a template (or an instruction) every row shares is no
        evidence of a copy."""
        return ["" if row.get(k) is None else str(row[k]) for k in self.fields()]

    def answer(self, row: dict) -> str:
        value = row.get(self.target)
        return "" if value is None else str(value).strip()


class TaskError(ValueError):
    """Bad task input; ``field`` is the dotted field of the experiment file it concerns."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def read_rows(path: Path, field: str = "task.files"):
    """A local JSONL/CSV/Parquet file as a ``datasets.Dataset``."""
    import datasets

    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise TaskError(field, f"{path}: unknown file type; allowed: {', '.join(FORMATS)}")
    if not path.is_file():
        raise TaskError(field, f"{path}: no such file")
    datasets.disable_progress_bars()
    try:
        ds = {"json": datasets.Dataset.from_json, "csv": datasets.Dataset.from_csv,
              "parquet": datasets.Dataset.from_parquet}[fmt](str(path), keep_in_memory=True)
    except Exception as e:  # malformed files come in many shapes; all are bad input
        raise TaskError(field, f"{path}: cannot read it as {fmt}: {str(e).splitlines()[0][:200]}") from None
    if len(ds) == 0:
        raise TaskError(field, f"{path}: the file holds no rows")
    return ds


def file_fingerprint(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


_TEST_KEY = object()  # held by finetune/final.py, the one place that opens the test split


class Splits:
    """Train and validation open; test closed (see the module docstring)."""

    def __init__(self, task: TaskConfig, paths: dict[str, Path]):
        self.task, self.paths = task, paths
        self.train = self._load("train")
        self.validation = self._load("validation")
        self._test = None
        self.fingerprints = {s: file_fingerprint(p) for s, p in paths.items()}  # hashes reveal nothing
        self._check_overlap()

    def _load(self, split: str):
        field = f"task.files.{split}"
        ds = read_rows(self.paths[split], field)
        for name in [*self.task.fields(), self.task.target]:
            if name not in ds.column_names:
                where = "task.target" if name == self.task.target else "task.prompt"
                raise TaskError(where, f"field '{name}' is not in {self.paths[split]} "
                                       f"(columns: {', '.join(ds.column_names)})")
        return ds

    def _check_overlap(self) -> None:
        same = [(a, b) for a in self.paths for b in self.paths
                if a < b and self.paths[a].resolve() == self.paths[b].resolve()]
        if same:
            a, b = same[0]
            raise TaskError(f"task.files.{b}", f"{a} and {b} are the same file {self.paths[a]}")
        # validation and test must not share an input: the search would be tuned on test examples.
        # (train overlaps are removed by decontamination instead, and reported.)
        test_inputs = {_norm(self.task.render(r)) for r in self._read_test()}
        for i, row in enumerate(self.validation):
            if _norm(self.task.render(row)) in test_inputs:
                raise TaskError("task.files.validation", f"row {i} of {self.paths['validation']} is also in the "
                                "test file: validation and test splits overlap")

    def _read_test(self):
        return self._load("test")

    @property
    def test(self):
        raise TestSplitClosed("the test split is closed: only the final evaluation "
                              "(recipetune.finetune.final.final_evaluation) opens it")

    def open_test(self, key: object):
        if key is not _TEST_KEY:
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


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def resolve_files(task: TaskConfig, base_dir: Path, cache_dir: Path | None = None) -> dict[str, Path]:
    """Split -> file: the task's own files (relative to the experiment file) or a generated builtin."""
    if task.builtin is not None:
        from recipetune.finetune.bench import builtin_files

        return builtin_files(task.builtin, cache_dir)
    out = {}
    for split, p in task.files.items():
        path = Path(p).expanduser()
        out[split] = path if path.is_absolute() else (base_dir / path).resolve()
    return out


def load_splits(task: TaskConfig, base_dir: Path, cache_dir: Path | None = None) -> Splits:
    return Splits(task, resolve_files(task, base_dir, cache_dir))
