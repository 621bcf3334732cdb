"""Bad input, reported once and completely: the file, every invalid field, and what each allows.

``ConfigError`` is what every command turns into exit code 2; ``validation_error`` is the one
conversion of a pydantic ``ValidationError`` into it, so every file format (campaign, experiment,
sweep, playbook) reports its mistakes the same way: all of them at once, with the allowed values.

A missing optional extra is bad input too: ``missing_extra`` turns the ``ModuleNotFoundError`` into
the ``pip install`` line (the command line does it for every command), ``require_extra`` refuses
before anything runs where a command knows what it will import.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError


class ConfigError(Exception):
    """Bad input: the file, the field, and what is wrong. The CLI turns it into exit code 2."""

    def __init__(self, file: str | Path, field: str, message: str):
        self.file, self.field, self.message = str(file), field, message
        where = f"{self.file}: {field}" if field else self.file
        super().__init__(f"{where}: {message}")


class _FileError(Protocol):
    def __init__(self, file: str, field: str, message: str) -> None: ...


E = TypeVar("E", bound=_FileError)

# pydantic's bound errors: the error type -> the ctx key that holds the bound, and how it reads
_BOUNDS = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"),
           "less_than_equal": ("le", "<="), "less_than": ("lt", "<")}


def _choices(expected: str) -> str:
    """pydantic writes ``'a', 'b' or 'c'`` (a union's tags: ``'a', 'b'``); one list reads better."""
    head, sep, tail = expected.rpartition(" or ")
    if sep:
        return f"one of {head}, {tail}"
    return f"one of {expected}" if "," in expected else expected


def _field(prefix: str, loc: tuple[Any, ...]) -> str:
    # "function-after[...]" entries name a validator, not a field the user wrote
    parts = [str(p) for p in loc if not str(p).startswith("function-")]
    return ".".join(p for p in (prefix, *parts) if p)


def _message(err: Any) -> tuple[tuple[Any, ...], str]:
    """The location and a message that says what is allowed, where pydantic knows it."""
    loc, ctx, kind = tuple(err["loc"]), err.get("ctx") or {}, err["type"]
    got = f" (got {err['input']!r})"
    if kind in ("literal_error", "enum") and "expected" in ctx:
        return loc, f"must be {_choices(str(ctx['expected']))}{got}"
    if kind == "union_tag_invalid" and "expected_tags" in ctx:
        key = str(ctx.get("discriminator", "")).strip("'")
        return (*loc, key) if key else loc, f"must be {_choices(str(ctx['expected_tags']))} (got {ctx.get('tag')!r})"
    if kind in _BOUNDS and _BOUNDS[kind][0] in ctx:
        key, op = _BOUNDS[kind]
        bound = ctx[key]  # a float field's bound of 1 reads 1.0 in pydantic; the user wrote 1
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return loc, f"must be {op} {bound}{got}"
    return loc, str(err["msg"]).removeprefix("Value error, ")


def validation_error(
    e: ValidationError, file: str | Path, prefix: str = "", skip: int = 0, error: type[E] = ConfigError  # type: ignore[assignment]
) -> E:
    """Every invalid field of ``e``, each with its allowed values: ``file: a.b: must be ...; c: ...``.

    ``prefix`` is where the validated value sits in the file (``search.data.dedup``); ``skip`` drops
    leading location parts that name no field (a tagged union's tag); ``error`` is the exception type
    the caller raises (a playbook has its own). ``field`` is the first invalid field, so code that
    reads it still finds one; the message names the others.
    """
    problems: list[tuple[str, str]] = []
    for err in e.errors():
        loc, message = _message(err)
        problem = (_field(prefix, loc[skip:]), message)
        if problem not in problems:  # a union reports the same mistake once per branch
            problems.append(problem)
    if not problems:  # never raised by pydantic, but an empty error must still say something
        return error(str(file), prefix, str(e))
    (field, first), rest = problems[0], problems[1:]
    return error(str(file), field, "; ".join([first, *(f"{f}: {m}" if f else m for f, m in rest)]))


# A module of an optional extra (pyproject.toml's [project.optional-dependencies]) -> the extra, and
# what in recipetune needs it. The smallest extra that holds the module is named.
EXTRAS: dict[str, tuple[str, str]] = {
    "ray": ("ray", "the Ray executor (--executor ray)"),
    "psycopg": ("postgres", "a PostgreSQL study (search.storage: postgresql://...)"),
    "mlflow": ("mlflow", "the MLflow export (--mlflow)"),
    "openai": ("llm", "the llm proposer (search.proposer: llm)"),
    "datasets": ("data", "the data chain"),
    "transformers": ("finetune", "the Hugging Face route (model.kind: hf)"),
    "trl": ("finetune", "the Hugging Face route (model.kind: hf)"),
    "tokenizers": ("finetune", "the Hugging Face route (model.kind: hf)"),
    "accelerate": ("finetune", "the Hugging Face route (model.kind: hf)"),
    "peft": ("finetune", "LoRA fine-tuning (method: lora)"),
    "xxhash": ("finetune", "the data chain's deduplication"),
    "rapidfuzz": ("finetune", "the edit-distance metric"),
    "rouge_score": ("finetune", "the ROUGE metric"),
    "sklearn": ("finetune", "the F1 metric"),
}
_PACKAGE = {"sklearn": "scikit-learn"}  # what pip calls a module whose package is named otherwise


def extra_hint(module: str, what: str | None = None) -> str:
    """``<what> needs <module>, an optional extra: pip install 'recipetune[<extra>]'``."""
    extra, user = EXTRAS[module]
    return f"{what or user} needs {_PACKAGE.get(module, module)}, an optional extra: pip install 'recipetune[{extra}]'"


def missing_extra(e: BaseException) -> str | None:
    """The install hint when ``e`` (or an error it was raised from: optuna and sqlalchemy wrap the
    import of a database driver) is a missing module of an optional extra; None for any other error.

    Only the package itself missing counts: a submodule missing from an installed package is a
    version mismatch, which ``pip install`` of the extra would not necessarily fix; that stays a bug."""
    seen: set[int] = set()
    current: BaseException | None = e
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ModuleNotFoundError) and current.name in EXTRAS:
            return extra_hint(current.name)
        current = current.__cause__ or current.__context__
    return None


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (a heavy one takes seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent missing, or a module left without a spec
        return False


def require_extra(modules: Iterable[str], file: str | Path, field: str = "") -> None:
    """Refuse, before anything runs, what needs a module of an optional extra that is not installed
    (each module of ``EXTRAS``; the first missing one is named, with what needs it)."""
    for module in modules:
        if not installed(module):
            raise ConfigError(file, field, extra_hint(module))
