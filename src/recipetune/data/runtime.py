"""How the data operators run: their context and outcome, batched maps over the Arrow table in
forked workers, and files of other formats aligned with the task's columns.

Per-row work is a batched ``Dataset.map`` (BATCH rows a call) in ``Context.workers`` forked
processes; what the map returns is small (a hash, a signature, a removal reason per row), and the
parent decides on the whole column with numpy: which rows to keep is a selection by indices, so no
operator holds the rows as Python objects. The functions the workers run are registered in the
parent (``_SHARED``) and inherited through the fork, never pickled: the contamination index is built
once per step and shared. Columns keep their types (a ``messages`` list of dicts stays one); a file
that ``load`` or ``mix`` brings in is cast to the training data's types where they differ.
"""

from __future__ import annotations

import itertools
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recipetune.data.ops import Row

EXAMPLES_KEPT = 2  # removed rows shown per operator and reason in the data version
BATCH = 1_000  # rows per call of a batched map (MinHash signatures are fastest in batches this size)
PARALLEL_MIN_ROWS = 20_000  # fewer rows run in one process: forking workers costs more than it saves
PROGRESS_MIN_ROWS = 50_000  # steps over this many rows show a progress bar (on a terminal)


@dataclass
class Outcome:
    rows: Any  # a datasets.Dataset
    removed: Counter = field(default_factory=Counter)
    examples: list[dict] = field(default_factory=list)
    added: int = 0
    kept: Counter = field(default_factory=Counter)  # rows an operator found but was told to keep (counted)

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


def texts_of(batch: dict[str, list], n: int, fld: str | None, ctx: Context) -> list[str]:
    """The text an operator looks at, per row of a batch: the rendered prompt, or ``fld``'s value."""
    if fld is not None:  # typed values as text: 0 is "0", a missing value ""
        return ["" if v is None else str(v) for v in batch.get(fld, [None] * n)]
    return [ctx.render(row) for row in rows_of(batch, n)]


def rows_of(batch: dict[str, list], n: int) -> list[Row]:
    if not batch:
        return [{} for _ in range(n)]
    keys = list(batch)
    return [dict(zip(keys, values, strict=True)) for values in zip(*batch.values(), strict=True)]


def columns_of(fld: str | None, ctx: Context) -> list[str]:
    return list(ctx.prompt_fields) if fld is None else [fld]


KEPT = "kept: "  # a reason that starts so counts the row in ``Outcome.kept`` and keeps it


def removal_by_reason(ds, reason_of, columns: list[str], ctx: Context, name: str, more=None,
                      revise=None) -> Outcome:
    """Keep the rows ``reason_of(batch, n) -> [reason or None]`` gives no reason to remove (or a reason
    that starts with ``KEPT``: counted, kept). A reason that only all the rows together decide:
    ``reason_of`` returns ``{"reason": [...], column: [...]}`` with the ``more`` columns' features, and
    ``revise(table) -> reasons`` (an Arrow string array) gives the final reasons from that table, in the
    parent."""
    import datasets
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(ds) == 0:
        return Outcome(ds)
    features = datasets.Features({"reason": datasets.Value("string"), **(more or {})})
    out = batch_map(ds, (lambda batch, n: {"reason": reason_of(batch, n)}) if more is None else reason_of,
                    columns, ctx, name, features=features)
    col = out.data.column("reason").combine_chunks() if revise is None else revise(out.data.table)
    flagged = pc.fill_null(pc.starts_with(col, KEPT), False).to_numpy(zero_copy_only=False)
    kept = Counter(r.removeprefix(KEPT) for r in pc.filter(col, flagged).to_pylist()) if flagged.any() else Counter()
    drop = col.is_valid().to_numpy(zero_copy_only=False) & ~flagged
    dropped = np.flatnonzero(drop)
    if not len(dropped):
        return Outcome(ds, kept=kept)
    encoded = pc.take(col, pa.array(dropped)).dictionary_encode()
    outcome = removal(ds, ~drop, dropped, encoded.indices.to_numpy(zero_copy_only=False),
                      encoded.dictionary.to_pylist(), ctx)
    outcome.kept = kept
    return outcome


def removal(ds, keep: np.ndarray, dropped: np.ndarray, codes: np.ndarray, reasons: list[str],
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


def concat(parts: list):
    """One dataset of ``parts`` in order (same columns: ``combine`` them first)."""
    import datasets

    full = [p for p in parts if len(p)] or parts[:1]
    return full[0] if len(full) == 1 else datasets.concatenate_datasets(
        [p.select_columns(full[0].column_names) for p in full])
