"""The data operators' configs: what a chain's YAML may say, one typed config per operator.

An operator takes the current training rows, a ``datasets.Dataset``, and returns the rows it keeps
(or adds) and why it removed the others (``data/runtime.py: Outcome``); its function is in
``data/operators.py``. The text an operator looks at is the rendered prompt unless it names a
``field``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Row = dict[str, Any]


class OpBase(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_regex(v: str) -> str:
    try:
        re.compile(v)
    except re.error as e:
        raise ValueError(f"not a valid regular expression: {e}") from None
    return v


class Load(OpBase):
    """Replace the rows with a local file's (JSONL/CSV/Parquet), e.g. a different training set."""

    op: Literal["load"]
    path: str


class Convert(OpBase):
    """Format conversion: rename fields, keep a subset, strip whitespace, template new fields."""

    op: Literal["convert"]
    rename: dict[str, str] = Field(default_factory=dict, description="old name -> new name")
    templates: dict[str, str] = Field(default_factory=dict, description="new field -> '{a} and {b}'")
    keep: list[str] | None = Field(None, description="fields kept (default: all)")
    strip: bool = True


class DedupExact(OpBase):
    """Drop rows whose text (normalised: case, whitespace) was already seen."""

    op: Literal["dedup_exact"]
    fields: list[str] | None = Field(None, description="compare these fields (default: the rendered prompt)")


class DedupNear(OpBase):
    """Drop a row whose estimated Jaccard similarity to an earlier row in one of its LSH buckets is at
    least ``threshold``: one-permutation MinHash over character 5-grams (data/minhash.py)."""

    op: Literal["dedup_near"]
    threshold: float = Field(0.8, gt=0.0, lt=1.0, description="estimated Jaccard similarity to count as a duplicate")
    num_perm: int = Field(64, ge=16, le=1024)
    field: str | None = None


class FilterLength(OpBase):
    op: Literal["filter_length"]
    field: str | None = None
    min_chars: int = Field(0, ge=0)
    max_chars: int | None = Field(None, ge=1)


class FilterCharset(OpBase):
    """Keep rows whose letters are mostly of one script (a cheap language heuristic)."""

    op: Literal["filter_charset"]
    field: str | None = None
    charset: Literal["ascii", "latin", "cyrillic"] = "ascii"
    min_ratio: float = Field(0.9, ge=0.0, le=1.0, description="share of non-space characters in the charset")


class FilterRepetition(OpBase):
    """Drop degenerate text: too large a share of repeated word n-grams."""

    op: Literal["filter_repetition"]
    field: str | None = None
    ngram: int = Field(3, ge=1, le=20)
    max_fraction: float = Field(0.3, ge=0.0, le=1.0)


class FilterRegex(OpBase):
    op: Literal["filter_regex"]
    pattern: str
    field: str | None = None
    keep: Literal["match", "no_match"] = "match"

    @field_validator("pattern")
    @classmethod
    def _regex(cls, v: str) -> str:
        return _check_regex(v)


class Decontaminate(OpBase):
    """Remove training rows that overlap validation or test in what varies between rows: the
    template's fixed text and phrases a large share of the evaluation rows repeat are not evidence
    (data/decontam.py says how). Always on: a chain without it gets it appended with these defaults."""

    op: Literal["decontaminate"]
    ngram: int = Field(8, ge=1, le=50, description="word n-gram length for evaluation inputs at least this long")
    min_overlap: float = Field(0.5, gt=0.0, le=1.0, description=(
        "share of a long evaluation input's n-grams a training row must hold to overlap it"))
    min_tokens: int = Field(3, ge=1, le=50, description="shorter evaluation inputs count only when copied whole")
    contain_share: float = Field(0.5, gt=0.0, le=1.0, description=(
        "a short evaluation input found inside a training field counts only when it is at least this share "
        "of what the field says (text every row shares not counted): a literal inside longer code is no copy"))
    common_share: float = Field(0.05, gt=0.0, le=1.0, description=(
        "a phrase in at least this share of the evaluation rows is boilerplate, not evidence; 1 = none is"))
    near_threshold: float = Field(0.8, gt=0.0, le=1.0, description="MinHash similarity; 1 = n-grams only")
    num_perm: int = Field(64, ge=16, le=1024)
    renamed: Literal["remove", "keep", "report"] = Field("remove", description=(
        "a training input that is an evaluation input with one name or number changed (a renamed copy): "
        "remove it (counted apart as 'renamed copy'), keep it, or keep it and count it in the data version "
        "('kept'); where natural inputs differ by one name (another function with the same parameters), "
        "the task's file says whether they count as copies"))


