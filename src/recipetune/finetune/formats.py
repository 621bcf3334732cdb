"""What a task's files hold: the file kinds, the conversations in them, and where a row lives in its file.

Files: JSONL (``.jsonl``, or ``.json`` lines or array), CSV, Parquet, or a folder written by
``datasets``' ``save_to_disk`` (a ``DatasetDict`` folder gives the split of the same name; another
split is named by its subfolder, ``data/dev``). Columns keep their types: a list of messages stays a
list. A CSV cell cannot hold one, so a messages cell is read as JSON text, or as the Python literal
pandas writes for a list column (parsed by ``ast.literal_eval``, never evaluated).

The dataset shapes themselves (``task.format``) are ``TaskConfig``'s, in task.py; a conversation's
plain rendering, used everywhere but the HF route's chat template, is ``chat_text``.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import json
from pathlib import Path
from typing import Any

FILE_KINDS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
ROLES = ("system", "user", "assistant")
Message = dict[str, str]


class TaskError(ValueError):
    """Bad task input; ``field`` is the dotted field of the experiment file it concerns."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


class RowProblem(ValueError):
    """A row the task cannot use. ``reason`` is what drop mode counts it under, ``field`` the experiment
    file's field the error names, and the message says what is wrong with this row."""

    def __init__(self, reason: str, field: str, message: str):
        self.reason, self.field = reason, field
        super().__init__(message)


# -- conversations -----------------------------------------------------------------------------------


def parse_messages(value: Any, column: str) -> list[Message]:
    """A cell of ``{role, content}`` messages, checked; RowProblem when it is not one."""
    if isinstance(value, str):  # a CSV cell: JSON text, or the Python literal pandas writes
        value = _literal(value)
    if value is None:
        raise RowProblem("missing target", "task.target", f"the column '{column}' is missing")
    if not isinstance(value, list) or not value:
        raise RowProblem("malformed messages", "task.target",
                         f"the column '{column}' must be a non-empty list of {{role, content}} messages")
    out = []
    for i, m in enumerate(value):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(content, str | None):
            raise RowProblem("malformed messages", "task.target",
                             f"message {i} of '{column}' must be {{role, content}} with role one of "
                             f"{', '.join(ROLES)} and text content; got {str(m)[:80]}")
        out.append({"role": m["role"], "content": content or ""})
    return out


def as_messages(value: Any) -> list | None:
    """A cell that holds messages (a list of dicts with a role, or its JSON or Python-literal text, as a
    CSV cell or a stringified row has it), as a list; None for anything else, a text prompt above all."""
    if isinstance(value, str) and value.lstrip().startswith("["):
        value = _literal(value)
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        return value
    return None


def _literal(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text  # refused by the caller as not a list


def answer_of(conversation: list[Message]) -> str:
    """The final assistant message: the answer the model is trained on and scored against."""
    last = conversation[-1]
    if last["role"] != "assistant":
        raise RowProblem("no final assistant message", "task.target",
                         f"the conversation ends with a {last['role']} message, not the assistant's answer")
    if not last["content"].strip():
        raise RowProblem("empty target", "task.target", "the final assistant message is empty")
    return last["content"].strip()


def before_answer(conversation: list[Message]) -> list[Message]:
    """The prompt of a conversation: every message before the final assistant one."""
    return conversation[:-1] if conversation[-1]["role"] == "assistant" else conversation


def chat_text(messages: list[Message]) -> str:
    """The plain rendering (the reference route, reports, dedup): ``System: ...\\nUser: ...\\nAssistant: ``;
    the answer follows, then the task's stop string (a newline by default), like every earlier turn."""
    return "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant: "


# -- files -------------------------------------------------------------------------------------------


def split_path(path: Path, split: str, field: str) -> Path:
    """A DatasetDict folder stands for its split of the same name (``path/<split>``); other paths as they are."""
    if not (path / "dataset_dict.json").is_file():
        return path
    splits = _dict_splits(path)
    if split not in splits:
        raise TaskError(field, f"{path} is a DatasetDict folder without a split '{split}' (splits: "
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
            raise TaskError(field, f"{path} holds a DatasetDict (splits: {', '.join(splits)}): name the split's "
                                   f"folder, e.g. {path / (splits[0] if splits else 'train')}")
        if not (path / "state.json").is_file():
            raise TaskError(field, f"{path}: a folder must be one written by datasets' save_to_disk "
                                   "(state.json, dataset_info.json)")
        try:
            ds = datasets.load_from_disk(str(path), keep_in_memory=True)
        except Exception as e:  # a damaged folder comes in many shapes; all are bad input
            raise TaskError(field, f"{path}: cannot load it with datasets.load_from_disk: "
                                   f"{str(e).splitlines()[0][:200]}") from None
    else:
        kind = FILE_KINDS.get(path.suffix.lower())
        if kind is None:
            raise TaskError(field, f"{path}: unknown file type; allowed: {', '.join(FILE_KINDS)} files, "
                                   "or a folder written by datasets' save_to_disk")
        if not path.is_file():
            raise TaskError(field, f"{path}: no such file")
        try:
            ds = {"json": datasets.Dataset.from_json, "csv": datasets.Dataset.from_csv,
                  "parquet": datasets.Dataset.from_parquet}[kind](str(path), keep_in_memory=True)
        except Exception as e:  # malformed files come in many shapes; all are bad input
            raise TaskError(field, f"{path}: cannot read it as {kind}: {str(e).splitlines()[0][:200]}") from None
    if len(ds) == 0:
        raise TaskError(field, f"{path}: the file holds no rows")
    return ds


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
