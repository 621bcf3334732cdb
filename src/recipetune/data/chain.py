"""A YAML chain of data operators over the task's training split, on Arrow, cached by fingerprint.

The rows are a ``datasets.Dataset`` from end to end (typed columns, memory-mapped Arrow files;
``data/runtime.py`` says how the operators run). Fingerprints are derived, as ``datasets`` derives its
own, never computed by hashing rows: the source's from the training file's sha256 and the settings it
was loaded with, and each step's output from its input fingerprint, the operator's config and
whatever else it reads (the prompt template, source files, the evaluation splits' fingerprints for
decontamination) and the operators' code. Every step's output is cached under ``<cache>/data/<its
fingerprint>`` (``datasets.save_to_disk``); a hit is a memory-mapped ``load_from_disk``. The
``DataVersion`` records, per operator, the fingerprints in and out, the rows in and out, what was
removed and why, and whether it came from the cache: what an experiment trained on, exactly.

Decontamination is always on: a chain without a ``decontaminate`` step gets one (defaults) before
its first ``export``, or at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from recipetune.data import ops
from recipetune.data.files import file_fingerprint, read_rows
from recipetune.data.operators import apply, write_rows
from recipetune.data.ops import Decontaminate, Export, Load, Mix, OpBase
from recipetune.data.runtime import PARALLEL_MIN_ROWS, Context, as_dataset

CACHE_VERSION = "2"  # bump when an operator's behaviour changes, so stale outputs are not reused
WORKERS_ENV = "RECIPETUNE_DATA_WORKERS"


class ChainError(ValueError):
    """Bad chain input; ``field`` is the dotted field (``data.2.path``) of the experiment file."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


class OperatorStats(BaseModel):
    index: int
    op: str
    config: dict[str, Any]
    rows_in: int
    rows_out: int
    added: int = 0
    removed: dict[str, int] = Field(default_factory=dict, description="reason -> rows")
    kept: dict[str, int] = Field(default_factory=dict, description=(
        "reason -> rows found but kept as the step was told (decontaminate's renamed: report)"))
    examples: list[dict[str, Any]] = Field(default_factory=list, description="a few removed training rows")
    fingerprint_in: str
    fingerprint_out: str
    cached: bool = False
    seconds: float = 0.0
    implicit: bool = Field(False, description="added by the chain itself (decontamination is always on)")


class DataVersion(BaseModel):
    """What an experiment trained on: sources, every operator's effect, and the result's fingerprint."""

    id: str = Field(..., description="fingerprint of the final training rows")
    sources: dict[str, str] = Field(..., description="split -> sha256 of its file (test included: a hash)")
    rows_in: int
    rows_out: int
    operators: list[OperatorStats]
    dropped_at_load: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="split -> reason -> rows dropped when the file was read")


def fingerprint(*parts: Any) -> str:
    """A fingerprint derived from others and settings (``datasets``' way): nothing hashes rows."""
    text = "|".join(p if isinstance(p, str) else json.dumps(p, sort_keys=True, default=str) for p in parts)
    return hashlib.sha256(f"{CACHE_VERSION}|{text}".encode()).hexdigest()[:16]


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """The operators' code: every module of this package (their configs, functions and runtime, and the
    rules they apply, however they are split into modules): a change to it is a change to every step's
    output."""
    h = hashlib.sha256()
    for path in code_files():
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def code_files() -> list[Path]:
    return sorted(Path(ops.__file__).parent.glob("*.py"))


def task_reads(task) -> dict[str, Any]:
    """What of the task the operators (and the loading of its files) read: its shape, not its metric."""
    return {"format": getattr(task, "format", "template"), "prompt": task.prompt, "target": task.target,
            "fields": task.fields(), "incomplete_rows": getattr(task, "incomplete_rows", None)}


def source_fingerprint(splits) -> str:
    """The training split as loaded: its file's sha256 and the settings it was read with."""
    path = Path(splits.paths["train"])
    dropped = (getattr(splits, "dropped", None) or {}).get("train", {})
    return fingerprint("source", splits.fingerprints["train"], path.suffix.lower(), task_reads(splits.task),
                       dropped, len(splits.train))


def with_decontamination(chain: list[OpBase]) -> tuple[list[OpBase], int | None]:
    """The chain as it runs, and the position of the step added implicitly (None if declared)."""
    if any(isinstance(op, Decontaminate) for op in chain):
        return list(chain), None
    at = next((i for i, op in enumerate(chain) if isinstance(op, Export)), len(chain))
    return [*chain[:at], Decontaminate(op="decontaminate"), *chain[at:]], at


