"""The data operators (the AIDP role): one typed config and one function each, on HF ``datasets``.

An operator takes the current training rows, a ``datasets.Dataset``, and returns the rows it keeps
(or adds) and why it removed the others: ``Outcome(rows, removed={reason: count}, examples=[a few
removed rows])``. Columns keep their types (a ``messages`` list of dicts stays one); a file that
``load`` or ``mix`` brings in is cast to the training data's types where they differ. The text an
operator looks at is the rendered prompt unless it names a ``field``.

Per-row work is a batched ``Dataset.map`` (BATCH rows a call) in ``Context.workers`` forked
processes; what the map returns is small (a hash, a signature, a removal reason per row), and the
parent decides on the whole column with numpy: which rows to keep is a selection by indices, so no
operator holds the rows as Python objects. The functions the workers run are registered in the
parent (``_SHARED``) and inherited through the fork, never pickled: the contamination index is built
once per step and shared.
"""

from __future__ import annotations

import itertools
import random
import re
import string
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from xxhash import xxh3_64_intdigest

from recipetune.data.minhash import near_duplicates, signatures
from recipetune.data.text import normalize, tokens
from recipetune.expr import ExprError
from recipetune.expr import evaluate as eval_expr

Row = dict[str, Any]
EXAMPLES_KEPT = 2  # removed rows shown per operator and reason in the data version
BATCH = 1_000  # rows per call of a batched map (MinHash signatures are fastest in batches this size)
PARALLEL_MIN_ROWS = 20_000  # fewer rows run in one process: forking workers costs more than it saves
PROGRESS_MIN_ROWS = 50_000  # steps over this many rows show a progress bar (on a terminal)


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
    min_overlap: float = Field(0.5, gt=0.0, le=1.0, description=(
        "share of a long evaluation input's n-grams a training row must hold to overlap it"))
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
    rows: Any  # a datasets.Dataset
    removed: Counter = field(default_factory=Counter)
    examples: list[dict] = field(default_factory=list)
    added: int = 0

    def example(self, row: Row, reason: str) -> None:
        # a training row that overlaps test is (nearly) test text: the search must not read it
        shown = "(withheld: overlaps the test split)" if reason.startswith("overlaps test") else row
        self.examples.append({"reason": reason, "row": shown})


@dataclass
class Context:
    """What operators may use besides the rows: the prompt renderer, file locations, the index, and
    how to run (workers, the folder for intermediate Arrow files)."""

    render: Any  # row -> rendered prompt
    prompt_fields: list[str]
    base_dir: Path
    out_dir: Path | None
    read_file: Any  # (path, field) -> datasets.Dataset (or a list of rows)
    contamination_index: Any  # Decontaminate settings -> ContaminationIndex
    parts: Any = None  # row -> its input parts (what varies between rows); default: the rendered prompt
    exports: list[tuple[Path, Any]] = field(default_factory=list)  # written once the chain succeeded
    features: Any = None  # the task's features (the training split's): what loaded files are cast to
    workers: int = 1  # processes for the batched maps (forked: they inherit the index)
    work_dir: Path | None = None  # intermediate Arrow files (None: kept in memory)
    progress: bool = False  # progress bars on long steps
    step: str = "step"  # a name for this step's intermediate files


class OpError(ValueError):
    """An operator's bad input; ``field`` is the dotted field of its config (``sources.0.path``)."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def as_dataset(rows):
    """A ``datasets.Dataset`` as it is; a list of row dicts as one (convenience for tests and callers)."""
    import datasets

    return rows if isinstance(rows, datasets.Dataset) else datasets.Dataset.from_list(list(rows))


def apply(op: OpBase, rows, ctx: Context) -> Outcome:
    """Run one operator (dispatch on its config type) on a ``datasets.Dataset`` (or a list of rows)."""
    return _APPLY[type(op)](op, as_dataset(rows), ctx)


# --- batched maps over the Arrow table, in forked workers -------------------------------------------

_SHARED: dict[int, Any] = {}  # the functions of the maps in flight: forked workers inherit them
_TOKENS = itertools.count()


class _Shared:
    """A picklable handle to a function the parent registered: workers look it up instead of
    unpickling it (the contamination index, the task's renderer and closures stay in the parent's
    memory, which a forked worker shares)."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, *args):
        return _SHARED[self.token](*args)


