"""Files every layer reads and writes: YAML input files with ``key=value`` overrides, atomic writes,
and a lock file that works across processes and machines sharing a folder.

Here, below the campaign file and the engine, so that a sweep, an experiment or a trial folder can
read its file or write its result without importing either.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from recipetune.core.errors import ConfigError


def write_atomic(path: Path, text: str) -> Path:
    """Write a file atomically: a reader never sees half of it, a crash never leaves half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # One temporary name per writer (process and thread): two writers never share a half-written file.
    tmp = path.with_name(path.name + f".tmp{os.getpid()}-{threading.get_ident()}")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk: no half-written temporary left behind either
        raise
    return path


HOST = socket.gethostname()
LOCK_STALE_S = 120.0  # a lock whose heartbeat is older than this is stale, whoever holds it
HEARTBEAT_S = 10.0  # how often a holder touches its locks (well inside LOCK_STALE_S)
_HELD: set[Path] = set()  # the locks this process holds: the heartbeat touches them
_HELD_LOCK = threading.Lock()
_BEAT: threading.Thread | None = None


def _beat() -> None:
    while True:
        time.sleep(HEARTBEAT_S)
        with _HELD_LOCK:
            held = list(_HELD)
        for path in held:
            with contextlib.suppress(OSError):  # released meanwhile, or taken over: its holder keeps it fresh
                os.utime(path)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


class FileLock:
    """One holder at a time, across threads, processes and machines sharing the folder.

    The lock is a file created with O_CREAT | O_EXCL (atomic on local file systems and NFS v3+) that
    names its holder: host, pid, since. While held, a heartbeat thread touches it every HEARTBEAT_S.
    It is stale, and taken over, when its holder is dead: on this host, its pid is gone (a kill -9
    leaves the file); on any host, its heartbeat is older than ``stale_s`` (a dead machine, or a pid
    reused). Taking over is itself serialized by a second O_EXCL file, so two waiters never both
    break a lock and one of them the new holder's."""

    def __init__(self, path: Path, stale_s: float = LOCK_STALE_S):
        self.path, self.stale_s = path, stale_s
        self.token = ""  # ours while we hold it

    def acquire(self) -> bool:
        """Take the lock if it is free or stale; False if a live holder has it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self._break_if_stale():
                    return False
                continue
            self.token = uuid.uuid4().hex
            holder = {"host": HOST, "pid": os.getpid(), "since": time.time(), "token": self.token}
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(holder))
            _hold(self.path)
            return True
        return False

    def release(self) -> None:
        """Give it up; a lock taken over meanwhile (ours judged stale) is left to its new holder."""
        with _HELD_LOCK:
            _HELD.discard(self.path)
        if self.token and (self.holder() or {}).get("token") == self.token:
            self.path.unlink(missing_ok=True)
        self.token = ""

    def holder(self) -> dict[str, Any] | None:
        """Who holds it (None: nobody, or a holder still writing its name)."""
        try:
            info = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return info if isinstance(info, dict) else None

    def stale(self) -> str:
        """Why the lock is stale ('' while its holder may be alive, or when there is no lock)."""
        try:
            age = time.time() - self.path.stat().st_mtime
        except OSError:
            return ""
        if age > self.stale_s:
            return f"its heartbeat is {age:.0f} s old (more than {self.stale_s:.0f} s)"
        info = self.holder()
        if info is not None and info.get("host") == HOST and isinstance(info.get("pid"), int) \
                and not pid_alive(info["pid"]):
            return f"its holder, process {info['pid']} on this host, is gone"
        return ""

    def held_by_other(self) -> bool:
        """A live holder other than this object has it."""
        return self.path.exists() and not self.token and not self.stale()

    def _break_if_stale(self) -> bool:
        """Remove a stale lock (True); False when it is alive or another waiter is breaking it."""
        seen = self._text()
        if seen is None:
            return True  # released meanwhile: try again
        if not self.stale():
            return False
        breaker = self.path.with_name(self.path.name + ".break")
        try:
            os.close(os.open(breaker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            try:  # a breaker that died within these few lines leaves its file: old, it is removed
                if time.time() - breaker.stat().st_mtime > self.stale_s:
                    breaker.unlink(missing_ok=True)
            except OSError:
                pass
            return False
        try:
            if self._text() == seen:  # still the stale holder's, not a new holder's
                self.path.unlink(missing_ok=True)
            return True
        finally:
            breaker.unlink(missing_ok=True)

    def _text(self) -> str | None:
        try:
            return self.path.read_text()
        except OSError:
            return None


def _hold(path: Path) -> None:
    global _BEAT
    with _HELD_LOCK:
        _HELD.add(path)
        if _BEAT is None:
            _BEAT = threading.Thread(target=_beat, name="lock-heartbeat", daemon=True)
            _BEAT.start()


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
