"""Where runs happen: the Executor interface and the local executor.

A throughput measurement needs the hardware to itself, so the local executor runs a measured run
(a trial, a speed pair) in the caller's thread, alone on the machine (core/process.py: MACHINE):
Ctrl-C then reaches the wait loop of ``run_process``, which kills the run's whole process group
before the campaign stops. A run that measures only its loss (``measured=False``: the guard's
parity evidence) may run beside other such runs, as many at once as the machine has devices (GPUs,
each run pinned to its own; on a CPU, its cores over the threads a run uses), in a pool of threads.

``submit`` runs one recipe; ``call`` runs one unit of several runs that must see the same hardware
(the baseline profile, a verdict's interleaved speed pairs) on one placement. ``parallel`` says how
many trials the campaign may keep in flight; ``close`` stops what is left.
execute/factory.py makes the one a campaign's ``execute:`` section names.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from recipetune.core.measure import RunResult
from recipetune.core.process import Cancelled, Share, sharing
from recipetune.core.recipe import Recipe
from recipetune.workloads.base import ProgressFn, Workload

T = TypeVar("T")


class TrialLost(Exception):
    """The process or node running a trial died (after its retries): no result exists."""


class Executor(Protocol):
    parallel: int

    def submit(
        self,
        workload: Workload,
        recipe: Recipe,
        steps: int,
        out_dir: Path,
        timeout_s: float | None,
        progress: ProgressFn | None = None,
        measured: bool = True,
    ) -> Future[RunResult]:
        """Run ``recipe``; ``measured=False``: only its loss counts, it may share its placement's
        machine with other such runs (never with a measured one)."""

    def call(self, fn: Callable[..., T], workload: Workload | None, *args: Any, **kwargs: Any) -> Future[T]:
        """``fn(workload, *args, **kwargs)`` on one placement (a guard measurement); with no workload,
        ``fn(*args, **kwargs)`` (a fine-tuning child, a final evaluation)."""

    def loss_runs_at_once(self, workload: Workload, recipe: Recipe) -> int:
        """How many loss-only runs of ``recipe`` run side by side (what a verdict's plan counts on)."""

    def close(self) -> None: ...


def _done(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
    future: Future[T] = Future()
    try:
        future.set_result(fn(*args, **kwargs))
    except Exception as e:  # the caller sees it through the future, as with any executor
        future.set_exception(e)
    return future


def visible_gpus() -> int:
    """GPUs this process may use, without importing torch: CUDA_VISIBLE_DEVICES where set, else the
    NVIDIA driver's list (0 on a machine without one)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return len([d for d in listed.split(",") if d.strip() and d.strip() != "-1"])
    gpus = Path("/proc/driver/nvidia/gpus")
    return sum(1 for _ in gpus.iterdir()) if gpus.is_dir() else 0


def local_share(workload: Workload, recipe: Recipe, at_once: int | None = None,
                cancel: threading.Event | None = None) -> Share:
    """A loss-only run's part of this machine: its GPUs out of the visible ones; on a CPU its threads
    out of the cores (a trainer that does not say how many threads it uses takes them all). At most
    ``at_once`` such runs side by side."""
    gpus = visible_gpus()
    if gpus:
        units = max(1, workload.n_devices(recipe))
        return Share(units, min(gpus, units * (at_once or gpus)), gpus=True, cancel=cancel or threading.Event())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    units = min(cores, workload.cpu_threads(recipe) or cores)
    return Share(units, min(cores, units * (at_once or cores)), cancel=cancel or threading.Event())


class LocalExecutor:
    """Runs a measured run to completion before ``submit`` returns (the future is already done);
    loss-only runs on a pool of threads, side by side within the machine's devices."""

    parallel = 1
    loss_runs: int | None = None  # at most this many loss-only runs at once (None: as the devices allow)
    _pool: ThreadPoolExecutor | None = None  # started with the first loss-only run
    _cancel: threading.Event | None = None
    _lock = threading.Lock()  # guards the pool's start and close (class-wide: they are rare)

    def __init__(self, loss_runs: int | None = None):
        self.loss_runs = loss_runs

    def submit(
        self,
        workload: Workload,
        recipe: Recipe,
        steps: int,
        out_dir: Path,
        timeout_s: float | None,
        progress: ProgressFn | None = None,
        measured: bool = True,
    ) -> Future[RunResult]:
        if measured:
            return _done(workload.run, recipe, steps, out_dir, timeout_s=timeout_s, progress=progress)
        with self._lock:
            if self._cancel is None:
                self._cancel = threading.Event()
            share = local_share(workload, recipe, self.loss_runs, self._cancel)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2, visible_gpus()),
                                                thread_name_prefix="loss-run")
            pool = self._pool

        def run() -> RunResult:
            if share.cancel.is_set():
                raise Cancelled(f"{out_dir}: not started, the executor was closed")
            with sharing(share):  # core/process.py: MACHINE holds the run to its share
                result = workload.run(recipe, steps, out_dir, timeout_s=timeout_s, progress=progress)
            if share.cancel.is_set():  # killed, or refused while it waited for its share: not a result
                raise Cancelled(f"{out_dir}: the executor was closed ({result.status}: {result.cause})")
            return result

        return pool.submit(run)

    def call(self, fn: Callable[..., T], workload: Workload | None, *args: Any, **kwargs: Any) -> Future[T]:
        return _done(fn, *args, **kwargs) if workload is None else _done(fn, workload, *args, **kwargs)

    def loss_runs_at_once(self, workload: Workload, recipe: Recipe) -> int:
        share = local_share(workload, recipe, self.loss_runs)
        return max(1, share.capacity // share.units)

    def close(self) -> None:
        """Loss-only runs not started are dropped, those running are killed (with their process group)."""
        with self._lock:
            pool, cancel = self._pool, self._cancel
            self._pool, self._cancel = None, None
        if pool is not None and cancel is not None:
            cancel.set()
            pool.shutdown(wait=True, cancel_futures=True)