def _can_fork() -> bool:
    import multiprocess

    return multiprocess.get_context().get_start_method() == "fork"


@contextmanager
def _progress(ctx: Context, n: int):
    """datasets' progress bar for a long step on a terminal (``ctx.progress``), off otherwise."""
    import datasets

    was, on = datasets.is_progress_bar_enabled(), ctx.progress and n >= PROGRESS_MIN_ROWS
    (datasets.enable_progress_bars if on else datasets.disable_progress_bars)()
    try:
        yield
    finally:
        (datasets.enable_progress_bars if was else datasets.disable_progress_bars)()


def batch_map(ds, fn, columns: list[str], ctx: Context, name: str, features=None, parallel: bool = True,
              remove: list[str] | None = None):
    """``fn(batch, n) -> {column: values}`` over ``ds`` in batches of BATCH rows (``batch`` holds the
    ``columns`` that exist, as Python lists), in ``ctx.workers`` forked processes for inputs of
    PARALLEL_MIN_ROWS rows or more when ``parallel``. The result holds the outputs (a row per input
    row, or per batch where ``fn`` returns one, as ``array_map``'s does) and the input's columns but
    ``remove`` (default: all of them). Batches keep their order, whatever the workers."""
    cols = [c for c in dict.fromkeys(columns) if c in ds.column_names]

    def call(*args):
        *values, indices = args
        return fn(dict(zip(cols, values, strict=True)), len(indices))

    token = next(_TOKENS)
    _SHARED[token] = call
    nproc = ctx.workers if parallel and ctx.workers > 1 and len(ds) >= PARALLEL_MIN_ROWS and _can_fork() else 1
    extra: dict[str, Any] = {}
    if ctx.work_dir is not None:
        extra["cache_file_name"] = str(ctx.work_dir / f"{ctx.step}-{name}.arrow")
    try:
        with _progress(ctx, len(ds)):
            return ds.map(_Shared(token), batched=True, batch_size=BATCH, with_indices=True, input_columns=cols,
                          remove_columns=ds.column_names if remove is None else remove,
                          num_proc=nproc if nproc > 1 else None, features=features, load_from_cache_file=False,
                          new_fingerprint=f"{ctx.step}-{name}", keep_in_memory=ctx.work_dir is None,
                          desc=f"{ctx.step[:8]} {name}", **extra)
    finally:
        del _SHARED[token]


def array_map(ds, fn, columns: list[str], ctx: Context, name: str, dtype, width: int = 1) -> np.ndarray:
    """``fn(batch, n) -> (n, width) array`` over ``ds`` (as ``batch_map``), as one (len(ds), width) array:
    each batch's array comes back as one binary value, not as n Arrow rows (a signature matrix
    through Arrow's list arrays costs more than computing it)."""
    import datasets

    out = batch_map(ds, lambda batch, n: {"block": [np.ascontiguousarray(fn(batch, n), dtype=dtype).tobytes()]},
                    columns, ctx, name, features=datasets.Features({"block": datasets.Value("binary")}))
    whole = np.empty((len(ds), width), dtype=dtype)
    at = 0
    for batch in _record_batches(out):
        for value in batch.column(0):
            block = np.frombuffer(value.as_buffer(), dtype=dtype).reshape(-1, width)
            whole[at : at + len(block)] = block
            at += len(block)
    if at != len(ds):
        raise RuntimeError(f"{name}: {at} rows computed for {len(ds)}")
    return whole


def _record_batches(ds):
    """The record batches of a map's output in order: read from its files one at a time where it has
    files (not memory-mapped: the blocks are copied once, not also kept mapped), else from memory."""
    import pyarrow as pa

    if not ds.cache_files:
        yield from ds.data.table.to_batches()
        return
    for f in ds.cache_files:
        with pa.OSFile(f["filename"]) as source:
            yield from pa.ipc.open_stream(source)