class Sample(OpBase):
    op: Literal["sample"]
    n: int | None = Field(None, ge=1)
    fraction: float | None = Field(None, gt=0.0, le=1.0)
    seed: int = 0

    @model_validator(mode="after")
    def _one(self) -> Sample:
        if (self.n is None) == (self.fraction is None):
            raise ValueError("give exactly one of n or fraction")
        return self


class MixSource(OpBase):
    path: str
    ratio: float = Field(..., gt=0.0, lt=1.0, description="share of the mixed rows drawn from this file")


class Mix(OpBase):
    """Mix in other files at given shares of the result (drawn without replacement, capped by size)."""

    op: Literal["mix"]
    sources: list[MixSource] = Field(..., min_length=1)
    seed: int = 0

    @model_validator(mode="after")
    def _ratios(self) -> Mix:
        if sum(s.ratio for s in self.sources) >= 1.0:
            raise ValueError("the sources' ratios must sum to less than 1 (the rest is the current data)")
        return self


AUGMENT_RULES = ("lowercase", "uppercase", "extra_spaces", "drop_punctuation", "strip_spaces")


class Augment(OpBase):
    """Rule-based augmentation: copies of rows with their input fields rewritten (target unchanged)."""

    op: Literal["augment"]
    rules: list[Literal["lowercase", "uppercase", "extra_spaces", "drop_punctuation", "strip_spaces"]] = Field(
        ..., min_length=1)
    fields: list[str] | None = Field(None, description="fields rewritten (default: the prompt's fields)")
    fraction: float = Field(1.0, gt=0.0, le=1.0, description="share of rows that get a copy")
    seed: int = 0


class Slot(OpBase):
    range: tuple[int, int] | None = Field(None, description="integers low..high inclusive")
    choices: list[str | int | float] | None = None

    @model_validator(mode="after")
    def _one(self) -> Slot:
        if (self.range is None) == (self.choices is None):
            raise ValueError("give exactly one of range or choices")
        if self.range is not None and self.range[0] > self.range[1]:
            raise ValueError("range low must be <= high")
        return self


class Synthesize(OpBase):
    """Template synthesis: rows from templates over random slot values. A field value starting with
    '=' is arithmetic evaluated by recipetune.core.expr after filling (never Python eval)."""

    op: Literal["synthesize"]
    n: int = Field(..., ge=1, le=1_000_000)
    slots: dict[str, Slot] = Field(..., min_length=1)
    fields: dict[str, str] = Field(..., min_length=1, description="field -> template, e.g. '{a}+{b}' or '={a}+{b}'")
    seed: int = 0


class Export(OpBase):
    """Write the current rows to a file (relative paths land in the run folder)."""

    op: Literal["export"]
    path: str = "train.jsonl"

    @field_validator("path")
    @classmethod
    def _format(cls, v: str) -> str:
        if Path(v).suffix.lower() not in (".jsonl", ".csv", ".parquet"):
            raise ValueError("export path must end in .jsonl, .csv or .parquet")
        return v


Operator = Annotated[
    Load | Convert | DedupExact | DedupNear | FilterLength | FilterCharset | FilterRepetition | FilterRegex
    | Decontaminate | Sample | Mix | Augment | Synthesize | Export,
    Field(discriminator="op"),
]
OPERATOR_NAMES = ("load", "convert", "dedup_exact", "dedup_near", "filter_length", "filter_charset",
                  "filter_repetition", "filter_regex", "decontaminate", "sample", "mix", "augment",
                  "synthesize", "export")