def default_workers() -> int:
    """Processes for the batched maps: ``RECIPETUNE_DATA_WORKERS``, else min(2, the CPUs this process may use)."""
    env = os.environ.get(WORKERS_ENV)
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            pass
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(2, cpus))


def _show_progress() -> bool:
    return sys.stderr.isatty() and "PYTEST_CURRENT_TEST" not in os.environ


def _cache_root() -> Path:
    from recipetune.core.measure import cache_dir

    return cache_dir() / "data"


def run_chain(
    chain: list[OpBase], splits, base_dir: Path, out_dir: Path | None = None, cache: Path | None = None,
    use_cache: bool = True, workers: int | None = None,
):
    """Run the chain on ``splits.train``: ``(datasets.Dataset, DataVersion)``; raise ChainError when a
    step fails or leaves no rows. ``workers``: processes for the batched maps (default
    ``default_workers()``; inputs under PARALLEL_MIN_ROWS rows run in one). The result is the same
    for any number of workers."""
    import datasets

    datasets.disable_progress_bars()  # long steps turn them on (runtime._progress)
    cache = cache or _cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    task = splits.task
    steps, implicit_at = with_decontamination(chain)
    _sweep(cache)
    work = Path(tempfile.mkdtemp(prefix="work-", dir=cache))  # intermediate Arrow files, removed at the end

    def read_file(path: str, field: str):
        p = Path(path).expanduser()
        p = p if p.is_absolute() else (base_dir / p).resolve()
        return read_rows(p, field)

    ctx = Context(render=task.render, prompt_fields=task.fields(), base_dir=base_dir, out_dir=out_dir,
                  read_file=read_file, contamination_index=splits.contamination_index, parts=task.input_parts,
                  features=splits.train.features, workers=max(1, workers or default_workers()), work_dir=work,
                  progress=_show_progress())
    try:
        fp_in = source_fingerprint(splits)
        ds = _source(splits.train, cache / fp_in, work, use_cache)
        stats: list[OperatorStats] = []
        for i, op in enumerate(steps):
            field = f"data.{i}" if implicit_at is None or i < implicit_at else f"data.{i - 1}"
            exporting = isinstance(op, Export)
            extra = _reads(op, base_dir, splits)
            fp_out = fp_in if exporting else fingerprint(fp_in, op.model_dump_json(), extra, code_fingerprint())
            folder = cache / fp_out
            t0 = time.perf_counter()
            hit = _cache_get(folder) if use_cache and not exporting else None
            if hit is not None:
                out, meta = hit
            else:
                ctx.step = fp_out
                if ctx.workers > 1 and not ds.cache_files and len(ds) >= PARALLEL_MIN_ROWS:
                    ds = _store(ds, work / f"{fp_in}-in")  # on disk: workers map it instead of unpickling it
                try:
                    outcome = apply(op, ds, ctx)
                except (ValueError, KeyError) as e:  # a DataFileError or an operator's bad input
                    sub = getattr(e, "field", "")
                    raise ChainError(f"{field}.{sub}" if sub else f"{field}.op", f"{op.op}: {e}") from None
                out = outcome.rows
                meta = {"removed": dict(outcome.removed), "kept": dict(outcome.kept), "examples": outcome.examples,
                        "added": outcome.added,
                        "rows": len(out)}
            if len(out) == 0:
                raise ChainError(f"{field}.op", f"step {i} ({op.op}) leaves no training rows "
                                                f"({len(ds)} in; removed: {meta['removed']})")
            if hit is None and use_cache and not exporting:
                out = _cache_put(folder, out, meta, work)
            stats.append(OperatorStats(
                index=i, op=op.op, config=op.model_dump(exclude={"op"}), rows_in=len(ds), rows_out=len(out),
                added=meta["added"], removed=meta["removed"], kept=meta.get("kept", {}), examples=meta["examples"],
                fingerprint_in=fp_in,
                fingerprint_out=fp_out, cached=hit is not None, seconds=round(time.perf_counter() - t0, 4),
                implicit=i == implicit_at,
            ))
            ds, fp_in = out, fp_out
        for path, exported in ctx.exports:
            write_rows(path, exported)
        if _inside(ds, work):  # the work folder goes: what is returned must not live there
            ds = ds.flatten_indices(keep_in_memory=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    version = DataVersion(id=fp_in, sources=dict(splits.fingerprints), rows_in=len(splits.train), rows_out=len(ds),
                          operators=stats, dropped_at_load=_dropped(splits))
    return ds, version


STALE_S = 24 * 3600  # a work folder or half-written entry this old belongs to no running chain


def _sweep(cache: Path) -> None:
    """Remove what chains that were killed left behind: work folders, half-written cache entries."""
    now = time.time()
    for p in [*cache.glob("work-*"), *cache.glob("*.tmp")]:
        try:
            if now - p.stat().st_mtime > STALE_S:
                shutil.rmtree(p, ignore_errors=True)
        except OSError:
            pass


def _dropped(splits) -> dict[str, dict[str, int]]:
    dropped = getattr(splits, "dropped", None) or {}
    return {split: {str(k): int(v) for k, v in reasons.items()} for split, reasons in dropped.items()}


def _inside(ds, folder: Path) -> bool:
    return any(Path(f["filename"]).resolve().is_relative_to(folder.resolve()) for f in ds.cache_files)


def _source(train, folder: Path, work: Path, use_cache: bool):
    """The training split as a memory-mapped dataset: from the cache, or stored there (or in the work
    folder without the cache, when it is large enough for workers to map it)."""
    train = as_dataset(train)
    if use_cache:
        hit = _cache_get(folder)
        if hit is not None:
            return hit[0]
        if train.cache_files and train._indices is None:
            return train  # already memory-mapped
        return _cache_put(folder, train, {"removed": {}, "examples": [], "added": 0, "rows": len(train)}, work)
    if not train.cache_files and len(train) >= PARALLEL_MIN_ROWS:
        return _store(train, work / "source")
    return train


def _store(ds, folder: Path):
    import datasets

    ds.save_to_disk(str(folder))
    return datasets.load_from_disk(str(folder))


def _reads(op: OpBase, base_dir: Path, splits) -> str:
    """What else an operator's output depends on, beside its input rows and config: the task's shape
    (the prompt most operators read), files, the evaluation splits."""

    def fp(path: str) -> str:
        p = Path(path).expanduser()
        p = p if p.is_absolute() else base_dir / p
        return file_fingerprint(p) if p.exists() else "missing"

    template = json.dumps(task_reads(splits.task), sort_keys=True, default=str)
    if isinstance(op, Load):
        return f"{template}|{fp(op.path)}"
    if isinstance(op, Mix):
        return f"{template}|" + ",".join(fp(s.path) for s in op.sources)
    if isinstance(op, Decontaminate):
        dropped = {s: v for s, v in (getattr(splits, "dropped", None) or {}).items() if s != "train"}
        return (f"{template}|{splits.fingerprints['validation']},{splits.fingerprints['test']}|"
                f"{json.dumps(dropped, sort_keys=True, default=str)}")
    return template


def _cache_get(folder: Path):
    import datasets

    meta_file = folder / "meta.json"
    if not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text())
        ds = datasets.load_from_disk(str(folder / "rows"))  # memory-mapped: nothing is read yet
        if meta.get("rows", len(ds)) != len(ds):
            return None
        return ds, meta
    except (OSError, ValueError, FileNotFoundError):
        return None  # a damaged entry is recomputed