def _texts(batch: dict[str, list], n: int, fld: str | None, ctx: Context) -> list[str]:
    """The text an operator looks at, per row of a batch: the rendered prompt, or ``fld``'s value."""
    if fld is not None:  # typed values as text: 0 is "0", a missing value ""
        return ["" if v is None else str(v) for v in batch.get(fld, [None] * n)]
    return [ctx.render(row) for row in _rows(batch, n)]


def _rows(batch: dict[str, list], n: int) -> list[Row]:
    if not batch:
        return [{} for _ in range(n)]
    keys = list(batch)
    return [dict(zip(keys, values, strict=True)) for values in zip(*batch.values(), strict=True)]


def _columns(fld: str | None, ctx: Context) -> list[str]:
    return list(ctx.prompt_fields) if fld is None else [fld]


def _reasons(ds, reason_of, columns: list[str], ctx: Context, name: str) -> Outcome:
    """Keep the rows ``reason_of(batch, n) -> [reason or None]`` gives no reason to remove."""
    import datasets
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(ds) == 0:
        return Outcome(ds)
    out = batch_map(ds, lambda batch, n: {"reason": reason_of(batch, n)}, columns, ctx, name,
                    features=datasets.Features({"reason": datasets.Value("string")}))
    col = out.data.column("reason").combine_chunks()
    drop = col.is_valid().to_numpy(zero_copy_only=False)
    dropped = np.flatnonzero(drop)
    if not len(dropped):
        return Outcome(ds)
    encoded = pc.take(col, pa.array(dropped)).dictionary_encode()
    return _removal(ds, ~drop, dropped, encoded.indices.to_numpy(zero_copy_only=False),
                    encoded.dictionary.to_pylist(), ctx)


def _removal(ds, keep: np.ndarray, dropped: np.ndarray, codes: np.ndarray, reasons: list[str],
             ctx: Context) -> Outcome:
    """The rows where ``keep`` (a selection by indices: no copy), with the removed rows counted by
    reason (``reasons[codes[i]]`` for the i-th removed row) in the order they first occur, and the
    first EXAMPLES_KEPT removed rows of each reason as examples."""
    out = Outcome(ds.select(np.flatnonzero(keep), new_fingerprint=f"{ctx.step}-keep") if not keep.all() else ds)
    counts = np.bincount(codes, minlength=len(reasons))
    shown: list[tuple[int, str]] = []
    _, first = np.unique(codes, return_index=True)
    for code in codes[np.sort(first)]:
        reason = reasons[code]
        out.removed[reason] = int(counts[code])
        shown += [(int(i), reason) for i in dropped[codes == code][:EXAMPLES_KEPT]]
    shown.sort()
    rows = ds.select([i for i, _ in shown]).to_list() if shown else []
    for (_, reason), row in zip(shown, rows, strict=True):
        out.example(row, reason)
    return out


# --- aligning files of other formats with the task's columns -----------------------------------------

def _is_null(feature) -> bool:
    import datasets

    return isinstance(feature, datasets.Value) and feature.dtype == "null"


def _cast(ds, name: str, feature, fld: str, what: str):
    try:
        return ds.cast_column(name, feature)
    except Exception as e:  # pyarrow raises several kinds for values that do not convert
        raise OpError(fld, f"{what}: field '{name}' cannot be cast to the training data's type {feature} "
                           f"({str(e).splitlines()[0][:200]})") from None


def conform(ds, features, fld: str, what: str):
    """``ds`` with its columns that ``features`` also has cast to those types (a CSV's integers to the
    JSONL's strings, say); OpError naming the field when a value does not convert."""
    if features is None:
        return ds
    for name, feature in features.items():
        have = ds.features.get(name)
        if have is not None and have != feature and not _is_null(feature):
            ds = _cast(ds, name, feature, fld, what)
    return ds


