"""Runs on this machine: one at a time, each in a fresh subprocess with a timeout.

A throughput measurement needs the hardware to itself, so a process-wide lock keeps local runs
exclusive. A run that outlives its timeout is killed with its whole process group (torchrun
children included).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_EXCLUSIVE = threading.Lock()
PR_SET_PDEATHSIG = 1
try:  # resolved here: the child, between fork and exec, must not load anything
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the runner that started it dies (a Ray worker
    killed mid-run, a campaign killed with -9), so a trainer never outlives its runner."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class ProcessOutcome:
    returncode: int | None  # None when killed for its timeout
    timed_out: bool
    wall_s: float
    stderr_tail: str
    stopped: bool = False  # killed because its stop file appeared (a search's pruner said stop)


STOP_FILE = "prune.json"  # in a run's folder: the driver's word to stop it, with why (the run may be on another
# node: the folder is shared)


def tail(path: Path, n_bytes: int = 4000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - n_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def run_process(
    argv: Sequence[str],
    *,
    log_dir: Path,
    timeout_s: float | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    on_poll: Callable[[], None] | None = None,
    poll_interval_s: float = 0.25,
    stop_file: Path | None = None,
) -> ProcessOutcome:
    """Run ``argv`` (no shell) to completion, timeout or ``stop_file``'s appearance; stdout/stderr go to
    files in ``log_dir``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stdout_path, stderr_path = log_dir / "stdout.log", log_dir / "stderr.log"
    full_env = {**os.environ, **(env or {})}
    with _EXCLUSIVE, stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            list(argv), stdout=out, stderr=err, env=full_env, cwd=cwd, start_new_session=True,
            preexec_fn=_die_with_parent if _prctl is not None else None,
        )
        timed_out = stopped = False
        try:
            while True:
                try:
                    proc.wait(timeout=poll_interval_s)
                    break
                except subprocess.TimeoutExpired:
                    if on_poll:
                        on_poll()
                    if timeout_s is not None and time.perf_counter() - start > timeout_s:
                        timed_out = True
                        _kill_group(proc)
                        break
                    if stop_file is not None and stop_file.exists():
                        stopped = True
                        _kill_group(proc)
                        break
        except BaseException:
            _kill_group(proc)  # Ctrl-C in the parent must not leave a trainer running
            raise
        wall = time.perf_counter() - start
    if on_poll:
        on_poll()
    return ProcessOutcome(None if timed_out else proc.returncode, timed_out, wall, tail(stderr_path), stopped)


def kill_orphans(run_dir: str | None) -> None:
    """A runner killed with SIGKILL (a campaign, a Ray worker) leaves its trainer behind: it would
    steal the hardware from every later measurement. Kill processes whose command line names that
    run's folder (this machine only)."""
    if not run_dir or not Path("/proc").is_dir():
        return
    needle = run_dir.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
