"""What a task's rows hold: the conversations in them, and the errors a row or a task can have.

The files themselves (JSONL, CSV, Parquet, ``save_to_disk`` folders; where a row lives in its file;
fingerprints) are read by data/files.py, which the data chain shares. A CSV cell cannot hold a list,
so a messages cell is read as JSON text, or as the Python literal pandas writes for a list column
(parsed by ``ast.literal_eval``, never evaluated).

The dataset shapes themselves (``task.format``) are ``TaskConfig``'s, in task.py; a conversation's
plain rendering, used everywhere but the HF route's chat template, is ``chat_text``.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from recipetune.data.files import DataFileError

ROLES = ("system", "user", "assistant")
Message = dict[str, str]


class TaskError(DataFileError):
    """Bad task input; ``field`` is the dotted field of the experiment file it concerns. A file that
    cannot be read at all is its base, data/files.py's DataFileError: catch that for both."""


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