def combine(base, other, fld: str, what: str):
    """``base`` and ``other`` with the same columns and types, ready to concatenate: columns one lacks
    are added as nulls; a column typed differently is cast to ``base``'s type (or to ``other``'s,
    where ``base``'s holds only nulls)."""
    for name, feature in other.features.items():
        have = base.features.get(name)
        if have is not None and have != feature and _is_null(have):
            base = base.cast_column(name, feature)
    other = conform(other, base.features, fld, what)
    for name, feature in other.features.items():
        if name not in base.column_names:
            base = _add_nulls(base, name, feature)
    for name, feature in base.features.items():
        if name not in other.column_names:
            other = _add_nulls(other, name, feature)
    return base, other.select_columns(base.column_names)


def _add_nulls(ds, name: str, feature):
    import datasets
    import pyarrow as pa

    pa_type = datasets.Features({name: feature}).arrow_schema.field(name).type
    return ds.add_column(name, pa.nulls(len(ds), pa_type), feature=feature)


def _concat(parts: list):
    """One dataset of ``parts`` in order (same columns: ``combine`` them first)."""
    import datasets

    full = [p for p in parts if len(p)] or parts[:1]
    return full[0] if len(full) == 1 else datasets.concatenate_datasets(
        [p.select_columns(full[0].column_names) for p in full])


# --- the operators ----------------------------------------------------------------------------------

def _load(op: Load, ds, ctx: Context) -> Outcome:
    new = conform(as_dataset(ctx.read_file(op.path, "path")), ctx.features, "path", op.path)
    out = Outcome(new, added=len(new))
    out.removed["replaced by " + op.path] = len(ds)
    return out


def _template_fields(template: str) -> list[str]:
    return [re.split(r"[.\[]", name, maxsplit=1)[0] for _, name, _, _ in string.Formatter().parse(template) if name]


def _is_string(feature) -> bool:
    import datasets

    return isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")


def _convert(op: Convert, ds, ctx: Context) -> Outcome:
    rename = {k: v for k, v in op.rename.items() if k in ds.column_names and k != v}
    if rename:
        ds = ds.rename_columns(rename)
    names = ds.column_names
    made = list(op.templates)
    final = list(op.keep) if op.keep is not None else list(dict.fromkeys([*names, *made]))
    strip = [c for c in final if c in made or (c in names and _is_string(ds.features[c]))] if op.strip else []
    missing = [c for c in final if c not in names and c not in made]
    reads = {f for t in op.templates.values() for f in _template_fields(t)} | {c for c in strip if c in names}
    if not made and not strip and not missing and final == names:
        return Outcome(ds)

    def fn(batch: dict[str, list], n: int) -> dict[str, list]:
        out: dict[str, list] = {}
        if op.templates:
            rows = _rows(batch, n)
            for name, template in op.templates.items():
                values = []
                for row in rows:
                    row[name] = template.format(**{k: "" if v is None else v for k, v in row.items()})
                    values.append(row[name])
                out[name] = values
        for c in strip:
            out[c] = [v.strip() if isinstance(v, str) else v for v in out.get(c, batch.get(c, []))]
        for c in missing:
            out[c] = [None] * n
        return out

    mapped = batch_map(ds, fn, [c for c in names if c in reads], ctx, "convert",
                       remove=[c for c in names if c not in final])
    return Outcome(mapped.select_columns(final))


def _dedup_exact(op: DedupExact, ds, ctx: Context) -> Outcome:

    if len(ds) == 0:
        return Outcome(ds)

    def key(batch: dict[str, list], n: int) -> list[str]:
        if op.fields is None:
            return [normalize(ctx.render(row)) for row in _rows(batch, n)]
        cols = [batch.get(f, [None] * n) for f in op.fields]
        return [normalize("\x1f".join(str(v) for v in values)) for values in zip(*cols, strict=True)]

    def hashes(batch: dict[str, list], n: int) -> np.ndarray:
        return np.fromiter((xxh3_64_intdigest(k.encode()) for k in key(batch, n)), dtype=np.uint64, count=n)

    h = array_map(ds, hashes, op.fields or ctx.prompt_fields, ctx, "hash", np.uint64)[:, 0]
    _, first = np.unique(h, return_index=True)  # the first occurrence of every text is kept
    keep = np.zeros(len(h), dtype=bool)
    keep[first] = True
    dropped = np.flatnonzero(~keep)
    return _removal(ds, keep, dropped, np.zeros(len(dropped), dtype=np.int64), ["exact duplicate"], ctx)


