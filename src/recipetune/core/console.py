"""How every command reports a failure: ``error: ...`` in red on stderr, and the exit code; and
which progress lines are kept (``Note``).

On stderr, so a command whose stdout carries data (``verify --json``) keeps it clean; soft-wrapped,
so a long path is never split across lines; as plain text, so a message with ``[brackets]`` (a
list of values, a path) is printed as written and not read as markup.
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.text import Text

errors = Console(stderr=True, soft_wrap=True)


class Note(str):
    """A progress line that belongs in the record (a verdict's plan, a look's outcome), not only on a
    spinner: a command prints it and keeps it, on a terminal and in a log; other progress lines say
    what runs now and may be shown in passing or dropped."""


def fail(message: object, code: int = 2) -> typer.Exit:
    """Print the error and return the Exit to raise: ``raise fail(e) from None``.

    Code 2 (the default) is bad input; commands document their other codes."""
    errors.print(Text.assemble(("error: ", "bold red"), str(message)))
    return typer.Exit(code)
