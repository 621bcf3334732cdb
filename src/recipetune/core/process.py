"""Runs on this machine, each in a fresh subprocess with a timeout.

A throughput measurement needs the hardware to itself: ``MACHINE`` lets a measured run start only
when nothing else of this process runs, and nothing start beside it. A run that measures only its
loss (the guard's parity evidence) may share the machine with other such runs, each holding its
share of the devices (GPUs, or CPU threads): the local executor says so through ``sharing``. A run
that outlives its timeout is killed with its whole process group (torchrun children included).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from recipetune.core.clock import Arrival, LineClock

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
    arrivals: list[Arrival] = field(default_factory=list)  # each line of the timed files, on the guard's clock
    poll_cpu_s: float = 0.0  # CPU the clock's thread used


@dataclass(frozen=True)
class Share:
    """A loss-only run's part of the machine: ``units`` of its ``capacity`` (GPUs, each run pinned to
    its own through ``CUDA_VISIBLE_DEVICES``, or CPU threads). Setting ``cancel`` kills every run of
    that share still going (the executor's ``close``)."""

    units: int
    capacity: int
    gpus: bool = False
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


_SHARE: ContextVar[Share | None] = ContextVar("recipetune_share", default=None)


class Cancelled(RuntimeError):
    """A loss-only run killed (or never started) because its executor was closed (Ctrl-C, an error)."""


class Machine:
    """This machine's hardware: one measured run alone, or loss-only runs side by side within the
    capacity. A measured run waiting goes first (new shared runs wait behind it), so a campaign's
    throughput measurements are never starved by parity runs."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._measured = False
        self._waiting = 0  # measured runs waiting
        self._used = 0  # units held by shared runs
        self._busy: set[int] = set()  # GPUs held by shared runs

    @property
    def waiting(self) -> int:
        """Measured runs waiting for the machine."""
        return self._waiting

    @contextlib.contextmanager
    def use(self) -> Iterator[dict[str, str]]:
        """Hold the machine for one run, as the calling context says (``sharing``); yields the
        environment that pins the run to its share."""
        share = _SHARE.get()
        with self._cond:
            if share is None:
                self._waiting += 1
                try:
                    self._cond.wait_for(lambda: not self._measured and self._used == 0)
                finally:
                    self._waiting -= 1
                self._measured = True
            else:
                units = min(share.units, share.capacity)
                self._cond.wait_for(lambda: not self._measured and not self._waiting
                                    and self._used + units <= share.capacity)
                self._used += units
                mine = [d for d in range(share.capacity) if d not in self._busy][:units] if share.gpus else []
                self._busy.update(mine)
        try:
            if share is not None and share.cancel.is_set():  # closed while this run waited: never start it
                raise Cancelled("the executor was closed") from None
            yield _pin(mine) if share is not None and share.gpus else {}
        finally:
            with self._cond:
                if share is None:
                    self._measured = False
                else:
                    self._used -= units
                    self._busy.difference_update(mine)
                self._cond.notify_all()


def _pin(devices: list[int]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES naming ``devices``, indices into the devices this process may see."""
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return {"CUDA_VISIBLE_DEVICES": ",".join(visible[d] if d < len(visible) else str(d) for d in devices)}


def cancelled() -> bool:
    """Whether the run started in this context was cancelled (its executor closed)."""
    share = _SHARE.get()
    return share is not None and share.cancel.is_set()


MACHINE = Machine()


@contextlib.contextmanager
def sharing(share: Share) -> Iterator[None]:
    """Runs started in this context measure loss only: they may share the machine (``share``)."""
    token = _SHARE.set(share)
    try:
        yield
    finally:
        _SHARE.reset(token)


STOP_FILE = "prune.json"  # in a run's folder: the driver's word to stop it, with why (the run may be on another
# node: the folder is shared)


def tail(path: Path, n_bytes: int = 4000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - n_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@contextlib.contextmanager
def opening(log_dir: Path, env: Mapping[str, str] | None) -> Iterator[dict[str, str]]:
    """How every runner opens a run (``run_process``, workloads/warm.py: ``run_warm``): its log folder,
    its place on the machine (``MACHINE``: a measured run alone, a loss-only run within its share), and
    the child's environment, its pinned devices included."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with MACHINE.use() as pinned:
        yield {**os.environ, **(env or {}), **pinned}


@dataclass
class Watch:
    """What every runner asks each time its child has not ended yet (``must_stop``), and the outcome
    it then reports (``outcome``): the caller's poll, the timeout, the stop file (the pruner's word),
    the executor closing."""

    timeout_s: float | None
    on_poll: Callable[[], None] | None
    stop_file: Path | None
    start: float = field(default_factory=time.perf_counter)
    timed_out: bool = False
    stopped: bool = False

    def must_stop(self) -> bool:
        """True when the child must be killed now (its timeout, or its stop file); raises ``Cancelled``
        when the executor was closed (the caller kills the child with its group)."""
        if self.on_poll:
            self.on_poll()
        self.timed_out = self.timeout_s is not None and time.perf_counter() - self.start > self.timeout_s
        self.stopped = not self.timed_out and self.stop_file is not None and self.stop_file.exists()
        if not (self.timed_out or self.stopped) and cancelled():
            raise Cancelled("the executor was closed") from None
        return self.timed_out or self.stopped

    def outcome(self, returncode: int | None, wall_s: float, log_dir: Path, clock: LineClock) -> ProcessOutcome:
        if self.on_poll:
            self.on_poll()  # the last word: the child's final lines
        return ProcessOutcome(None if self.timed_out else returncode, self.timed_out, wall_s,
                              tail(log_dir / "stderr.log"), self.stopped, clock.arrivals, clock.poll_cpu_s)


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
    timed: Sequence[Path] = (),
) -> ProcessOutcome:
    """Run ``argv`` (no shell) to completion, timeout or ``stop_file``'s appearance; stdout/stderr go to
    files in ``log_dir``. The lines appended to the ``timed`` files (where the metrics come through) are
    stamped on the guard's own clock as they arrive (core/clock.py)."""
    with opening(log_dir, env) as full_env, (log_dir / "stdout.log").open("wb") as out, \
            (log_dir / "stderr.log").open("wb") as err:
        watch = Watch(timeout_s, on_poll, stop_file)
        clock = LineClock(timed, watch.start).__enter__()
        proc = subprocess.Popen(
            list(argv), stdout=out, stderr=err, env=full_env, cwd=cwd, start_new_session=True,
            preexec_fn=_die_with_parent if _prctl is not None else None,
        )
        try:
            while True:
                try:
                    proc.wait(timeout=poll_interval_s)
                    break
                except subprocess.TimeoutExpired:
                    if watch.must_stop():
                        _kill_group(proc)
                        break
        except BaseException:
            _kill_group(proc)  # Ctrl-C in the parent must not leave a trainer running
            raise
        finally:
            clock.__exit__()
        wall = time.perf_counter() - watch.start
    return watch.outcome(proc.returncode, wall, log_dir, clock)


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