def _dedup_near(op: DedupNear, ds, ctx: Context) -> Outcome:

    if len(ds) == 0:
        return Outcome(ds)
    m = op.num_perm
    sig = array_map(ds, lambda batch, n: signatures(_texts(batch, n, op.field, ctx), m), _columns(op.field, ctx),
                    ctx, "minhash", np.uint32, m)
    match = near_duplicates(sig, op.threshold)
    dropped = np.flatnonzero(match >= 0)
    return _removal(ds, match < 0, dropped, np.zeros(len(dropped), dtype=np.int64),
                    [f"near duplicate (MinHash >= {op.threshold})"], ctx)


def _filter_length(op: FilterLength, ds, ctx: Context) -> Outcome:
    def reasons(batch: dict[str, list], n: int) -> list[str | None]:
        out: list[str | None] = []
        for text in _texts(batch, n, op.field, ctx):
            if len(text) < op.min_chars:
                out.append(f"shorter than {op.min_chars} chars")
            elif op.max_chars is not None and len(text) > op.max_chars:
                out.append(f"longer than {op.max_chars} chars")
            else:
                out.append(None)
        return out

    return _reasons(ds, reasons, _columns(op.field, ctx), ctx, "filter_length")


_CHARSETS = {
    "ascii": lambda c: ord(c) < 128,
    "latin": lambda c: ord(c) < 0x250,
    "cyrillic": lambda c: "\u0400" <= c <= "\u04ff" or not c.isalpha(),
}


def _filter_charset(op: FilterCharset, ds, ctx: Context) -> Outcome:
    inside = _CHARSETS[op.charset]
    why = f"under {op.min_ratio:.0%} {op.charset}"

    def reason(text: str) -> str | None:
        chars = [c for c in text if not c.isspace()]
        return why if chars and sum(map(inside, chars)) / len(chars) < op.min_ratio else None

    return _reasons(ds, lambda batch, n: [reason(t) for t in _texts(batch, n, op.field, ctx)],
                    _columns(op.field, ctx), ctx, "filter_charset")


def repeated_fraction(text: str, n: int) -> float:
    toks = tokens(text)
    grams = [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)


def _filter_repetition(op: FilterRepetition, ds, ctx: Context) -> Outcome:
    why = f"over {op.max_fraction:.0%} repeated {op.ngram}-grams"
    return _reasons(ds, lambda batch, n: [why if repeated_fraction(t, op.ngram) > op.max_fraction else None
                                          for t in _texts(batch, n, op.field, ctx)],
                    _columns(op.field, ctx), ctx, "filter_repetition")


def _filter_regex(op: FilterRegex, ds, ctx: Context) -> Outcome:
    pattern = re.compile(op.pattern)
    why = f"{'no ' if op.keep == 'match' else ''}match for /{op.pattern}/"
    want = op.keep == "match"
    return _reasons(ds, lambda batch, n: [None if (pattern.search(t) is not None) == want else why
                                          for t in _texts(batch, n, op.field, ctx)],
                    _columns(op.field, ctx), ctx, "filter_regex")


def _decontaminate(op: Decontaminate, ds, ctx: Context) -> Outcome:
    index = ctx.contamination_index(op)  # once, in the parent: forked workers share it
    parts = ctx.parts or (lambda row: [ctx.render(row)])

    def reasons(batch: dict[str, list], n: int) -> list[str | None]:
        hits = index.hits_batch([parts(row) for row in _rows(batch, n)])
        return [None if hit is None else f"overlaps {hit[0]} ({hit[1]})" for hit in hits]

    return _reasons(ds, reasons, ctx.prompt_fields, ctx, "decontaminate")


def _sample(op: Sample, ds, ctx: Context) -> Outcome:
    k = op.n if op.n is not None else round(op.fraction * len(ds))
    k = min(k, len(ds))
    if k == len(ds):
        return Outcome(ds)
    keep = sorted(random.Random(op.seed).sample(range(len(ds)), k))
    out = Outcome(ds.select(keep, new_fingerprint=f"{ctx.step}-sample"))
    out.removed["not sampled"] = len(ds) - k
    return out


