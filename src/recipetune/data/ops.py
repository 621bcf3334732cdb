"""The data operators (the AIDP role): one typed config and one function each, on HF ``datasets``.

An operator takes the current training rows and returns the rows it keeps (or adds) and why it
removed the others: ``Outcome(rows, removed={reason: count}, examples=[a few removed rows])``.
Rows are dicts of strings (``chain.py`` casts the task's columns once, so files of any format mix).
The text an operator looks at is the rendered prompt unless it names a ``field``.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from recipetune.data.minhash import near_duplicates, signatures
from recipetune.data.text import normalize, tokens
from recipetune.expr import ExprError
from recipetune.expr import evaluate as eval_expr

Row = dict[str, Any]
EXAMPLES_KEPT = 2  # removed rows shown per operator and reason in the data version


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
    (data/text.py says how). Always on: a chain without it gets it appended with these defaults."""

    op: Literal["decontaminate"]
    ngram: int = Field(8, ge=1, le=50, description="word n-gram length for evaluation inputs at least this long")
    min_tokens: int = Field(3, ge=1, le=50, description="shorter evaluation inputs count only when copied whole")
    common_share: float = Field(0.05, gt=0.0, le=1.0, description=(
        "a phrase in at least this share of the evaluation rows is boilerplate, not evidence; 1 = none is"))
    near_threshold: float = Field(0.8, gt=0.0, le=1.0, description="MinHash similarity; 1 = n-grams only")
    num_perm: int = Field(64, ge=16, le=1024)


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
    '=' is arithmetic evaluated by recipetune.expr after filling (never Python eval)."""

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


@dataclass
class Outcome:
    rows: list[Row]
    removed: Counter = field(default_factory=Counter)
    examples: list[dict] = field(default_factory=list)
    added: int = 0

    def drop(self, row: Row, reason: str) -> None:
        self.removed[reason] += 1
        if sum(e["reason"] == reason for e in self.examples) < EXAMPLES_KEPT:
            # a training row that overlaps test is (nearly) test text: the search must not read it
            shown = "(withheld: overlaps the test split)" if reason.startswith("overlaps test") else row
            self.examples.append({"reason": reason, "row": shown})


@dataclass
class Context:
    """What operators may use besides the rows: the prompt renderer, file locations, the index."""

    render: Any  # row -> rendered prompt
    prompt_fields: list[str]
    base_dir: Path
    out_dir: Path | None
    read_file: Any  # (path, field) -> list[Row]
    contamination_index: Any  # Decontaminate settings -> ContaminationIndex
    parts: Any = None  # row -> its input parts (what varies between rows); default: the rendered prompt
    exports: list[tuple[Path, list[Row]]] = field(default_factory=list)  # written once the chain succeeded


def _text(row: Row, fld: str | None, ctx: Context) -> str:
    return ctx.render(row) if fld is None else str(row.get(fld) or "")


def _keep_if(rows: list[Row], ctx: Context, reason_of) -> Outcome:
    out = Outcome([])
    for row in rows:
        reason = reason_of(row)
        if reason is None:
            out.rows.append(row)
        else:
            out.drop(row, reason)
    return out


def apply(op: OpBase, rows: list[Row], ctx: Context) -> Outcome:
    """Run one operator (dispatch on its config type)."""
    return _APPLY[type(op)](op, rows, ctx)


def _load(op: Load, rows: list[Row], ctx: Context) -> Outcome:
    new = ctx.read_file(op.path, "path")
    out = Outcome(new, added=len(new))
    out.removed["replaced by " + op.path] = len(rows)
    return out


def _convert(op: Convert, rows: list[Row], ctx: Context) -> Outcome:
    out = Outcome([])
    for row in rows:
        new = {op.rename.get(k, k): v for k, v in row.items()}
        for name, template in op.templates.items():
            new[name] = template.format(**{k: "" if v is None else v for k, v in new.items()})
        if op.keep is not None:
            new = {k: new.get(k) for k in op.keep}
        if op.strip:
            new = {k: v.strip() if isinstance(v, str) else v for k, v in new.items()}
        out.rows.append(new)
    return out


def _dedup_exact(op: DedupExact, rows: list[Row], ctx: Context) -> Outcome:
    seen: set[str] = set()

    def reason(row: Row) -> str | None:
        key = normalize(ctx.render(row) if op.fields is None else "\x1f".join(str(row.get(f)) for f in op.fields))
        if key in seen:
            return "exact duplicate"
        seen.add(key)
        return None

    return _keep_if(rows, ctx, reason)


def _dedup_near(op: DedupNear, rows: list[Row], ctx: Context) -> Outcome:
    sig = signatures([_text(row, op.field, ctx) for row in rows], op.num_perm)
    match = near_duplicates(sig, op.threshold)
    out = Outcome([])
    for row, m in zip(rows, match.tolist(), strict=True):
        if m < 0:
            out.rows.append(row)
        else:
            out.drop(row, f"near duplicate (MinHash >= {op.threshold})")
    return out


def _filter_length(op: FilterLength, rows: list[Row], ctx: Context) -> Outcome:
    def reason(row: Row) -> str | None:
        n = len(_text(row, op.field, ctx))
        if n < op.min_chars:
            return f"shorter than {op.min_chars} chars"
        if op.max_chars is not None and n > op.max_chars:
            return f"longer than {op.max_chars} chars"
        return None

    return _keep_if(rows, ctx, reason)


_CHARSETS = {
    "ascii": lambda c: ord(c) < 128,
    "latin": lambda c: ord(c) < 0x250,
    "cyrillic": lambda c: "\u0400" <= c <= "\u04ff" or not c.isalpha(),
}


def _filter_charset(op: FilterCharset, rows: list[Row], ctx: Context) -> Outcome:
    inside = _CHARSETS[op.charset]

    def reason(row: Row) -> str | None:
        chars = [c for c in _text(row, op.field, ctx) if not c.isspace()]
        if chars and sum(map(inside, chars)) / len(chars) < op.min_ratio:
            return f"under {op.min_ratio:.0%} {op.charset}"
        return None

    return _keep_if(rows, ctx, reason)


def repeated_fraction(text: str, n: int) -> float:
    toks = tokens(text)
    grams = [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def _filter_repetition(op: FilterRepetition, rows: list[Row], ctx: Context) -> Outcome:
    def reason(row: Row) -> str | None:
        if repeated_fraction(_text(row, op.field, ctx), op.ngram) > op.max_fraction:
            return f"over {op.max_fraction:.0%} repeated {op.ngram}-grams"
        return None

    return _keep_if(rows, ctx, reason)


def _filter_regex(op: FilterRegex, rows: list[Row], ctx: Context) -> Outcome:
    pattern = re.compile(op.pattern)

    def reason(row: Row) -> str | None:
        found = pattern.search(_text(row, op.field, ctx)) is not None
        if found != (op.keep == "match"):
            return f"{'no ' if op.keep == 'match' else ''}match for /{op.pattern}/"
        return None

    return _keep_if(rows, ctx, reason)


def _decontaminate(op: Decontaminate, rows: list[Row], ctx: Context) -> Outcome:
    index = ctx.contamination_index(op)
    parts = ctx.parts or (lambda row: [ctx.render(row)])
    out = Outcome([])
    for row, hit in zip(rows, index.hits_batch([parts(r) for r in rows]), strict=True):
        if hit is None:
            out.rows.append(row)
        else:
            out.drop(row, f"overlaps {hit[0]} ({hit[1]})")
    return out


def _sample(op: Sample, rows: list[Row], ctx: Context) -> Outcome:
    k = op.n if op.n is not None else round(op.fraction * len(rows))
    k = min(k, len(rows))
    keep = sorted(random.Random(op.seed).sample(range(len(rows)), k))
    out = Outcome([rows[i] for i in keep])
    if len(rows) > k:
        out.removed["not sampled"] = len(rows) - k
    return out


def _mix(op: Mix, rows: list[Row], ctx: Context) -> Outcome:
    rng = random.Random(op.seed)
    base_share = 1.0 - sum(s.ratio for s in op.sources)
    total = len(rows) / base_share  # the current rows are the base share of the result
    out = Outcome(list(rows))
    for i, src in enumerate(op.sources):
        pool = ctx.read_file(src.path, f"sources.{i}.path")
        want = min(len(pool), round(src.ratio * total))
        out.rows += rng.sample(pool, want)
        out.added += want
    rng.shuffle(out.rows)
    return out


_PUNCT = re.compile(r"[^\w\s]")


def augment_text(text: str, rule: str, rng: random.Random) -> str:
    if rule == "lowercase":
        return text.lower()
    if rule == "uppercase":
        return text.upper()
    if rule == "drop_punctuation":
        return _PUNCT.sub("", text)
    if rule == "strip_spaces":
        return " ".join(text.split())
    words = text.split(" ")  # extra_spaces: double one space at random
    if len(words) > 1:
        i = rng.randrange(len(words) - 1)
        words[i] += " "
    return " ".join(words)


def _augment(op: Augment, rows: list[Row], ctx: Context) -> Outcome:
    rng = random.Random(op.seed)
    fields = op.fields or ctx.prompt_fields
    out = Outcome(list(rows))
    for row in rows:
        if rng.random() >= op.fraction:
            continue
        rule = rng.choice(op.rules)
        new = dict(row)
        for f in fields:
            if isinstance(new.get(f), str):
                new[f] = augment_text(new[f], rule, rng)
        if new != row:
            out.rows.append(new)
            out.added += 1
    return out


def _synthesize(op: Synthesize, rows: list[Row], ctx: Context) -> Outcome:
    rng = random.Random(op.seed)
    out = Outcome(list(rows))
    for _ in range(op.n):
        values = {name: (rng.randint(*s.range) if s.range else rng.choice(s.choices)) for name, s in op.slots.items()}
        new: Row = {}
        for name, template in op.fields.items():
            text = template.format(**values)
            if text.startswith("="):
                try:
                    result = eval_expr(text[1:], {})
                except ExprError as e:
                    raise ValueError(f"fields.{name}: {e}") from None
                text = str(int(result)) if isinstance(result, float) and result.is_integer() else str(result)
            new[name] = text
        out.rows.append(new)
        out.added += 1
    return out


def _export(op: Export, rows: list[Row], ctx: Context) -> Outcome:
    path = Path(op.path).expanduser()
    if not path.is_absolute():
        path = (ctx.out_dir or ctx.base_dir) / path
    ctx.exports.append((path, list(rows)))  # written by the chain at its end: nothing on bad input
    return Outcome(list(rows))


def write_rows(path: Path, rows: list[Row]) -> None:
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    ds = datasets.Dataset.from_list(rows)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        ds.to_json(str(path), lines=True, force_ascii=False)
    elif suffix == ".csv":
        ds.to_csv(str(path), index=False)
    else:
        ds.to_parquet(str(path))


_APPLY = {
    Load: _load, Convert: _convert, DedupExact: _dedup_exact, DedupNear: _dedup_near,
    FilterLength: _filter_length, FilterCharset: _filter_charset, FilterRepetition: _filter_repetition,
    FilterRegex: _filter_regex, Decontaminate: _decontaminate, Sample: _sample, Mix: _mix,
    Augment: _augment, Synthesize: _synthesize, Export: _export,
}
