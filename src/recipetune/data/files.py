"""A data file on disk: its kind, its rows as a ``datasets.Dataset``, where a row lives, its fingerprint.

Files: JSONL (``.jsonl``, or ``.json`` lines or array), CSV, Parquet, or a folder written by
``datasets``' ``save_to_disk`` (a ``DatasetDict`` folder gives the split of the same name; another
split is named by its subfolder, ``data/dev``). Columns keep their types: a list of messages stays a
list. Read by a task's splits (finetune/task.py) and by the data chain's steps alike.

Cells are read as written. A CSV cell that reads ``None``, ``NA``, ``null`` or ``nan`` is that text
(pandas would guess a missing value from a list of such strings, so a Python literal ``None`` would
train as an empty input); a missing value is only a cell the file leaves empty. A file without rows
(empty, blank lines, ``[]``, a CSV header alone, a Parquet file or ``save_to_disk`` folder of 0 rows)
is bad input naming the file, as is any file ``datasets`` cannot read.
"""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

FILE_KINDS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
# pandas' read_csv options that make a CSV cell what it says: only an empty cell is missing
CSV_AS_WRITTEN = {"keep_default_na": False, "na_values": [""]}


class DataFileError(ValueError):
    """A file that cannot be read as data; ``field`` is the dotted field of the experiment file that names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def split_path(path: Path, split: str, field: str) -> Path:
    """A DatasetDict folder stands for its split of the same name (``path/<split>``); other paths as they are."""
    if not (path / "dataset_dict.json").is_file():
        return path
    splits = _dict_splits(path)
    if split not in splits:
        raise DataFileError(field, f"{path} is a DatasetDict folder without a split '{split}' (splits: "
                               f"{', '.join(splits)}); name the one to use, e.g. {path / splits[0]}")
    return path / split


def _dict_splits(path: Path) -> list[str]:
    try:
        return list(json.loads((path / "dataset_dict.json").read_text())["splits"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def read_rows(path: Path, field: str = "task.files"):
    """A local file or ``save_to_disk`` folder as a ``datasets.Dataset``, its columns' types kept."""
    import datasets

    datasets.disable_progress_bars()
    if path.is_dir():
        if (path / "dataset_dict.json").is_file():
            splits = _dict_splits(path)
            raise DataFileError(field, f"{path} holds a DatasetDict (splits: {', '.join(splits)}): name the split's "
                                   f"folder, e.g. {path / (splits[0] if splits else 'train')}")
        if not (path / "state.json").is_file():
            raise DataFileError(field, f"{path}: a folder must be one written by datasets' save_to_disk "
                                   "(state.json, dataset_info.json)")
        if _no_shards(path):  # load_from_disk fails on a folder of 0 rows with an IndexError of its own
            raise DataFileError(field, f"{path}: the folder holds no rows (a dataset of 0 rows was saved)")
        try:
            ds = datasets.load_from_disk(str(path), keep_in_memory=True)
        except Exception as e:  # a damaged folder comes in many shapes; all are bad input
            raise DataFileError(field, f"{path}: cannot load it with datasets.load_from_disk: {_said(e)}") from None
    else:
        kind = FILE_KINDS.get(path.suffix.lower())
        if kind is None:
            raise DataFileError(field, f"{path}: unknown file type; allowed: {', '.join(FILE_KINDS)} files, "
                                   "or a folder written by datasets' save_to_disk")
        if not path.is_file():
            raise DataFileError(field, f"{path}: no such file")
        if (empty := _without_rows(path, kind)) is not None:
            raise DataFileError(field, f"{path}: the file holds no rows ({empty}); a data file needs at least one")
        read = {"json": datasets.Dataset.from_json, "parquet": datasets.Dataset.from_parquet,
                "csv": lambda p, **kw: datasets.Dataset.from_csv(p, **CSV_AS_WRITTEN, **kw)}[kind]
        try:
            ds = read(str(path), keep_in_memory=True)
        except Exception as e:  # malformed files come in many shapes; all are bad input
            raise DataFileError(field, f"{path}: cannot read it as {kind}: {_said(e)}") from None
    if len(ds) == 0:
        raise DataFileError(field, f"{path}: the file holds no rows")
    return ds


def _said(e: Exception) -> str:
    """An exception's first line, or its type when it says nothing (``IndexError()``)."""
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else type(e).__name__


def _without_rows(path: Path, kind: str) -> str | None:
    """Why a file holds no rows (it is empty, blank, ``[]``, a CSV header alone, a Parquet file of 0
    rows), else None; read as far as the first row, so a large file costs nothing here."""
    if kind == "parquet":
        if path.stat().st_size == 0:
            return "an empty file"
        import pyarrow.parquet as pq

        try:
            return "a Parquet file of 0 rows" if pq.read_metadata(path).num_rows == 0 else None
        except Exception:  # not Parquet at all: datasets says so below
            return None
    with path.open(newline="", errors="replace") as f:
        if kind == "csv":
            records = (r for r in csv.reader(f) if any(cell.strip() for cell in r))
            if next(records, None) is None:
                return "an empty file"
            return "a header and no rows" if next(records, None) is None else None
        head = ""
        while not head and (chunk := f.read(1 << 16)):
            head = chunk.lstrip()
        if not head:
            return "an empty file" if path.stat().st_size == 0 else "blank lines only"
        if head.startswith("["):  # a JSON array: empty when its first value is its end
            rest = head[1:].lstrip() or f.read(1 << 16).lstrip()
            return "an empty JSON array" if rest.startswith("]") else None
    return None


def _no_shards(path: Path) -> bool:
    try:
        return not json.loads((path / "state.json").read_text()).get("_data_files")
    except (OSError, ValueError, AttributeError):
        return False  # load_from_disk says what is wrong


def row_position(path: Path, index: int) -> str:
    """Where row ``index`` (0-based) of a file is: its 1-based line in a JSONL or CSV file, else its index."""
    kind = None if path.is_dir() else FILE_KINDS.get(path.suffix.lower())
    starts: list[int] | None = None
    if kind == "json":
        text = path.read_text(errors="replace")
        if not text.lstrip().startswith("["):  # JSON lines; datasets skips blank ones
            starts = [n for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    elif kind == "csv":
        starts, end = [], 0
        with path.open(newline="", errors="replace") as f:
            reader = csv.reader(f)
            for record in reader:  # a quoted cell may span lines: a record starts after the last one ended
                if record:
                    starts.append(end + 1)
                end = reader.line_num
        starts = starts[1:]  # the header
    if starts is not None and index < len(starts):
        return f"{path} line {starts[index]}"
    return f"{path} row index {index}"


def file_fingerprint(path: Path) -> str:
    """sha256 of a file, or of a folder's files and their names (a save_to_disk folder)."""
    if not path.is_dir():
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(path)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]
