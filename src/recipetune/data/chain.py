"""A YAML chain of data operators over the task's training split, cached by fingerprint.

Every step's output is cached under ``<cache>/data/<key>`` (``datasets.save_to_disk``), where the
key hashes the input rows' fingerprint, the operator's config and whatever else it reads (source
files, the evaluation splits' fingerprints for decontamination). The ``DataVersion`` records, per
operator, the fingerprints in and out, the rows in and out, what was removed and why, and whether it
came from the cache: what an experiment trained on, exactly.

Decontamination is always on: a chain without a ``decontaminate`` step gets one (defaults) before
its first ``export``, or at the end.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from recipetune.data.ops import Context, Decontaminate, Export, Load, Mix, OpBase, Row, apply, write_rows

CACHE_VERSION = "1"  # bump when an operator's behaviour changes, so stale outputs are not reused


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

    def removed_total(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.operators:
            for reason, n in s.removed.items():
                out[reason] = out.get(reason, 0) + n
        return out


def rows_fingerprint(rows: list[Row]) -> str:
    h = hashlib.sha256()
    for row in rows:
        h.update(json.dumps(row, sort_keys=True, default=str).encode() + b"\n")
    return h.hexdigest()[:16]


def as_rows(ds) -> list[Row]:
    """A dataset as rows of strings: files of any format then mix, and fingerprints are stable."""
    return [{k: None if v is None else str(v) for k, v in row.items()} for row in ds]


def with_decontamination(chain: list[OpBase]) -> tuple[list[OpBase], int | None]:
    """The chain as it runs, and the position of the step added implicitly (None if declared)."""
    if any(isinstance(op, Decontaminate) for op in chain):
        return list(chain), None
    at = next((i for i, op in enumerate(chain) if isinstance(op, Export)), len(chain))
    return [*chain[:at], Decontaminate(op="decontaminate"), *chain[at:]], at


def _cache_root() -> Path:
    from recipetune.measure import cache_dir

    return cache_dir() / "data"


def run_chain(
    chain: list[OpBase], splits, base_dir: Path, out_dir: Path | None = None, cache: Path | None = None,
    use_cache: bool = True,
) -> tuple[list[Row], DataVersion]:
    """Run the chain on ``splits.train``; raise ChainError when a step fails or leaves no rows."""
    import datasets

    from recipetune.finetune.task import TaskError, file_fingerprint, read_rows

    datasets.disable_progress_bars()
    cache = cache or _cache_root()
    task = splits.task
    steps, implicit_at = with_decontamination(chain)

    def read_file(path: str, field: str) -> list[Row]:
        p = Path(path).expanduser()
        p = p if p.is_absolute() else (base_dir / p).resolve()
        return as_rows(read_rows(p, field))

    ctx = Context(render=task.render, prompt_fields=task.fields(), base_dir=base_dir, out_dir=out_dir,
                  read_file=read_file, contamination_index=splits.contamination_index,
                  parts=task.input_parts)
    rows = as_rows(splits.train)
    stats: list[OperatorStats] = []
    for i, op in enumerate(steps):
        field = f"data.{i}" if implicit_at is None or i < implicit_at else f"data.{i - 1}"
        fp_in = rows_fingerprint(rows)
        extra = _reads(op, base_dir, splits, file_fingerprint)
        key = hashlib.sha256(f"{CACHE_VERSION}|{fp_in}|{op.model_dump_json()}|{extra}".encode()).hexdigest()[:24]
        folder = cache / key
        t0 = time.perf_counter()
        hit = None
        if use_cache and not isinstance(op, Export):
            hit = _cache_get(folder)
        if hit is not None:
            out_rows, meta = hit
        else:
            try:
                outcome = apply(op, rows, ctx)
            except (TaskError, ValueError, KeyError) as e:
                sub = getattr(e, "field", "")
                raise ChainError(f"{field}.{sub}" if sub else f"{field}.op", f"{op.op}: {e}") from None
            out_rows = outcome.rows
            meta = {"removed": dict(outcome.removed), "examples": outcome.examples, "added": outcome.added}
        if not out_rows:
            raise ChainError(f"{field}.op", f"step {i} ({op.op}) leaves no training rows "
                                            f"({len(rows)} in; removed: {meta['removed']})")
        if hit is None and use_cache and not isinstance(op, Export):
            _cache_put(folder, out_rows, meta)
        stats.append(OperatorStats(
            index=i, op=op.op, config=op.model_dump(exclude={"op"}), rows_in=len(rows), rows_out=len(out_rows),
            added=meta["added"], removed=meta["removed"], examples=meta["examples"], fingerprint_in=fp_in,
            fingerprint_out=rows_fingerprint(out_rows), cached=hit is not None,
            seconds=round(time.perf_counter() - t0, 4), implicit=i == implicit_at,
        ))
        rows = out_rows
    for path, exported in ctx.exports:
        write_rows(path, exported)
    version = DataVersion(id=rows_fingerprint(rows), sources=dict(splits.fingerprints),
                          rows_in=len(splits.train), rows_out=len(rows), operators=stats)
    return rows, version


def _reads(op: OpBase, base_dir: Path, splits, file_fingerprint) -> str:
    """What else an operator's output depends on, beside its input rows and config."""

    def fp(path: str) -> str:
        p = Path(path).expanduser()
        p = p if p.is_absolute() else base_dir / p
        return file_fingerprint(p) if p.is_file() else "missing"

    if isinstance(op, Load):
        return fp(op.path)
    if isinstance(op, Mix):
        return ",".join(fp(s.path) for s in op.sources)
    if isinstance(op, Decontaminate):
        return f"{splits.fingerprints['validation']},{splits.fingerprints['test']}"
    return ""


def _cache_get(folder: Path) -> tuple[list[Row], dict] | None:
    import datasets

    meta_file = folder / "meta.json"
    if not meta_file.is_file():
        return None
    try:
        meta = json.loads(meta_file.read_text())
        return as_rows(datasets.load_from_disk(str(folder / "rows"))), meta
    except (OSError, ValueError, FileNotFoundError):
        return None  # a damaged entry is recomputed


def _cache_put(folder: Path, rows: list[Row], meta: dict) -> None:
    import datasets

    tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        datasets.Dataset.from_list(rows).save_to_disk(str(tmp / "rows"))
        (tmp / "meta.json").write_text(json.dumps(meta, default=str))
        if folder.exists():
            shutil.rmtree(tmp, ignore_errors=True)  # another process filled it first
        else:
            os.replace(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # caching is an optimisation, never a failure
