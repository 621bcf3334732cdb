"""Files every layer reads and writes: YAML input files with ``key=value`` overrides, atomic writes.

Here, below the campaign file and the engine, so that a sweep, an experiment or a trial folder can
read its file or write its result without importing either.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from recipetune.core.errors import ConfigError


def write_atomic(path: Path, text: str) -> Path:
    """Write a file atomically: a reader never sees half of it, a crash never leaves half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: no half-written temporary left behind either
        raise
    return path


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML file whose top is a mapping of sections; ConfigError names the file and what is wrong."""
    if not path.is_file():
        raise ConfigError(path, "", "no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(path, "", f"not a text file: byte {e.start} is not UTF-8 (a campaign file is YAML text)") \
            from None
    except OSError as e:
        raise ConfigError(path, "", f"cannot read: {e.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(path, where, f"malformed YAML: {getattr(e, 'problem', e)}") from None
    except RecursionError:
        raise ConfigError(path, "", "nested too deeply to be a campaign file") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(path, "", f"expected a mapping of sections at the top, got {type(raw).__name__}")
    return raw


def parse_override(text: str, fields: Collection[str], default_section: str) -> tuple[list[str], Any]:
    """``micro_batch_size=16`` sets a key of ``default_section``; a dotted key (``run.steps=50``) any
    field. ``fields`` are the top-level sections of the file; a key naming none of them is the default
    section's."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError("command line", text, "an override must look like key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    path = key.strip().split(".")
    if path[0] not in fields:
        path = [default_section, *path]
    return path, value


def apply_overrides(
    raw: dict[str, Any], overrides: list[str], fields: Collection[str], default_section: str
) -> dict[str, Any]:
    """``raw`` (a file's sections) with each override set in it, sections created as needed."""
    for text in overrides:
        path, value = parse_override(text, fields, default_section)
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError("command line", text, f"'{part}' is not a section")
            node = child
        node[path[-1]] = value
    return raw