def _mix(op: Mix, ds, ctx: Context) -> Outcome:
    rng = random.Random(op.seed)
    base_share = 1.0 - sum(s.ratio for s in op.sources)
    total = len(ds) / base_share  # the current rows are the base share of the result
    out = Outcome(ds)
    parts = [ds]
    for i, src in enumerate(op.sources):
        fld = f"sources.{i}.path"
        pool = as_dataset(ctx.read_file(src.path, fld))
        want = min(len(pool), round(src.ratio * total))
        picked = pool.select(rng.sample(range(len(pool)), want))
        for j, part in enumerate(parts):
            parts[j], picked = combine(part, picked, fld, src.path)
        parts.append(picked)
        out.added += want
    rows = _concat(parts)
    order = list(range(len(rows)))
    rng.shuffle(order)
    out.rows = rows.select(order, new_fingerprint=f"{ctx.step}-mix")
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


def _augment(op: Augment, ds, ctx: Context) -> Outcome:
    import datasets

    rng = random.Random(op.seed)  # one sequence over the rows in order: this map runs in one process
    rewrite = [f for f in op.fields or ctx.prompt_fields if f in ds.column_names and _is_string(ds.features[f])]
    fields = list(dict.fromkeys(rewrite))
    if len(ds) == 0:
        return Outcome(ds)

    def fn(batch: dict[str, list], n: int) -> dict[str, list]:
        out: dict[str, list] = {f: list(batch[f]) for f in fields}
        copy = [False] * n
        for i in range(n):
            if rng.random() >= op.fraction:
                continue
            rule = rng.choice(op.rules)
            for f in rewrite:
                v = out[f][i]
                if isinstance(v, str):
                    out[f][i] = augment_text(v, rule, rng)
                    copy[i] = copy[i] or out[f][i] != v
        return {**out, "_copy": copy}

    features = datasets.Features({**{f: ds.features[f] for f in fields}, "_copy": datasets.Value("bool")})
    rewritten = batch_map(ds, fn, fields, ctx, "augment", features=features, parallel=False)
    picked = np.flatnonzero(rewritten.data.column("_copy").to_numpy(zero_copy_only=False))
    if not len(picked):
        return Outcome(ds)
    whole = datasets.concatenate_datasets([ds.remove_columns(fields), rewritten.remove_columns("_copy")], axis=1)
    copies = whole.select(picked).select_columns(ds.column_names)
    return Outcome(_concat([ds, copies]), added=len(picked))


def _synthesize(op: Synthesize, ds, ctx: Context) -> Outcome:
    import datasets

    rng = random.Random(op.seed)
    columns: dict[str, list[str]] = {name: [] for name in op.fields}
    for _ in range(op.n):
        values = {name: (rng.randint(*s.range) if s.range else rng.choice(s.choices)) for name, s in op.slots.items()}
        for name, template in op.fields.items():
            text = template.format(**values)
            if text.startswith("="):
                try:
                    result = eval_expr(text[1:], {})
                except ExprError as e:
                    raise OpError(f"fields.{name}", f"fields.{name}: {e}") from None
                text = str(int(result)) if isinstance(result, float) and result.is_integer() else str(result)
            columns[name].append(text)
    new = datasets.Dataset.from_dict(columns)
    if len(ds) == 0 and not ds.column_names:
        return Outcome(new, added=op.n)
    base, new = combine(ds, new, "fields", "synthesized rows")
    return Outcome(_concat([base, new]), added=op.n)


def _export(op: Export, ds, ctx: Context) -> Outcome:
    path = Path(op.path).expanduser()
    if not path.is_absolute():
        path = (ctx.out_dir or ctx.base_dir) / path
    ctx.exports.append((path, ds))  # written by the chain at its end: nothing on bad input
    return Outcome(ds)


def write_rows(path: Path, rows) -> None:
    """Write a ``datasets.Dataset`` (or a list of rows) as JSONL, CSV or Parquet, by the suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = as_dataset(rows)
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