def flattened(ds, work: Path):
    """A selection by ascending indices written out as one contiguous Arrow file in ``work``, taken
    record batch by record batch (``save_to_disk`` would take its rows a thousand at a time: twice as
    slow at a million rows) and streamed (the memory of one batch)."""
    import datasets
    import numpy as np
    import pyarrow as pa
    from datasets.arrow_writer import ArrowWriter

    if ds._indices is None or len(ds) < PARALLEL_MIN_ROWS:
        return ds
    idx = ds._indices.column(0).to_numpy().astype(np.int64)
    if len(idx) > 1 and (np.diff(idx) < 0).any():
        return ds  # shuffled (mix): datasets' own way
    batches = ds.data.table.to_batches()
    starts = np.cumsum([0, *(len(b) for b in batches)], dtype=np.int64)
    bounds = np.searchsorted(idx, starts)
    path = work / f"flat-{ds._fingerprint}-{os.getpid()}.arrow"
    writer = ArrowWriter(features=ds.features, path=str(path))
    try:
        for b, start, lo, hi in zip(batches, starts[:-1], bounds[:-1], bounds[1:], strict=True):
            if hi > lo:
                writer.write_table(pa.Table.from_batches([b.take(pa.array(idx[lo:hi] - start))]))
        writer.finalize()
    finally:
        writer.close()
    return datasets.Dataset.from_file(str(path), info=ds.info.copy(), split=ds.split)


def _cache_put(folder: Path, ds, meta: dict, work: Path):
    """Store ``ds`` and its meta; the stored, memory-mapped copy (``ds`` itself if storing failed)."""
    import datasets

    tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        flattened(ds, work).save_to_disk(str(tmp / "rows"))
        (tmp / "meta.json").write_text(json.dumps(meta, default=str))
        if folder.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # another process filled it first
        else:
            os.replace(tmp, folder)
        return datasets.load_from_disk(str(folder / "rows"))
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # caching is an optimisation, never a failure
        return ds
